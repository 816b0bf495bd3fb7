"""The crawler end to end against the local hub server: the real huggingface_hub client, the
bundled mirror, injected faults, hostile repos, an interrupted crawl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from hub_fixtures import (
    DERIVATIVES,
    EXPECTED_DECLARED,
    EXPECTED_TEAM,
    MIRROR,
    TEAM_MODEL,
    copy_mirror,
    rows as query,
    team_model_present,
    write_watchlist,
)

from atlas.hub import crawl as crawler
from atlas.cli import cli
from atlas.hub.local.server import Fault

ALL_ORGS = sorted({r.split("/")[0] for r in EXPECTED_DECLARED} | {"mtp-atlas"})


def run_crawl(tmp_path: Path, hub, watchlist: Path, **kwargs) -> crawler.CrawlSummary:
    return crawler.crawl(
        tmp_path / "atlas.duckdb", watchlist, endpoint=hub.url, endpoint_label="mirror:test", token=False,
        cache_dir=tmp_path / "cache", concurrency=4, progress=False, **kwargs,
    )


def fingerprint_table(db: Path, snapshot_id: int) -> list[tuple]:
    return query(
        db,
        "SELECT repo_id, revision, declared_num_mtp_layers, declared_key, shipped_mtp_layers, shipped_evidence, "
        f"model_type, fetch_status FROM mtp_fingerprints_history WHERE snapshot_id = {snapshot_id} ORDER BY repo_id",
    )


# ---- the bundled mirror -------------------------------------------------------------------------


def test_cli_mirror_crawl_stores_every_bundled_model(tmp_path: Path) -> None:
    db = tmp_path / "atlas.duckdb"
    result = CliRunner().invoke(
        cli, ["crawl", "--db", str(db), "--mirror", str(MIRROR), "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "snapshot 1 (complete)" in result.output and "failed 0" in result.output
    rows = {r[0]: r[1:] for r in query(db, "SELECT repo_id, declared_num_mtp_layers, declared_key, fetch_status, "
                                            "is_derivative, is_exemplar, base_model FROM mtp_fingerprints")}
    for repo_id, (value, key) in EXPECTED_DECLARED.items():
        assert rows[repo_id][:3] == (value, key, "ok"), repo_id
    # _unattributed/ configs are test data, never atlas rows
    assert set(rows) - set(EXPECTED_DECLARED) == {TEAM_MODEL}
    assert {r for r, v in rows.items() if v[3]} == DERIVATIVES
    assert rows["Qwen/Qwen3-32B-FP8"][5] == "Qwen/Qwen3-32B"
    assert {r for r, v in rows.items() if v[4]} == {
        "deepseek-ai/DeepSeek-V3", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "Qwen/Qwen3.5-397B-A17B", TEAM_MODEL,
    }
    team = query(db, f"SELECT declared_num_mtp_layers, declared_key, shipped_mtp_layers, shipped_evidence, "
                     f"fetch_status FROM mtp_fingerprints WHERE repo_id = '{TEAM_MODEL}'")[0]
    if team_model_present():
        assert team == (*EXPECTED_TEAM["declared"], EXPECTED_TEAM["shipped"], EXPECTED_TEAM["evidence"], "ok")
    else:
        assert team[-1] == "missing"
    status = query(db, "SELECT status, endpoint FROM snapshots")
    assert status == [("complete", f"mirror:{MIRROR.as_posix()}")]


def test_second_crawl_makes_no_file_requests_and_keeps_fingerprints(tmp_path: Path, bundled_hub) -> None:
    watch = write_watchlist(tmp_path / "w.toml", ALL_ORGS)
    first = run_crawl(tmp_path, bundled_hub, watch)
    assert (first.fetched, first.unchanged, first.failed) == (len(EXPECTED_DECLARED) + team_model_present(), 0, 0)
    bundled_hub.clear_log()
    second = run_crawl(tmp_path, bundled_hub, watch)
    assert bundled_hub.file_requests() == []
    assert all(r["path"] == "/api/models" for r in bundled_hub.requests)
    assert (second.snapshot_id, second.fetched, second.unchanged) == (2, 0, first.fetched)
    db = tmp_path / "atlas.duckdb"
    assert fingerprint_table(db, 1) == fingerprint_table(db, 2)
    assert query(db, "SELECT count(*) FROM snapshots WHERE status = 'complete'") == [(2,)]


def test_changed_repo_is_the_only_one_refetched(tmp_path: Path, make_hub) -> None:
    repos = ["zai-org/GLM-4.5", "zai-org/GLM-4.5-Air", "zai-org/GLM-5-FP8"]
    mirror = copy_mirror(tmp_path / "m", repos)
    watch = write_watchlist(tmp_path / "w.toml", ["zai-org"])
    run_crawl(tmp_path, make_hub(mirror), watch)
    config = mirror / "zai-org/GLM-4.5/config.json"
    config.write_text(config.read_text().replace('"num_nextn_predict_layers": 1', '"num_nextn_predict_layers": 2'))
    hub = make_hub(mirror)  # reloads the mirror: GLM-4.5 now has a new sha
    summary = run_crawl(tmp_path, hub, watch)
    assert (summary.fetched, summary.unchanged) == (1, 2)
    assert {r["path"].split("/resolve/")[0] for r in hub.file_requests()} == {"/zai-org/GLM-4.5"}
    rows = query(tmp_path / "atlas.duckdb", "SELECT declared_num_mtp_layers FROM mtp_fingerprints WHERE repo_id = 'zai-org/GLM-4.5'")
    assert rows == [(2,)]


def test_pagination_follows_link_headers(tmp_path: Path, make_hub) -> None:
    hub = make_hub(MIRROR, page_size=3)
    summary = run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["Qwen"]))
    qwen = [r for r in EXPECTED_DECLARED if r.startswith("Qwen/")]
    assert summary.listed == len(qwen) == 21
    pages = [r for r in hub.requests if r["path"] == "/api/models" and r["query"] != "limit=1"]  # not the reachability check
    # one listing per pipeline tag, filtered by the server: text-generation 15 repos (5 pages of 3),
    # image-text-to-text 6 (2 pages); each next page is the Link URL, cursor and filters in it
    assert len(pages) == 7
    assert all("pipeline_tag=text-generation" in r["query"] for r in pages[:5])
    assert all("pipeline_tag=image-text-to-text" in r["query"] for r in pages[5:])
    assert ["cursor=" in r["query"] for r in pages] == [False, True, True, True, True, False, True]
    assert all("author=Qwen" in r["query"] and "expand=sha" in r["query"] for r in pages)


# ---- failure modes ------------------------------------------------------------------------------


def test_429_with_retry_after_is_honoured(tmp_path: Path, make_hub, no_sleep: list[float]) -> None:
    hub = make_hub(MIRROR)
    hub.inject(Fault(429, path_contains="/resolve/", times=3, headers={"Retry-After": "7"}))
    summary = run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["zai-org"]))
    assert (summary.fetched, summary.failed) == (3, 0)
    assert summary.rate_limited == 3
    assert max(no_sleep) > 6.5  # waited (about) what the server asked, never really
    assert [r["status"] for r in hub.file_requests()].count(429) == 3


def test_ratelimit_header_pauses_and_model_info_is_retried(tmp_path: Path, make_hub, no_sleep: list[float]) -> None:
    hub = make_hub(MIRROR)
    # model_info (an explicit repo id) has no retry of its own in huggingface_hub: ours does it
    hub.inject(Fault(429, path_contains="/api/models/openai/", times=1, headers={"RateLimit": '"api";r=0;t=5'}))
    watch = write_watchlist(tmp_path / "w.toml", [], repos=["openai/gpt-oss-20b"])
    summary = run_crawl(tmp_path, hub, watch)
    assert (summary.listed, summary.fetched, summary.rate_limited) == (1, 1, 1)
    assert 5.0 in no_sleep


def test_5xx_then_success(tmp_path: Path, make_hub, no_sleep: list[float]) -> None:
    hub = make_hub(MIRROR)
    hub.inject(Fault(503, path_contains="/zai-org/GLM-4.5-Air/resolve/", times=2))
    hub.inject(Fault(500, path_contains="/api/models", times=1))  # the listing retries too
    summary = run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["zai-org"]))
    assert (summary.fetched, summary.failed, summary.status) == (3, 0, "complete")


def test_persistent_5xx_is_a_per_repo_error_and_the_crawl_goes_on(tmp_path: Path, make_hub, no_sleep: list[float]) -> None:
    hub = make_hub(MIRROR)
    hub.inject(Fault(502, path_contains="/zai-org/GLM-4.5-Air/resolve/", times=-1))
    summary = run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["zai-org"]))
    assert (summary.fetched, summary.failed, summary.status) == (2, 1, "complete")
    row = query(tmp_path / "atlas.duckdb", "SELECT fetch_status, error FROM mtp_fingerprints WHERE repo_id = 'zai-org/GLM-4.5-Air'")
    assert row[0][0] == "error" and "502" in row[0][1] and "gave up" in row[0][1]


def test_gated_and_missing(tmp_path: Path, make_hub, no_sleep: list[float]) -> None:
    mirror = copy_mirror(tmp_path / "m", ["zai-org/GLM-4.5", "zai-org/GLM-4.5-Air", "zai-org/GLM-5-FP8"])
    (mirror / "zai-org/GLM-5-FP8/config.json").rename(mirror / "zai-org/GLM-5-FP8/params.json")
    hub = make_hub(mirror)
    hub.gated.add("zai-org/GLM-4.5")  # 401 + X-Error-Code: GatedRepo on every file (no token)
    # the Hub's answer for a private repo without a token: 401 + RepoNotFound, i.e. missing, not gated
    hub.inject(Fault(401, path_contains="/zai-org/GLM-4.5-Air/resolve/", times=1, error_code="RepoNotFound"))
    watch = write_watchlist(tmp_path / "w.toml", ["zai-org"], repos=["zai-org/absent"])
    summary = run_crawl(tmp_path, hub, watch)
    assert (summary.gated, summary.missing, summary.fetched, summary.status) == (1, 3, 0, "complete")
    rows = dict(query(tmp_path / "atlas.duckdb", "SELECT repo_id, fetch_status FROM mtp_fingerprints"))
    assert rows == {"zai-org/GLM-4.5": "gated", "zai-org/GLM-4.5-Air": "missing",
                    "zai-org/GLM-5-FP8": "missing", "zai-org/absent": "missing"}
    errors = dict(query(tmp_path / "atlas.duckdb", "SELECT repo_id, error FROM mtp_fingerprints"))
    assert "401 RepoNotFound" in errors["zai-org/GLM-4.5-Air"] and "401 RepoNotFound" in errors["zai-org/absent"]
    assert "GatedRepo" in errors["zai-org/GLM-4.5"]
    assert [r["status"] for r in hub.requests if r["path"] == "/api/models/zai-org/absent"] == [401]
    # missing config known from the listing's siblings: no request for it
    assert not any("GLM-5-FP8" in r["path"] for r in hub.file_requests())


def test_bad_input_is_a_clear_per_repo_error(tmp_path: Path, make_hub) -> None:
    mirror = tmp_path / "m"
    good = (MIRROR / "zai-org/GLM-4.5/config.json").read_bytes()

    def repo(name: str, **files: bytes) -> None:
        (mirror / "bad" / name).mkdir(parents=True)
        for fname, data in files.items():
            (mirror / "bad" / name / fname.replace("__", ".")).write_bytes(data)

    repo("fine", config__json=good)
    repo("malformed", config__json=b'{"model_type": "glm4_moe",')
    repo("array", config__json=b"[1, 2, 3]")
    repo("huge", config__json=b"{" + b" " * (50 * 1024 * 1024) + b"}")
    repo("latin1", config__json=b'{"model_type": "caf\xe9"}')
    repo("badindex", config__json=good, model__safetensors__index__json=b'{"weight_map": ["a", "b"]}')
    repo("<script>alert(1)<", config__json=good)
    repo("new\nline", config__json=good)
    hostile = json.loads(good)
    hostile.update({"<img src=x onerror=alert(1)>": 1, "model_type": "**bold**\n# h1", "num_nextn_predict_layers": "<b>1</b>"})
    repo("hostile-keys", config__json=json.dumps(hostile).encode())
    hub = make_hub(mirror)
    summary = run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["bad"]))
    assert summary.status == "complete" and summary.listed == 9
    rows = {r[0]: r[1:] for r in query(tmp_path / "atlas.duckdb",
                                       "SELECT repo_id, fetch_status, error, declared_num_mtp_layers FROM mtp_fingerprints")}
    assert rows["bad/fine"] == ("ok", None, 1)
    # a bad side file is reported on its own; the config was read and counts
    badindex = query(tmp_path / "atlas.duckdb", "SELECT fetch_status, error, side_file_error, declared_num_mtp_layers "
                                                "FROM mtp_fingerprints WHERE repo_id = 'bad/badindex'")
    assert badindex == [("ok", None, "model.safetensors.index.json: 'weight_map' is an array, expected an object", 1)]
    expect = {
        "bad/malformed": "config.json: malformed JSON",
        "bad/array": "config.json: JSON an array, expected an object",
        "bad/huge": "config.json: 52,428,802 bytes, over the 8,388,608-byte limit",
        "bad/latin1": "config.json: not UTF-8 text",
        "bad/<script>alert(1)<": "not a valid Hub repo id: 'bad/<script>alert(1)<'",
        "bad/new\nline": "not a valid Hub repo id: 'bad/new\\nline'",
    }
    for repo_id, message in expect.items():
        status, error, _ = rows[repo_id]
        assert status == "error" and error.startswith(message), (repo_id, error)
    status, error, declared = rows["bad/hostile-keys"]
    assert status == "ok" and declared is None and "num_nextn_predict_layers is not a count" in error
    assert query(tmp_path / "atlas.duckdb", "SELECT model_type FROM model_facts WHERE repo_id = 'bad/hostile-keys'") == [(None,)]
    # errors that cannot change at this sha are stored, not asked again
    hub.clear_log()
    run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["bad"]))
    assert hub.file_requests() == []
    assert query(tmp_path / "atlas.duckdb", "SELECT side_file_error FROM mtp_fingerprints "
                                            "WHERE repo_id = 'bad/badindex'") == [(badindex[0][2],)]


def _with_index(tmp_path: Path) -> Path:
    """zai-org's three repos, GLM-4.5 with a weight index naming its MTP layer."""
    mirror = copy_mirror(tmp_path / "m", ["zai-org/GLM-4.5", "zai-org/GLM-4.5-Air", "zai-org/GLM-5-FP8"])
    index = {"weight_map": {"model.norm.weight": "a.safetensors", "model.layers.92.eh_proj.weight": "b.safetensors"}}
    (mirror / "zai-org/GLM-4.5/model.safetensors.index.json").write_text(json.dumps(index))
    return mirror


