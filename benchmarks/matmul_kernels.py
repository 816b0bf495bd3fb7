"""Which CPU matmul kernel reads a weight once for a few rows, on this machine: every kernel our loop
could use for y = x Wᵀ, per weight shape of a checkpoint and per row count (1 = a decode step,
k + 1 = a verify pass), as a ratio over the 1-row `torch.mm` of the same shape, interleaved.

    .venv/bin/python benchmarks/matmul_kernels.py [--model DIR] [--threads 1] [--rows 1,2,3,4,5] [--reps 15]

A ratio near 1 for n rows means the kernel streams the weight once and the extra rows are free, as a
verify pass needs; a ratio near n means it reads the weight once per row. Kernels:
  mm        torch.mm(x, Wᵀ) on a stored contiguous Wᵀ (our loop's 1-row path, `kernels="mm"`)
  linear    F.linear(x, W) (stock nn.Linear)
  W·xᵀ      torch.mm(W, xᵀ), the weight as the left operand
  onednn-5  oneDNN inner product on a weight reordered once, rows zero-padded to 5 (our loop's
            `kernels="rows"` path for 2+ rows)
  onednn    the same reordered weight, unpadded
  onepass   the project's own kernel (atlas/decode/onepass.cpp, `make kernels`): each weight row dotted
            with up to 4 rows at once (our loop's path for every row count where it is built)
The shapes are the checkpoint's fused projections (qkv, o, gate+up, down) and its lm_head. Timed
alone, a layer's weight stays in the CPU's caches between calls, while a real pass streams every
layer's weights from memory: only the lm_head row (larger than the caches) shows what a pass sees,
and `benchmarks/measure.py --pass-costs` times whole passes.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP (see benchmarks/measure.py)

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from atlas.checkpoints import smollm
from atlas.decode import onepass
from atlas.engines.stamp import load_average
from atlas.paths import project_path

PAD = 5
KERNELS = ("mm", "linear", "W·xᵀ", "onednn-5", "onednn", *(() if onepass.missing() else ("onepass",)))


def shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(out, in) of each fused projection a decoder layer of `config` runs, and of the lm_head."""
    d, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // heads
    kv = config.get("num_key_value_heads", heads)
    ffn = config["intermediate_size"]
    return {"qkv": ((heads + 2 * kv) * head_dim, d), "o": (d, heads * head_dim), "gate+up": (2 * ffn, d),
            "down": (d, ffn), "lm_head": (config["vocab_size"], d)}


def kernels(w: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    wt = w.t().contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, PAD - 1)

    def onednn(x: torch.Tensor, pad: bool) -> torch.Tensor:
        if pad and x.shape[0] < PAD:
            x = torch.cat([x, x.new_zeros(PAD - x.shape[0], x.shape[1])])
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    return {"mm": lambda x: torch.mm(x, wt), "linear": lambda x: F.linear(x, w), "W·xᵀ": lambda x: torch.mm(w, x.t()),
            "onednn-5": lambda x: onednn(x, True), "onednn": lambda x: onednn(x, False),
            **({"onepass": lambda x: onepass.matmul(x, w)} if "onepass" in KERNELS else {})}


def median_ms(calls: list[Callable[[], object]], reps: int) -> list[float]:
    """Median wall time of each call, the calls interleaved within every repetition."""
    for call in calls:
        call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(reps):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the real team model)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,2,3,4,5")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    model = a.model or project_path(smollm.DEFAULT_OUT_PATH)
    config = json.loads((model / "config.json").read_text())
    rows = [int(r) for r in a.rows.split(",")]
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    before = load_average()
    lines = []
    for name, (out, inp) in shapes(config).items():
        ks = kernels(torch.randn(out, inp))
        xs = {n: torch.randn(n, inp) for n in rows}
        calls = [(k, n, lambda f=f, x=xs[n]: f(x)) for n in rows for k, f in ks.items()]
        ms = dict(zip([(k, n) for k, n, _ in calls], median_ms([c for _, _, c in calls], a.reps)))
        base = ms[("mm", rows[0])]
        for n in rows:
            best = min(ks, key=lambda k: ms[(k, n)])
            lines.append(f"  {name:<8} {out:>6}x{inp:<5} {n:>4} " + " ".join(f"{ms[(k, n)] / base:>9.2f}" for k in ks)
                         + f"   {best}" + (f"   (1-row mm {base:.3f} ms)" if n == rows[0] else ""))
    print(f"{model.name}: {a.threads} thread(s), OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"{torch.backends.cpu.get_cpu_capability()}, median of {a.reps} interleaved; "
          f"load average before {before}, after {load_average()}")
    print(f"  {'weight':<8} {'shape':>12} {'rows':>4} " + " ".join(f"{k:>9}" for k in KERNELS) + "   fastest")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
