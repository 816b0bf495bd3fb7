"""Test-only repos for every MTP form (issue 37), each SYNTHETIC: shaped from the keys and tensor
names its link documents, never a real model's files, and never in the demo mirror. Each form has at
least two; the expected form and the key facts sit beside each repo.

GGUF files are built with tests/gguf_writer.py; safetensors checkpoints are given as weight maps
(model.safetensors.index.json), the file the crawl reads for tensor names."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gguf_writer import Model, mtp_model

ORG = "synthetic"


def index(names: list[str], shard_of: dict[str, str] | None = None, total_size: int = 0) -> bytes:
    shard_of = shard_of or {}
    return json.dumps({"metadata": {"total_size": total_size},
                       "weight_map": {n: shard_of.get(n, "model-00001-of-00002.safetensors") for n in names}}).encode()


def safetensors_file(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors file (https://github.com/huggingface/safetensors#format): an 8-byte header
    length, the JSON header with each tensor's dtype, shape and data offsets, zero-filled data."""
    size = {"BF16": 2, "F32": 4, "F8_E4M3": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + b"\0" * offset


# GLM-shaped head in its own shard: eh_proj 128x64 and q_proj 64x64 in BF16, three norms in F32
GLM_HEAD = {"model.layers.2.eh_proj.weight": ("BF16", [64, 128]), "model.layers.2.enorm.weight": ("F32", [64]),
            "model.layers.2.hnorm.weight": ("F32", [64]), "model.layers.2.shared_head.norm.weight": ("F32", [64]),
            "model.layers.2.self_attn.q_proj.weight": ("BF16", [64, 64])}
GLM_HEAD_BYTES = (64 * 128 + 64 * 64) * 2 + 3 * 64 * 4
GLM_TOTAL = 100_000  # the index's metadata.total_size


def layers(prefix: str, idx: range, parts: tuple[str, ...] = ("self_attn.q_proj", "mlp.down_proj", "input_layernorm")) -> list[str]:
    return [f"{prefix}layers.{i}.{p}.weight" for i in idx for p in parts]


TRUNK = ["model.embed_tokens.weight", *layers("model.", range(2)), "model.norm.weight", "lm_head.weight"]
GLM = {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
       "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16"}
QWEN35 = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
          "text_config": {"num_hidden_layers": 2, "mtp_num_hidden_layers": 1, "torch_dtype": "bfloat16"}}
QWEN35_TRUNK = ["model.language_model.embed_tokens.weight", *layers("model.language_model.", range(2)), "lm_head.weight"]
QWEN35_MTP = ["mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.layers.0.self_attn.q_proj.weight"]


@dataclass
class Repo:
    repo_id: str
    files: dict[str, bytes]
    form: str  # expected mtp_form (after the store's cross-repo rule)
    link: str  # the public page that documents the keys / layout this repo is shaped from
    meta: dict[str, str] = field(default_factory=dict)  # HUB_METADATA.toml entries (base_model, relation)


def _config(body: dict) -> bytes:
    return json.dumps(body).encode()


def glm_ckpt() -> dict[str, bytes]:
    shard = "model-00002-of-00002.safetensors"
    return {"config.json": _config(GLM),
            "model.safetensors.index.json": index(TRUNK + list(GLM_HEAD), {n: shard for n in GLM_HEAD}, GLM_TOTAL),
            shard: safetensors_file(GLM_HEAD)}


def step35_ckpt() -> dict[str, bytes]:
    # three MTP layers after the trunk, each with its own shared_head.head (vLLM PR #38494)
    mtp = [f"model.layers.{i}.{p}.weight" for i in (2, 3, 4)
           for p in ("eh_proj", "enorm", "hnorm", "shared_head.head", "shared_head.norm", "self_attn.q_proj")]
    body = {"model_type": "step3p5", "architectures": ["Step3p5ForCausalLM"], "num_hidden_layers": 2,
            "num_nextn_predict_layers": 3, "torch_dtype": "bfloat16"}
    return {"config.json": _config(body), "model.safetensors.index.json": index(TRUNK + mtp)}


def gguf(model: Model) -> bytes:
    return model.file()


