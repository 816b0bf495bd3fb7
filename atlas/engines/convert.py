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

A GLM-4-MoE checkpoint whose main layers are all dense (the real team model: SmolLM2 in GLM's
layout) is rewritten too, exactly, for two things vLLM's Glm4MoeForCausalLM assumes of every GLM:
- at least one main layer is a mixture of experts (it reads its expert counts from one): the last
  main layer holds its dense MLP as expert 0 behind a zero router with score-correction bias
  [0, -1, ...], so sigmoid(0) + 0 always picks expert 0 and top-k renormalisation gives it weight
  0.5 / 0.5 = 1; the other experts are zero placeholders that are never picked;
- the head is stored: the class never ties lm_head to the embedding, so a tied checkpoint gets
  `lm_head.weight` written out (the same tensor);
- a shared expert exists: its CPU MoE kernel dies (SIGFPE) on a zero-width one, so a checkpoint
  without one gets a zero shared expert of full width in every MoE layer (its output is exactly 0).
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


def _load_tensors(src: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files (never a pickle)."""
    from safetensors.torch import load_file

    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise AtlasError(f"{src}: no safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(f))
    return tensors


def _folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return "sha256:" + h.hexdigest()


def convert_mellum(src: Path, dst: Path) -> Conversion:
    """Write the Qwen3-Next form of the Mellum checkpoint `src` into `dst` (config, one safetensors
    file, tokenizer files, conversion.json). Idempotent: an existing conversion of the same source
    bytes is reused."""
    from safetensors.torch import save_file

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
    tensors = _load_tensors(src)
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


GLM_CONVERTER_VERSION = "glm4_moe-for-vllm/2"  # /2: its note names every rewrite made; the tensors are /1's


def glm_needs_rewrite(config: dict) -> bool:
    """A GLM-4-MoE config vLLM cannot load or run as it stands: no MoE main layer, tied embeddings,
    or no shared expert."""
    if config.get("model_type") != "glm4_moe":
        return False
    return (int(config.get("first_k_dense_replace") or 0) >= int(config["num_hidden_layers"]) or bool(config.get("tie_word_embeddings"))
            or not config.get("n_shared_experts"))


def glm_tensors(tensors: dict[str, torch.Tensor], config: dict) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The rewritten tensors and the main layers turned into one-expert MoE blocks (see the module
    docstring); every other tensor is passed through unchanged."""
    import torch

    n = int(config["num_hidden_layers"])
    out = dict(tensors)
    moe_layers: list[int] = []
    if int(config.get("first_k_dense_replace") or 0) >= n:
        last, experts, size = n - 1, int(config["n_routed_experts"]), int(config["moe_intermediate_size"])
        prefix = f"model.layers.{last}.mlp."
        mlp = {name: out.pop(prefix + name + ".weight", None) for name in ("gate_proj", "up_proj", "down_proj")}
        if any(w is None for w in mlp.values()):
            raise AtlasError(f"GLM-4-MoE rewrite: layer {last} has no dense MLP ({prefix}gate/up/down_proj)")
        if mlp["gate_proj"].shape[0] != size or experts < 2 or int(config.get("num_experts_per_tok") or 0) != 1:
            raise AtlasError(f"GLM-4-MoE rewrite: layer {last}'s MLP (intermediate {mlp['gate_proj'].shape[0]}) fits as one "
                             f"expert only when moe_intermediate_size = {size} equals it, with top-1 routing over 2+ experts")
        d = mlp["gate_proj"].shape[1]
        for e in range(experts):
            for name, w in mlp.items():
                out[f"{prefix}experts.{e}.{name}.weight"] = w if e == 0 else torch.zeros_like(w)
        out[prefix + "gate.weight"] = torch.zeros(experts, d, dtype=torch.float32)
        out[prefix + "gate.e_score_correction_bias"] = torch.tensor([0.0] + [-1.0] * (experts - 1))
        moe_layers.append(last)
    if not config.get("n_shared_experts"):  # vLLM's CPU MoE dies (SIGFPE) on a zero-width shared expert: a zero one of full width
        size = int(config["moe_intermediate_size"])
        d = int(config["hidden_size"])
        for prefix in sorted({k.partition(".mlp.")[0] for k in out if ".mlp.gate.weight" in k}):
            p = prefix + ".mlp.shared_experts."
            out.update({p + "gate_proj.weight": torch.zeros(size, d), p + "up_proj.weight": torch.zeros(size, d),
                        p + "down_proj.weight": torch.zeros(d, size)})
    if config.get("tie_word_embeddings") and "lm_head.weight" not in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"].clone()
    return out, moe_layers


def glm_config_for_vllm(config: dict) -> dict:
    """The config of the rewritten checkpoint: the last main layer sparse, the head untied."""
    n = int(config["num_hidden_layers"])
    return dict(config, first_k_dense_replace=min(int(config.get("first_k_dense_replace") or 0), n - 1), tie_word_embeddings=False,
                n_shared_experts=int(config.get("n_shared_experts") or 1))


def convert_glm(src: Path, dst: Path) -> dict:
    """Write the vLLM-loadable form of the GLM-4-MoE checkpoint `src` into `dst` (config, one
    safetensors file, tokenizer files, conversion.json); reused while the source bytes are unchanged.
    Returns the conversion record."""
    from safetensors.torch import save_file

    config = json.loads((src / "config.json").read_text())
    if not glm_needs_rewrite(config):
        raise AtlasError(f"{src}: vLLM loads this GLM-4-MoE checkpoint as it is; nothing to rewrite")
    digest = _folder_digest(src)
    marker = dst / "conversion.json"
    if marker.is_file():
        done = json.loads(marker.read_text())
        if done.get("source_digest") == digest and done.get("converter") == GLM_CONVERTER_VERSION:
            return done
    tensors = _load_tensors(src)
    converted, moe_layers = glm_tensors(tensors, config)
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in converted.items()}, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(glm_config_for_vllm(config), indent=1) + "\n")
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name != "config.json":
            shutil.copyfile(path, dst / path.name)
    conversion = {
        "converter": GLM_CONVERTER_VERSION, "source_model_type": "glm4_moe", "source_digest": digest,
        "target_layout": "glm4_moe", "moe_layers": moe_layers,
        "note": "; ".join(part for part, done in (
            (f"layer(s) {moe_layers} hold their dense MLP as expert 0 (zero router, bias [0, -1, ...]: weight 1 exactly)", moe_layers),
            ("lm_head written out (vLLM's class does not tie it)", config.get("tie_word_embeddings")),
            ("a zero shared expert in every MoE layer (it had none; its output is exactly 0)", not config.get("n_shared_experts")),
        ) if done),
    }
    marker.write_text(json.dumps(conversion, indent=1) + "\n")
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
