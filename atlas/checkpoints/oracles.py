"""Tiny checkpoints laid out exactly like real MTP families (config.json + model.safetensors with the
family's real tensor names), in two modes:

- `random`: every weight random, so a wrong wiring (concat order, norm style, hidden fed) changes
  the draft distribution; acceptance is low but greedy output must still equal plain decoding.
- `oracle`: the main model is first order (every residual branch's output projection is zero, so
  its logits at a position depend only on that position's token) and the MTP layer computes the
  main model's next-token function from the token it is fed: its projection passes the (unit-norm)
  token embedding through, its block's branches are zero, and its final norm is the main final
  norm times `draft_scale`. So the draft distribution is softmax(draft_scale · main logits of that
  token): with draft_scale = 1 greedy acceptance is exactly 1 at every k, and for any scale the
  expected T = 1 acceptance follows in closed form from `bigram_tables` (atlas.records.theory).
  With `disagree` the final norm is also perturbed, so the draft's argmax differs from the main
  model's on some tokens: T = 0 acceptance is then known (the argmax tables) and below 1 too.

The layouts are written here from the families' published inference code (names per
../shared/research-notes), independently of atlas.decode.mtphead, which reads them: a naming
slip in one is caught by tests that load the other. The main model's own tensors come from
transformers' save_pretrained of its class, so they carry the checkpoint names transformers loads.
Overrides let an engine's shape limits be met (e.g. vLLM on CPU: head sizes 32..256, MLA with
kv_lora_rank 512 and qk_rope_head_dim 64). The hybrid families (Qwen3-Next, Qwen3.5, Nemotron-H)
start from a real config in the bundled mirror and shrink only its sizes (`shrunk_config`), so their
checkpoints carry the shipped keys, layer pattern rule and multimodal nesting.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from atlas import AtlasError
from atlas.fingerprints import blockpattern
from atlas.checkpoints.layercut import cut_to_depth
from atlas.paths import ROOT

if TYPE_CHECKING:  # transformers loads where a checkpoint is written
    from transformers import PretrainedConfig

Mode = Literal["oracle", "random"]
# Output projections of residual branches (attention, linear attention, dense MLP, experts, shared
# experts): zeroing them makes a layer the identity on its residual stream.
BRANCH_OUT = re.compile(r"\.(o_proj|out_proj|down_proj)\.(weight|bias)\Z")  # \Z: `$` also matches before a final newline


@dataclass(frozen=True)
class Layout:
    """Where one family keeps its MTP layer i and how it wires it (real tensor names)."""

    model_type: str
    architectures: tuple[str, ...]
    count_key: str
    defaults: dict[str, Any]  # tiny main-model config (transformers' config class for model_type)
    glue: str  # prefix of the MTP glue tensors, {N} = num_hidden_layers, {i} = MTP layer
    block: str  # prefix of the MTP decoder block's tensors
    e_norm: str
    h_norm: str
    proj: str  # [H, 2H] over the concatenation
    final_norm: str
    hidden_first: bool
    gemma_norms: bool  # every norm computes x̂·(1 + w)
    own_head: str | None = None  # a physical copy of lm_head inside the MTP layer, as the family ships it
    own_embed: str | None = None
    # The names those copies take (under `glue`) in a checkpoint of this layout that carries them,
    # whether or not the family's releases do (GLM-5 ships none; DeepSeek-V3 ships both)
    copy_names: tuple[str, str] | None = None  # (head, embedding)
    # A real config in the bundled mirror (data/hub-mirror/<org>/<name>/config.json) that the
    # checkpoint's config is a shrunk copy of: every key kept, `defaults` replacing the sizes (into
    # text_config for a multimodal config), the layer pattern cut to the depth asked for.
    mirror: str | None = None
    main_prefix: str = "model."  # where transformers' save_pretrained puts the main model
    shipped_prefix: str = "model."  # where the real checkpoints put it (Qwen3.5: model.language_model.)
    embed: str = "embed_tokens.weight"  # under the main prefix
    norm: str = "norm.weight"  # the main final norm, under the main prefix
    final_glue: str | None = None  # prefix of final_norm when it is not `glue` ({i} = the last sub-layer)

    def copies(self, local_copies: bool | None = None) -> tuple[str | None, str | None]:
        """(head copy, embedding copy) names a checkpoint written with `local_copies` carries: None
        as the family ships, True both (copy_names), False neither."""
        if local_copies is None:
            return self.own_head, self.own_embed
        if not local_copies:
            return None, None
        if self.copy_names is None:
            raise AtlasError(f"{self.model_type}: no layer-local copy names for this layout")
        return self.copy_names

    def names(self, depth: int, sublayers: int = 1, layer: int = 0, local_copies: bool | None = None) -> dict[str, str]:
        """The checkpoint names of the tensors an oracle's closed form reads (of MTP layer `layer`
        in a chain; a chain's layer i is a one-block layer whose prefixes take {i} = i); the MTP
        layer's head and embedding are its own copies where the checkpoint has them (`copies`)."""
        glue = _prefix(self.glue, depth, layer)
        final = _prefix(self.final_glue, depth, sublayers - 1) if self.final_glue else glue
        own_head, own_embed = self.copies(local_copies)
        return {
            "e_norm": glue + self.e_norm, "h_norm": glue + self.h_norm, "proj": glue + self.proj,
            "final_norm": final + self.final_norm, "embed": self.shipped_prefix + self.embed, "norm": self.shipped_prefix + self.norm,
            "mtp_embed": glue + own_embed if own_embed else self.shipped_prefix + self.embed,
            "mtp_head": glue + own_head if own_head else "lm_head.weight",
        }


