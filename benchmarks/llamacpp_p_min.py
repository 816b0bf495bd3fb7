"""Whether drafting only where the MTP head is confident makes llama.cpp's draft-mtp pay: llama-server
plain against draft-mtp at k = 1 with --spec-draft-p-min at several values (a round drafts only where
the head's top probability reaches p-min; 0, the records' setting, drafts every round), on the real
model's GGUF, every server resident, each prompt on each in an order alternating by prompt.

    .venv/bin/python benchmarks/llamacpp_p_min.py [--model data/real-models/smollm2-135m-mtp-v3] [--quant Q4_0]
        [--draft-vocab 8192] [--output Q4_0] [--p-min 0,0.5,0.7,0.85] [--threads 1] [--prompts-per-workload 2]

Needs `make llamacpp real-model-gguf`. T = 0, atlas-categories-v1 through the chat template. Per
setting: decode tokens over the servers' own decode seconds, summed over prompts, and its ratio to
plain decoding; acceptance (accepted / drafted); the share of steps that drafted; whether every
greedy output equals plain decoding's. A step that does not draft still runs the head (to read its
confidence) and its catch-up, so the ratio cannot pass 1 / (1 + that cost) as p-min rises. The
load average before and after is printed; nothing is written to evidence/.
"""

from __future__ import annotations

import argparse
import os
from contextlib import ExitStack
from pathlib import Path

from atlas.checkpoints.smollm import DEFAULT_OUT_PATH
from atlas.engines.llamacpp import engine as llamacpp_engine
from atlas.engines.llamacpp.build import find_build, repack_setting
from atlas.engines.llamacpp.gguf import read_manifest
from atlas.engines.llamacpp.server import Server
from atlas.engines.options import Options
from atlas.paths import project_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=project_path(DEFAULT_OUT_PATH))
    ap.add_argument("--quant", default="Q4_0")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--output", default="Q4_0", help="the set's untied copy whose output layer is of this type; 'tied' for the tied file")
    ap.add_argument("--p-min", default="0,0.5,0.7,0.85", help="comma-separated --spec-draft-p-min values")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts-per-workload", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from atlas.records.workloads import load_prompt_set

    folder = llamacpp_engine.gguf_set_dir(args.model)
    output = None if args.output == "tied" else args.output
    gguf = folder / read_manifest(folder).find("combined", args.quant, args.draft_vocab, output).file
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    prompt_set = load_prompt_set("atlas-categories-v1")
    prompts = [prompt_set.encode(tokenizer, p) for w in prompt_set.workloads for p in w.prompts[:args.prompts_per_workload]]
    n = args.max_new_tokens
    ctx = max(map(len, prompts)) + n + 16
    repack = repack_setting("auto")[0]
    binary = find_build().binary("llama-server")
    settings: list[float | None] = [None, *(float(p) for p in args.p_min.split(","))]  # None: plain decoding
    print(f"{gguf.name}; {args.threads} thread(s); {len(prompts)} prompts x {n} tokens at T = 0; load before {os.getloadavg()}")
    # per setting: decode tokens, seconds, drafted, accepted, steps that drafted, steps; and the outputs
    totals = {s: [0, 0.0, 0, 0, 0, 0] for s in settings}
    outputs: dict[float | None, list[list[int]]] = {s: [] for s in settings}
    with ExitStack() as stack:
        servers = {s: stack.enter_context(Server(binary, gguf, llamacpp_engine.server_args(
            args.threads, 1, ctx, repack, 0 if s is None else 1, p_min=s or 0.0))) for s in settings}
        for s, server in servers.items():  # warm-up, not counted
            server.complete(llamacpp_engine.request(prompts[0], 8, 0.0, 0, Options()), k=0 if s is None else 1)
        for i, prompt in enumerate(prompts):
            for s in settings if i % 2 == 0 else settings[::-1]:
                done = servers[s].complete(llamacpp_engine.request(prompt, n, 0.0, i, Options()), k=0 if s is None else 1)
                t = totals[s]
                t[0] += len(done.tokens) - 1
                t[1] += done.seconds
                t[2] += sum(d for d, _ in done.rounds)
                t[3] += sum(a for _, a in done.rounds)
                t[4] += sum(1 for d, _ in done.rounds if d)
                t[5] += len(done.rounds)
                outputs[s].append(done.tokens)
    plain = totals[None][0] / totals[None][1]
    print(f"plain: {plain:.1f} tokens/s")
    print("| p-min | tokens/s | vs plain | acceptance | steps that drafted | greedy as plain |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in settings[1:]:
        tokens, seconds, drafted, accepted, drafting, steps = totals[s]
        same = sum(a == b for a, b in zip(outputs[s], outputs[None]))
        print(f"| {s:g} | {tokens / seconds:.1f} | {tokens / seconds / plain:.3f}x | {accepted / max(drafted, 1):.3f} | "
              f"{drafting / max(steps, 1):.2f} | {same}/{len(prompts)} |")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
