"""The gate's decisions at their stated level, measured by simulating the project's own decision
(cells.build_cell, then gating.decide) on records whose true speed-up is known.

The simulated design is a record's: per workload x temperature, draft lengths k = 1..4 that share
one plain run per prompt and repeat; prompts drawn from a workload whose per-prompt speed-ups
vary around the workload's true geometric-mean speed-up. The spreads are the committed records':
a repeat's paired log speed-up over 3 summed prompts varied by 0.03-0.07 (median over cells), so
one prompt's timing by about 0.06; between prompts 0.15 (acceptance of the held-out prompts of
one category ranged widely; an assumption until records keep per-prompt timings, which schema 4
does). A false "on" is an "on" at a true speed-up of 1.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

import pytest

from atlas.engines.cells import build_cell
from atlas.records import studentt
from atlas.records.fields import PromptRun
from atlas.records.gating import FAMILY_ALPHA, GATE_RULE, decide, p_faster, paired_bounds, regate, t_bounds
from atlas.records.record import Repeat, canonical_bytes, read_record
from atlas.paths import ROOT

KS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Design:
    prompts: int = 16  # the prompt count per workload the bundled category set carries
    repeats: int = 3
    prompt_sd: float = 0.15  # log speed-up, between prompts (shared by every k of a prompt)
    k_sd: float = 0.05  # log speed-up, between draft lengths of one prompt
    run_sd: float = 0.06  # log seconds of one timed run
    per_prompt: bool = True  # the record keeps per-prompt timings (schema 4); else only repeat sums


def _repeat(plain: list[float], spec: list[float], k: int, per_prompt: bool) -> Repeat:
    prompts = [PromptRun(tokens=64, seconds=s, baseline_seconds=b, drafted=20 * k, accepted=10 * k, verify_passes=20,
                         identical_to_baseline=True) for s, b in zip(spec, plain)]
    n = len(prompts)
    return Repeat(tokens=64 * n, seconds=math.fsum(spec), baseline_seconds=math.fsum(plain), drafted_per_position=[20 * n] * k,
                  accepted_per_position=[10 * n] * k, verify_passes=20 * n, identical_to_baseline=True,
                  prompts=prompts if per_prompt else None)


def simulate(speedup: float, trials: int, design: Design, rule: int, seed: int = 0) -> float:
    """Share of `trials` simulated workload x T decisions that come out "on" under `rule`."""
    rng = random.Random(seed)
    on = 0
    for _ in range(trials):
        base = [math.exp(rng.gauss(0, 0.3)) for _ in range(design.prompts)]  # plain seconds of each prompt
        effect = []  # each prompt's true log speed-up per k, centred on the workload's
        for _ in range(design.prompts):
            shared = rng.gauss(0, design.prompt_sd)
            effect.append({k: math.log(speedup) + shared + rng.gauss(0, design.k_sd) for k in KS})
        repeats: dict[int, list[Repeat]] = {k: [] for k in KS}
        for _ in range(design.repeats):
            plain = [b * math.exp(rng.gauss(0, design.run_sd)) for b in base]  # one plain run, shared by every k
            for k in KS:
                spec = [b * math.exp(-effect[p][k] + rng.gauss(0, design.run_sd)) for p, b in enumerate(base)]
                repeats[k].append(_repeat(plain, spec, k, design.per_prompt))
        cells = [build_cell("atlas", "0", "plain", "w", 0.0, k, repeats[k], None, False) for k in KS]
        [decision] = decide(cells, rule)
        on += decision.verdict == "on"
    return on / trials


def _tolerance(rate: float, trials: int) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / trials)  # three Monte-Carlo standard errors


def test_false_on_rate_is_at_most_the_stated_level() -> None:
    trials = 2000
    rate = simulate(1.0, trials, Design(), rule=2)
    assert rate <= FAMILY_ALPHA + _tolerance(FAMILY_ALPHA, trials), f"false 'on' in {rate:.1%} of {trials} decisions"


def test_power_at_a_true_speedup_of_1_3() -> None:
    rate = simulate(1.3, 300, Design(), rule=2, seed=1)
    assert rate >= 0.95, f"'on' in only {rate:.1%} of decisions at a true 1.3x"


def test_the_old_rule_breaks_the_level_on_the_old_design() -> None:
    """Rule 1 on the records' own design (3 prompts summed per repeat, 4 uncorrected draft lengths)
    turns on far more often than 5 % at a true speed-up of 1: the check above can fail."""
    old = Design(prompts=3, per_prompt=False)
    rate = simulate(1.0, 400, old, rule=1, seed=2)
    assert rate > FAMILY_ALPHA + _tolerance(FAMILY_ALPHA, 400), rate
    # the current rule on the same repeat sums: corrected over k, yet the 3 prompts' spread is no
    # part of the bound, so the level does not hold either; only per-prompt timings restore it
    assert simulate(1.0, 400, old, rule=2, seed=2) > FAMILY_ALPHA + _tolerance(FAMILY_ALPHA, 400)


def test_student_t_matches_the_published_table() -> None:
    """One-sided quantiles of Student's t (any statistics table) and the CDF's symmetry."""
    table = {(0.95, 1): 6.314, (0.95, 2): 2.920, (0.95, 4): 2.132, (0.95, 10): 1.812, (0.95, 30): 1.697,
             (0.975, 10): 2.228, (0.975, 3): 3.182, (0.99, 3): 4.541, (0.995, 5): 4.032}
    for (p, df), t in table.items():
        assert studentt.quantile(p, df) == pytest.approx(t, abs=5e-4)
        assert studentt.cdf(-t, df) == pytest.approx(1 - p, abs=1e-4)


def test_the_gate_uses_t_not_the_normal_quantile() -> None:
    """Three units whose mean is 1.73 standard errors above 0: "on" by the normal quantile (1.645),
    not by t with 2 degrees of freedom (2.920). Both rules, cell and decision, say undecided."""
    logs = [0.0, 0.06, 0.12]
    ratios = [math.exp(x) for x in logs]
    mean, se = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(3)
    assert mean - 1.645 * se > 0 > mean - 2.920 * se
    assert paired_bounds(ratios)[0] < 1  # rule 1
    assert t_bounds(logs)[0] < 1 and p_faster(logs) > FAMILY_ALPHA > 1 - statistics.NormalDist().cdf(mean / se)  # rule 2
    repeats = [_repeat([r], [1.0], 1, per_prompt=False) for r in ratios]
    for rule in (1, 2):
        cell = build_cell("atlas", "0", "plain", "w", 0.0, 1, repeats, None, False)
        assert decide([cell], rule)[0].verdict == "undecided"
    per_prompt = [_repeat(ratios, [1.0] * 3, 1, per_prompt=True)] * 3  # the same three prompts' ratios, repeated
    cell = build_cell("atlas", "0", "plain", "w", 0.0, 1, per_prompt, None, False)
    assert cell.gate_verdict == "undecided" and "3 prompts x 3 repeats" in cell.gate_reason


def test_a_repeat_is_the_sum_of_its_prompts() -> None:
    good = _repeat([1.0, 2.0], [0.5, 1.0], 1, per_prompt=True)
    data = good.model_dump()
    data["prompts"][1]["accepted"] += 1
    with pytest.raises(ValueError, match="the prompts' accepted sum to 21, not the repeat's 20"):
        Repeat.model_validate(data)
    data = good.model_dump()
    data["prompts"][0]["seconds"] *= 1.01
    with pytest.raises(ValueError, match="the prompts' seconds sum to"):
        Repeat.model_validate(data)


def test_committed_records_keep_their_rule_and_bytes_and_are_regated() -> None:
    """Records made before rule 2 import as written (rule 1, their bytes and so their ids), and
    regate recomputes their decisions under the current rule, which names its correction; records
    made under rule 2 regate to their own decisions."""
    folder = ROOT / "evidence" / "measurements"
    seen = {1: 0, 2: 0}
    for path in sorted(folder.glob("*.json")):
        record = read_record(path)
        assert canonical_bytes(record) == path.read_bytes()
        now = regate(record)
        assert [(g.workload, g.temperature) for g in now] == [(g.workload, g.temperature) for g in record.gates]
        seen[record.rule] += 1
        if record.gate_rule is None:
            assert record.rule == 1
            for g in now:
                assert "Holm over" in g.reason and "repeats of the same prompts" in g.reason
        else:
            assert record.rule == 2 and [g.verdict for g in now] == [g.verdict for g in record.gates]
    assert seen[1] and seen[2]


def test_sixteen_prompts_a_category_have_the_power_the_prompt_set_states() -> None:
    """atlas-categories-v1 says: 16 prompts detect a true 1.15x with 90 % power (8: 55 %), at this
    design's spreads. 20 000-trial runs gave 0.90 and 0.55; 400 trials each check the claim."""
    assert simulate(1.15, 400, Design(prompts=16), rule=2, seed=3) >= 0.84
    assert simulate(1.15, 400, Design(prompts=8), rule=2, seed=4) <= 0.65


def test_a_run_page_states_the_rule_its_record_was_gated_by() -> None:
    from atlas.site.pages import runpages
    from test_records import make_record

    new = make_record()
    old = new.model_copy(update={"schema_version": 3, "gate_rule": None})
    assert runpages.gate_rule_text(old) == runpages.GATE_RULE and "Holm" not in runpages.GATE_RULE
    text = runpages.gate_rule_text(new)
    assert new.rule == GATE_RULE == 2 and "Holm step-down over every k" in text and "spread between prompts" in text
