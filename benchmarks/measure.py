"""Plain decoding vs our MTP self-speculative loop vs transformers' generate(use_mtp=True), side
by side per workload, on the bundled team model (or --model). One interleaved run of the real
runner; the record goes to a scratch folder, not evidence/.

    .venv/bin/python benchmarks/measure.py [--model PATH] [--repeats 5] [--max-new-tokens 128]

Targets on a 2-core CPU: speed-up > 1 at T=0 and T=1, efficiency >= 0.95 of the ideal on the best
workload, our speed-up above transformers' use_mtp. Timings on shared cores are noisy: every figure
is a median over interleaved repeats, with the min-max of the speed-up in brackets.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from atlas.measure import runner as measure
from atlas.measure.records import Cell


def row(label: str, tps: float, c: Cell | None, plain_tps: float | None = None) -> str:
    if c is None:
        return f"  {label:<16} {tps:8.1f}"
    d = c.derived
    acc = "-" if d.acceptance_rate is None else f"{d.acceptance_rate:.3f}"
    length = "-" if d.mean_accepted_length is None else f"{d.mean_accepted_length:.2f}"
    ideal = "-" if d.ideal_speedup is None else f"{d.ideal_speedup:.2f}"
    eff = "-" if d.efficiency is None else f"{d.efficiency:.2f}"
    vs_ours = "" if plain_tps is None else f"   ({tps / plain_tps:.2f}x our plain)"
    return (f"  {label:<16} {tps:8.1f} {acc:>6} {length:>6} {d.speedup:6.2f} ({d.speedup_lo:.2f}-{d.speedup_hi:.2f})"
            f" {ideal:>6} {eff:>5}  {'on' if c.gate_enabled else 'off'}{vs_ours}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(measure.DEFAULT_MODEL))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompts-per-workload", type=int, default=2)
    parser.add_argument("--draft-tokens", default="1,2,3")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=None, help="keep the record in this folder (default: a scratch folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        options = measure.Options(
            model=args.model, device=args.device, dtype=args.dtype, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
            prompts_per_workload=args.prompts_per_workload, draft_tokens=tuple(int(k) for k in args.draft_tokens.split(",")),
            out=Path(args.out or scratch), command=shlex.join(["benchmarks/measure.py", *sys.argv[1:]]),
        )
        record, path = measure.run(options, log=lambda line: print(line, flush=True))
    if args.out:
        print(f"record: {path}")
    costs = record.pass_costs
    print(f"\n{record.model_id} on {record.hardware.text}, torch threads {record.hardware.torch_threads}, "
          f"{record.settings.max_new_tokens} new tokens x {record.settings.prompts_per_workload} prompts x {record.settings.repeats} repeats")
    print(f"pass costs (median): plain 1-row step {costs.plain * 1e3:.2f} ms; "
          + "; ".join(f"verify {k + 1} rows {v * 1e3:.2f} ms ({v / costs.plain:.2f}x)" for k, v in costs.verify.items())
          + f"; MTP draft step {costs.draft * 1e3:.2f} ms ({costs.draft / costs.plain:.2f}x)")
    best: dict[float, tuple[float, str]] = {}
    ours_beats_hf: list[bool] = []
    throughput: list[float] = []  # our best MTP tok/s over transformers use_mtp tok/s, per cell
    for t in record.settings.temperatures:
        print(f"\nT = {t:g}   {'engine':<16} {'tok/s':>8} {'accept':>6} {'length':>6} {'speedup (min-max)':>19} {'ideal':>6} {'eff':>5}  gate")
        for w in record.settings.workloads:
            cells = [c for c in record.cells if c.workload == w and c.temperature == t]
            ours = [c for c in cells if c.engine == "atlas"]
            hf = next((c for c in cells if c.engine != "atlas"), None)
            plain_tps = ours[0].derived.baseline_tokens_per_second
            print(f"{w}")
            print(row("plain (ours)", plain_tps, None))
            for c in ours:
                print(row(f"atlas k={c.draft_tokens}", c.derived.tokens_per_second, c))
                if c.derived.efficiency is not None and c.derived.efficiency > best.get(t, (0.0, ""))[0]:
                    best[t] = (c.derived.efficiency, f"{w} k={c.draft_tokens}")
            if hf is not None:
                print(row("hf generate", hf.derived.baseline_tokens_per_second, None))
                print(row("hf use_mtp", hf.derived.tokens_per_second, hf, plain_tps))
                top = max(ours, key=lambda c: c.derived.speedup)
                ours_beats_hf.append(top.derived.speedup > hf.derived.speedup)
                throughput.append(top.derived.tokens_per_second / hf.derived.tokens_per_second)
    print("\nTargets")
    for t in record.settings.temperatures:
        top = max((c for c in record.cells if c.engine == "atlas" and c.temperature == t), key=lambda c: c.derived.speedup)
        print(f"  T={t:g}: best speed-up {top.derived.speedup:.2f}x ({top.workload}, k={top.draft_tokens}) "
              f"{'> 1' if top.derived.speedup > 1 else 'NOT > 1'}; best efficiency {best[t][0]:.2f} ({best[t][1]})")
    if ours_beats_hf:
        print(f"  our best speed-up above transformers use_mtp on {sum(ours_beats_hf)}/{len(ours_beats_hf)} workload x temperature cells "
              "(each against its own plain baseline)")
        print(f"  our MTP tokens/s over transformers use_mtp tokens/s: median {statistics.median(throughput):.2f}x "
              f"(min {min(throughput):.2f}x)")


if __name__ == "__main__":
    main()
