"""The engine backend without the engine: the vLLM driver's protocol (the real driver script, run
against tests/fake_vllm, a stand-in `vllm` package), the mapping of vLLM's counts onto our record
schema, the refusal paths, the Mellum -> Qwen3-Next conversion, and the conformance statistics
against simulated samplers, correct and planted-wrong."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from atlas import AtlasError, omp
from atlas.cli import cli
from atlas.conformance import record as conformance, stats as conformancestats
from atlas.site.parts import conformance_table
from atlas.engines.convert import convert_mellum, qwen3_next_config
from atlas.engines.vllm.engine import cross_check, to_run_stats
from atlas.engines.options import parse_vllm_options
from atlas.engines.generated import Generated, Result
from atlas.engines.vllm.client import Driver
from atlas.records.record import read_record
from atlas.decode.checkpoint import DEFAULT_MODEL

FAKE = Path(__file__).parent / "fake_vllm"
needs_team = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="team checkpoint not built yet")


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Our own interpreter as the 'vLLM environment', with the stand-in package on its path."""
    monkeypatch.setenv("PYTHONPATH", str(FAKE))
    monkeypatch.setenv("ATLAS_VLLM_PYTHON", sys.executable)
    return Path(sys.executable)


# ---- protocol ------------------------------------------------------------------------------------


def test_driver_protocol_round_trip(fake_engine: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with Driver(fake_engine) as d:
        hello = d.hello()
        assert (hello.package, hello.version, hello.device) == ("vllm", "0.0.0+fake", "cpu")
        loaded = d.load(model=str(tmp_path), draft_tokens=2, dtype="float32", max_model_len=64,
                        speculative={"draft_sample_method": "probabilistic"}, options={"enforce_eager": True})
        assert loaded.draft_sample_method == "probabilistic"
        assert loaded.engine_args["trust_remote_code"] is False and loaded.engine_args["enforce_eager"] is True
        assert loaded.engine_args["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2, "draft_sample_method": "probabilistic"}
        out = d.generate(requests=[{"prompt": [1, 2], "seed": 0}, {"prompt": [5], "seed": 1}], max_tokens=9, temperature=0.0)
        assert [len(r.tokens) for r in out.results] == [9, 9]
        assert out.counters is not None and out.counters.num_drafts == sum(len(r.per_step_drafted) for r in out.results)
        cross_check(out, 2)  # the driver's counter deltas cover exactly this call
        again = d.generate(requests=[{"prompt": [3], "seed": 0}], max_tokens=5, temperature=0.0)
        cross_check(again, 2)
        # an engine-side failure is reported and the driver keeps serving
        with pytest.raises(AtlasError, match="vLLM load failed: FileNotFoundError"):
            d.load(model=str(tmp_path / "missing"), draft_tokens=0, max_model_len=64)
        with pytest.raises(AtlasError, match="unknown op"):
            d.request({"op": "bogus"})
        assert d.hello().package == "vllm"


def test_the_driver_runs_without_the_wait_policy_the_atlas_set_for_torch(fake_engine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM-CPU's OpenMP threads under PASSIVE decoded at 0.56x (benchmarks/vllm_wait_policy.py): the
    driver gets the environment a user's vLLM would, and a policy the user set."""
    def driver_sees() -> list[bytes]:
        with Driver(fake_engine) as d:
            d.hello()
            return [v for v in Path(f"/proc/{d.proc.pid}/environ").read_bytes().split(b"\0") if v.startswith(b"OMP_WAIT_POLICY=")]
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv(omp.SET_BY_ATLAS, "1")
    assert driver_sees() == []
    monkeypatch.delenv(omp.SET_BY_ATLAS)
    assert driver_sees() == [b"OMP_WAIT_POLICY=PASSIVE"]


def test_driver_keeps_eos_in_the_law_and_returns_exactly_max_tokens(fake_engine: Path, tmp_path: Path) -> None:
    # the stand-in's chain from 1 runs 1, 10, 23, 14, 1, ...: with EOS = 23 on it, the output must
    # carry EOS where the law puts it (no min_tokens masking) and still be max_tokens long
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 23}))
    with Driver(fake_engine) as d:
        for k in (0, 2):
            d.load(model=str(tmp_path), draft_tokens=k, max_model_len=64)
            [r] = d.generate(requests=[{"prompt": [1], "seed": 0}], max_tokens=12, temperature=0.0).results
            assert r.tokens == [10, 23, 14, 1] * 3, k


def test_patch_is_applied_before_the_engine_and_named_by_its_hash(fake_engine: Path, tmp_path: Path) -> None:
    import hashlib

    from atlas.engines.vllm import driver as vllm_driver

    (tmp_path / "config.json").write_text("{}")
    chain = [10, 23, 14, 1, 10, 23]

    def sampled(d: Driver) -> list[int]:
        d.load(model=str(tmp_path), draft_tokens=2, max_model_len=64)
        return d.generate(requests=[{"prompt": [1], "seed": 0}, {"prompt": [1], "seed": 1}], max_tokens=6,
                          temperature=0.7).results[0].tokens

    with Driver(fake_engine) as d:  # the stand-in's copy of the defect: T > 0 with drafts goes astray
        assert not d.hello().triton and sampled(d) != chain
        with pytest.raises(AtlasError, match="before the first engine is loaded"):
            d.patch("expand-kernel-fix")
    with Driver(fake_engine) as d:
        applied = d.patch("expand-kernel-fix")
        patch_file = Path(vllm_driver.__file__).with_name(vllm_driver.PATCHES["expand-kernel-fix"])
        assert applied == {"name": "expand-kernel-fix", "sha256": hashlib.sha256(patch_file.read_bytes()).hexdigest(),
                           "replaces": "vllm.utils.cpu_triton_utils._expand_kernel_impl", "file": patch_file.name}
        assert sampled(d) == chain
        with pytest.raises(AtlasError, match="no run-time patch named 'bogus'"):
            d.patch("bogus")


