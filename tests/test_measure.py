"""The runner and the CLI end to end on the bundled team checkpoint (short horizons), and the
errors a user can hit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hub_fixtures import MIRROR, TEAM_MODEL
from transformers import MellumConfig, MellumForCausalLM

from atlas import AtlasError
from atlas.cli import cli
from atlas.hub.local.server import HubServer, MirrorRepo, load_mirror
from atlas.checkpoints.oracles import write_checkpoint
from atlas.decode.checkpoint import DEFAULT_MODEL, load_checkpoint, resolve
from atlas.records.record import read_record

needs_team = pytest.mark.skipif(not (DEFAULT_MODEL / "config.json").exists(), reason="team checkpoint not built yet")
GATED = "gated-org/byte-mtp-8l"
TINY = ["--workloads", "templated", "--temperatures", "0", "--draft-tokens", "1,2", "--max-new-tokens", "8",
        "--repeats", "1", "--prompts-per-workload", "1", "--no-peer"]


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    """The bundled mirror behind the local hub server (own instance: a test reads its request log),
    plus a gated copy of the team model under its own id, so that no cached download of the team
    model can answer for it."""
    repos = load_mirror(MIRROR)
    if TEAM_MODEL in repos:
        repos[GATED] = MirrorRepo(GATED, dict(repos[TEAM_MODEL].files), {"gated": "manual"})
    with HubServer(repos) as server:
        yield server


@needs_team
def test_run_then_import(tmp_path: Path) -> None:
    out, db = tmp_path / "m", tmp_path / "atlas.duckdb"
    runner = CliRunner()
    result = runner.invoke(cli, [
        "measure", "run", "--workloads", "templated,random", "--temperatures", "0,1", "--draft-tokens", "1,2",
        "--max-new-tokens", "24", "--repeats", "1", "--prompts-per-workload", "1", "--out", str(out),
    ])
    assert result.exit_code == 0, result.output
    [path] = out.glob("*.json")
    record = read_record(path)
    assert record.model_id == "mtp-atlas/byte-mtp-8l" and record.revision.startswith("sha256:")
    engines = {(c.engine, c.workload, c.temperature, c.draft_tokens) for c in record.cells}
    assert ("atlas", "random", 1.0, 2) in engines and ("transformers-use_mtp", "templated", 0.0, 1) in engines
    assert all(c.derived.greedy_lossless for c in record.cells if c.temperature == 0)
    assert all(sum(r.tokens for r in c.repeats) == 23 for c in record.cells)  # decode-phase tokens

    first = runner.invoke(cli, ["measure", "import", "--db", str(db), "--dir", str(out)])
    second = runner.invoke(cli, ["measure", "import", "--db", str(db), "--dir", str(out)])
    assert first.exit_code == 0 and "1 record(s) loaded" in first.output
    assert second.exit_code == 0 and "1 already present" in second.output

    data = json.loads(path.read_text())
    data["cells"][0]["derived"]["acceptance_rate"] = 0.99
    (out / "tampered.json").write_text(json.dumps(data))
    third = runner.invoke(cli, ["measure", "import", "--db", str(db), "--dir", str(out)])
    assert third.exit_code == 1 and "tampered.json" in third.output and "acceptance_rate" in third.output


@pytest.mark.parametrize(("family", "mtp_layers"), [("mimo", 1), ("deepseek_v3", 1), ("deepseek_v3", 2), ("qwen3_next", 1),
                                                   ("deepseek_v32", 1), ("glm_moe_dsa", 1)])
def test_run_measures_a_family_checkpoint_through_the_cli(tmp_path: Path, family: str, mtp_layers: int) -> None:
    """A real-layout oracle checkpoint at a depth no real model has: measured, greedy-lossless, and
    every draft accepted; a DSA family's record states its dense-equivalent regime."""
    folder = write_checkpoint(family, tmp_path / "ckpt", "oracle", depth=4 if family == "qwen3_next" else 3, mtp_layers=mtp_layers)
    result = CliRunner().invoke(cli, ["measure", "run", "--model", str(folder), *TINY, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    [path] = (tmp_path / "out").glob("*.json")
    record = read_record(path)
    assert {c.draft_tokens for c in record.cells} == {1, 2}
    assert all(c.derived.greedy_lossless and c.derived.acceptance_rate == 1.0 for c in record.cells)
    dsa = family in ("deepseek_v32", "glm_moe_dsa")
    assert (record.settings.regime or "").startswith("dense-equivalent DSA: prompt + new tokens - 1 = ") == dsa
    assert dsa == ("keys <= index_topk = 2048" in (record.settings.regime or ""))
    assert dsa or record.settings.regime is None
    # GLM-5 ships no layer-local embedding or head: the record names the target tensors bound in
    # their place, read back from the file; families whose checkpoints carry their own say nothing.
    shared = {f"model.layers.3.{n}": t for n, t in (("shared_head.head.weight", "lm_head.weight"),
                                                     ("embed_tokens.weight", "model.embed_tokens.weight"))}
    assert record.settings.shared_tensors == (shared if family == "glm_moe_dsa" else None)
    assert ("shared_tensors" in json.loads(path.read_text())["settings"]) == (family == "glm_moe_dsa")


def test_a_dsa_run_longer_than_index_topk_is_refused_by_name(tmp_path: Path) -> None:
    folder = write_checkpoint("deepseek_v32", tmp_path / "ckpt", "oracle", depth=2, overrides=dict(index_topk=8))
    result = CliRunner().invoke(cli, ["measure", "run", "--model", str(folder), *TINY, "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "DeepSeek-V3.2: DSA sparse attention: not measured beyond index_topk = 8 keys" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


def test_model_that_is_neither_folder_nor_repo_id() -> None:
    with pytest.raises(AtlasError, match="neither a checkpoint folder nor a hub repo id"):
        resolve("not a repo id", None)


def test_checkpoint_without_mtp_is_refused(tmp_path: Path) -> None:
    config = MellumConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=8, mlp_layer_types=["dense"])
    MellumForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(AtlasError, match="MTP"):
        load_checkpoint(str(tmp_path), torch.device("cpu"), torch.float32)


def test_bad_cli_values() -> None:
    result = CliRunner().invoke(cli, ["measure", "run", "--temperatures", "zero", "--no-peer"])
    assert result.exit_code == 1 and "--temperatures expects comma-separated non-negative numbers" in result.output
    result = CliRunner().invoke(cli, ["measure", "run", "--workloads", "nope", "--no-peer"])
    assert result.exit_code == 1 and "unknown workload" in result.output
    for bad in ("1.5", "2,x", "0"):
        result = CliRunner().invoke(cli, ["measure", "run", "--draft-tokens", bad, "--no-peer"])
        assert result.exit_code == 1 and "--draft-tokens expects" in result.output, bad
    for bad in ("gpu", "cuda:x", "cuda:99" if torch.cuda.is_available() else "cuda"):
        result = CliRunner().invoke(cli, ["measure", "run", "--device", bad, "--no-peer"])
        assert result.exit_code == 1 and "--device" in result.output and "Traceback" not in result.output, bad


def test_default_paths_do_not_depend_on_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an empty folder
    result = CliRunner().invoke(cli, ["measure", "import", "--db", "x.duckdb"])  # default --dir: the project's records
    assert result.exit_code == 0 and "0 rejected" in result.output, result.output
    assert "measurements: 0 record(s) loaded" not in result.output  # (10 record(s) ends with the same words)


@needs_team
def test_run_from_a_hub_repo_id(tmp_path: Path, hub: HubServer) -> None:
    hub.clear_log()
    result = CliRunner().invoke(cli, ["measure", "run", "--model", TEAM_MODEL, "--endpoint", hub.url, *TINY, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [path] = tmp_path.glob("*.json")
    record = read_record(path)
    sha = hub.repos[TEAM_MODEL].sha
    assert record.model_id == TEAM_MODEL and record.revision == sha  # the resolved commit, not "main"
    assert record.cells and all(c.derived.greedy_lossless for c in record.cells)
    fetched = [r["path"] for r in hub.file_requests()]
    assert fetched and all(f"/resolve/{sha}/" in p for p in fetched)  # every file pinned to that commit
    assert not any(p.endswith(("README.md", ".bin", ".pt")) for p in fetched)  # only the allowed patterns


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "mtp-atlas/no-such-model"], "mtp-atlas/no-such-model was not found on"),
    pytest.param(["--model", GATED], f"{GATED} is gated on", marks=needs_team),
    pytest.param(["--model", TEAM_MODEL, "--revision", "v9"], f"{TEAM_MODEL} has no revision 'v9'", marks=needs_team),
    (["--model", "Qwen/Qwen3-8B"], "Qwen/Qwen3-8B has no safetensors weights"),
])
def test_hub_repo_id_errors(tmp_path: Path, hub: HubServer, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["measure", "run", *args, "--endpoint", hub.url, *TINY, "--out", str(tmp_path)])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.json"))


@needs_team
@pytest.mark.parametrize("use_mtp", [False, True], ids=["plain", "use_mtp"])
def test_the_peer_times_the_decode_phase_only(monkeypatch: pytest.MonkeyPatch, use_mtp: bool) -> None:
    """On a clock that ticks once per main-model decode forward and by a random amount per prefill
    (a busy machine's noise), transformers' decode phase lasts exactly its forwards after the
    prefill: the prefill (and use_mtp's MTP load before it) never leaks in, and no run can come out
    shorter than nothing, as one did when a separately timed 1-token call was subtracted."""
    import random

    from atlas.decode import generate
    from atlas.engines.ours.transformers_peer import Peer

    loaded = load_checkpoint(str(DEFAULT_MODEL), torch.device("cpu"), torch.float32)
    prompt = loaded.tokenizer("The cat sat on the")["input_ids"]
    clock, noise = {"now": 0.0}, random.Random(0)

    def tick(module: object, args: tuple, kwargs: dict, output: object) -> None:
        prefill = kwargs["input_ids"].shape[1] == len(prompt)
        clock["now"] += noise.uniform(0.0, 50.0) if prefill else 1.0

    monkeypatch.setattr(generate.time, "perf_counter", lambda: clock["now"])
    loaded.model.register_forward_hook(tick, with_kwargs=True)
    peer = Peer(loaded.model, torch.device("cpu"))
    for n in (5, 12):
        stats = peer.run(prompt, n, generate.Sampling(0.0, None, None), use_mtp, seed=0)
        assert len(stats.tokens) == n and stats.verify_passes == peer.forwards - 1
        assert stats.seconds == float(stats.verify_passes)