def test_side_file_that_failed_for_a_while_is_fetched_again(tmp_path: Path, make_hub, no_sleep: list[float]) -> None:
    hub = make_hub(_with_index(tmp_path))
    hub.inject(Fault(503, path_contains="/model.safetensors.index.json", times=-1))
    watch = write_watchlist(tmp_path / "w.toml", ["zai-org"])
    db = tmp_path / "atlas.duckdb"
    first = run_crawl(tmp_path, hub, watch)
    assert (first.fetched, first.failed, first.status) == (3, 0, "complete")
    sql = ("SELECT fetch_status, error, side_file_error, declared_num_mtp_layers, shipped_mtp_layers "
           "FROM mtp_fingerprints WHERE repo_id = 'zai-org/GLM-4.5'")
    ((status, error, side_error, declared, shipped),) = query(db, sql)
    assert (status, error, declared, shipped) == ("ok", None, 1, None)  # its config was read
    assert "503" in side_error and "gave up" in side_error
    assert query(db, "SELECT count(*) FROM file_errors") == [(0,)]  # a passing failure is not kept

    hub.faults.clear()
    hub.clear_log()
    second = run_crawl(tmp_path, hub, watch)
    assert (second.fetched, second.unchanged, second.failed) == (1, 2, 0)
    # only the index is asked for again, not the stored config
    assert {r["path"].rsplit("/", 1)[-1] for r in hub.file_requests()} == {"model.safetensors.index.json"}
    assert query(db, sql) == [("ok", None, None, 1, 1)]