_TINY = dict(vocab_size=259, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False)

# Shrunk sizes for the mirror-based layouts (specials: the byte tokenizer's, atlas.checkpoints.team_corpus).
_SHRUNK = dict(vocab_size=259, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=1024, bos_token_id=257, eos_token_id=258, dtype="float32")
_LINEAR = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=8)
# DeepSeek-style MLA and MoE, shrunk; the MTP block (layer num_hidden_layers) is MoE, as shipped.
_MLA = dict(moe_intermediate_size=32, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
            n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
            num_key_value_heads=4)
_INDEXER = dict(index_n_heads=2, index_head_dim=32)  # index_topk kept: 2048, as shipped
# Nemotron-H pattern letters -> transformers' block types; the MTP block may use only * and E.
NEMOTRON_BLOCKS = {"M": "linear_attention", "*": "full_attention", "E": "moe", "-": "mlp"}

# Nemotron-H's tensor names (vLLM nemotron_h_mtp.py: glue on the first MTP sub-layer, final norm on the last)
_NEMOTRON: dict[str, Any] = dict(
    model_type="nemotron_h", architectures=("NemotronHForCausalLM",), count_key="num_nextn_predict_layers",
    glue="mtp.layers.0.", block="mtp.layers.{i}.", final_glue="mtp.layers.{i}.",
    e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="final_layernorm.weight",
    hidden_first=False, gemma_norms=False,
    main_prefix="backbone.", shipped_prefix="backbone.", embed="embeddings.weight", norm="norm_f.weight",
)
_NEMOTRON_SIZES = dict(_SHRUNK, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=8, chunk_size=8,
                       n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
                       pad_token_id=256)
# transformers layer types -> the names the shipped list-spelled configs write (Nemotron-3 Ultra, 3.5)
LIST_NAMES = {"linear_attention": "mamba", "full_attention": "attention", "moe": "moe", "mlp": "mlp"}
# Where the DeepSeek-style MTP layer keeps its own head and embedding when a checkpoint carries them
COPIES = ("shared_head.head.weight", "embed_tokens.weight")

