"""Oracle and random real-layout checkpoints: the names the families publish, a main model that
transformers loads, and (for oracles) a draft law that follows from the tensors in closed form."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from atlas import AtlasError
from atlas.checkpoints.oracles import bigram_tables, write_checkpoint

# The MTP tensors each family's inference code reads (vLLM/SGLang model files), at depth 3.
EXPECTED = {
    "mimo": ["model.mtp_layers.0.input_proj.weight", "model.mtp_layers.0.token_layernorm.weight",
             "model.mtp_layers.0.hidden_layernorm.weight", "model.mtp_layers.0.final_layernorm.weight",
             "model.mtp_layers.0.self_attn.q_proj.bias", "model.mtp_layers.0.mlp.down_proj.weight"],
    "deepseek_v3": ["model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight", "model.layers.3.hnorm.weight",
                    "model.layers.3.shared_head.norm.weight", "model.layers.3.shared_head.head.weight",
                    "model.layers.3.embed_tokens.weight", "model.layers.3.self_attn.kv_a_proj_with_mqa.weight",
                    "model.layers.3.mlp.experts.3.down_proj.weight", "model.layers.3.mlp.shared_experts.up_proj.weight"],
    "deepseek_v32": ["model.layers.3.eh_proj.weight", "model.layers.3.shared_head.head.weight",
                     "model.layers.3.self_attn.indexer.wk.weight", "model.layers.3.self_attn.indexer.weights_proj.weight",
                     "model.layers.0.self_attn.indexer.wq_b.weight", "model.layers.3.mlp.experts.3.down_proj.weight"],
    "glm_moe_dsa": ["model.layers.3.eh_proj.weight", "model.layers.3.shared_head.norm.weight", "model.layers.3.self_attn.indexer.wk.weight"],
    "qwen3_next": ["mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
                   "mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.mlp.shared_expert_gate.weight",
                   "mtp.layers.0.mlp.experts.1.gate_proj.weight", "model.layers.0.linear_attn.in_proj_qkvz.weight"],
    "qwen3_5": ["mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight",
                "mtp.layers.0.mlp.down_proj.weight", "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
                "model.language_model.embed_tokens.weight"],
    "qwen3_5_moe": ["mtp.fc.weight", "mtp.layers.0.mlp.experts.1.gate_proj.weight", "mtp.layers.0.mlp.shared_expert_gate.weight",
                    "model.language_model.layers.3.self_attn.o_proj.weight"],
    "nemotron_h": ["mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj.weight",
                   "mtp.layers.0.mixer.q_proj.weight", "mtp.layers.1.mixer.experts.3.down_proj.weight",
                   "mtp.layers.1.mixer.shared_experts.up_proj.weight", "mtp.layers.1.final_layernorm.weight",
                   "backbone.layers.0.mixer.A_log", "backbone.norm_f.weight"],
}
# Tensors a family's releases do not ship: GLM-5.x has no layer-local head or embedding copy (vLLM PR #34385).
ABSENT = {"glm_moe_dsa": ["model.layers.3.embed_tokens.weight", "model.layers.3.shared_head.head.weight"]}
# A depth with a full-attention main layer: transformers' forward cannot run a recurrent-only cache.
DEPTH = {"qwen3_next": 4, "qwen3_5": 4, "qwen3_5_moe": 4}


def transformers_model(folder: Path):
    """transformers' own class for the checkpoint; MiMo's model_type "mimo" has none (its config
    names remote code, never run): read as Qwen2's, as vLLM runs it."""
    raw = json.loads((folder / "config.json").read_text())
    config = None
    if raw["model_type"] == "mimo":
        config = AutoConfig.for_model("qwen2", **{k: v for k, v in raw.items() if k not in ("model_type", "auto_map", "architectures")})
    return AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()


def names(folder: Path) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_oracle_layout_and_closed_form_laws(family: str, tmp_path: Path) -> None:
    depth = DEPTH.get(family, 3)
    folder = write_checkpoint(family, tmp_path, "oracle", depth=depth)
    assert set(EXPECTED[family]) <= names(folder)
    assert not set(ABSENT.get(family, [])) & names(folder)
    assert not any(f"layers.{depth + 1}." in n for n in names(folder))
    model = transformers_model(folder)
    assert model.config.get_text_config().num_hidden_layers == depth
    p, q = bigram_tables(folder, family)
    ids = torch.tensor([[5, 77, 3, 200, 12, 5]])
    with torch.no_grad():
        probs = model(ids).logits[0].double().softmax(-1).numpy()
    # first order: transformers' own forward gives the closed-form law of each position's token
    assert np.abs(probs - p[ids[0].numpy()]).max() < 1e-5
    assert np.abs(p - q).max() < 1e-6
    assert p.max(-1).mean() > 0.2  # peaked enough that greedy choices are not near-ties


def test_draft_scale_and_random_mode(tmp_path: Path) -> None:
    scaled = write_checkpoint("mimo", tmp_path / "scaled", "oracle", draft_scale=0.5)
    p, q = bigram_tables(scaled, "mimo")
    assert 0.3 < np.minimum(p, q).sum(-1).mean() < 0.99
    rand = write_checkpoint("mimo", tmp_path / "random", "random", seed=3)
    with safe_open(str(rand / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.0.self_attn.o_proj.weight").abs().sum() > 0
        assert f.get_tensor("model.mtp_layers.0.input_proj.weight")[:, :64].abs().sum() > 0  # h half used


def test_overrides_for_engine_shape_limits(tmp_path: Path) -> None:
    """vLLM on CPU: head sizes from 32 up, MLA with kv_lora_rank 512 and qk_rope_head_dim 64; a
    Qwen3-Next hybrid main model with a linear-attention layer."""
    ds = write_checkpoint("deepseek_v3", tmp_path / "ds", depth=1, overrides=dict(
        hidden_size=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, num_attention_heads=2,
        num_key_value_heads=2))
    with safe_open(str(ds / "model.safetensors"), "pt") as f:
        assert list(f.get_tensor("model.layers.1.self_attn.kv_a_proj_with_mqa.weight").shape) == [512 + 64, 128]
    qn = write_checkpoint("qwen3_next", tmp_path / "qn", depth=2, overrides=dict(layer_types=["linear_attention", "full_attention"]))
    assert "model.layers.0.linear_attn.out_proj.weight" in names(qn) and "mtp.layers.0.self_attn.q_proj.weight" in names(qn)
    with pytest.raises(AtlasError, match="layer_types"):
        write_checkpoint("qwen3_next", tmp_path / "bad", depth=2, overrides=dict(layer_types=["full_attention"]))
    with pytest.raises(AtlasError, match="no oracle layout"):
        write_checkpoint("nope", tmp_path / "nope")
