"""Does a head's held-out figure forecast what decoding accepts? Teacher-forced first-draft
acceptance (headtrain.train.measure, as each recipe's held-out figure is computed) of one or more
committed heads on the main model's own greedy answers to a measurement prompt set, per workload,
beside the recipe's own held-out figure. Compare the output with a record's decoded first-draft
acceptance on the same prompts: if the teacher-forced figure on these answers lands near the
decoded one while the recipe's is far above both, the gap is the prompts (categories the head never
trained on), not the decode loop. The decoded column schedules the rounds as T = 0 decoding runs
them (measure()'s t0_decoded): a round starts where the last verify pass ended, so the position
right after an accepted draft is never drafted.

    .venv/bin/python benchmarks/head_forecast.py [--heads DIR,DIR] [--prompt-set atlas-categories-v1]
        [--prompts-per-workload 4] [--max-new-tokens 48] [--threads 1]

Needs `make real-model-deps`. A diagnostic only: it reads measurement prompts, so never select or
train a head on its output. Nothing is written.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from atlas.checkpoints import smollm
from atlas.checkpoints.headtrain.data import Sequence
from atlas.checkpoints.headtrain.head import MtpLayer, Shape
from atlas.checkpoints.headtrain.train import measure, teacher_pass
from atlas.records.workloads import load_prompt_set

HEADS = "data/real-heads/smollm2-135m-mtp,data/real-heads/smollm2-135m-mtp-v2,data/real-heads/smollm2-135m-mtp-v3"


def answers(llama: object, tokenizer: object, prompt_set: str, per_workload: int, max_new: int) -> list[Sequence]:
    """The main model's greedy answers, exactly `max_new` tokens each past any end-of-sequence token,
    as both engines decode them in a record (our loop runs to max_new; llama.cpp is asked with
    ignore_eos): transformers' forward with its cache, the logits our checkpoint gives."""
    ps = load_prompt_set(prompt_set)
    out = []
    with torch.inference_mode():
        for workload, rows in ps.encode_workloads(tokenizer, ps.workloads, per_workload, 1000).items():
            for ids in rows:
                step = llama(input_ids=torch.tensor([ids]), use_cache=True)  # type: ignore[operator]
                answer = [int(step.logits[0, -1].argmax())]
                while len(answer) < max_new:
                    step = llama(input_ids=torch.tensor([answer[-1:]]), cache=step.cache,  # type: ignore[operator]
                                 use_cache=True)
                    answer.append(int(step.logits[0, -1].argmax()))
                out.append(Sequence(ids + answer, len(ids), workload, "greedy", True))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", default=HEADS)
    ap.add_argument("--prompt-set", default="atlas-categories-v1")
    ap.add_argument("--prompts-per-workload", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llama, tokenizer = smollm.load_original()
    start = time.perf_counter()
    sequences = answers(llama, tokenizer, args.prompt_set, args.prompts_per_workload, args.max_new_tokens)
    teacher = teacher_pass(llama, sequences, 64, lambda _: None)
    print(f"{len(sequences)} greedy answers to {args.prompt_set} ({args.prompts_per_workload} per workload, "
          f"{args.max_new_tokens} tokens), {time.perf_counter() - start:.0f} s at {args.threads} thread(s)")
    for folder in map(Path, args.heads.split(",")):
        recipe = json.loads((folder / smollm.RECIPE_FILE).read_text())
        head = MtpLayer(Shape.of(llama.config, recipe["head_intermediate"]), llama.get_input_embeddings().weight, 2048)
        head.load_tensors(load_file(str(folder / smollm.HEAD_FILE)), smollm.mtp_prefix())
        found = measure(head, sequences, teacher, list(range(len(sequences))), 3)
        print(f"\n{folder.name} (head {recipe['head_sha256'][:12]}): teacher-forced on these answers, T = 0 per position "
              f"{found['t0_conditional']}; the recipe's held-out first draft {recipe['heldout_after']['t0_conditional'][0]}")
        print("  first draft as T = 0 decoding schedules its rounds: "
              + ", ".join(f"k = {k} {d['first_draft']} ({d['rounds']} rounds)" for k, d in found["t0_decoded"].items()))
        print(f"  {'category':<12} {'every position':>14} {'decoded, k = 1':>15}")
        for category, share in found["t0_first_by_category"].items():
            alone = [i for i, s in enumerate(sequences) if s.category == category]
            scheduled = measure(head, sequences, teacher, alone, 1)["t0_decoded"][1]["first_draft"]
            print(f"  {category:<12} {share:>14.3f} {scheduled:>15.3f}")


if __name__ == "__main__":
    main()
