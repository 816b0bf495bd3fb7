"""Does llama.cpp's verify pass get cheaper, in plain steps, as the model grows? Its pass costs
(llama-bench pp1 and pp(k+1), as every llama.cpp record times them: atlas.engines.llamacpp.bench)
for published model shapes at random weights, beside the real team model's own GGUF, in one run.

A CPU decode step of a small model is bound by arithmetic rather than by reading its weights, so a
2-row pass costs nearly two steps and MTP cannot pay however good the head; a larger model's step
is bound by memory, and extra rows come nearly free. Timing does not depend on the weights' values,
so each shape is written as an F16 GGUF of random weights (the config's own dimensions, a
placeholder vocabulary of its size, tied or untied as the config says), quantized with the build's
llama-quantize, timed, and kept in a cache outside the clone. No acceptance can come from these
files: only pass costs. The configs are verbatim public ones from data/hub-mirror.

    .venv/bin/python benchmarks/llamacpp_size_scaling.py [--configs data/hub-mirror/Qwen/Qwen3-0.6B,...]
        [--quant Q4_0] [--threads 1] [--depth 86] [--cache ~/.cache/mtp-atlas/size-scaling]

Needs `make llamacpp` (and `make real-model-gguf` for the real model's row). The last column is the
k = 1 acceptance even a free draft would need to break even (verify(1) - 1 plain steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from atlas.checkpoints.smollm import DEFAULT_OUT_PATH
from atlas.engines.llamacpp import bench as llamacpp_bench, engine as llamacpp_engine
from atlas.engines.llamacpp.build import Build, find_build
from atlas.engines.llamacpp.gguf import read_manifest, source_of
from atlas.paths import project_path

SHAPES = "data/hub-mirror/Qwen/Qwen3-0.6B,data/hub-mirror/Qwen/Qwen3-1.7B"


def write_random_qwen3(config: dict, path: Path, gguf_py: Path) -> int:
    """An F16 qwen3 GGUF with the config's dimensions and N(0, 0.02) weights; returns its parameter
    count. Norm weights are ones, in F32 as the converter writes them."""
    sys.path.insert(0, str(gguf_py))
    import gguf

    h, n_layer, ffn = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    n_head, n_kv, vocab = config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]
    head = config.get("head_dim") or h // n_head
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_context_length(4096)
    w.add_embedding_length(h)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_rope_freq_base(float(config.get("rope_theta", 1e6)))
    w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # a placeholder vocabulary of the config's size: llama-bench feeds random token ids
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"<{i}>" for i in range(vocab)])
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_token_merges(["< >"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    tensors = {"token_embd.weight": weight(vocab, h), "output_norm.weight": np.ones(h, np.float32)}
    if not config.get("tie_word_embeddings", False):
        tensors["output.weight"] = weight(vocab, h)
    for i in range(n_layer):
        tensors |= {
            f"blk.{i}.attn_norm.weight": np.ones(h, np.float32), f"blk.{i}.ffn_norm.weight": np.ones(h, np.float32),
            f"blk.{i}.attn_q_norm.weight": np.ones(head, np.float32), f"blk.{i}.attn_k_norm.weight": np.ones(head, np.float32),
            f"blk.{i}.attn_q.weight": weight(n_head * head, h), f"blk.{i}.attn_k.weight": weight(n_kv * head, h),
            f"blk.{i}.attn_v.weight": weight(n_kv * head, h), f"blk.{i}.attn_output.weight": weight(h, n_head * head),
            f"blk.{i}.ffn_gate.weight": weight(ffn, h), f"blk.{i}.ffn_up.weight": weight(ffn, h),
            f"blk.{i}.ffn_down.weight": weight(h, ffn),
        }
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sum(a.size for a in tensors.values())


def quantized(build: Build, config_dir: Path, quant: str, cache: Path) -> tuple[Path, int]:
    """The shape's GGUF at `quant`, written once into the cache (the F16 step removed after)."""
    config = json.loads((config_dir / "config.json").read_text())
    name = f"{config_dir.parent.name}-{config_dir.name}-random"
    out, f16 = cache / f"{name}-{quant}.gguf", cache / f"{name}-F16.gguf"
    params_file = cache / f"{name}.params"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        params_file.write_text(str(write_random_qwen3(config, f16, source_of(build) / "gguf-py")))
        subprocess.run([str(build.binary("llama-quantize")), str(f16), str(out), quant, "2"], check=True,
                       capture_output=True)
        f16.unlink()
    return out, int(params_file.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=SHAPES, help="comma-separated folders holding a qwen3 config.json")
    ap.add_argument("--model", type=Path, default=project_path(DEFAULT_OUT_PATH), help="the real model, for its own row")
    ap.add_argument("--quant", default="Q4_0")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--depth", type=int, default=86)  # the records' median context depth
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/mtp-atlas/size-scaling")
    args = ap.parse_args()
    build = find_build()
    rows: list[tuple[str, Path, int | None]] = []
    folder = llamacpp_engine.gguf_set_dir(args.model)
    if folder.is_dir():
        rows.append((f"{args.model.name} (real weights)", folder / read_manifest(folder).find("combined", args.quant, None).file,
                     None))
    for c in args.configs.split(","):
        gguf, params = quantized(build, project_path(c), args.quant, args.cache)
        rows.append((f"{Path(c).name} shape, random weights", gguf, params))
    print(f"llama.cpp b{build.version}, {args.quant}, {args.threads} thread(s), repacking on, depth {args.depth}; "
          f"load before {os.getloadavg()}")
    print(f"{'model':<44} {'params':>7} {'GiB':>5} {'plain ms':>9} {'GB/s':>5} {'k=1':>5} {'k=2':>5} {'k=3':>5} {'a needed':>8}")
    for name, gguf, params in rows:
        plain, verify = llamacpp_bench.time_passes(build, gguf, args.threads, True, args.depth, [1, 2, 3])
        size = gguf.stat().st_size
        steps = {k: s / plain for k, s in verify.items()}
        print(f"{name:<44} {(f'{params / 1e9:.2f}B' if params else '—'):>7} {size / 2**30:>5.2f} {plain * 1e3:>9.2f} "
              f"{size / plain / 1e9:>5.1f} {steps[1]:>5.2f} {steps[2]:>5.2f} {steps[3]:>5.2f} {steps[1] - 1:>8.2f}")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
