"""The team model (Mellum, `mtp.*` tensors) rewritten in the Qwen3-Next layout, which vLLM serves
with MTP; vLLM runs Mellum only through its generic transformers backend, which drops MTP weights.

The rewrite is exact arithmetic, not an approximation:
- Mellum's RMS norms are x̂·w, Qwen3-Next's are Gemma-style x̂·(1+w'): stored w' = w − 1. In float32,
  w − 1 and then 1 + (w − 1) give w back bit for bit when 0.5 ≤ w ≤ 2 (Sterbenz); the conversion
  checks every element and records whether the round trip was exact.
- Qwen3-Next attention with `attn_output_gate: false`, full rotary (`partial_rotary_factor: 1`),
  every layer `full_attention`: Mellum's attention (q/k head norms, NeoX RoPE) unchanged.
- vLLM builds the Qwen3-Next MTP path only with a mixture-of-experts block, so layer 0 and the MTP
  layer hold their dense MLP as a single expert behind a zero router (softmax over one expert = 1.0)
  plus a zero shared expert (its output is zero, times sigmoid(0)); the other main layers stay dense
  (`mlp_only_layers`). The MTP concat order is embedding first in both layouts.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from atlas import AtlasError

if TYPE_CHECKING:
    import torch

CONVERTER_VERSION = "mellum-to-qwen3_next/1"
# Small: the shared expert only has to exist; its weights are zeros.
SHARED_EXPERT_SIZE = 32
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


class Conversion(BaseModel):
    """What was converted, how, and whether every norm weight survived the −1 shift exactly."""

    converter: str = CONVERTER_VERSION
    source_model_type: str
    source_digest: str
    target_layout: str = "qwen3_next"
    norm_shift_exact: bool
    moe_layers: list[int]
    note: str


def needs_conversion(config: dict) -> bool:
    """True for a checkpoint vLLM cannot run with MTP as it stands but this module can rewrite."""
    return config.get("model_type") == "mellum"


def _check_mellum(config: dict) -> None:
    n = config["num_hidden_layers"]
    if config.get("num_nextn_predict_layers") != 1:
        raise AtlasError("only a Mellum checkpoint with exactly one MTP layer can be converted")
    types = config.get("layer_types") or ["full_attention"] * n
    if set(types) | set(config.get("mtp_layer_types") or []) != {"full_attention"}:
        raise AtlasError("Mellum conversion: sliding-window layers have no Qwen3-Next equivalent; only full attention converts")
    mlps = set(config.get("mlp_layer_types") or []) | set(config.get("mtp_mlp_layer_types") or [])
    if mlps != {"dense"}:
        raise AtlasError("Mellum conversion: only dense MLPs convert (a sparse Mellum layer would need its router kept)")
    rope = config.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    if rope.get("rope_type", "default") != "default":
        raise AtlasError(f"Mellum conversion: rope_type {rope.get('rope_type')!r} not supported (default only)")
    if config.get("attention_bias"):
        raise AtlasError("Mellum conversion: attention biases have no Qwen3-Next slot")


def qwen3_next_config(config: dict) -> dict:
    """The Qwen3-Next config that computes what the Mellum config does."""
    n = config["num_hidden_layers"]
    rope = config.get("rope_parameters") or {}
    theta = float(rope.get("full_attention", rope).get("rope_theta", 10000.0))
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"],
        "intermediate_size": config["intermediate_size"],
        "num_hidden_layers": n,
        "num_attention_heads": config["num_attention_heads"],
        "num_key_value_heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "hidden_act": config.get("hidden_act", "silu"),
        "max_position_embeddings": config["max_position_embeddings"],
        "rms_norm_eps": config["rms_norm_eps"],
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "attention_bias": False,
        "attn_output_gate": False,
        "partial_rotary_factor": 1.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 1.0},
        "layer_types": ["full_attention"] * n,
        "full_attention_interval": 1,
        "num_experts": 1,
        "num_experts_per_tok": 1,
        "norm_topk_prob": True,
        "moe_intermediate_size": config["intermediate_size"],
        "shared_expert_intermediate_size": SHARED_EXPERT_SIZE,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(range(1, n)),
        "num_nextn_predict_layers": 1,
        "bos_token_id": config.get("bos_token_id"),
        "eos_token_id": config.get("eos_token_id"),
        "pad_token_id": config.get("pad_token_id"),
        "dtype": config.get("dtype", "float32"),
    }


def _shifted(w: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """w − 1 for a Gemma-style norm, and whether 1 + (w − 1) == w in the tensor's own dtype."""
    import torch

    out = w - 1
    return out.contiguous(), bool(torch.equal(out + 1, w))