def test_damaged_or_unwritable_header_cache_loses_nothing(tmp_path: Path, make_hub) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    repos = ["Qwen/Qwen3-Next-80B-A3B-Thinking", "Qwen/Qwen3-32B"]
    mirror = copy_mirror(tmp_path / "m", repos)
    for repo_id in repos:
        save_file({"mtp.fc.weight": np.zeros((2, 2), dtype=np.float32)}, str(mirror / repo_id / "model.safetensors"))
    hub = make_hub(mirror)
    headers = tmp_path / "cache" / "atlas-safetensors-headers"
    # a crawl killed while writing the cache left half a file...
    truncated = headers / hub.repos[repos[0]].sha / "Qwen--Qwen3-Next-80B-A3B-Thinking.json"
    truncated.parent.mkdir(parents=True)
    truncated.write_text('["mtp.fc.wei')
    # ...and something unexpected sits where the other repo's entry goes
    (headers / hub.repos[repos[1]].sha / "Qwen--Qwen3-32B.json").mkdir(parents=True)
    summary = run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["Qwen"]))
    assert (summary.status, summary.failed) == ("complete", 0)
    rows = {r[0]: r[1:] for r in query(tmp_path / "atlas.duckdb",
                                       "SELECT repo_id, fetch_status, error, shipped_mtp_layers FROM mtp_fingerprints")}
    assert rows[repos[0]] == ("ok", None, 1)
    assert json.loads(truncated.read_text()) == ["mtp.fc.weight"]
    # the cache could not be written, yet what the crawl read is kept
    assert rows[repos[1]] == ("ok", None, 1)


