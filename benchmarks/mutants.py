"""Planted bugs: each mutant edits one spot of the decode loop or the records in memory, and the test
files that guard that code must then fail. Lossy mutants change what is emitted; metric mutants keep
the output exact but record wrong numbers. Prints caught/missed per mutant; exits 1 if any is missed.

    .venv/bin/python benchmarks/mutants.py [--only NAME,...]

Each mutant runs in its own Python process: the module's source is patched (the original text must
occur exactly once) and executed in place before pytest imports the tests, so the tests see it.
A run without any mutant must pass first, or the verdicts would mean nothing. About 5-10 minutes
on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP_TESTS = ["tests/test_decode.py", "tests/test_families.py"]
RECORD_TESTS = ["tests/test_records.py"]
# where the runner sums runs into a record: several prompts and repeats, the stamp against the facts
AGGREGATION_TESTS = ["tests/test_aggregation.py"]
RECURRENT_TESTS = ["tests/test_recurrent.py"]


@dataclass(frozen=True)
class Mutant:
    name: str
    kind: str  # "lossy" | "metric"
    module: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str


LOOP = "atlas.decode.generate"
RECURRENT = "atlas.decode.recurrent"
GATING = "atlas.records.gating"
CELLS = "atlas.engines.cells"
MODEL = "atlas.decode.model"
KERNELS = "atlas.decode.kernels"
LAYERS = "atlas.decode.layers"
MUTANTS = (
    Mutant("reused-uniform", "lossy", LOOP,
           "r = torch.rand(k, generator=gen, device=p.device)",
           "r = torch.rand(1, generator=gen, device=p.device).expand(k)", tuple(LOOP_TESTS),
           "one uniform number for every draft position"),
    Mutant("resample-from-p", "lossy", LOOP,
           "return j, sample(residual if float(residual.sum()) > 0 else p[j], gen)",
           "return j, sample(p[j], gen)", tuple(LOOP_TESTS), "a rejection resamples from p, not max(0, p - q)"),
    Mutant("exact-match-at-T", "lossy", LOOP,
           "rejected = (r * q.gather(1, at)[:, 0] >= p[:k].gather(1, at)[:, 0]).tolist()",
           "rejected = (p[:k].argmax(-1) != drafts).tolist()", tuple(LOOP_TESTS),
           "T > 0 drafts accepted only when equal to the target's argmax"),
    Mutant("bonus-wrong-row", "lossy", LOOP,
           "return k, sample(p[k], gen)", "return k, sample(p[k - 1], gen)", tuple(LOOP_TESTS),
           "the bonus token drawn from the last draft's row"),
    Mutant("greedy-off-by-one", "lossy", LOOP,
           "while n < k_now and drafts[n] == target[n]:", "while n < k_now and drafts[n] == target[n + 1]:",
           tuple(LOOP_TESTS), "greedy drafts compared with the next row's argmax"),
    Mutant("position-skips-rejected", "lossy", LOOP,
           "        pos += n + 1\n", "        pos += k_now + 1\n", tuple(LOOP_TESTS),
           "the next round starts after the rejected drafts' slots"),
    Mutant("catch-up-last-pair", "metric", LOOP,
           "h_mtp, q_logits = model.catch_up(ids.new_tensor([*drafts[:n], token]), hidden[: n + 1], pos)",
           "h_mtp, q_logits = model.catch_up(ids.new_tensor([token]), hidden[n : n + 1], pos + n)", tuple(LOOP_TESTS),
           "MTP catch-up only on the last accepted pair"),
    Mutant("chain-wrong-slot", "metric", LOOP,
           "model.draft(ids.new_tensor(drafts[-1:]), h_mtp, pos + i - 1, i % n_mtp)",
           "model.draft(ids.new_tensor(drafts[-1:]), h_mtp, pos + i, i % n_mtp)", tuple(LOOP_TESTS),
           "draft chain at the wrong slot / RoPE position"),
    Mutant("chain-stale-hidden", "metric", LOOP,
           "model.draft(ids.new_tensor(drafts[-1:]), h_mtp, pos + i - 1, i % n_mtp)",
           "model.draft(ids.new_tensor(drafts[-1:]), hidden[-1:], pos + i - 1, i % n_mtp)", tuple(LOOP_TESTS),
           "draft chain fed the stale main hidden"),
    Mutant("count-to-first-rejection", "metric", LOOP,
           "            self.drafted[i] += 1\n", "            self.drafted[i] += int(i <= accepted)\n", tuple(LOOP_TESTS),
           "drafts counted only up to the first rejection"),
    Mutant("reached-miscounted", "metric", LOOP,
           "self.reached[i] += int(i <= accepted)", "self.reached[i] += int(i < accepted)", tuple(LOOP_TESTS),
           "a rejected position not counted as reached"),
    Mutant("passes-count-prefill", "metric", LOOP,
           "        self.rounds = 0\n", "        self.rounds = 1\n", tuple(LOOP_TESTS), "the prefill counted as a verify pass"),
    Mutant("mtp-prefill-untimed", "metric", LOOP,
           "    watch.start()  # the MTP layer's prefill is a cost only speculation pays: timed\n"
           "    h_mtp, q_logits = model.catch_up(torch.cat([ids[1:], ids.new_tensor(out)]), hidden, 0)\n",
           "    h_mtp, q_logits = model.catch_up(torch.cat([ids[1:], ids.new_tensor(out)]), hidden, 0)\n"
           "    watch.start()\n", tuple(LOOP_TESTS), "MTP prefill left out of the speculative time"),
    Mutant("tokens-per-pass-no-bonus", "metric", GATING,
           "mal = _ratio(accepted + passes, passes)", "mal = _ratio(accepted, passes)", tuple(RECORD_TESTS),
           "tokens per verify pass without the token every pass adds"),
    Mutant("conditional-as-pooled", "metric", GATING,
           "conditional = conditional_acceptance(reached_pos, accepted_pos)",
           "conditional = [_ratio(a, d) for a, d in zip(accepted_pos, drafted_pos)]", tuple(RECORD_TESTS),
           "per-position conditional acceptance computed as accepted/drafted"),
    Mutant("ideal-without-drafts", "metric", GATING,
           "return ideal_from_costs(mean_accepted_length, k, costs.draft / costs.plain, verify / costs.plain)",
           "return ideal_from_costs(mean_accepted_length, 0, costs.draft / costs.plain, verify / costs.plain)", tuple(RECORD_TESTS),
           "ideal speed-up ignoring the draft steps' cost"),
    Mutant("headline-max", "metric", GATING,
           "speedup = statistics.median(speedups)", "speedup = max(speedups)", tuple(RECORD_TESTS),
           "headline speed-up as the best repeat, not the median"),
    Mutant("speedup-other-repeat", "metric", GATING,
           "speedups = [r.baseline_seconds / r.seconds for r in repeats]",
           "speedups = [a.baseline_seconds / b.seconds for a, b in zip(repeats, repeats[1:] + repeats[:1])]",
           tuple(AGGREGATION_TESTS), "each repeat's speed-up paired with the next repeat's baseline"),
    Mutant("counts-overwritten", "metric", CELLS,
           "self.drafted = drafted if self.drafted is None else [a + b for a, b in zip(self.drafted, drafted)]",
           "self.drafted = drafted", tuple(AGGREGATION_TESTS), "per-position drafted counts overwritten by each prompt, not summed"),
    Mutant("identity-last-prompt", "metric", CELLS,
           "self.identical &= spec.tokens == plain.tokens", "self.identical = spec.tokens == plain.tokens",
           tuple(AGGREGATION_TESTS), "the greedy-identity flag taken from the last prompt only"),
    Mutant("tree-dirty-constant", "metric", "atlas.engines.stamp",
           "atlas_tree_dirty=None if status is None else bool(status.strip())", "atlas_tree_dirty=False",
           tuple(AGGREGATION_TESTS), "the stamp's atlas_tree_dirty a constant"),
    Mutant("top-p-unrecorded", "metric", "atlas.engines.options",
           "top_p=options.top_p, quick=options.quick,", "top_p=None, quick=options.quick,",
           tuple(AGGREGATION_TESTS), "--top-p used by the runs but not recorded in the settings"),
    Mutant("state-slot-off-by-one", "lossy", RECURRENT,
           "return self.zero if start == 0 else self.state[(start - 1) % self.state.shape[0]]",
           "return self.zero if start == 0 else self.state[(start - 2) % self.state.shape[0]]", tuple(RECURRENT_TESTS),
           "a round starts from the recurrent state one position before the last accepted one"),
    Mutant("conv-window-not-rolled-back", "lossy", RECURRENT,
           "before = [p % c for p in range(start - self.kernel + 1, start) if p >= 0]",
           "before = [p % c for p in range(start - self.kernel + 2, start + 1) if p >= 0]", tuple(RECURRENT_TESTS),
           "the conv window keeps the newest column written, a rejected draft's input after a rejection"),
    # the DSA dense regime's boundary (issue 30): keys attended = prompt + new tokens - 1 <= index_topk
    Mutant("dsa-forward-one-key-generous", "lossy", MODEL,
           "if self.dense_limit is not None and start + n > self.dense_limit:",
           "if self.dense_limit is not None and start + n > self.dense_limit + 1:", ("tests/test_families.py",),
           "a main forward attending index_topk + 1 keys runs as dense, where the indexer would select a subset"),
    Mutant("dsa-run-one-key-generous", "lossy", MODEL,
           "    return prompt + new - 1\n", "    return prompt + new - 2\n", ("tests/test_families.py",),
           "a run whose last forward attends index_topk + 1 keys passes the up-front check"),
    # known acceptance (issue 30): greedy output stays exact, the counts leave the known value
    Mutant("no-catch-up-after-zero-accepted", "metric", LOOP,
           "        if len(out) < max_new:\n            # Catch the MTP caches up",
           "        if len(out) < max_new and n > 0:\n            # Catch the MTP caches up", ("tests/test_known_acceptance.py",),
           "no MTP catch-up after a round with no accepted draft: the next round drafts from a stale state"),
    Mutant("dt-floor-every-step", "lossy", RECURRENT,
           "dt = F.softplus(dt.float() + self.dt_bias).clamp(self.limit[0], self.limit[1])",
           "dt = F.softplus(dt.float() + self.dt_bias).clamp(max(self.limit[0], self.m.config.time_step_min) if start else self.limit[0], self.limit[1])",
           tuple(RECURRENT_TESTS), "Mamba2 time steps floored at time_step_min in every decode step (plain and verify alike; the prefill right)"),
    # Nemotron-H block patterns in both spellings (issue 29): the fingerprint's MTP family, its
    # module count and its pattern facts, and the Mamba2 time-step bound Nemotron-3 Ultra writes as 1e308
    Mutant("mtp-list-spelling-unread", "metric", "atlas.fingerprints.rules",
           'requires_keys=blockpattern.KEYS["mtp"],', 'requires_keys=blockpattern.KEYS["mtp"][:1],',
           ("tests/test_fingerprints.py",), "the nemotron_h tensor rule needs the string key: list-spelled MTP tensors read as two Qwen mtp.* layers"),
    Mutant("mtp-sub-layers-not-divided", "metric", "atlas.fingerprints.rules",
           "count = math.ceil(count / len(pattern.kinds))", "count = math.ceil(count / max(1, len(pattern.kinds) - 1))",
           ("tests/test_fingerprints.py",), "shipped MTP layers counted with one sub-layer too few per module"),
    Mutant("legacy-layer-names-swapped", "metric", "atlas.fingerprints.blockpattern",
           'NAMES = {"mamba": "linear_attention", "attention": "full_attention",',
           'NAMES = {"mamba": "full_attention", "attention": "linear_attention",',
           ("tests/test_fingerprints.py",), "a list's mamba / attention entries read as each other (block_pattern facts wrong)"),
    Mutant("time-step-limit-past-float32-kept", "lossy", RECURRENT,
           "low, high = (float(v) if abs(v) <= top else math.copysign(math.inf, v) for v in values)",
           "low, high = (float(v) for v in values)",
           ("tests/test_recurrent.py::test_a_time_step_limit_past_float32_is_no_limit",
            "tests/test_families.py::test_oracle_greedy_acceptance_is_exactly_one"),
           "Nemotron-3 Ultra's 1e308 upper bound passed to torch.clamp, which refuses it as an overflow"),
    # the CPU kernels, the cut draft vocabulary, the one-expert fold and the head's training (issue 22)
    Mutant("verify-rows-padding-read", "lossy", KERNELS,
           'y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.b, "none", [], "")[:n]',
           'y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.b, "none", [], "")[-n:]', ("tests/test_decode.py",),
           "a verify pass of 2-4 rows reads the zero padding's rows instead of its own"),
    Mutant("draft-vocab-scattered-wrong", "metric", MODEL,
           'return x, logits.new_full((self.vocab_size,), float("-inf")).index_copy_(0, p.vocab, logits)',
           'return x, logits.new_full((self.vocab_size,), float("-inf")).index_copy_(0, p.vocab.roll(1), logits)',
           ("tests/test_decode.py",), "the cut head's scores land on the wrong tokens (output stays exact, drafts go wrong)"),
    Mutant("fixed-route-weight-dropped", "metric", LAYERS,
           "gates.append(g), ups.append(u), downs.append(experts.down_proj[e].detach() * w)",
           "gates.append(g), ups.append(u), downs.append(experts.down_proj[e].detach())", ("tests/test_smollm.py",),
           "the one-expert fold forgets the routing weight (then refused by its own check: the block runs routed)"),
    Mutant("head-chain-attends-own-step", "metric", "atlas.checkpoints.headtrain.head",
           "k1, v1 = (t[:, :, :n].repeat_interleave(rep, dim=1) for t in keys[0])",
           "k1, v1 = (t[:, :, :n].repeat_interleave(rep, dim=1) for t in keys[-1])", ("tests/test_headtrain.py",),
           "training's chain step s attends to its own step's keys, not the first step's as decoding does"),
    Mutant("head-acceptance-unreached-chains", "metric", "atlas.checkpoints.headtrain.train",
           "before = chain_ok.get((r, jj)) if s > 0 else True",
           "before = chain_ok.get((r, jj), True) if s > 0 else True", ("tests/test_headtrain.py",),
           "held-out acceptance counts chains whose earlier drafts target prompt tokens"),
    # issue 24: the MTP layer's own head/embedding (used where shipped, the target's bound where not)
    Mutant("mtp-embed-copy-ignored", "metric", "atlas.decode.mtphead",
           "            embed = tensor(glue + family.own_embed)\n", "            pass\n",
           ("tests/test_families.py::test_random_checkpoint_with_or_without_layer_local_copies_is_faithful_and_lossless",),
           "the target's embedding drafts where the checkpoint ships the MTP layer's own copy"),
    Mutant("mtp-shared-unrecorded", "metric", "atlas.decode.mtphead",
           "            shared[glue + family.own_head] = target_name(model.lm_head.weight)", "            pass",
           ("tests/test_families.py::test_oracle_with_or_without_layer_local_copies_accepts_every_draft",),
           "the target's lm_head is bound in place of a missing shared_head.head without the record saying so"),
    # the MTP layer's precision, a present claim
    Mutant("precision-prefix-off-by-one", "metric", "atlas.fingerprints.precision",
           'return [f"model.layers.{depth + i}." for i in range(n)]', 'return [f"model.layers.{depth + i + 1}." for i in range(n)]',
           ("tests/test_mtpprecision.py",), "the exclusion lists are read for the layer after the MTP layer"),
    Mutant("precision-unknown-as-dtype", "metric", "atlas.fingerprints.precision",
           'return Precision("unknown", f"{where}: no exclusion list and no weight names read", "unknown", "not stated")',
           'return Precision("no", f"{where}: no exclusion list and no weight names read", *plain)',
           ("tests/test_mtpprecision.py",), "a quantized config that names no exclusion reads as an unquantized bf16 MTP layer"),
    # coverage by rule
    Mutant("coverage-ignores-refusal", "metric", "atlas.families.coverage",
           "    if row.refuse:", "    if False:",
           ("tests/test_coverage.py::test_each_mtp_declaring_mirror_config_runs_or_is_refused_by_name",),
           "a refused family (MiniMax) is listed as running in our loop"),
)


def apply_and_test(mutant: Mutant | None, tests: list[str]) -> int:
    """In this process: patch the module (if a mutant), then run pytest on `tests`."""
    import pytest

    if mutant is not None:
        module = importlib.import_module(mutant.module)
        source = inspect.getsource(module)
        if source.count(mutant.old) != 1:
            print(f"mutant {mutant.name}: its original text occurs {source.count(mutant.old)} times in {mutant.module}")
            return 3
        exec(compile(source.replace(mutant.old, mutant.new), module.__file__, "exec"), module.__dict__)
    return int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--no-header", "-W", "ignore", *tests]))


def run_child(name: str, tests: list[str]) -> tuple[int, float]:
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, __file__, "--child", name, *tests], cwd=ROOT, capture_output=True, text=True).returncode
    return rc, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated mutant names")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    by_name = {m.name: m for m in MUTANTS}
    if args.child:
        name, *tests = args.child
        sys.exit(apply_and_test(by_name.get(name), tests))
    chosen = [by_name[n] for n in args.only.split(",")] if args.only else list(MUTANTS)
    all_tests = sorted({t for m in chosen for t in m.tests})
    rc, seconds = run_child("none", all_tests)
    print(f"baseline (no mutant): {'pass' if rc == 0 else 'FAIL'} ({seconds:.0f} s) on {' '.join(all_tests)}")
    if rc != 0:
        sys.exit("the unmutated suite must pass first")
    missed = 0
    for m in chosen:
        rc, seconds = run_child(m.name, list(m.tests))
        verdict = {0: "MISSED", 1: "caught"}.get(rc, f"error (exit {rc})")
        missed += rc != 1
        print(f"{m.kind:<6} {m.name:<26} {verdict:<8} {seconds:5.0f} s  {m.why}")
    print(f"{len(chosen) - missed} of {len(chosen)} mutants caught")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