def convert_tensors(tensors: dict[str, torch.Tensor], n_layers: int) -> tuple[dict[str, torch.Tensor], bool]:
    """Mellum tensor names and values -> Qwen3-Next's; (tensors, every norm shift exact)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    exact = True
    for name, w in tensors.items():
        parts = name.split(".")
        if name.endswith("norm.weight") or parts[-2] in ("pre_fc_norm_embedding", "pre_fc_norm_hidden"):
            out[name], ok = _shifted(w)
            exact &= ok
            continue
        # layer 0 and the MTP layer (its index is 0 too) hold their MLP as one expert
        moe = ".mlp." in name and (name.startswith("model.layers.0.") or name.startswith("mtp.layers.0."))
        if moe:
            prefix, _, rest = name.partition(".mlp.")
            out[f"{prefix}.mlp.experts.0.{rest}"] = w
            continue
        if name.startswith(("model.", "mtp.", "lm_head.")):
            out[name] = w
            continue
        raise AtlasError(f"Mellum conversion: unexpected tensor {name!r}")
    for prefix in ("model.layers.0", "mtp.layers.0"):
        gate = out[f"{prefix}.mlp.experts.0.gate_proj.weight"]
        hidden, dtype = gate.shape[1], gate.dtype
        out[f"{prefix}.mlp.gate.weight"] = torch.zeros(1, hidden, dtype=dtype)
        out[f"{prefix}.mlp.shared_expert.gate_proj.weight"] = torch.zeros(SHARED_EXPERT_SIZE, hidden, dtype=dtype)
        out[f"{prefix}.mlp.shared_expert.up_proj.weight"] = torch.zeros(SHARED_EXPERT_SIZE, hidden, dtype=dtype)
        out[f"{prefix}.mlp.shared_expert.down_proj.weight"] = torch.zeros(hidden, SHARED_EXPERT_SIZE, dtype=dtype)
        out[f"{prefix}.mlp.shared_expert_gate.weight"] = torch.zeros(1, hidden, dtype=dtype)
    return out, exact


def _folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return "sha256:" + h.hexdigest()


def convert_mellum(src: Path, dst: Path) -> Conversion:
    """Write the Qwen3-Next form of the Mellum checkpoint `src` into `dst` (config, one safetensors
    file, tokenizer files, conversion.json). Idempotent: an existing conversion of the same source
    bytes is reused."""
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    if not needs_conversion(config):
        raise AtlasError(f"{src}: model_type {config.get('model_type')!r} is not Mellum; nothing to convert")
    _check_mellum(config)
    digest = _folder_digest(src)
    marker = dst / "conversion.json"
    if marker.is_file():
        done = Conversion.model_validate_json(marker.read_text())
        if done.source_digest == digest and done.converter == CONVERTER_VERSION:
            return done
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise AtlasError(f"{src}: no safetensors weights")
    tensors: dict = {}
    for f in files:
        tensors.update(load_file(f))
    converted, exact = convert_tensors(tensors, config["num_hidden_layers"])
    dst.mkdir(parents=True, exist_ok=True)
    save_file(converted, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(qwen3_next_config(config), indent=1) + "\n")
    for name in _TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    conversion = Conversion(
        source_model_type="mellum",
        source_digest=digest,
        norm_shift_exact=exact,
        moe_layers=[0],
        note="norms w-1 (Gemma-style), attn_output_gate false, full rotary, all layers full attention; "
             "layer 0 and the MTP layer: dense MLP as one expert, zero router, zero shared expert",
    )
    marker.write_text(conversion.model_dump_json(indent=1) + "\n")
    return conversion


def without_remote_code(config: dict) -> dict | None:
    """The config as vLLM loads it with remote code off, or None when it already loads so. vLLM
    refuses any config that names remote code (`auto_map`) unless trust_remote_code is on, which
    the atlas never turns on; MiMo ships such a config with model_type "mimo", unknown to
    transformers, while vLLM's own MiMoForCausalLM runs it on a Qwen2 config."""
    if "auto_map" not in config and config.get("model_type") != "mimo":
        return None
    rewritten = {k: v for k, v in config.items() if k != "auto_map"}
    if rewritten.get("model_type") == "mimo":
        rewritten["model_type"] = "qwen2"
    return rewritten


def config_for_the_engine(src: Path, dst: Path) -> dict:
    """`src` as the engine loads it without remote code, in `dst`: every file linked, config.json
    rewritten (the source folder is never touched). Returns what the rewrite changed."""
    config = json.loads((src / "config.json").read_text())
    rewritten = without_remote_code(config)
    if rewritten is None:
        raise AtlasError(f"{src}: its config already loads without remote code; nothing to rewrite")
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for path in src.iterdir():
        if path.is_file() and path.name != "config.json":
            (dst / path.name).symlink_to(path.resolve())
    (dst / "config.json").write_text(json.dumps(rewritten, indent=2))
    return {"converter": "config-without-remote-code/1", "source_model_type": config.get("model_type"),
            "removed": sorted(set(config) - set(rewritten)), "model_type": rewritten.get("model_type")}