# ---- token, lock, re-fingerprint ---------------------------------------------------------------


def test_hf_token_is_sent_but_never_stored_or_printed(tmp_path: Path, make_hub, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "hf_canaryTOKEN0123456789"
    monkeypatch.setenv("HF_TOKEN", canary)
    hub = make_hub(MIRROR)
    db = tmp_path / "atlas.duckdb"
    watch = write_watchlist(tmp_path / "w.toml", ["zai-org"])
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--endpoint", hub.url, "--watchlist", str(watch),
                                      "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert canary not in result.output
    assert hub.requests and all(r["auth"] for r in hub.requests if r["query"] != "limit=1")  # not the reachability check
    assert hub.cdn_requests == [] or not any(r["auth"] for r in hub.cdn_requests)
    con = duckdb.connect(str(db), read_only=True)
    cols = con.execute("SELECT table_name, column_name FROM information_schema.columns "
                       "WHERE data_type = 'VARCHAR' AND table_schema = 'main'").fetchall()
    for table, column in cols:
        hits = con.execute(f'SELECT count(*) FROM "{table}" WHERE "{column}" LIKE ?', [f"%{canary}%"]).fetchall()
        assert hits == [(0,)], (table, column)
    con.close()
    assert canary.encode() not in db.read_bytes()


def test_second_concurrent_crawl_gets_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "atlas.duckdb"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys; from atlas.store.db import connect; c = connect({str(db)!r}); "
                               "print('ready', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--mirror", str(MIRROR), "--no-progress"])
        assert result.exit_code == 1
        assert "Error: the atlas store" in result.output and "in use by another process" in result.output
        assert "Traceback" not in result.output
    finally:
        holder.communicate("done\n", timeout=30)


def test_refingerprint_uses_stored_data_only(tmp_path: Path, make_hub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = make_hub(MIRROR)
    run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["deepseek-ai", "Qwen"]))
    hub.stop()  # nothing to talk to: re-fingerprinting must not need the hub
    monkeypatch.setattr(crawler, "RULE_VERSION", "fp-test-next")
    db = tmp_path / "atlas.duckdb"
    before = fingerprint_table(db, 1)
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--refingerprint"])
    assert result.exit_code == 0, result.output
    assert "re-fingerprinted 26 stored configs with rules fp-test-next" in result.output
    assert query(db, "SELECT DISTINCT rule_version FROM fingerprints") == [("fp-test-next",)]
    assert fingerprint_table(db, 1) == before


# ---- interrupted crawl --------------------------------------------------------------------------