def repos() -> list[Repo]:
    o = ORG
    notes = "https://github.com/ggml-org/llama.cpp (convert_hf_to_gguf.py --mtp / --no-mtp; PR #26534)"
    return [
        # ---- in the checkpoint
        Repo(f"{o}/GLM-4.5-Air-shaped", glm_ckpt(), "in_checkpoint", "https://huggingface.co/zai-org/GLM-4.5-Air"),
        Repo(f"{o}/Step-3.5-shaped", step35_ckpt(), "in_checkpoint", "https://github.com/vllm-project/vllm/pull/38494"),
        Repo(f"{o}/GLM-4.5-Air-shaped-combined-GGUF", {"GLM-4.5-Air-Q4_K_M.gguf": gguf(mtp_model(head_type=8))},
             "in_checkpoint", notes, {"base_model": f"{o}/GLM-4.5-Air-shaped", "base_relation": "quantized"}),
        # ---- declared but missing
        Repo(f"{o}/MiniMax-M2.5-shaped", {"config.json": _config({
            "model_type": "minimax_m2", "architectures": ["MiniMaxM2ForCausalLM"], "num_hidden_layers": 2,
            "use_mtp": True, "num_mtp_modules": 3, "mtp_transformer_layers": 1}),
            "model.safetensors.index.json": index(TRUNK)}, "declared_missing", "https://huggingface.co/MiniMaxAI/MiniMax-M2.5"),
        Repo(f"{o}/Qwen3.5-2B-PARO-shaped", {"config.json": _config(QWEN35), "model.safetensors.index.json": index(QWEN35_TRUNK)},
             "declared_missing", "https://huggingface.co/z-lab/Qwen3.5-2B-PARO"),
        # ---- stripped by a conversion
        Repo(f"{o}/Qwen3.5-0.8B-shaped-MLX-4bit", {"config.json": _config({**QWEN35, "quantization": {"group_size": 64, "bits": 4}}),
             "model.safetensors.index.json": index(QWEN35_TRUNK)}, "stripped",
             "https://huggingface.co/mlx-community (MLX conversions drop mtp.*; research notes field-2026 §2)",
             {"base_model": f"{o}/Qwen3.5-0.8B-shaped", "base_relation": "quantized"}),
        Repo(f"{o}/Qwen3.5-2B-shaped-MLX-bf16", {"config.json": _config(QWEN35), "model.safetensors.index.json": index(QWEN35_TRUNK)},
             "stripped", "https://huggingface.co/mlx-community (an MLX bf16 conversion: no quantization key; the Hub's "
             "library_name says mlx)", {"library_name": "mlx"}),
        Repo(f"{o}/GLM-4.5-Air-shaped-GGUF", {"GLM-4.5-Air-Q4_K_M.gguf": gguf(mtp_model(head=False, nextn=None))},
             "stripped", notes, {"base_model": f"{o}/GLM-4.5-Air-shaped", "base_relation": "quantized"}),
        Repo(f"{o}/Qwen3.6-shaped-trunk-GGUF", {"qwen-Q8_0.gguf": gguf(mtp_model(head=False, arch="qwen35", nextn=1))},
             "stripped", notes),
        # ---- MTP-only sidecars
        Repo(f"{o}/Qwen3.5-0.8B-shaped", {"config.json": _config(QWEN35)}, "declared_unread", "https://huggingface.co/Qwen/Qwen3.5-0.8B"),
        Repo(f"{o}/qwen3-5-0-8b-shaped-mtp", {"config.json": _config({
            "model_type": "qwen3_5_mtp", "architectures": ["Qwen3_5MTPForCausalLM"], "block_size": 4, "num_hidden_layers": 1}),
            "model.safetensors.index.json": index(QWEN35_MTP)}, "mtp_sidecar",
            "https://huggingface.co/FoxlightAI/qwen3-5-0-8b-base-mtp", {"base_model": f"{o}/Qwen3.5-0.8B-shaped"}),
        # a sidecar whose card claims a base that is no Hub repo id: a sidecar still, its base unknown
        Repo(f"{o}/evil-sidecar-mtp", {"config.json": _config({"model_type": "qwen3_5_mtp", "block_size": 2})},
             "mtp_sidecar", "(hostile test card)", {"base_model": "<img src=x onerror=alert(1)>/x"}),
        Repo(f"{o}/GLM-4.5-Air-shaped-MTP-GGUF", {"GLM-4.5-Air-MTP-Q8_0.gguf": gguf(mtp_model(trunk=False, own_head=True))},
             "mtp_sidecar", "https://huggingface.co/jacek2024/GLM-4.5-Air-MTP-GGUF"),
        # ---- separate drafters
        Repo(f"{o}/gemma-4-12B-it", {"config.json": _config({"model_type": "gemma4", "num_hidden_layers": 4})}, "none",
             "https://huggingface.co/google/gemma-4-12B-it"),
        Repo(f"{o}/gemma-4-12B-it-assistant", {"config.json": _config({
            "model_type": "gemma4_unified_assistant", "num_hidden_layers": 4, "hidden_size": 1024})},
            "separate_drafter", "https://huggingface.co/google/gemma-4-12B-it-assistant"),
        Repo(f"{o}/gemma-4-E2B-it-assistant", {"config.json": _config({
            "model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"], "num_hidden_layers": 4})},
            "separate_drafter", "https://huggingface.co/google/gemma-4-E2B-it-assistant"),
        # ---- block drafters in the checkpoint (not MTP)
        Repo(f"{o}/DeepSeek-V4-Flash-0731-shaped", {"config.json": _config({
            "model_type": "deepseek_v4", "num_hidden_layers": 2, "dspark_block_size": 5, "dspark_target_layer_ids": [0, 1]})},
            "block_drafter", "https://github.com/vllm-project/vllm/pull/41834"),
        Repo(f"{o}/DeepSeek-V4.1-shaped", {"config.json": _config({
            "model_type": "deepseek_v4", "text_config": {"num_hidden_layers": 2, "dspark_block_size": 7}})},
            "block_drafter", "https://github.com/vllm-project/vllm/pull/41834"),
        # ---- none
        Repo(f"{o}/Llama-shaped", {"config.json": _config({"model_type": "llama", "num_hidden_layers": 2}),
                                   "model.safetensors.index.json": index(TRUNK)}, "none", "https://huggingface.co/meta-llama/Llama-3.1-8B"),
        Repo(f"{o}/Llama-shaped-GGUF", {"llama-Q4_0.gguf": gguf(mtp_model(head=False, arch="llama", nextn=None))}, "none", notes),
    ]


EVIL_GGUF = f"{ORG}/evil-GGUF"  # one truncated header and one good file: the error names the file, the good one is read


def evil_repo() -> Repo:
    good = mtp_model(head_type=1).file()
    return Repo(EVIL_GGUF, {"a-truncated.gguf": good[:200], "b-good.gguf": good}, "in_checkpoint", "(hostile test file)")