LAYOUTS: dict[str, Layout] = {
    "mimo": Layout(  # as MiMo-7B ships it: model_type mimo, run on transformers' Qwen2 classes
        model_type="qwen2", architectures=("MiMoForCausalLM",), count_key="num_nextn_predict_layers",
        defaults=dict(_SHRUNK, head_dim=16, max_window_layers=1),
        glue="model.mtp_layers.{i}.", block="model.mtp_layers.{i}.",
        e_norm="token_layernorm.weight", h_norm="hidden_layernorm.weight", proj="input_proj.weight",
        final_norm="final_layernorm.weight", hidden_first=True, gemma_norms=False,
        mirror="_unattributed/XiaomiMiMo-MiMo-7B-variant-from-jj8127-mimo_kor",
    ),
    "deepseek_v3": Layout(
        model_type="deepseek_v3", architectures=("DeepseekV3ForCausalLM",), count_key="num_nextn_predict_layers",
        defaults=dict(_SHRUNK, **_MLA), glue="model.layers.{N+i}.", block="model.layers.{N+i}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        hidden_first=False, gemma_norms=False, own_head="shared_head.head.weight", own_embed="embed_tokens.weight", copy_names=COPIES,
        mirror="deepseek-ai/DeepSeek-V3",
    ),
    "deepseek_v2": Layout(  # no DeepSeek-V2 config in the mirror: a fixture with the DeepSeek MTP glue
        model_type="deepseek_v2", architectures=("DeepseekV2ForCausalLM",), count_key="num_nextn_predict_layers",
        defaults=dict(_TINY, **_MLA), glue="model.layers.{N+i}.", block="model.layers.{N+i}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        hidden_first=False, gemma_norms=False, own_head="shared_head.head.weight", own_embed="embed_tokens.weight", copy_names=COPIES,
    ),
    "deepseek_v32": Layout(  # DSA: every key selected while the sequence fits in index_topk
        model_type="deepseek_v32", architectures=("DeepseekV32ForCausalLM",), count_key="num_nextn_predict_layers",
        defaults=dict(_SHRUNK, **_MLA, **_INDEXER), glue="model.layers.{N+i}.", block="model.layers.{N+i}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        hidden_first=False, gemma_norms=False, own_head="shared_head.head.weight", own_embed="embed_tokens.weight", copy_names=COPIES,
        mirror="deepseek-ai/DeepSeek-V3.2",
    ),
    "glm_moe_dsa": Layout(  # GLM-5: DeepSeek-V3.2 attention; as GLM-5.x ships, no layer-local embed_tokens or shared_head.head
        model_type="glm_moe_dsa", architectures=("GlmMoeDsaForCausalLM",), count_key="num_nextn_predict_layers",
        defaults=dict(_SHRUNK, **_MLA, **_INDEXER, head_dim=16, qk_head_dim=32, pad_token_id=256),
        glue="model.layers.{N+i}.", block="model.layers.{N+i}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        hidden_first=False, gemma_norms=False, copy_names=COPIES, mirror="zai-org/GLM-5-FP8",
    ),
    "glm4_moe": Layout(
        model_type="glm4_moe", architectures=("Glm4MoeForCausalLM",), count_key="num_nextn_predict_layers",
        defaults=dict(_SHRUNK, head_dim=16, moe_intermediate_size=32, first_k_dense_replace=1, n_routed_experts=4,
                      num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, pad_token_id=256),
        glue="model.layers.{N+i}.", block="model.layers.{N+i}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        hidden_first=False, gemma_norms=False, own_head="shared_head.head.weight", own_embed="embed_tokens.weight", copy_names=COPIES,
        mirror="zai-org/GLM-4.5",
    ),
    "glm4_moe_lite": Layout(  # GLM-4.7-Flash: MLA attention, DeepSeek-style MTP glue
        model_type="glm4_moe_lite", architectures=("Glm4MoeLiteForCausalLM",), count_key="num_nextn_predict_layers",
        defaults=dict(_TINY, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                      n_shared_experts=1, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16,
                      qk_nope_head_dim=16, v_head_dim=16),
        glue="model.layers.{N+i}.", block="model.layers.{N+i}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        hidden_first=False, gemma_norms=False, own_head="shared_head.head.weight", own_embed="embed_tokens.weight", copy_names=COPIES,
    ),
    "qwen3_next": Layout(  # as shipped: three Gated DeltaNet layers per full-attention one
        model_type="qwen3_next", architectures=("Qwen3NextForCausalLM",), count_key="num_nextn_predict_layers",
        defaults=dict(_SHRUNK, head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      shared_expert_intermediate_size=32, **_LINEAR),
        glue="mtp.", block="mtp.layers.{i}.",
        e_norm="pre_fc_norm_embedding.weight", h_norm="pre_fc_norm_hidden.weight", proj="fc.weight",
        final_norm="norm.weight", hidden_first=False, gemma_norms=True, mirror="Qwen/Qwen3-Next-80B-A3B-Thinking",
    ),
    "qwen3_5": Layout(  # Qwen3.5 dense (a vision-language config; the language model under model.language_model.)
        model_type="qwen3_5", architectures=("Qwen3_5ForConditionalGeneration",), count_key="mtp_num_hidden_layers",
        defaults=dict(_SHRUNK, head_dim=32, rope_parameters={"mrope_section": [2, 1, 1]}, **_LINEAR),
        glue="mtp.", block="mtp.layers.{i}.",
        e_norm="pre_fc_norm_embedding.weight", h_norm="pre_fc_norm_hidden.weight", proj="fc.weight",
        final_norm="norm.weight", hidden_first=False, gemma_norms=True, mirror="Qwen/Qwen3.5-9B", shipped_prefix="model.language_model.",
    ),
    "qwen3_5_moe": Layout(
        model_type="qwen3_5_moe", architectures=("Qwen3_5MoeForConditionalGeneration",), count_key="mtp_num_hidden_layers",
        defaults=dict(_SHRUNK, head_dim=32, rope_parameters={"mrope_section": [2, 1, 1]}, moe_intermediate_size=32, num_experts=4,
                      num_experts_per_tok=2, shared_expert_intermediate_size=32, **_LINEAR),
        glue="mtp.", block="mtp.layers.{i}.",
        e_norm="pre_fc_norm_embedding.weight", h_norm="pre_fc_norm_hidden.weight", proj="fc.weight",
        final_norm="norm.weight", hidden_first=False, gemma_norms=True, mirror="Qwen/Qwen3.5-35B-A3B", shipped_prefix="model.language_model.",
    ),
    # Nemotron-3 Super: Mamba2 / MoE / attention main layers, MTP block "*E" (string spelling)
    "nemotron_h": Layout(**_NEMOTRON, defaults=dict(_NEMOTRON_SIZES, moe_latent_size=32), mirror="nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8"),
    # Nemotron-3 Ultra: the same blocks spelled as lists (layers_block_type, mtp_layers_block_type),
    # no num_hidden_layers key (the depth is the list's length), a latent MoE
    "nemotron_h_ultra": Layout(**_NEMOTRON, defaults=dict(_NEMOTRON_SIZES, moe_latent_size=32),
                               mirror="nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"),
    # Nemotron-3.5 Lightning: lists too, with num_hidden_layers, and no latent MoE (moe_latent_size null, kept)
    "nemotron_h_lightning": Layout(**_NEMOTRON, defaults=_NEMOTRON_SIZES, mirror="nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"),
}


