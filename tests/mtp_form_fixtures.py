"""Test-only repos for every MTP form (issue 37), each SYNTHETIC: shaped from the keys and tensor
names its link documents, never a real model's files, and never in the demo mirror. Each form has at
least two; the expected form and the key facts sit beside each repo.

GGUF files are built with tests/gguf_writer.py; safetensors checkpoints are given as weight maps
(model.safetensors.index.json), the file the crawl reads for tensor names."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gguf_writer import STRING, Model, mtp_model

ORG = "synthetic"
# bases outside the crawled scope: served by the local hub, never listed (read on demand, issue 63)
UPSTREAM = "synthetic-upstream"


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


# ---- issue 63: original quantized releases, conversions of bases outside the snapshot, heads as files
# of their own, speculative drafters that are not MTP, and bases that must exist. Each SYNTHETIC, shaped
# from the page its link names.
GGUF_NOTES = "https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (general.base_model.* keys)"
PIN = "0123456789abcdef0123456789abcdef01234567"  # a base commit a sidecar says it matches
MISSING_BASE = f"{UPSTREAM}/no-such-base"  # served by no hub


def based_gguf(model: Model, base: str) -> bytes:
    """A GGUF file whose header names the Hub repo it was converted from (general.base_model.0.repo_url)."""
    model.kvs += [("general.base_model.count", 4, 1), ("general.base_model.0.repo_url", STRING, f"https://huggingface.co/{base}")]
    return model.file()


def upstream() -> list[Repo]:
    """Bases outside the crawled org, each with the form a lookup must read."""
    u = UPSTREAM
    return [
        Repo(f"{u}/GLM-4.5-Air-base", glm_ckpt(), "in_checkpoint", "https://huggingface.co/zai-org/GLM-4.5-Air"),
        Repo(f"{u}/Qwen3.5-4B-base", {"config.json": _config(QWEN35),
                                      "model.safetensors.index.json": index(QWEN35_TRUNK + QWEN35_MTP)},
             "in_checkpoint", "https://huggingface.co/Qwen/Qwen3.5-4B (mtp.* beside the trunk)"),
        Repo(f"{u}/Qwen3-8B-base", {"config.json": _config({"model_type": "qwen3", "num_hidden_layers": 2})}, "none",
             "https://huggingface.co/Qwen/Qwen3-8B"),
    ]


def round_two() -> list[Repo]:
    o, u = ORG, UPSTREAM
    mlx = "https://github.com/ml-explore/mlx-lm/issues/1543 (the MTP head saved as mtp.safetensors beside the shards)"
    minimax = {"model_type": "minimax_m2", "architectures": ["MiniMaxM2ForCausalLM"], "num_hidden_layers": 2,
               "use_mtp": True, "num_mtp_modules": 3, "mtp_transformer_layers": 1}
    return [
        # ---- an original release in FP8: its own quantization config, no base named: declared but missing
        Repo(f"{o}/MiniMax-M2.7-shaped-FP8", {"config.json": _config({**minimax, "quantization_config": {"quant_method": "fp8"}}),
             "model.safetensors.index.json": index(TRUNK)}, "declared_missing",
             "https://huggingface.co/MiniMaxAI/MiniMax-M2.7 (config.json: quant_method fp8, num_mtp_modules 3)"),
        Repo(f"{o}/Qwen3.5-2B-shaped-FP8", {"config.json": _config({**QWEN35, "quantization_config": {"quant_method": "fp8"}}),
             "model.safetensors.index.json": index(QWEN35_TRUNK)}, "declared_missing",
             "https://huggingface.co/Qwen/Qwen3.5-27B-FP8 (a lab's own FP8 release of its own base)",
             {"base_model": f"{o}/Qwen3.5-0.8B-shaped"}),  # its own org's base: not another author's copy
        # ---- conversions whose base is outside the snapshot: judged by the base read on demand
        Repo(f"{o}/GLM-4.5-Air-base-trunk-GGUF", {"GLM-4.5-Air-Q4_0.gguf": based_gguf(
            mtp_model(head=False, nextn=None), f"{u}/GLM-4.5-Air-base")}, "stripped", GGUF_NOTES),
        Repo(f"{o}/Qwen3.5-4B-base-NVFP4", {"config.json": _config({"model_type": "qwen3_5", "text_config": {
            "num_hidden_layers": 2}, "quantization_config": {"quant_method": "modelopt"}}),
            "model.safetensors.index.json": index(QWEN35_TRUNK)}, "stripped",
            "https://huggingface.co/nvidia/DeepSeek-V3.2-NVFP4 (another author's quantization; card base_model)",
            {"base_model": f"{u}/Qwen3.5-4B-base"}),
        Repo(f"{o}/Qwen3.5-4B-base-FP8-by-another", {"config.json": _config({**QWEN35, "quantization_config": {"quant_method": "fp8"}}),
             "model.safetensors.index.json": index(QWEN35_TRUNK)}, "stripped",
             "https://huggingface.co/nvidia/MiniMax-M2.5-NVFP4 (another author's quantization that keeps the MTP key)",
             {"base_model": f"{u}/Qwen3.5-4B-base"}),
        # ---- the head as a file of its own beside trunk files: in repo, separate file
        Repo(f"{o}/GLM-4.5-Air-shaped-mixed-GGUF", {"GLM-4.5-Air-MTP-Q8_0.gguf": gguf(mtp_model(trunk=False)),
                                                     "GLM-4.5-Air-Q4_K_M.gguf": gguf(mtp_model(head=False)),
                                                     "GLM-4.5-Air-Q8_0.gguf": gguf(mtp_model(head=False))},
             "in_repo_separate", "https://huggingface.co/ggml-org/Qwen3.6-35B-A3B-MTP-GGUF (trunk quants and the MTP file)"),
        Repo(f"{o}/Qwen3.5-2B-shaped-MLX-separate-head", {
            "config.json": _config(QWEN35), "model.safetensors.index.json": index(QWEN35_TRUNK),
            "mtp.safetensors": safetensors_file({n: ("BF16", [8, 8]) for n in QWEN35_MTP})}, "in_repo_separate", mlx),
        # ---- speculative drafters that are not MTP, each linked to its target
        Repo(f"{o}/EAGLE3-Llama-shaped", {"config.json": _config({
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1, "draft_vocab_size": 32})},
            "separate_drafter", "https://github.com/sgl-project/SpecForge (configs/*-eagle3.json: LlamaForCausalLMEagle3, "
            "draft_vocab_size)", {"base_model": f"{o}/Llama-shaped"}),
        Repo(f"{o}/Llama-shaped-speculator-eagle3", {"config.json": _config({
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "speculators_config": {"verifier": {"name_or_path": f"{o}/Llama-shaped"}}})},
            "separate_drafter", "https://github.com/vllm-project/speculators (speculators_config.verifier.name_or_path)"),
        Repo(f"{o}/Qwen3-8B-shaped-DFlash-b16", {"config.json": _config({
            "architectures": ["DFlashDraftModel"], "block_size": 16, "num_hidden_layers": 1,
            "dflash_config": {"mask_token_id": 7, "target_layer_ids": [0, 1]}})},
            "separate_drafter", "https://github.com/z-lab/dflash (z-lab/Qwen3-8B-DFlash-b16: DFlashDraftModel)",
            {"base_model": f"{u}/Qwen3-8B-base", "base_model_revision": PIN}),
        Repo(f"{o}/DeepSeek-V4-shaped-DSpark-drafter", {"config.json": _config({
            "model_type": "deepseek_v4", "num_hidden_layers": 2, "dspark_block_size": 5, "dspark_target_layer_ids": [0, 1]}),
            "model.safetensors.index.json": index(["mtp.main_proj.weight", "mtp.markov_head.weight", "mtp.confidence_head.weight"])},
            "separate_drafter", "https://github.com/vllm-project/vllm/pull/41834 (DSpark stages under mtp.*)",
            {"base_model": f"{o}/DeepSeek-V4-Flash-0731-shaped"}),
        # ---- a sidecar and a drafter whose named base does not exist; a sidecar pinned to its base's commit
        Repo(f"{o}/qwen3-5-orphan-mtp", {"config.json": _config({"model_type": "qwen3_5_mtp", "block_size": 2})},
             "mtp_sidecar", "https://huggingface.co/FoxlightAI/qwen3-5-0-8b-base-mtp", {"base_model": MISSING_BASE}),
        Repo(f"{o}/orphan-DFlash", {"config.json": _config({"architectures": ["DFlashDraftModel"], "dflash_config": {}})},
             "separate_drafter", "https://github.com/z-lab/dflash", {"base_model": MISSING_BASE}),
        Repo(f"{o}/qwen3-5-4b-pinned-mtp", {"config.json": _config({"model_type": "qwen3_5_mtp", "block_size": 4})},
             "mtp_sidecar", "https://huggingface.co/guru87/Qwen3.5-2B-MTP",
             {"base_model": f"{u}/Qwen3.5-4B-base", "base_model_revision": PIN}),
    ]


EVIL_GGUF = f"{ORG}/evil-GGUF"  # one truncated header and one good file: the error names the file, the good one is read


def evil_repo() -> Repo:
    good = mtp_model(head_type=1).file()
    return Repo(EVIL_GGUF, {"a-truncated.gguf": good[:200], "b-good.gguf": good}, "in_checkpoint", "(hostile test file)")
