"""Three bugs a reviewer planted that the conformance suite's tests missed (issue 38), each tested
directly: an unknown needed sample counted as enough, an oracle whose draft law is the target's
(so no sampled draft is ever rejected and a wrong correction goes unseen), and a distribution test
over no transitions. The fourth, the gate's t quantile, is in tests/test_gate_level.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atlas.checkpoints.oracles import bigram_tables
from atlas.conformance import record as conformance, stats as conformancestats
from atlas.engines.conformance_suite import ORACLE_DRAFT_SCALE, write_checkpoints
from test_conformance_power import _check, _distribution, _record, _run
from test_engines import _simulate

REQUESTS, TOKENS = 16, 64  # the suite's defaults (run_suite)


def test_an_unknown_needed_sample_is_never_enough() -> None:
    huge = conformance.Power(sample=10**9, unit="transitions", effect=conformance.NLL_SHIFT, needed=None)
    assert not huge.sufficient
    # a distribution check whose figures do not say its power: every other check is well powered,
    # so only the unknown need stands between this run and "lossless"
    unknown = {k: v for k, v in _distribution(REQUESTS * (TOKENS - 1)).items() if k != "detectable_nll_shift"}
    checks = [c for c in _run(REQUESTS, TOKENS) if c.temperature == 1.0]
    group = [c for c in checks if c.draft_tokens]
    controls = [c for c in checks if not c.draft_tokens]
    assert conformance.judge(_record(REQUESTS, TOKENS, group).checks, controls)[0] == "lossless"
    swapped = [_check("distribution", 1.0, 1, unknown) if c.name == "distribution" else c for c in group]
    read = _record(REQUESTS, TOKENS, swapped).checks
    assert [c.power.needed for c in read if c.name == "distribution"] == [None]
    result, reason = conformance.judge(read, controls)
    assert result == "inconclusive" and "underpowered" in reason and "an unknown number of transitions" in reason


@pytest.fixture(scope="module")
def oracle_laws(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, np.ndarray]:
    """The target's law P and the draft law Q of the oracle the suite writes (mimo, seed 0)."""
    folders = write_checkpoints("mimo", tmp_path_factory.mktemp("oracle"), seed=0)
    return bigram_tables(folders["oracle"], "mimo")


def test_the_suite_oracle_drafts_from_another_law_with_the_same_argmax(oracle_laws) -> None:
    p, q = oracle_laws
    assert ORACLE_DRAFT_SCALE != 1
    assert (p.argmax(1) == q.argmax(1)).all()  # T = 0: every greedy draft still exact
    sampled = conformancestats.prefix_acceptance(p, q, greedy=False, k=1)[0]
    assert 0.3 < sampled.mean() < 0.8  # T = 1: sampled drafts are rejected, so the correction is drawn


def _distribution_fails(p: np.ndarray, q: np.ndarray, bug: str, seeds: int = 5) -> int:
    """How many of `seeds` suite-sized runs of a simulated engine fail the distribution check."""
    fails = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        runs = [_simulate(p, q, 2, False, TOKENS, rng, bug) for _ in range(REQUESTS)]
        fails += not conformance.distribution_passed(conformancestats.distribution_test(p, [t for t, _, _ in runs]))
    return fails


def test_a_correction_drawn_from_p_fails_against_the_suite_oracle(oracle_laws) -> None:
    """An engine that, after a rejection, draws from p instead of the residual max(0, p - q): the
    suite's oracle catches it in every run of the suite's size, a correct engine passes, and an
    oracle drafting with the target's own law (the old blind one) lets the bug pass every time."""
    p, q = oracle_laws
    assert _distribution_fails(p, q, "no-residual") == 5
    assert _distribution_fails(p, q, "") == 0
    assert _distribution_fails(p, p, "no-residual") == 0


def test_no_transitions_is_a_named_result_that_cannot_earn_lossless() -> None:
    p = np.full((4, 4), 0.25)
    f = conformancestats.distribution_test(p, [[1], [], [2]])
    assert f["result"] == "no transitions" and f["transitions"] == 0 and f["p_value"] is None
    assert conformance.distribution_passed(f)  # nothing rejected ...
    check = _record(REQUESTS, TOKENS, [_check("distribution", 1.0, 1, f)]).checks[0]
    assert conformance.passed_by_statistics(check, conformance.ALPHA) is True
    assert check.power is not None and check.power.sample == 0 and not check.power.sufficient
    assert conformance.judge([check], [])[0] == "inconclusive"  # ... and nothing shown


def test_a_record_from_the_blind_oracle_cannot_call_probabilistic_drafts_lossless() -> None:
    """Records written before the oracle's draft law was named ran the target's own law: their
    passing T > 0 rows with sampled drafts never saw a rejection, so they are inconclusive; the
    same checks from an oracle that rejects are lossless. Greedy-draft rows are untouched."""
    checks = [c.model_copy(update={"draft_sampling": "probabilistic"}) if c.temperature > 0 and c.draft_tokens else c
              for c in _run(REQUESTS, TOKENS)]

    def rows(scale: float | None) -> dict[tuple[str, str], str]:
        rec = _record(REQUESTS, TOKENS, checks).model_copy(update={"oracle_draft_scale": scale})
        return {(v.temperature, v.draft_sampling): v.result for v in conformance.verdicts([(Path("r.json"), rec)])}

    assert rows(ORACLE_DRAFT_SCALE) == {("0", "any"): "lossless", ("> 0", "probabilistic"): "lossless"}
    assert rows(None) == rows(1.0) == {("0", "any"): "lossless", ("> 0", "probabilistic"): "inconclusive"}