def _prefix(template: str, depth: int, i: int) -> str:
    return template.replace("{N+i}", str(depth + i)).replace("{i}", str(i))


def _main_config(layout: Layout, depth: int, overrides: dict[str, Any], blocks: int = 1):
    """The family's transformers config with depth + `blocks` layers: the extra ones are built as
    the MTP blocks (same class and config as a main layer, as the families define it) and renamed."""
    from transformers import AutoConfig

    kwargs = {**layout.defaults, **overrides, "num_hidden_layers": depth + blocks}
    if "mlp_layer_types" in AutoConfig.for_model(layout.model_type).to_dict():
        kwargs["mlp_layer_types"] = ["dense"] + ["sparse"] * (depth + blocks - 1)  # first layer dense, the MTP blocks MoE
    return AutoConfig.for_model(layout.model_type, **kwargs)


def _merge(into: dict[str, Any], sizes: dict[str, Any]) -> None:
    for key, value in sizes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def shrunk_config(layout: Layout, depth: int, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(config.json to write: the mirror's real config with its sizes shrunk and its layer pattern
    cut to `depth`, every other key kept; the main layers' types; the MTP block's sub-layer types).

    Qwen3-Next / Qwen3.5: layer i is full attention when (i + 1) % full_attention_interval == 0,
    as the shipped pattern; the MTP block is one full-attention layer. Nemotron-H: the main
    pattern cycles M, *, E (or is given as hybrid_override_pattern); the MTP block is the
    config's mtp_hybrid_override_pattern."""
    saved = json.loads((ROOT / "data" / "hub-mirror" / str(layout.mirror) / "config.json").read_text())
    return shrink(saved, depth, layout.defaults, overrides)


def shrink(saved: dict[str, Any], depth: int, sizes: dict[str, Any], overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """shrunk_config's work on a config already read: every per-layer setting cut to `depth` by
    atlas.checkpoints.layercut's rule, `sizes` and `overrides` merged in, the layer pattern set."""
    saved = copy.deepcopy(saved)
    nested = isinstance(saved.get("text_config"), dict)
    text = cut_to_depth(saved["text_config"] if nested else saved, depth)
    if nested:
        saved["text_config"] = text
    else:
        saved = text
    _merge(text, {**sizes, **{k: v for k, v in overrides.items() if k not in ("layer_types", "layers_block_type")}})
    for config in (saved, text):  # the tiny weights are written unquantised
        config.pop("quantization_config", None)
    if "mtp_hybrid_override_pattern" in text:
        pattern = str(overrides.get("hybrid_override_pattern", ("M*E" * depth)[:depth]))
        if len(pattern) != depth:
            raise AtlasError(f"hybrid_override_pattern {pattern!r} has {len(pattern)} letters for {depth} main layers")
        text["hybrid_override_pattern"] = pattern
        block = [NEMOTRON_BLOCKS[c] for c in text["mtp_hybrid_override_pattern"]]
        return saved, [NEMOTRON_BLOCKS[c] for c in pattern], block
    if "mtp_layers_block_type" in text:  # the list spelling, in the names the shipped lists use
        listed = list(overrides.get("layers_block_type", (["mamba", "attention", "moe"] * depth)[:depth]))
        if len(listed) != depth:
            raise AtlasError(f"layers_block_type has {len(listed)} entries for {depth} main layers")
        text["layers_block_type"] = listed
        main, block = blockpattern.read(text, "main"), blockpattern.read(text, "mtp")
        assert main is not None and block is not None  # both keys were just checked / written
        return saved, list(main.kinds), list(block.kinds)
    interval = int(text.get("full_attention_interval", 1))
    types = list(overrides.get("layer_types", ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(depth)]))
    if len(types) != depth:
        raise AtlasError(f"layer_types has {len(types)} entries for {depth} main layers")
    if "layer_types" in text or "layer_types" in overrides:
        text["layer_types"] = types
    return saved, types, ["full_attention"]


def _transformers_config(layout: Layout, saved: dict[str, Any], types: list[str], block: list[str]):
    """transformers' config of the language model with the MTP block's sub-layers appended as
    main layers (so its class builds them, and save_pretrained names them), in the class the
    layout names (MiMo's mimo config read as Qwen2's)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    text = dict(saved["text_config"] if isinstance(saved.get("text_config"), dict) else saved)
    model_type = text.pop("model_type")
    if model_type not in CONFIG_MAPPING:  # MiMo's "mimo": read as the class the layout runs it on
        model_type = layout.model_type
    for key in ("architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "num_nextn_predict_layers"):
        text.pop(key, None)
    if "hybrid_override_pattern" in text:
        letters = {v: k for k, v in NEMOTRON_BLOCKS.items()}
        text["hybrid_override_pattern"] = "".join(letters[t] for t in [*types, *block])
    elif "layers_block_type" in text:  # transformers derives the depth from the list: no num_hidden_layers
        text.pop("num_hidden_layers", None)
        text["layers_block_type"] = [LIST_NAMES[t] for t in [*types, *block]]
    else:
        text.update(num_hidden_layers=len(types) + len(block), layer_types=[*types, *block])
    for key, fill in (("mlp_layer_types", "sparse"), ("indexer_types", "full")):  # MTP blocks: MoE, own indexer, as shipped
        if isinstance(text.get(key), list):
            text[key] = [*text[key][: len(types)], *[fill] * len(block)]
    config = AutoConfig.for_model(model_type, **text)
    if isinstance(getattr(config, "mlp_layer_types", None), list):  # the MTP blocks are MoE, as shipped
        config.mlp_layer_types = [*config.mlp_layer_types[: len(types)], *["sparse"] * len(block)]
    return config


def _randomise(tensors: dict[str, torch.Tensor], gen: torch.Generator) -> None:
    """Weights far from the init (norms perturbed around their init value, so either norm style is
    exercised; matrices with unit-scale rows) so that every piece changes the logits visibly."""
    for name, t in tensors.items():
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16) or name.endswith(("A_log", "dt_bias", "e_score_correction_bias")):
            continue
        noise = torch.randn(t.shape, generator=gen)
        if "norm" in name and t.dim() == 1:
            t.add_(0.3 * noise)
        elif t.dim() >= 2:
            t.copy_(1.5 * noise / t.shape[-1] ** 0.5)
        else:
            t.copy_(0.1 * noise)


def write_checkpoint(
    family: str,
    out: Path,
    mode: Mode = "oracle",
    depth: int = 2,
    overrides: dict[str, Any] | None = None,
    draft_scale: float = 1.0,
    seed: int = 0,
    noise: float = 0.0,
    mtp_layers: int = 1,
    disagree: float = 0.0,
    local_copies: bool | None = None,
    mirror: str | None = None,
) -> Path:
    """Write a tiny `family` checkpoint (config.json, model.safetensors, a byte-level tokenizer)
    into `out` and return it. `depth` main layers (any depth: the MTP tensor index follows it where
    the family numbers them after the main layers), `mtp_layers` MTP layers (a chain: families whose
    glue is per layer), each an oracle of the same law in oracle mode.

    `noise` (oracle mode): the MTP layer's hidden columns and its block's branch outputs get random
    weights of this scale instead of zeros, so its drafts depend on the hidden it is fed and on its
    own KV cache while still being right often: what a check of the draft chain's wiring needs.

    `disagree` (oracle mode): random noise of this scale added to the MTP layer's final norm, so
    its argmax departs from the main model's on some tokens (T = 0 acceptance below 1) while its
    law stays first order and closed form (`bigram_tables` reads the norm as written): an oracle
    with a known, partial acceptance at every temperature.

    `local_copies`: whether the MTP layers carry their own copies of the head and embedding (None:
    as the family ships, e.g. DeepSeek-V3 both, GLM-5 neither; Layout.copies). `mirror`: the bundled
    mirror's org/name whose config is shrunk (a mirror-based layout's own by default)."""
    if family not in LAYOUTS:
        raise AtlasError(f"no oracle layout for {family!r} (known: {', '.join(LAYOUTS)})")
    if mode not in ("oracle", "random"):
        raise AtlasError(f"mode must be oracle or random, got {mode!r}")
    from transformers import AutoModelForCausalLM

    from atlas.checkpoints.team_corpus import build_tokenizer

    # `mirror`: another real config of the family, shrunk instead of the layout's own (coverage)
    layout = dataclasses.replace(LAYOUTS[family], mirror=mirror) if mirror else LAYOUTS[family]
    overrides = dict(overrides or {})
    if mtp_layers > 1 and "{" not in layout.glue:
        raise AtlasError(f"{family}: its MTP glue is one set of tensors; no chain of {mtp_layers} layers to write")
    config, block_types, saved = _configs(layout, depth, overrides, mtp_layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with tempfile.TemporaryDirectory() as tmp:  # save_pretrained writes the checkpoint-format names
        model.save_pretrained(tmp)
        tensors = {k: v.clone() for k, v in load_file(str(Path(tmp) / "model.safetensors")).items()}
    # The MTP block's sub-layers (built as main layers depth, depth + 1, ...) under the family's
    # names, then the main model under the prefix the real checkpoints use.
    main, shipped = layout.main_prefix, layout.shipped_prefix
    renames = [(f"{main}layers.{depth + i}.", _prefix(layout.block, depth, i)) for i in range(len(block_types))] + [(main, shipped)]
    tensors = {next((new + k[len(old):] for old, new in renames if k.startswith(old)), k): v for k, v in tensors.items()}
    names = layout.names(depth, len(block_types))
    gen = torch.Generator().manual_seed(seed + 1)
    _randomise(tensors, gen)
    embed, head = tensors[names["embed"]], tensors["lm_head.weight"]
    embed.copy_(embed / embed.pow(2).mean(-1, keepdim=True).sqrt())  # unit RMS rows: see the oracle note
    head.mul_(2.0)  # peaked next-token distributions, as trained models have

    d = config.hidden_size
    sublayers = 1 if mtp_layers > 1 else len(block_types)
    one = torch.zeros(d) if layout.gemma_norms else torch.ones(d)
    _random_mtp_layers(tensors, layout, depth, sublayers, mtp_layers, mode, local_copies, one, gen)
    if mode == "oracle":
        _oracle_mtp_layers(tensors, layout, depth, sublayers, mtp_layers, len(block_types), one, draft_scale, disagree, noise, gen)

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(_config_json(layout, config, saved, depth, mtp_layers), indent=1, sort_keys=True) + "\n")
    build_tokenizer().save_pretrained(out)
    return out


def _configs(layout: Layout, depth: int, overrides: dict[str, Any], mtp_layers: int) -> tuple[PretrainedConfig, list[str], dict[str, Any] | None]:
    """(the config the checkpoint's model is built from, the MTP block's sub-layer types, the shrunk
    real config a mirror-based layout writes; None for the others)."""
    if layout.mirror:
        saved, types, block_types = shrunk_config(layout, depth, overrides)
        if mtp_layers > 1:
            block_types = block_types * mtp_layers  # one-block layers: sub-layer i is MTP layer i
        return _transformers_config(layout, saved, types, block_types), block_types, saved
    return _main_config(layout, depth, overrides, mtp_layers), ["block"] * mtp_layers, None


def _config_json(layout: Layout, config: PretrainedConfig, saved: dict[str, Any] | None, depth: int, mtp_layers: int) -> dict[str, Any]:
    """What config.json holds: the main model's `depth` layers and the MTP layer count."""
    if not layout.mirror:
        saved = config.to_dict()
        saved.update(num_hidden_layers=depth, architectures=list(layout.architectures), **{layout.count_key: mtp_layers})
        for key in ("layer_types", "mlp_layer_types"):
            if isinstance(saved.get(key), list):
                saved[key] = saved[key][:depth]
        saved.pop("transformers_version", None)
    elif mtp_layers > 1:
        (saved.get("text_config") or saved)[layout.count_key] = mtp_layers
    return saved