def test_patched_expand_is_the_exact_expansion_at_the_callers_dtype() -> None:
    from atlas.engines.vllm.patch_expand import expand

    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        out = torch.full((6,), 99, dtype=dtype)
        expand(out, torch.tensor([3, -1, 5], dtype=dtype), torch.tensor([2, 5, 6], dtype=torch.int32), -1, 1)
        assert out.tolist() == [3, 3, 1, 1, 1, 5] and out.dtype == dtype
    out = torch.full((4,), 7.0)
    expand(out, torch.tensor([0.25, 2.0]), torch.tensor([0, 3]), 0, 0)  # a request with no draft tokens
    assert out.tolist() == [2.0, 2.0, 2.0, 7.0]


def test_driver_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho 'boom: no vllm here' >&2\nexit 3\n")
    script.chmod(0o755)
    with Driver(script) as d, pytest.raises(AtlasError, match="(?s)exited.*boom: no vllm here"):
        d.hello()


def test_reply_that_breaks_the_protocol(tmp_path: Path) -> None:
    script = tmp_path / "python"
    script.write_text('#!/bin/sh\nread line\necho \'{"ok": true, "package": 3}\'\nread line\necho not-json\n')
    script.chmod(0o755)
    with Driver(script) as d:
        with pytest.raises(AtlasError, match="does not follow the protocol"):
            d.hello()
        with pytest.raises(AtlasError, match="not JSON"):
            d.hello()


def test_missing_environment_says_how_to_make_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from atlas.engines.vllm import client as vllm_client

    monkeypatch.delenv("ATLAS_VLLM_PYTHON", raising=False)
    monkeypatch.setattr(vllm_client, "CACHE", tmp_path)
    with pytest.raises(AtlasError, match="make vllm-env"):
        vllm_client.find_python()
    with pytest.raises(AtlasError, match="does not exist"):
        vllm_client.find_python(str(tmp_path / "nope"))


# ---- mapping vLLM's counts onto the record -------------------------------------------------------


def _result(steps: list[tuple[int, int]], n: int, seconds: float = 0.5) -> Result:
    return Result(tokens=list(range(n)), decode_seconds=seconds, per_step_drafted=[d for d, _ in steps],
                  per_step_accepted=[a for _, a in steps])


def test_last_step_is_cut_to_what_could_be_emitted() -> None:
    # 10 tokens: 1 from the prefill, 9 decoded. Steps emit 4, 4, then vLLM drafts 3 more and
    # accepts all though only 1 token is left: that step becomes 0 drafted, 0 accepted, 1 emitted.
    stats = to_run_stats(_result([(3, 3), (3, 3), (3, 3)], 10), 10)
    assert stats.drafted_per_position == [2, 2, 2] and stats.accepted_per_position == [2, 2, 2]
    assert stats.verify_passes == 3 and stats.seconds == 0.5
    # a rejection where one draft fits (cut to 1 drafted, 0 accepted), then a bonus-only step
    stats = to_run_stats(_result([(3, 3), (3, 0), (3, 3)], 7), 7)
    assert stats.drafted_per_position == [2, 1, 1] and stats.accepted_per_position == [1, 1, 1]
    assert stats.reached_per_position == [2, 1, 1]  # position 0 of step 2 was tested and failed
    # invariant of the record: accepted + passes = decode tokens
    assert sum(stats.accepted_per_position) + stats.verify_passes == 6


@pytest.mark.parametrize(("steps", "n", "message"), [
    ([(2, 2)], 9, "account for 3 decode tokens"),  # too few steps for the output
    ([(2, 2), (2, 2), (2, 2), (2, 0)], 9, "after the last token"),
    ([(1, 2)], 3, "2 accepted of 1 drafted"),
])
def test_counts_that_cannot_be_right_are_refused(steps: list[tuple[int, int]], n: int, message: str) -> None:
    with pytest.raises(AtlasError, match=message):
        to_run_stats(_result(steps, n), n)


def test_wrong_length_or_no_time_is_refused() -> None:
    with pytest.raises(AtlasError, match="returned 3 tokens where 5"):
        to_run_stats(_result([], 3), 5)
    with pytest.raises(AtlasError, match="no decode time"):
        to_run_stats(_result([], 3, seconds=0.0), 3)


def test_cross_check_against_counter_deltas() -> None:
    results = [_result([(2, 2), (2, 0), (2, 1)], 7)]
    ok = {"num_drafts": 3, "num_draft_tokens": 6, "num_accepted_tokens": 3, "accepted_per_position": [2, 1]}
    cross_check(Generated(results=results, wall_seconds=1.0, counters=ok), 2)
    for key, value in [("num_accepted_tokens", 4), ("accepted_per_position", [2, 2]), ("num_drafts", 4)]:
        with pytest.raises(AtlasError, match="disagree with its counter deltas"):
            cross_check(Generated(results=results, wall_seconds=1.0, counters={**ok, key: value}), 2)
    with pytest.raises(AtlasError, match="no spec-decode counters"):
        cross_check(Generated(results=results, wall_seconds=1.0, counters=None), 2)


