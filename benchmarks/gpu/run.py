"""The GPU run, one command on the lent machine (benchmarks/gpu/run.sh installs the wheels first):

1. the team model through our loop on the device, fp32 then bf16 (`atlas measure run`, no
   transformers peer: the machine's transformers may predate use_mtp), each record into $OUT;
   whether greedy output stayed token-identical to plain decoding in bf16 is reported as found
   (transformers is the shipped 5.24: the machine's 5.17 cannot load the team model's MTP layer);
2. the pass-cost table (benchmarks/gpu/pass_costs.py) into $OUT;
3. summary.md in $OUT: versions, the identity verdicts, the speed-up cells, the pass-cost table.

Every step has its own time limit and a failure is written into the summary, so what finished
still comes back. At most 5 files land in $OUT (the machine returns 8).

    python benchmarks/gpu/run.py --out "$OUT" [--device cuda] [--rehearsal]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEAM = ROOT / "data" / "hub-mirror" / "mtp-atlas" / "byte-mtp-8l"
# Sized so both dtypes and the table fit in one 8-minute command on a GPU.
MEASURE = ["--temperatures", "0,1", "--draft-tokens", "1,2,3", "--max-new-tokens", "64", "--repeats", "3",
           "--prompts-per-workload", "1"]
LIMITS = {"team": 120, "costs": 220}  # seconds per step: 2 x 120 + 220 + the install stays under 8 minutes
# The CPU rehearsal checks the path, not the figures: one workload, short runs, shrunk exemplars.
REHEARSAL = ["--workloads", "code", "--temperatures", "0", "--draft-tokens", "1", "--max-new-tokens", "16",
             "--repeats", "1", "--prompts-per-workload", "1"]


def step(name: str, argv: list[str], timeout: float, log) -> tuple[bool, str]:
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        log.write(f"## {name}: timed out after {timeout:.0f} s\n")
        return False, f"timed out after {timeout:.0f} s"
    log.write(f"## {name} ({time.monotonic() - t0:.0f} s, exit {done.returncode})\n{done.stdout[-6000:]}\n{done.stderr[-4000:]}\n")
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
    return done.returncode == 0, "ok" if done.returncode == 0 else tail[0][:300]


def identity_lines(record_path: Path) -> list[str]:
    """Per workload and k at T = 0: did our loop's greedy output equal plain decoding?"""
    rec = json.loads(record_path.read_text())
    lines = []
    for c in rec["cells"]:
        if c["engine"] == "atlas" and c["temperature"] == 0:
            d = c["derived"]
            lines.append(f"| {c['workload']} | {c['draft_tokens']} | {'identical' if d['greedy_lossless'] else 'DIFFERS'} | "
                         f"{d['acceptance_rate']:.3f} | {d['speedup']:.2f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rehearsal", action="store_true", help="CPU rehearsal: tiny settings, shrunk exemplars")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    import torch
    import transformers

    summary = [f"# GPU run {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", "",
               f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
               f"{transformers.__version__}, device {a.device}"
               + (f" ({torch.cuda.get_device_name(0)})" if a.device.startswith("cuda") and torch.cuda.is_available() else ""),
               "" if not a.rehearsal else "\n**CPU rehearsal**: the path is checked, the figures mean nothing.\n"]
    status = []
    with open(a.out / "run.log", "w") as log:
        for dtype in ("float32", "bfloat16"):
            folder = a.out / f"team-{dtype}"
            ok, why = step(f"team model, our loop, {dtype}", [
                sys.executable, "-m", "atlas", "measure", "run", "--model", str(TEAM), "--device", a.device, "--dtype", dtype,
                "--no-peer", "--out", str(folder), *(REHEARSAL if a.rehearsal else MEASURE)], LIMITS["team"] * (4 if a.rehearsal else 1), log)
            records = sorted(folder.glob("*.json"))
            # an fp32 run whose greedy output differs exits 1 but keeps its record: report it all the same
            status.append(f"team model {dtype}: {why}")
            if records:
                flat = a.out / f"team-{dtype}.json"
                records[-1].rename(flat)
                folder.rmdir()
                summary += [f"## Team model, our loop, {dtype} ({flat.name})", "",
                            "| workload | k | greedy output vs plain | acceptance | speed-up over plain |", "|---|---|---|---|---|",
                            *identity_lines(flat), ""]
        costs = a.out / "passcosts.json"
        ok, why = step("pass-cost table", [
            sys.executable, str(ROOT / "benchmarks" / "gpu" / "pass_costs.py"), "--device", a.device, "--out", str(costs),
            "--budget-seconds", str(LIMITS["costs"] - 70),
            *(["--shrink", "16", "--batches", "1,4", "--repeats", "2", "--context", "32", "--dtype", "float32"] if a.rehearsal else [])],
            LIMITS["costs"] * (3 if a.rehearsal else 1), log)
        status.append(f"pass-cost table: {why}")
        if costs.exists():
            sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
            from pass_costs import format_table

            summary += ["## Pass cost (hardware cost, not a speed-up)", "", "```", format_table(json.loads(costs.read_text())), "```", ""]
    summary += ["## Steps", "", *(f"- {s}" for s in status), ""]
    (a.out / "summary.md").write_text("\n".join(summary))
    print("\n".join(summary))
    return 0 if all(s.endswith(": ok") for s in status) else 1


if __name__ == "__main__":
    sys.exit(main())