def _random_mtp_layers(tensors: dict[str, torch.Tensor], layout: Layout, depth: int, sublayers: int, mtp_layers: int, mode: Mode,
                       local_copies: bool | None, one: torch.Tensor, gen: torch.Generator) -> None:
    """Random norms and projection for every MTP layer, and its own head and embedding copies
    where the layout has them."""
    embed, head = tensors[layout.names(depth)["embed"]], tensors["lm_head.weight"]
    d = one.shape[0]
    for m in range(mtp_layers):
        names = layout.names(depth, sublayers, m)
        glue = _prefix(layout.glue, depth, m)
        tensors[names["e_norm"]] = one + 0.3 * torch.randn(d, generator=gen)
        tensors[names["h_norm"]] = one + 0.3 * torch.randn(d, generator=gen)
        tensors[names["proj"]] = 1.5 * torch.randn(d, 2 * d, generator=gen) / (2 * d) ** 0.5
        tensors[names["final_norm"]] = one + 0.3 * torch.randn(d, generator=gen)
        # Layer-local copies: in an oracle the target's (the law needs them); random elsewhere, so a
        # loader that binds the target's where the checkpoint has its own is caught by the wiring.
        own_head, own_embed = layout.copies(local_copies)
        if own_head:
            tensors[glue + own_head] = head.clone() if mode == "oracle" else 3.0 * torch.randn(head.shape, generator=gen) / d**0.5
        if own_embed and mode == "oracle":
            tensors[glue + own_embed] = embed.clone()
        elif own_embed:
            fresh = torch.randn(embed.shape, generator=gen)
            tensors[glue + own_embed] = fresh / fresh.pow(2).mean(-1, keepdim=True).sqrt()