def test_engine_options() -> None:
    opts = parse_vllm_options(["enforce_eager=true", "gpu_memory_utilization=0.85", "kv_cache_dtype=fp8",
                                 "speculative.draft_sample_method=probabilistic"], None, 8, 1)
    assert opts.options == {"enforce_eager": True, "gpu_memory_utilization": 0.85, "kv_cache_dtype": "fp8"}
    assert opts.speculative == {"draft_sample_method": "probabilistic"} and opts.tensor_parallel_size == 8
    for bad, message in [("trust_remote_code=true", "never"), ("dtype=bfloat16", "--dtype"), ("noequals", "KEY=VALUE"),
                         ("speculative.num_speculative_tokens=3", "--draft-tokens")]:
        with pytest.raises(AtlasError, match=message):
            parse_vllm_options([bad], None, 1, 1)


# ---- the CLI end to end on the stand-in engine -----------------------------------------------------

RUN = ["measure", "run", "--engine", "vllm", "--workloads", "templated,random", "--draft-tokens", "1,2",
       "--max-new-tokens", "12", "--repeats", "2", "--prompts-per-workload", "1"]


@needs_team
def test_measure_run_engine_vllm_then_import(fake_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # as atlas.cli sets it for torch
    monkeypatch.setenv(omp.SET_BY_ATLAS, "1")
    runner = CliRunner()
    result = runner.invoke(cli, [*RUN, "--temperatures", "0", "--tensor-parallel-size", "1",
                                 "--engine-option", "enforce_eager=true", "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    [path] = (tmp_path / "m").glob("*.json")
    record = read_record(path)
    run = record.engine_run
    assert run is not None and (run.name, run.package, run.version, run.layout) == ("vllm", "vllm", "0.0.0+fake", "qwen3_next")
    assert run.options == {"enforce_eager": True} and run.conversion["norm_shift_exact"] is True
    assert "greedy" in run.draft_sample_method and run.tensor_parallel_size == 1 and record.pass_costs is None
    assert run.engine_args["omp_wait_policy"] is None  # the driver's threads ran without torch's policy, and the record says so
    assert {(c.engine, c.workload, c.draft_tokens) for c in record.cells} == {("vllm", w, k) for w in ("templated", "random") for k in (1, 2)}
    # the same paired gate as our loop's, over vLLM's cells (1 prompt, the sampling unit: too few to decide)
    assert {(g.workload, g.temperature) for g in record.gates} == {("templated", 0.0), ("random", 0.0)}
    assert all(g.verdict == "undecided" and "too few sampling units (1;" in g.reason for g in record.gates)
    assert record.gate_rule == 2 and all(len(r.prompts or []) == 1 for c in record.cells for r in c.repeats)
    for c in record.cells:
        assert c.engine_version == "vllm 0.0.0+fake" and c.derived.greedy_lossless is True
        for r in c.repeats:  # the stand-in's chain: step s accepts s mod (k+1), cut at the end
            assert sum(r.accepted_per_position) + r.verify_passes == r.tokens == 11
    imported = runner.invoke(cli, ["measure", "import", "--db", str(tmp_path / "a.duckdb"), "--dir", str(tmp_path / "m")])
    assert imported.exit_code == 0 and "1 record(s) loaded" in imported.output, imported.output


@needs_team
def test_sequential_schedule_for_models_that_fit_once(fake_engine: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [*RUN, "--temperatures", "0", "--engine-schedule", "sequential", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [path] = tmp_path.glob("*.json")
    record = read_record(path)
    assert record.engine_run.schedule.startswith("one engine at a time") and len(record.cells) == 4
    assert all(c.derived.greedy_lossless for c in record.cells)


@needs_team
def test_counts_that_disagree_are_not_recorded(fake_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_VLLM_MISCOUNT", "1")
    result = CliRunner().invoke(cli, [*RUN, "--temperatures", "0", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "disagree with its counter deltas" in result.output
    assert not list(tmp_path.glob("*.json"))


@needs_team
def test_t_above_zero_from_an_unchecked_engine_is_refused(fake_engine: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [*RUN, "--temperatures", "0,1", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "no T > 0 conformance record for vllm 0.0.0+fake" in result.output
    assert not list(tmp_path.glob("*.json"))


@needs_team
def test_engine_transformers_measures_only_its_generate_pair(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["measure", "run", "--engine", "transformers", "--workloads", "templated", "--temperatures", "0",
                                      "--max-new-tokens", "32", "--repeats", "1", "--prompts-per-workload", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [path] = tmp_path.glob("*.json")
    record = read_record(path)
    assert {(c.engine, c.draft_tokens) for c in record.cells} == {("transformers-use_mtp", 1)}
    assert record.pass_costs is None and record.settings.draft_tokens == [1] and record.engine_run is None
    assert record.gates == [] and "1 cells; no gate: it decides for our loop's or vLLM's cells" in result.output
    result = CliRunner().invoke(cli, ["measure", "run", "--engine", "transformers", "--no-peer"])
    assert result.exit_code == 1 and "leaves nothing to run" in result.output


def test_transformers_rounds_are_counted_like_ours() -> None:
    from atlas.engines.ours.transformers_peer import round_counts

    def counts(emitted: list[int], k: int) -> tuple[list[int], list[int], list[int]]:
        c = round_counts(emitted, k)
        return c.drafted, c.reached, c.accepted

    # 47 decode tokens in 24 passes: 23 accepted one draft, the last had one token left to emit
    assert counts([2] * 23 + [1], 1) == ([23], [23], [23])
    # a rejection mid-run is a drafted, tested, unaccepted position; the final single token is no draft
    assert counts([2, 1, 2, 1], 1) == ([3], [3], [2])
    assert counts([3, 1, 2], 2) == ([3, 2], [3, 1], [2, 1])  # k = 2: the last pass, 2 tokens left, drafts 1
    with pytest.raises(AtlasError, match="not a speculative round"):
        round_counts([3, 1], 1)


# Rounds written as the fate of each drafted position: A accepted, R rejected (tested, failed), - not
# tested (an earlier draft failed). Per prompt, k = 3; each has a full-accept and a zero-accept round,
# one ends on a shortened round (drafts cut near max_new), one on a bonus-only round (nothing drafted).
PROMPT_ROUNDS = [
    ["AAA", "R--", "AR-", "AA"],
    ["R--", "AAA", "AAA", ""],
    ["AAR", "AAA", "R-", "A"],
]


def _independent_counts(prompts: list[list[str]], k: int) -> dict[str, object]:
    """The per-position counts read straight off the written fates, as a reader would tally them."""
    rounds = [r for p in prompts for r in p]
    return {
        "drafted": [sum(len(r) > i for r in rounds) for i in range(k)],
        "reached": [sum(len(r) > i and r[i] in "AR" for r in rounds) for i in range(k)],
        "accepted": [sum(r[i:i + 1] == "A" for r in rounds) for i in range(k)],
        "passes": len(rounds),
        "tokens": sum(r.count("A") + 1 for r in rounds),  # accepted drafts plus the verify pass's own token
    }


def test_round_counts_equal_an_independent_count_over_several_prompts() -> None:
    from atlas.engines.cells import RepeatCounts
    from atlas.decode.generate import RoundCounts, RunStats

    k = 3
    repeat = RepeatCounts()
    for rounds in PROMPT_ROUNDS:
        c = RoundCounts(k)
        for fate in rounds:
            c.observe(len(fate), fate.count("A"))
        decoded = [7] * (c.emitted + 1)  # the first token comes from the prefill
        plain = RunStats(decoded, 1.0, [], [], len(decoded) - 1)
        repeat.add(c.stats(decoded, 0.5), plain)
    got = repeat.repeat(greedy=True)
    want = _independent_counts(PROMPT_ROUNDS, k)
    assert want == {"drafted": [11, 10, 8], "reached": [11, 7, 5], "accepted": [8, 6, 4], "passes": 12, "tokens": 30}
    assert (got.drafted_per_position, got.reached_per_position, got.accepted_per_position) == (
        want["drafted"], want["reached"], want["accepted"])
    assert (got.verify_passes, got.tokens) == (want["passes"], want["tokens"])
    # the record's invariant: every decode token is an accepted draft or a verify pass's own token
    assert sum(got.accepted_per_position) + got.verify_passes == got.tokens


@pytest.mark.parametrize("bad", [(2, 3), (4, 1), (-1, 0)])
def test_a_round_that_cannot_be_is_refused(bad: tuple[int, int]) -> None:
    from atlas.decode.generate import RoundCounts

    with pytest.raises(AtlasError, match="drafts, where at most 3 are drafted per round"):
        RoundCounts(3).observe(*bad)


def test_every_engine_feeds_the_same_round_counts() -> None:
    """The same rounds reach the record alike from our loop's, transformers' and vLLM's reports."""
    from atlas.engines.ours.transformers_peer import round_counts
    from atlas.decode.generate import RoundCounts

    for rounds in PROMPT_ROUNDS:
        ours = RoundCounts(3)
        for fate in rounds:
            ours.observe(len(fate), fate.count("A"))
        n = ours.emitted + 1
        theirs = round_counts([fate.count("A") + 1 for fate in rounds], 3)
        # vLLM drafts a full k every step and reports it; to_run_stats cuts the steps near the end
        vllm = to_run_stats(_result([(3, fate.count("A")) for fate in rounds], n), n)
        for got in (theirs.stats(list(range(n)), 0.5), vllm):
            assert (got.drafted_per_position, got.reached_per_position, got.accepted_per_position, got.verify_passes) == (
                ours.drafted, ours.reached, ours.accepted, ours.rounds)


@needs_team
def test_transformers_peer_and_our_loop_report_the_same_acceptance_on_the_same_rounds() -> None:
    from atlas.decode.checkpoint import load_checkpoint
    from atlas.engines.ours.transformers_peer import Peer
    from atlas.decode.generate import Sampling, generate_speculative
    from atlas.decode.model import build_fused_model

    loaded = load_checkpoint(str(DEFAULT_MODEL), torch.device("cpu"), torch.float32)
    peer = Peer(loaded.model, torch.device("cpu"), loaded.transformers_mtp)
    for text, n in (("def parse(self, text):\n    ", 48), ("Permission is hereby granted, ", 31)):
        prompt = loaded.tokenizer.encode(text, add_special_tokens=False)
        fused = build_fused_model(loaded.model, loaded.mtp, len(prompt) + n + 8, prompt)
        ours = generate_speculative(fused, prompt, n, 1, Sampling(0.0), torch.Generator().manual_seed(0))
        theirs = peer.run(prompt, n, Sampling(0.0), True, seed=0)
        assert theirs.tokens == ours.tokens and theirs.verify_passes == ours.verify_passes, text
        assert (theirs.drafted_per_position, theirs.reached_per_position, theirs.accepted_per_position) == (
            ours.drafted_per_position, ours.reached_per_position, ours.accepted_per_position), text


# Per registered engine, options that do not apply to it and the message each is refused with.
VLLM_ONLY = "need --engine vllm"
REFUSED = [
    *((engine, flags, VLLM_ONLY) for engine in ("atlas", "transformers") for flags in (
        ["--tensor-parallel-size", "2"], ["--pipeline-parallel-size", "2"], ["--engine-option", "enforce_eager=true"],
        ["--engine-python", "/nowhere/python"], ["--engine-schedule", "sequential"])),
    *((engine, ["--device", "tpu"], "--device 'tpu': expected auto, cpu, cuda or cuda:N") for engine in ("atlas", "transformers")),
    ("transformers", ["--no-peer"], "--engine transformers measures transformers' generate pair itself; --no-peer leaves nothing to run"),
    ("vllm", ["--device", "cpu"], "--device and --threads do not apply to --engine vllm"),
    ("vllm", ["--threads", "2"], "--device and --threads do not apply to --engine vllm"),
    ("vllm", ["--draft-vocab", "64"], "--draft-vocab is an option of our loop and llama.cpp; vLLM drafts over the whole vocabulary"),
    *(("llamacpp", flags, "are vLLM's; --engine llamacpp runs one CPU server pair") for flags in (
        ["--tensor-parallel-size", "2"], ["--pipeline-parallel-size", "2"], ["--engine-python", "/nowhere/python"],
        ["--engine-schedule", "sequential"])),
    ("llamacpp", ["--device", "cuda"], "--device and --device-map do not apply to --engine llamacpp"),
    ("llamacpp", ["--dtype", "bfloat16"], "--dtype does not apply to --engine llamacpp"),
    ("llamacpp", ["--engine-option", "enforce_eager=true"], "--engine-option enforce_eager: --engine llamacpp takes gguf, quant"),
    ("llamacpp", ["--engine-option", "repack=maybe"], "--engine-option repack=maybe: expected auto, on or off"),
    ("llamacpp", ["--engine-option", "flash_attn=1"], "--engine-option flash_attn=1: expected auto, on or off"),
    ("llamacpp", ["--engine-option", "parallel=0"], "--engine-option parallel=0: expected a whole number >= 1"),
    ("atlas", ["--engine-option", "repack=off"], VLLM_ONLY),
]


@pytest.fixture
def engines_recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Every registered engine's run replaced by one that records what it was handed: the CLI's
    dispatch and options without loading a model."""
    from atlas.engines import ENGINES
    from test_records import make_record

    calls: list[tuple[str, object]] = []  # (the module whose run was called, its options)
    for module in {engine.module for engine in ENGINES.values()}:  # two engines may share a module (ours)
        def run(options: object, log: object = print, module: str = module) -> tuple[object, Path]:
            calls.append((module, options))
            return make_record(), Path("record.json")
        monkeypatch.setattr(importlib.import_module(module), "run", run)
    return calls


def test_every_registered_engine_is_reachable_from_measure_run(engines_recorded: list[tuple[str, object]]) -> None:
    from atlas.engines import ENGINES
    from atlas.engines.options import LlamacppOptions, VllmOptions

    assert set(ENGINES) == {"atlas", "transformers", "vllm", "llamacpp"}
    extras = {"vllm": ["--engine-option", "enforce_eager=true", "--tensor-parallel-size", "2"],
              "llamacpp": ["--engine-option", "quant=Q8_0", "--engine-option", "repack=off", "--engine-option", "parallel=2",
                           "--engine-option", "flash_attn=off"]}
    for name in ENGINES:
        extra = extras.get(name, [])
        result = CliRunner().invoke(cli, ["measure", "run", "--engine", name, "--draft-tokens", "2,1", "--temperatures", "0",
                                          "--workloads", "code, random", "--seed", "7", "--quick", *extra])
        assert result.exit_code == 0, result.output
        assert "wrote record.json (" in result.output
        got, options = engines_recorded[-1]
        assert got == ENGINES[name].module and options.engine == name
        assert (options.draft_tokens, options.temperatures, options.workloads, options.seed) == ((2, 1), (0.0,), ["code", "random"], 7)
        assert options.quick and options.max_new_tokens == 24 and options.prompts_per_workload == 1
        assert options.peer and options.ours == (name == "atlas")
        assert options.vllm == (VllmOptions(tensor_parallel_size=2, options={"enforce_eager": True}) if name == "vllm" else VllmOptions())
        assert options.llamacpp == (LlamacppOptions(quant="Q8_0", repack="off", parallel=2, flash_attn="off") if name == "llamacpp" else LlamacppOptions())
    assert [options.engine for _, options in engines_recorded] == list(ENGINES)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("engine", "flags", "message"), REFUSED)
def test_each_engine_refuses_what_does_not_apply_before_it_runs(
        engines_recorded: list[tuple[str, object]], engine: str, flags: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["measure", "run", "--engine", engine, *flags])
    assert result.exit_code == 1 and message in result.output, result.output
    assert engines_recorded == []


def test_every_registered_engine_has_its_refusals_listed() -> None:
    from atlas.engines import ENGINES

    assert {engine for engine, _, _ in REFUSED} == set(ENGINES)


# ---- refusal by conformance record ----------------------------------------------------------------


def _record(passed_t1: bool, version: str = "0.32.0") -> conformance.ConformanceRecord:
    def check(t: float, name: str, passed: bool) -> conformance.Check:
        # figures that say what `passed` says (a record whose statistics contradict it is refused),
        # from a sample large enough for a pass to count as lossless (conformance.derive_power)
        figures = {"identity": {"requests": 16, "identical": 16 if passed else 15},
                   "acceptance": {"drafted": 400, "accepted": 400 if passed else 399},
                   "distribution": {"transitions": 1008, "p_value": 0.5 if passed else 0.0, "chi2_p_value": None,
                                    "detectable_nll_shift": 0.33, "power": 0.99}}[name]
        return conformance.Check(layout="qwen3_next", checkpoint="oracle", temperature=t, draft_tokens=1, draft_sampling="greedy",
                                 name=name, passed=passed, summary=f"{name} | <b>x</b>", figures=figures)
    return conformance.ConformanceRecord(
        schema_version=1, run_date="2026-11-30T12:00:00Z", engine="vllm", package="vllm-cpu", version=version,
        hardware="CPU: test", device="cpu", dtype="float32", command="atlas conformance run", seed=0, alpha=1e-4,
        requests=16, max_new_tokens=64,
        checks=[check(0.0, "identity", True), check(0.0, "acceptance", True), check(1.0, "distribution", passed_t1)],
    )


def test_require_conforming(tmp_path: Path) -> None:
    conformance.write_record(_record(passed_t1=False), tmp_path)
    conformance.require_conforming("vllm-cpu", "0.32.0", "qwen3_next", [0.0], "greedy", tmp_path)  # T = 0 only: fine
    with pytest.raises(AtlasError, match=r"refused: the T > 0 conformance verdict for vllm-cpu 0.32.0 on the qwen3_next layout "
                                         r"with greedy drafts is fails"):
        conformance.require_conforming("vllm-cpu", "0.32.0", "qwen3_next", [0.0, 1.0], "greedy", tmp_path)
    with pytest.raises(AtlasError, match="no T > 0 conformance record"):
        conformance.require_conforming("vllm-cpu", "0.32.0", "mimo", [1.0], "greedy", tmp_path)
    with pytest.raises(AtlasError, match="no T > 0 conformance record"):
        conformance.require_conforming("vllm-cpu", "0.32.0", "qwen3_next", [1.0], "probabilistic", tmp_path)
    later = _record(passed_t1=True)
    later.run_date = later.run_date.replace(hour=13)
    conformance.write_record(later, tmp_path)  # the latest record decides
    conformance.require_conforming("vllm-cpu", "0.32.0", "qwen3_next", [1.0], "greedy", tmp_path)
    # a patched build's record never speaks for the release
    patched = _record(passed_t1=False)
    patched.run_date = patched.run_date.replace(hour=14)
    conformance.write_record(patched, tmp_path)
    patched_ok = _record(passed_t1=True)
    patched_ok.run_date = patched_ok.run_date.replace(hour=15)
    patched_ok.patches = [conformance.AppliedPatch(name="expand-kernel-fix", sha256="0" * 64, replaces="x", file="y")]
    conformance.write_record(patched_ok, tmp_path)
    with pytest.raises(AtlasError, match="is fails"):
        conformance.require_conforming("vllm-cpu", "0.32.0", "qwen3_next", [1.0], "greedy", tmp_path)


def test_verdict_table_escapes_and_says_fails(tmp_path: Path) -> None:
    conformance.write_record(_record(passed_t1=False), tmp_path)
    table = conformance_table.evidence_table(conformance.current_verdicts(conformance.load_records(tmp_path)))
    assert "**checked lossless**" in table and "**fails**" in table
    assert "<b>" not in table and "&#124;" in table  # untrusted summary text is escaped
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(AtlasError, match="bad.json: not a valid conformance record"):
        conformance.load_records(tmp_path)


def _check(checkpoint: str, k: int, passed: bool, t: float = 0.0, name: str = "identity") -> conformance.Check:
    # 16 requests x 64 tokens: enough for a pass to count (the power rule has its own tests)
    return conformance.Check(layout="deepseek_v3", checkpoint=checkpoint, temperature=t, draft_tokens=k, draft_sampling="greedy",
                             name=name, passed=passed, summary="s", figures={},
                             power=conformance.Power(sample=1024, unit="tokens", effect=conformance.IDENTITY_RATE, needed=299))


@pytest.mark.parametrize(("random_control", "random_k", "oracle_k", "expected"), [
    (True, True, True, "lossless"),
    (False, True, True, "lossless"),  # a failed control excuses failures; it does not spoil passes
    (True, False, True, "fails"),  # k > 0 differs from a batch-invariant plain engine: the MTP path
    (False, False, True, "inconclusive"),  # the plain engine itself depends on batching there
    (False, False, False, "fails"),  # an oracle check failed with its control passing
])
def test_judge_three_verdicts(random_control: bool, random_k: bool, oracle_k: bool, expected: str) -> None:
    controls = [_check("random", 0, random_control), _check("oracle", 0, True)]
    group = [_check("random", k, random_k) for k in (1, 2)] + [_check("oracle", k, oracle_k) for k in (1, 2)]
    result, reason = conformance.judge(group, controls)
    assert result == expected, reason
    if expected == "inconclusive":
        assert "plain engine failed its own control" in reason and "all 2 checks on the other checkpoint passed" in reason


def test_committed_records_give_the_verdicts_by_rule() -> None:
    """From the committed records, by the rule alone: the latest release record names its cause at
    T > 0, DeepSeek-V3 at T = 0 is inconclusive where its k = 0 engine was not batch-invariant
    (every oracle T = 0 check passed), and the patched build is judged apart from the release."""
    from atlas.paths import project_path

    folder = project_path(conformance.DEFAULT_DIR)
    rows = conformance.verdicts(conformance.latest_records(folder))
    release = [v for v in rows if not v.patched and v.version == "0.32.0"]
    assert {v.result for v in release if v.temperature == "> 0"} == {"fails"}
    assert all(c.id == "vllm-cpu-expand-kernel" and c.status == "present" for v in release if v.temperature == "> 0" for c in v.causes)
    assert all(v.causes for v in release if v.temperature == "> 0")
    # where a release run's plain engine depended on batching (DeepSeek-V3 random, 2026-12-01
    # 09:34; the checkpoint the suite wrote then), T = 0 is inconclusive, not "fails"
    every = conformance.verdicts(conformance.load_records(folder))
    batch_dependent = [v for v in every if not v.patched and (v.layout, v.temperature) == ("deepseek_v3", "0")
                       and "plain engine failed its own control" in v.reason]
    assert batch_dependent and {v.result for v in batch_dependent} == {"inconclusive"}
    patched = [v for v in rows if v.patched and v.package == "vllm-cpu"]
    assert patched and all("expand-kernel-fix" in v.build for v in patched)
    assert all(c.status == "patched" for v in patched for c in v.causes)
    # the positive control: with the defect patched out, every layout passes at T > 0; all but one
    # greedy-draft row with the power to call it lossless (mimo greedy: 714 drafts where 736 are
    # needed); sampled-draft rows inconclusive, as their oracle never rejected a draft (issue 38)
    greedy = [v for v in patched if v.temperature == "> 0" and v.draft_sampling == "greedy"]
    assert {v.result for v in greedy if v.layout != "mimo"} == {"lossless"}
    sampled = [v for v in patched if v.temperature == "> 0" and v.draft_sampling == "probabilistic"]
    assert sampled and all(v.result == "inconclusive" and "target's own law" in v.reason for v in sampled)
    [short] = [v for v in patched if v.temperature == "> 0" and (v.layout, v.draft_sampling) == ("mimo", "greedy")]
    assert short.result == "inconclusive" and "714 of 736 drafts needed" in short.reason
    assert {v.layout for v in patched if v.temperature == "> 0"} == set(conformance.LAYOUTS)
    # and the newest patched record names the patch file in this tree by its hash
    import hashlib

    from atlas.engines.vllm import driver as vllm_driver

    [(_, newest)] = [(p, r) for p, r in conformance.latest_records(folder) if r.patches and r.package == "vllm-cpu"]
    patch_file = Path(vllm_driver.__file__).with_name(vllm_driver.PATCHES["expand-kernel-fix"])
    assert newest.patches[0].sha256 == hashlib.sha256(patch_file.read_bytes()).hexdigest()
    # llama.cpp's build carries its own patches (a cut draft vocabulary, a verify's rows read at once): the
    # patch files in this tree, by their hashes, have records with and without a cut, and every
    # patched build's records are lossless everywhere
    from atlas.engines.llamacpp.build import PATCHES

    carried = {p.name.removesuffix(".patch"): hashlib.sha256(p.read_bytes()).hexdigest() for p in PATCHES}
    llama = [(p, r) for p, r in conformance.latest_records(folder) if r.patches and r.package == "llama.cpp"]
    assert sorted(r.draft_vocab or 0 for _, r in llama if {q.name: q.sha256 for q in r.patches} == carried) == [0, 192]
    assert {v.result for v in conformance.verdicts(llama)} == {"lossless"}


def test_committed_records_load() -> None:
    from atlas.paths import project_path

    rows = conformance.verdicts(conformance.load_records(project_path(conformance.DEFAULT_DIR)))
    assert all(r.package and r.layout for r in rows)


# ---- conformance statistics against simulated samplers ----------------------------------------------


def _bigram(v: int, seed: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = scale * rng.standard_normal((v, v))
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    q_logits = logits + 0.7 * rng.standard_normal((v, v))
    return p, np.exp(q_logits) / np.exp(q_logits).sum(1, keepdims=True)


def _simulate(p: np.ndarray, q: np.ndarray, k: int, greedy: bool, n: int, rng: np.random.Generator, bug: str = ""):
    """One generation of speculative sampling on a first-order target, as a reference engine would
    run it; `bug` plants a known mistake."""
    v = p.shape[0]
    tokens = [int(rng.choice(v, p=p[0]))]
    drafted, accepted = [], []
    while len(tokens) < n:
        c, drafts, qs = tokens[-1], [], []
        for _ in range(k):
            row = np.eye(v)[q[c].argmax()] if greedy else q[c]
            drafts.append(int(rng.choice(v, p=row)))
            qs.append(row)
            c = drafts[-1]
        c, a = tokens[-1], 0
        for d, row in zip(drafts, qs):
            ratio = p[c, d] / row[d] if bug != "squared" else (p[c, d] / row[d]) ** 2
            if rng.random() < min(1.0, ratio):
                a, c = a + 1, d
                continue
            residual = np.clip(p[c] - row, 0, None) if bug != "no-residual" else p[c]
            tokens += drafts[:a] + [int(rng.choice(v, p=residual / residual.sum()))]
            break
        else:
            tokens += drafts + [int(rng.choice(v, p=p[c]))]
        drafted.append(k)
        accepted.append(a)
    return tokens[:n], drafted, accepted


@pytest.mark.parametrize("greedy", [True, False])
def test_statistics_pass_a_correct_sampler_and_catch_planted_bugs(greedy: bool) -> None:
    p, q = _bigram(6, seed=3, scale=1.5)
    k, rng = 2, np.random.default_rng(7)

    def runs(bug: str = "") -> list[tuple[list[int], list[int], list[int]]]:
        return [_simulate(p, q, k, greedy, 120, rng, bug) for _ in range(60)]

    good = runs()
    acc = conformancestats.acceptance_test(p, q, greedy, k, good)
    dist = conformancestats.distribution_test(p, [t for t, _, _ in good])
    assert acc["p_value"] > 1e-3 and dist["p_value"] > 1e-3 and dist["chi2_p_value"] > 1e-3, (acc, dist)
    assert dist["detectable_nll_shift"] < 0.1  # the stated power: 7 000 tokens resolve 0.1 nat/token
    # drawing the correction from p instead of the residual leaves acceptance intact but skews the law
    skewed = runs("no-residual")
    assert conformancestats.distribution_test(p, [t for t, _, _ in skewed])["chi2_p_value"] < conformance.ALPHA
    # a wrong accept test shows in the acceptance check
    squared = runs("squared")
    assert conformancestats.acceptance_test(p, q, greedy, k, squared)["p_value"] < conformance.ALPHA


def test_a_chi_square_p_value_of_zero_fails() -> None:
    base = {"p_value": 0.5, "chi2_p_value": 0.0}
    assert not conformance.distribution_passed(base)
    assert conformance.distribution_passed({**base, "chi2_p_value": None})
    assert not conformance.distribution_passed({**base, "p_value": 0.0, "chi2_p_value": 0.9})


def test_step_starts_and_exact_acceptance_on_an_oracle() -> None:
    assert conformancestats.step_starts([5, 6, 7, 8, 9], [1, 0, 2]) == [5, 7, 8]
    with pytest.raises(AtlasError):
        conformancestats.step_starts([5, 6], [1, 0, 0])
    p, _ = _bigram(5, seed=1, scale=2.0)
    v = conformancestats.prefix_acceptance(p, p, greedy=False, k=3)
    assert np.allclose(v, 1.0)  # q = p: every sampled draft passes
    g = conformancestats.prefix_acceptance(p, p, greedy=True, k=2)
    first = p.max(1)
    assert np.allclose(g[0], first) and np.allclose(g[1], first * first[p.argmax(1)])


# ---- the Mellum -> Qwen3-Next conversion ------------------------------------------------------------


@needs_team
def test_conversion_is_exact(tmp_path: Path) -> None:
    from transformers.models.mellum.modeling_mellum import MellumRMSNorm
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

    conv = convert_mellum(DEFAULT_MODEL, tmp_path)
    assert conv.norm_shift_exact and convert_mellum(DEFAULT_MODEL, tmp_path) == conv  # reused
    src = load_file(DEFAULT_MODEL / "model.safetensors")
    out = load_file(tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == qwen3_next_config(json.loads((DEFAULT_MODEL / "config.json").read_text()))
    assert config["attn_output_gate"] is False and config["partial_rotary_factor"] == 1.0
    assert set(config["layer_types"]) == {"full_attention"} and config["mlp_only_layers"] == list(range(1, 8))
    x = torch.randn(4, 192)
    for name, w in src.items():
        if "norm" in name and w.dim() == 1:
            assert torch.equal(out[name] + 1, w), name
            ours, theirs = MellumRMSNorm(w.shape[0], eps=1e-6), Qwen3NextRMSNorm(w.shape[0], eps=1e-6)
            ours.weight.data, theirs.weight.data = w, out[name]
            xs = x[:, : w.shape[0]]
            assert torch.equal(ours(xs), theirs(xs)), name
        elif ".mlp." in name and name.startswith(("model.layers.0.", "mtp.layers.0.")):
            prefix, _, rest = name.partition(".mlp.")
            assert torch.equal(out[f"{prefix}.mlp.experts.0.{rest}"], w)
        else:
            assert torch.equal(out[name], w), name
    for prefix in ("model.layers.0", "mtp.layers.0"):
        zeros = [k for k in out if k.startswith(f"{prefix}.mlp.") and ("shared_expert" in k or k.endswith("mlp.gate.weight"))]
        assert len(zeros) == 5 and all(not out[k].any() for k in zeros)


def test_conversion_refuses_what_it_cannot_express(tmp_path: Path) -> None:
    config = {"model_type": "mellum", "num_hidden_layers": 2, "num_nextn_predict_layers": 1, "layer_types": ["sliding_attention"] * 2,
              "mlp_layer_types": ["dense"] * 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(AtlasError, match="sliding-window"):
        convert_mellum(tmp_path, tmp_path / "out")
    config.update(layer_types=["full_attention"] * 2, mlp_layer_types=["sparse"] * 2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(AtlasError, match="only dense MLPs"):
        convert_mellum(tmp_path, tmp_path / "out")


def test_a_config_naming_remote_code_is_linked_for_the_engine_with_its_config_rewritten(tmp_path: Path) -> None:
    """MiMo as it ships names remote code (auto_map) under a model_type transformers does not know;
    vLLM would refuse it with remote code off. The engine gets a linked copy whose config drops
    auto_map and reads MiMo on Qwen2's config; the source folder is left as it was."""
    import json

    from atlas.engines.vllm.engine import prepare_checkpoint
    from atlas.checkpoints.oracles import write_checkpoint

    src = write_checkpoint("mimo", tmp_path / "mimo", "random", depth=2)
    before = (src / "config.json").read_bytes()
    assert "auto_map" in json.loads(before)
    served, layout, conversion = prepare_checkpoint(src)
    try:
        config = json.loads((served / "config.json").read_text())
        assert "auto_map" not in config and config["model_type"] == "qwen2" and layout == "mimo"
        assert conversion == {"converter": "config-without-remote-code/1", "source_model_type": "mimo",
                              "removed": ["auto_map"], "model_type": "qwen2"}
        assert (served / "model.safetensors").resolve() == (src / "model.safetensors").resolve()
        assert (src / "config.json").read_bytes() == before
    finally:
        import shutil

        shutil.rmtree(served)
