"""Which GGUF type, threads and repacking give llama.cpp's MTP the cheapest round: the verify pass
of draft length k (a (k+1)-row forward) in plain steps (a 1-row forward), timed by llama-bench as
every llama.cpp record times it (atlas.engines.llamacpp.bench), over a grid of the checkpoint's
GGUF set, in one run. Beside each row: the k = 1 acceptance that round needs to break even, with the
draft cost given (a record's measured draft, in plain steps; the draft's own cost is not timed here).

    .venv/bin/python benchmarks/llamacpp_pass_costs.py [--model data/real-models/smollm2-135m-mtp]
        [--quants f16,Q8_0,Q4_1,Q4_0] [--threads 1,2] [--repack 1,0] [--depth 86] [--draft 0.15]

Needs `make llamacpp real-model-gguf`. The load average before and after is printed; nothing is
written to evidence/.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from atlas.checkpoints.smollm import DEFAULT_OUT_PATH
from atlas.engines.llamacpp import bench as llamacpp_bench, engine as llamacpp_engine
from atlas.engines.llamacpp.build import find_build
from atlas.engines.llamacpp.gguf import read_manifest
from atlas.paths import project_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=project_path(DEFAULT_OUT_PATH))
    ap.add_argument("--quants", default="f16,Q8_0,Q4_1,Q4_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repack", default="1,0")
    ap.add_argument("--depth", type=int, default=86)  # the records' median context depth (48 new tokens after the prompt)
    ap.add_argument("--draft", type=float, default=0.15, help="draft cost in plain steps, for the break-even column")
    args = ap.parse_args()
    build = find_build()
    folder = llamacpp_engine.gguf_set_dir(args.model)
    manifest = read_manifest(folder)
    print(f"llama.cpp b{build.version}; {folder}; depth {args.depth}; load before {os.getloadavg()}")
    print(f"{'type':<6} {'threads':>7} {'repack':>6} {'plain ms':>9} {'k=1':>6} {'k=2':>6} {'k=3':>6} {'break-even a (k=1)':>19}")
    for quant in args.quants.split(","):
        gguf = folder / manifest.find("combined", quant, None).file
        for threads in map(int, args.threads.split(",")):
            for repack in (r == "1" for r in args.repack.split(",")):
                plain, verify = llamacpp_bench.time_passes(build, gguf, threads, repack, args.depth, [1, 2, 3])
                steps = {k: s / plain for k, s in verify.items()}
                print(f"{quant:<6} {threads:>7} {int(repack):>6} {plain * 1e3:>9.2f} {steps[1]:>6.2f} {steps[2]:>6.2f} "
                      f"{steps[3]:>6.2f} {steps[1] + args.draft - 1:>19.2f}")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