def _oracle_mtp_layers(tensors: dict[str, torch.Tensor], layout: Layout, depth: int, sublayers: int, mtp_layers: int, blocks: int,
                       one: torch.Tensor, draft_scale: float, disagree: float, noise: float, gen: torch.Generator) -> None:
    """Every MTP layer made an oracle of the main model's law: the block's branches silenced, the
    projection passing the normed embedding through, the final norm the main model's."""
    d = one.shape[0]
    for name, t in tensors.items():
        if BRANCH_OUT.search(name):
            t.zero_()
    main_norm = tensors[layout.names(depth, sublayers)["norm"]]
    effective = (1 + main_norm) if layout.gemma_norms else main_norm
    for m in range(mtp_layers):
        names = layout.names(depth, sublayers, m)
        tensors[names["e_norm"]] = one.clone()  # effective weight 1: ê itself
        proj = torch.zeros(d, 2 * d)
        e_cols = slice(d, 2 * d) if layout.hidden_first else slice(0, d)
        proj[:, e_cols] = torch.eye(d)
        tensors[names["proj"]] = proj
        tensors[names["final_norm"]] = draft_scale * effective - (1 if layout.gemma_norms else 0)
        if disagree:
            tensors[names["final_norm"]] += disagree * torch.randn(d, generator=gen)
        if noise:
            h_cols = slice(0, d) if layout.hidden_first else slice(d, 2 * d)
            proj[:, h_cols] = noise * torch.randn(d, d, generator=gen) / d**0.5
    if noise:
        prefixes = tuple(_prefix(layout.block, depth, i) for i in range(blocks))
        for name, t in tensors.items():
            if name.startswith(prefixes) and BRANCH_OUT.search(name):
                t.copy_(noise * torch.randn(t.shape, generator=gen) / t.shape[-1] ** 0.5)