def test_interrupted_crawl_leaves_last_snapshot_and_rerun_completes(tmp_path: Path, make_hub) -> None:
    db, cache = tmp_path / "atlas.duckdb", tmp_path / "cache"
    hub = make_hub(MIRROR, latency_s=0.03)
    run_crawl(tmp_path, hub, write_watchlist(tmp_path / "small.toml", ["zai-org"]))
    full = write_watchlist(tmp_path / "full.toml", ALL_ORGS)
    hub.clear_log()
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(tmp_path / "hfhome"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "atlas", "crawl", "--db", str(db), "--endpoint", hub.url, "--watchlist", str(full),
         "--cache-dir", str(cache), "--concurrency", "2", "--no-progress"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while sum(r["method"] == "GET" for r in hub.file_requests()) < 20:
        assert proc.poll() is None, "the crawl finished before it could be interrupted"
        assert time.monotonic() < deadline
        threading.Event().wait(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    fetched_before = {r["path"] for r in hub.file_requests() if r["method"] == "GET" and r["status"] == 200}

    # the store opens, and only the earlier, whole snapshot is there
    assert query(db, "SELECT snapshot_id, status, n_listed FROM snapshots") == [(1, "complete", 3)]
    assert {r[0] for r in query(db, "SELECT repo_id FROM mtp_fingerprints")} == {
        "zai-org/GLM-4.5", "zai-org/GLM-4.5-Air", "zai-org/GLM-5-FP8"}

    hub.clear_log()
    summary = run_crawl(tmp_path, hub, full)
    assert (summary.snapshot_id, summary.status, summary.failed) == (2, "complete", 0)
    assert summary.listed == len(EXPECTED_DECLARED) + team_model_present()
    refetched = {r["path"] for r in hub.file_requests() if r["method"] == "GET"} & fetched_before
    assert len(refetched) <= 2  # at most the downloads in flight when it was killed
    rows = dict(query(db, "SELECT repo_id, declared_num_mtp_layers FROM mtp_fingerprints WHERE fetch_status = 'ok'"))
    assert {r: v for r, v in rows.items() if r != TEAM_MODEL} == {r: v for r, (v, _) in EXPECTED_DECLARED.items()}


def test_watchlist_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "w.toml"
    bad.write_text("orgs = [ { name = 'x' } ]\n")
    result = CliRunner().invoke(cli, ["crawl", "--db", str(tmp_path / "a.duckdb"), "--watchlist", str(bad),
                                      "--endpoint", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "watch list" in result.output and "orgs.0.author" in result.output
    bad.write_text("orgs = [\n")
    result = CliRunner().invoke(cli, ["crawl", "--db", str(tmp_path / "a.duckdb"), "--watchlist", str(bad),
                                      "--endpoint", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "is not valid TOML" in result.output


def test_hub_server_speaks_the_resolve_contract(make_hub) -> None:
    """The headers huggingface_hub needs, checked on the wire (HEAD, Range, errors)."""
    import urllib.error
    import urllib.request

    hub = make_hub(MIRROR)
    sha = hub.repos["zai-org/GLM-4.5"].sha
    req = urllib.request.Request(f"{hub.url}/zai-org/GLM-4.5/resolve/{sha}/config.json", method="HEAD")
    with urllib.request.urlopen(req) as resp:
        assert resp.headers["X-Repo-Commit"] == sha and resp.headers["ETag"].startswith('"')
    req = urllib.request.Request(f"{hub.url}/zai-org/GLM-4.5/resolve/main/config.json", headers={"Range": "bytes=0-9"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 206 and len(resp.read()) == 10
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{hub.url}/zai-org/GLM-4.5/resolve/main/absent.json")
    assert info.value.code == 404 and info.value.headers["X-Error-Code"] == "EntryNotFound"
    assert info.value.headers["X-Repo-Commit"] == sha
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{hub.url}/_unattributed/XiaomiMiMo-MiMo-7B-variant-from-jj8127-mimo_kor/resolve/main/config.json")
    assert info.value.headers["X-Error-Code"] == "RepoNotFound"


def test_single_file_checkpoint_names_come_from_its_header(tmp_path: Path, make_hub) -> None:
    """How the team model is fingerprinted: a single model.safetensors, read with Range requests."""
    import numpy as np
    from safetensors.numpy import save_file

    mirror = copy_mirror(tmp_path / "m", ["Qwen/Qwen3-Next-80B-A3B-Thinking"])
    names = ["model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "model.norm.weight",
             "mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.norm.weight"]
    save_file({n: np.zeros((4, 4), dtype=np.float32) for n in names},
              str(mirror / "Qwen/Qwen3-Next-80B-A3B-Thinking/model.safetensors"))
    hub = make_hub(mirror)
    summary = run_crawl(tmp_path, hub, write_watchlist(tmp_path / "w.toml", ["Qwen"]))
    assert (summary.fetched, summary.failed) == (1, 0)
    row = query(tmp_path / "atlas.duckdb", "SELECT declared_num_mtp_layers, shipped_mtp_layers, shipped_evidence, "
                                           "weight_source FROM mtp_fingerprints")
    assert row == [(None, 1, "mtp.*", "header")]
    weights = [r for r in hub.file_requests() if r["path"].endswith("model.safetensors")]
    assert weights and all(r["method"] == "GET" and r["range"] for r in weights)


# ---- the real Hub's answers, end to end ------------------------------------------------------------


def _repo(mirror: Path, repo_id: str, meta: str = "", **files: bytes) -> None:
    folder = mirror / repo_id
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name.replace("__", ".")).write_bytes(data)
    if meta:
        with open(mirror / "HUB_METADATA.toml", "a") as fh:
            fh.write(f'["{repo_id}"]\n{meta}\n')


GOOD = (MIRROR / "zai-org/GLM-4.5/config.json").read_bytes()


def test_statuses_from_the_hubs_real_answers(tmp_path: Path, make_hub, no_sleep: list[float]) -> None:
    mirror = tmp_path / "m"
    _repo(mirror, "org/open", config__json=GOOD)
    _repo(mirror, "org/gated", 'gated = "manual"', config__json=GOOD)
    _repo(mirror, "org/off", "disabled = true", config__json=GOOD)
    _repo(mirror, "org/secret", "private = true", config__json=GOOD)
    hub = make_hub(mirror)
    watch = write_watchlist(tmp_path / "w.toml", ["org"], repos=["org/secret", "org/never-was"])
    summary = run_crawl(tmp_path, hub, watch)
    rows = {r[0]: r[1:] for r in query(tmp_path / "atlas.duckdb", "SELECT repo_id, fetch_status, error FROM mtp_fingerprints")}
    assert {r: v[0] for r, v in rows.items()} == {
        "org/open": "ok", "org/gated": "gated", "org/off": "disabled", "org/secret": "missing", "org/never-was": "missing",
    }
    assert "401 RepoNotFound" in rows["org/secret"][1]  # private without a token: missing, never "gated"
    assert (summary.gated, summary.missing, summary.fetched, summary.status) == (1, 3, 1, "complete")
    # requests that cannot succeed are not made: nothing for the gated or the disabled repo's files
    assert {r["path"].split("/resolve/")[0] for r in hub.file_requests()} == {"/org/open"}
    # one GET per file (no HEAD), answered by a 307 to the resolve cache on the same host
    assert [(r["method"], r["status"]) for r in hub.file_requests()] == [("GET", 307)]
    assert [r["status"] for r in hub.requests if r["path"].startswith("/api/resolve-cache/")] == [200]
    # only listing-valid expand values were sent to the listing
    listing = [r["query"] for r in hub.requests if r["path"] == "/api/models" and "author=" in r["query"]]
    assert listing and all("baseModels" not in q for q in listing)
    assert all(r["status"] != 400 for r in hub.requests)


def test_gated_repo_with_a_token_is_asked_and_lfs_headers_come_through_the_cdn(tmp_path: Path, make_hub) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    mirror = copy_mirror(tmp_path / "m", ["Qwen/Qwen3-Next-80B-A3B-Thinking"])
    save_file({"mtp.fc.weight": np.zeros((2, 2), dtype=np.float32)},
              str(mirror / "Qwen/Qwen3-Next-80B-A3B-Thinking/model.safetensors"))
    hub = make_hub(mirror)
    hub.gated.add("Qwen/Qwen3-Next-80B-A3B-Thinking")
    hub.granted.add("Qwen/Qwen3-Next-80B-A3B-Thinking")
    db = tmp_path / "atlas.duckdb"
    summary = crawler.crawl(db, write_watchlist(tmp_path / "w.toml", ["Qwen"]), endpoint=hub.url, token="hf_granted",
                            cache_dir=tmp_path / "c", progress=False)
    assert (summary.fetched, summary.failed) == (1, 0)
    assert query(db, "SELECT shipped_mtp_layers FROM mtp_fingerprints") == [(1,)]
    weights = [r for r in hub.file_requests() if r["path"].endswith("model.safetensors")]
    assert [r["status"] for r in weights] == [302] and all(r["auth"] for r in weights)
    assert [(r["status"], r["range"], r["auth"]) for r in hub.cdn_requests] == [(206, "bytes=0-100000", False)]


def test_coverage_filters_on_the_server_and_pages_only_down_to_the_minimum(tmp_path: Path, make_hub) -> None:
    mirror = tmp_path / "m"
    for i in range(12):  # a big mixed org: 12 image models with more downloads than any LLM
        _repo(mirror, f"big/vision-{i:02d}", f'pipeline_tag = "image-classification"\ndownloads = {10_000 + i}',
              config__json=b"{}")
    for i, downloads in enumerate([9000, 800, 700, 50, 40, 30, 20, 10]):
        _repo(mirror, f"big/llm-{i}", f"downloads = {downloads}", config__json=GOOD)
    hub = make_hub(mirror, page_size=2)
    watch = tmp_path / "w.toml"
    watch.write_text('orgs = [{ author = "big", min_downloads = 500, max_models = 5 }]\n'
                     '[defaults]\npipeline_tags = ["text-generation"]\n')
    summary = run_crawl(tmp_path, hub, watch)
    assert summary.listed == 3 and summary.fetched == 3  # top-N by downloads would have kept only images
    [cover] = summary.coverage
    assert (cover.seen, cover.kept, cover.capped) == (4, 3, False)  # stopped at the first under 500
    pages = [r for r in hub.requests if r["path"] == "/api/models" and "author=" in r["query"]]
    assert len(pages) == 2 and all("pipeline_tag=text-generation" in r["query"] for r in pages)
    assert query(tmp_path / "atlas.duckdb", "SELECT n_seen FROM snapshots") == [(4,)]
    lines = list(crawler.iter_summary_lines(summary))
    assert any("4 models seen" in line and "3 kept" in line for line in lines)
    watch.write_text(watch.read_text().replace("max_models = 5", "max_models = 2"))
    [cover] = run_crawl(tmp_path, hub, watch).coverage
    assert (cover.seen, cover.kept, cover.capped) == (2, 2, True)  # said, not silent


def test_no_network_fails_in_seconds_with_one_line_and_no_snapshot(tmp_path: Path) -> None:
    import socket

    db = tmp_path / "atlas.duckdb"
    watch = write_watchlist(tmp_path / "w.toml", ["zai-org"])
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        for endpoint in ("http://127.0.0.1:9", f"http://127.0.0.1:{silent.getsockname()[1]}",
                         "http://no-such-host.invalid"):
            result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--endpoint", endpoint, "--watchlist", str(watch),
                                              "--no-progress"])
            assert result.exit_code == 1, result.output
            [line] = result.output.strip().splitlines()
            assert line.startswith(f"Error: cannot reach {endpoint}") and "make crawl-mirror" in line
            assert "No snapshot was written" in line
            assert not db.exists()  # the store was never opened, let alone locked


def test_something_that_answers_but_not_as_a_hub_fails_before_the_store_is_opened(tmp_path: Path) -> None:
    import http.server

    class Portal(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>Please log in to the Wi-Fi</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    portal = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Portal)
    threading.Thread(target=portal.serve_forever, args=(0.05,), daemon=True).start()
    try:
        db = tmp_path / "atlas.duckdb"
        endpoint = f"http://127.0.0.1:{portal.server_address[1]}"
        result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--endpoint", endpoint, "--no-progress",
                                          "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["zai-org"]))])
    finally:
        portal.shutdown()
        portal.server_close()
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert "HTTP 200 (text/html), not with a Hugging Face Hub model listing" in line and not db.exists()


def test_a_hub_that_stops_answering_midway_ends_the_crawl_without_a_snapshot(tmp_path: Path, make_hub, no_sleep) -> None:
    hub = make_hub(MIRROR)
    hub.inject(Fault(0, path_contains="/resolve/", times=-1))  # status 0: the connection is dropped
    result = CliRunner().invoke(cli, ["crawl", "--db", str(tmp_path / "a.duckdb"), "--endpoint", hub.url,
                                      "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["Qwen"])),
                                      "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert result.exit_code == 1 and "stopped answering" in result.output and "no snapshot written" in result.output
    assert query(tmp_path / "a.duckdb", "SELECT count(*) FROM snapshots") == [(0,)]
    assert len(hub.file_requests()) < 21 * crawler.MAX_ATTEMPTS  # it stopped asking


def test_a_listing_that_gets_no_answer_stops_after_a_few_attempts(tmp_path: Path, make_hub, no_sleep) -> None:
    hub = make_hub(MIRROR)
    hub.inject(Fault(0, path_contains="author=", times=-1))  # the reachability check passes, then silence
    db = tmp_path / "a.duckdb"
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--endpoint", hub.url, "--no-progress",
                                      "--watchlist", str(write_watchlist(tmp_path / "w.toml", ALL_ORGS))])
    assert result.exit_code == 1 and "stopped answering" in result.output
    # the client's own retries count too: no minutes of retrying org after org
    assert len([r for r in hub.requests if "author=" in r["query"]]) == crawler.UNREACHABLE_AFTER
    assert query(db, "SELECT count(*) FROM snapshots") == [(0,)]


def test_partial_snapshot_exits_non_zero_naming_the_org(tmp_path: Path, make_hub, no_sleep) -> None:
    hub = make_hub(MIRROR)
    hub.inject(Fault(503, path_contains="author=openai", times=-1))
    db = tmp_path / "a.duckdb"
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--endpoint", hub.url, "--no-progress",
                                      "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["zai-org", "openai"])),
                                      "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 2
    assert "snapshot 1 (partial)" in result.output and "org 'openai': listing failed: HTTP 503" in result.output
    assert query(db, "SELECT status, n_listed FROM snapshots") == [("partial", 3)]


def test_repos_that_could_not_be_fetched_exit_non_zero_and_are_named(tmp_path: Path, make_hub, no_sleep) -> None:
    hub = make_hub(MIRROR)
    hub.inject(Fault(502, path_contains="/zai-org/GLM-4.5-Air/resolve/", times=-1))
    result = CliRunner().invoke(cli, ["crawl", "--db", str(tmp_path / "a.duckdb"), "--endpoint", hub.url, "--no-progress",
                                      "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["zai-org"])),
                                      "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 2 and "snapshot 1 (complete)" in result.output
    assert "not fetched (a later crawl may get it): zai-org/GLM-4.5-Air: HTTP 502" in result.output


def test_ctrl_c_says_whether_the_snapshot_was_committed(tmp_path: Path, make_hub, monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas.store import db as store

    hub = make_hub(MIRROR)
    db = tmp_path / "a.duckdb"
    args = ["crawl", "--db", str(db), "--endpoint", hub.url, "--no-progress", "--cache-dir", str(tmp_path / "c"),
            "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["zai-org"]))]
    real_write = store.write_snapshot

    def commit_then_interrupt(*a, **k):
        real_write(*a, **k)
        raise KeyboardInterrupt  # Ctrl-C right after the commit, before the crawl could report it

    monkeypatch.setattr(store, "write_snapshot", commit_then_interrupt)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 130 and "after snapshot 1 was committed" in result.output
    assert query(db, "SELECT snapshot_id, status FROM snapshots") == [(1, "complete")]

    def interrupt_before(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "write_snapshot", interrupt_before)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 130 and "no snapshot written" in result.output
    assert query(db, "SELECT count(*) FROM snapshots") == [(1,)]


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "inherited-ignored"])
def test_sigint_during_the_downloads_exits_130(tmp_path: Path, make_hub, inherited: int) -> None:
    """Deterministic: the hub holds every file request after the fifth unanswered, so the signal
    lands while downloads are provably in flight (and hung). A crawl started with SIGINT ignored (a
    background job of a shell without job control, as test runners and CI scripts often are) must
    still stop; so must one whose downloads sit in a read that would only time out after 30 s."""
    hub = make_hub(MIRROR)
    hub.hold_files(after=5)
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(tmp_path / "hfhome"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "atlas", "crawl", "--db", str(tmp_path / "a.duckdb"), "--endpoint", hub.url,
         "--watchlist", str(write_watchlist(tmp_path / "w.toml", ALL_ORGS)), "--cache-dir", str(tmp_path / "c"),
         "--concurrency", "2", "--no-progress"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited),
    )
    try:
        deadline = time.monotonic() + 120
        while hub.held < 2:  # both download threads are stuck on an unanswered request
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the crawl never reached its downloads"
            threading.Event().wait(0.05)
        proc.send_signal(signal.SIGINT)
        try:  # the held requests are still unanswered: exiting must not wait for them (30 s timeout)
            out, err = proc.communicate(timeout=25)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("Ctrl-C did not end a crawl whose downloads hang: " + proc.communicate()[1][-2000:])
    finally:
        hub.release()
    assert proc.returncode == 130, err
    assert "no snapshot written" in err and "Traceback" not in err
    assert query(tmp_path / "a.duckdb", "SELECT count(*) FROM snapshots") == [(0,)]


def test_evidence_refuses_a_store_without_a_complete_snapshot(tmp_path: Path) -> None:
    from atlas.store import db as store

    db = tmp_path / "empty.duckdb"
    store.connect(db).close()
    out = tmp_path / "ev.md"
    result = CliRunner().invoke(cli, ["evidence", "--db", str(db), "--out", str(out)])
    assert result.exit_code == 1 and "has no complete snapshot" in result.output and "atlas crawl" in result.output
    assert not out.exists()


def test_plan_lists_scope_requests_and_durations_without_file_requests(tmp_path: Path, make_hub) -> None:
    hub = make_hub(MIRROR)
    db = tmp_path / "atlas.duckdb"  # where run_crawl writes
    watch = write_watchlist(tmp_path / "w.toml", ["zai-org", "deepseek-ai"], repos=["openai/gpt-oss-20b"])
    result = CliRunner().invoke(cli, ["crawl", "--plan", "--db", str(db), "--endpoint", hub.url, "--watchlist", str(watch)])
    assert result.exit_code == 0, result.output
    assert hub.file_requests() == [] and not db.exists()
    out = result.output
    assert "-> 9 models in scope" in out and "to fetch: 9 new or changed" in out
    assert "resolvers 18" in out  # a config each, 2 requests apiece (the 307 hop)
    for tier in ("anonymous", "free", "pro"):
        assert f"  {tier}" in out
    run_crawl(tmp_path, hub, watch)  # once crawled, the plan knows nothing needs fetching
    hub.clear_log()
    result = CliRunner().invoke(cli, ["crawl", "--plan", "--db", str(db), "--endpoint", hub.url, "--watchlist", str(watch)])
    assert "to fetch: 0 new or changed" in result.output and "resolvers 0" in result.output
    assert hub.file_requests() == []


def test_probe_prints_status_error_code_and_ratelimit(make_hub, tmp_path: Path) -> None:
    hub = make_hub(MIRROR)
    watch = write_watchlist(tmp_path / "w.toml", ["mtp-atlas"], exemplars=[TEAM_MODEL])
    result = CliRunner().invoke(cli, ["crawl", "--probe", "--endpoint", hub.url, "--watchlist", str(watch)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any("expand=baseModels -> 400" in line for line in lines)
    assert any("atlas-probe-no-such-repo -> 401" in line and "X-Error-Code: RepoNotFound" in line for line in lines)
    assert any("config.json -> 307" in line and "/api/resolve-cache/" in line for line in lines)
    assert all('RateLimit: "' in line for line in lines[1:])
    if team_model_present():
        assert any("model.safetensors -> 302" in line and "(another host)" in line for line in lines)


def _can_unshare_network() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.skipif(not _can_unshare_network(), reason="needs `unshare -n` (root or user namespaces) to take the network away")
def test_live_crawl_in_a_network_namespace_without_network(tmp_path: Path) -> None:
    """`atlas crawl` against the real endpoint, as a user with no network would run it."""
    db = tmp_path / "atlas.duckdb"
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    result = subprocess.run(["unshare", "-n", sys.executable, "-m", "atlas", "crawl", "--db", str(db), "--no-progress"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: cannot reach https://huggingface.co") and "crawl-mirror" in line
    assert not db.exists()


class _ForwardProxy:
    """A plain HTTP forward proxy on 127.0.0.1: requests arrive with absolute URIs for a host that
    does not resolve (hub.invalid); it sends each on to the local hub and logs the URI."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import urllib.request
        from urllib.parse import urlsplit

        seen = self.seen = []
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the proxy itself goes direct

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for it
                seen.append(self.path)
                parts = urlsplit(self.path)
                target = upstream.rstrip("/") + parts.path + (f"?{parts.query}" if parts.query else "")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "proxy-connection")}
                try:
                    with direct.open(urllib.request.Request(target, headers=headers), timeout=30) as r:
                        status, body, answer = r.status, r.read(), r.headers
                except urllib.error.HTTPError as err:
                    status, body, answer = err.code, err.read(), err.headers
                self.send_response(status)
                for k, v in answer.items():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        # the hub's absolute links name the host the client asked for
                        self.send_header(k, v.replace(upstream.rstrip("/"), "http://hub.invalid"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_HEAD = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_crawl_goes_through_the_environments_proxy(tmp_path: Path, bundled_hub, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY / HTTPS_PROXY are honoured (the crawl's own transport would otherwise drop them):
    a hub whose name does not resolve is crawled through the proxy, while a hub on this machine's
    loopback (the mirror's server) is reached direct even though no NO_PROXY names it."""
    proxy = _ForwardProxy(bundled_hub.url)
    try:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        watchlist = write_watchlist(tmp_path / "w.toml", ["zai-org"])
        summary = crawler.crawl(tmp_path / "a.duckdb", watchlist, endpoint="http://hub.invalid", token=False,
                                cache_dir=tmp_path / "c1", concurrency=2, progress=False)
        assert summary.fetched > 0 and summary.failed == 0
        assert any("/api/models" in p for p in proxy.seen) and all(p.startswith("http://hub.invalid/") for p in proxy.seen)
        before = len(proxy.seen)
        again = crawler.crawl(tmp_path / "b.duckdb", watchlist, endpoint=bundled_hub.url, token=False,
                              cache_dir=tmp_path / "c2", concurrency=2, progress=False)
        assert again.fetched == summary.fetched and len(proxy.seen) == before
    finally:
        proxy.close()
