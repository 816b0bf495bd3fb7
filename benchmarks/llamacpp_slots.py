"""Where llama.cpp's MTP stops paying as the server gets busier: aggregate decode tokens/s of
llama-server at 1, 2 and 4 parallel slots (`--parallel N`, N requests at once), plain against
`--spec-type draft-mtp` at k = 1 (or --draft-tokens), on the same GGUF, prompts and threads, T = 0.
Rounds alternate plain and MTP, so drift in the machine's load hits both alike.

    .venv/bin/python benchmarks/llamacpp_slots.py [--quant Q4_1] [--threads 1] [--slots 1,2,4] [--rounds 3] [--max-new-tokens 48]

Needs `make llamacpp real-model-gguf`. Aggregate rate = all requests' tokens after their first /
wall seconds from the first request sent to the last answer (the prefill inside it, alike on both
sides); acceptance from each request's own counters (checked against its streamed tokens). The
load average before and after is printed. Nothing is written to evidence/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from atlas.checkpoints.smollm import DEFAULT_OUT_PATH
from atlas.engines.llamacpp import engine as llamacpp_engine
from atlas.engines.llamacpp.build import find_build, repack_setting, require_draft_mtp
from atlas.engines.llamacpp.server import Completion, Server
from atlas.engines.options import Options
from atlas.paths import project_path
from atlas.records.workloads import load_prompt_set


def prompts_for(folder: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompt_set = load_prompt_set("atlas-chat-v1")
    every = [prompt_set.encode(tokenizer, p) for w in prompt_set.workloads for p in w.prompts]
    return [every[i % len(every)] for i in range(count)]


def burst(server: Server, prompts: list[list[int]], n: int) -> tuple[float, list[Completion]]:
    """All prompts at once; (wall seconds, completions)."""
    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        done = list(pool.map(lambda p: server.complete(llamacpp_engine.request(p, n, 0.0, 0, Options())), prompts))
    return time.perf_counter() - start, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default="Q4_1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slots", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--draft-tokens", type=int, default=1)
    args = parser.parse_args()
    folder = project_path(DEFAULT_OUT_PATH)
    build = find_build()
    require_draft_mtp(build)
    gguf = llamacpp_engine.gguf_set_dir(folder) / f"combined-{args.quant}.gguf"
    repack = repack_setting("auto")
    n, k = args.max_new_tokens, args.draft_tokens
    print(f"llama.cpp b{build.version}; {gguf.name}; {args.threads} thread(s); repacking {repack[1]}; load {os.getloadavg()}")
    print(f"{'slots':>5} {'plain tok/s':>12} {'MTP tok/s':>10} {'MTP/plain':>9} {'acceptance':>10}")
    for slots in (int(s) for s in args.slots.split(",")):
        prompts = prompts_for(folder, slots)
        ctx = max(map(len, prompts)) + n + k + 16
        rates: dict[int, list[float]] = {0: [], k: []}
        drafted = accepted = 0
        with Server(build.binary("llama-server"), gguf, llamacpp_engine.server_args(args.threads, slots, ctx, repack[0], 0)) as plain, \
                Server(build.binary("llama-server"), gguf, llamacpp_engine.server_args(args.threads, slots, ctx, repack[0], k)) as spec:
            for r in range(args.rounds + 1):  # the first round warms both up and is not counted
                for kk in ([0, k] if r % 2 == 0 else [k, 0]):
                    seconds, done = burst(plain if kk == 0 else spec, prompts, n)
                    if r == 0:
                        continue
                    rates[kk].append(sum(len(c.tokens) - 1 for c in done) / seconds)
                    drafted += sum(d for c in done for d, _ in c.rounds) if kk else 0
                    accepted += sum(a for c in done for _, a in c.rounds) if kk else 0
        p, m = statistics.median(rates[0]), statistics.median(rates[k])
        print(f"{slots:>5} {p:>12.1f} {m:>10.1f} {m / p:>9.2f} {accepted / drafted if drafted else 0:>10.2f}")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