def bigram_tables(folder: Path, family: str) -> tuple[np.ndarray, np.ndarray]:
    """(P, Q): the next-token laws of an oracle checkpoint's main model and MTP head given the
    current token, [V, V] each, computed in float64 straight from its tensors (no transformers,
    no loop): P[t] = softmax(head · norm(embed t)), Q[t] the same through the MTP glue."""
    layout = LAYOUTS[family]
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") or config
    # the MTP block's sub-layer count and the main depth, in either Nemotron-H spelling
    pattern = text.get("mtp_hybrid_override_pattern", text.get("mtp_layers_block_type", "x"))
    main = text.get("hybrid_override_pattern", text.get("layers_block_type"))
    depth = len(main) if main is not None else text["num_hidden_layers"]
    eps = text.get("rms_norm_eps", text.get("layer_norm_epsilon"))
    names = layout.names(depth, len(pattern))
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        get = lambda name: f.get_tensor(names.get(name, name)).astype(np.float64)  # noqa: E731 - local shorthand
        embed, head, norm = get("embed"), get("lm_head.weight"), get("norm")
        e_w, final_w, proj = get("e_norm"), get("final_norm"), get("proj")
    shift = 1.0 if layout.gemma_norms else 0.0

    def rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (w + shift)

    d = embed.shape[1]
    e_part = proj[:, d:] if layout.hidden_first else proj[:, :d]
    p_logits = rms(embed, norm) @ head.T
    q_logits = rms(rms(embed, e_w) @ e_part.T, final_w) @ head.T  # h's columns are zero in an oracle

    def softmax(z: np.ndarray) -> np.ndarray:
        z = np.exp(z - z.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)

    return softmax(p_logits), softmax(q_logits)
