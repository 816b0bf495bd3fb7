"""Hostile hubs, proxies and disks against the crawl and the store, one test per class of defect
(issue 14 §1): answers that never end, waits of 31 years, listings without end, a token echoed
back, validators that let a trailing newline through, a malformed config that every crawl retried,
a damaged store, a full or read-only disk, hard links out of the mirror, a listing quadratic in
the mirror's size. Each is real HTTP through huggingface_hub to the local hub on 127.0.0.1, with
bounds made small so that nothing waits long; the outcomes are asserted, not the durations."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from hub_fixtures import (EXPECTED_DECLARED, GOOD, MIRROR, build_mirror, config, copy_mirror, rows,
                          write_watchlist)
from huggingface_hub.hf_api import ModelInfo

from atlas.fingerprints import rules as fingerprints
from atlas.store import db as store
from atlas.cli import cli
from atlas.fingerprints.rules import fingerprint
from atlas.hub import crawl as crawler
from atlas.hub import pacing, redact
from atlas.hub.local import server as hubserver
from atlas.hub.crawl import Bounds, ListingGuard
from atlas.hub.pacing import GaveUp
from atlas.hub.local.server import Fault, load_mirror

ROOT = Path(__file__).resolve().parents[1]
CANARY = "hf_canaryTOKENhostile0123456789"


def run(tmp_path: Path, hub, orgs: list[str], bounds: Bounds | None = None, concurrency: int = 4,
        **watch) -> crawler.CrawlSummary:
    return crawler.crawl(tmp_path / "atlas.duckdb", write_watchlist(tmp_path / "w.toml", orgs, **watch),
                         endpoint=hub.url, token=False, cache_dir=tmp_path / "cache", concurrency=concurrency,
                         progress=False, bounds=bounds)


def cli_crawl(tmp_path: Path, hub, orgs: list[str], db: Path | None = None, **watch):
    return CliRunner().invoke(cli, [
        "crawl", "--db", str(db or tmp_path / "atlas.duckdb"), "--endpoint", hub.url, "--no-progress",
        "--cache-dir", str(tmp_path / "cache"), "--watchlist", str(write_watchlist(tmp_path / "w.toml", orgs, **watch)),
    ])


def one_clear_line(result, *needles: str) -> str:
    """The command ended by itself (no exception escaped it) with exit 1 and one line naming the cause."""
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (result.exception, result.output)
    [line] = result.output.strip().splitlines()
    assert line.startswith("Error: ") and "Traceback" not in line
    for needle in needles:
        assert needle in line, line
    return line


# ---- hangs: every wait has a bound ---------------------------------------------------------------


def test_answers_sent_a_byte_at_a_time_are_given_up_at_the_deadline(tmp_path: Path, make_hub, monkeypatch) -> None:
    hub = make_hub(build_mirror(tmp_path / "m", {"h/fine": {"config.json": config()}, "h/slow-body": {"config.json": config()},
                                          "h/slow-head": {"config.json": config()}, "s/listed": {"config.json": config()}},
                         '["h/fine"]\ndownloads = 3\n["h/slow-body"]\ndownloads = 2\n["h/slow-head"]\ndownloads = 1\n'))
    # each read comes well inside the client's per-read timeout; only the whole answer is late
    hub.inject(Fault(200, path_contains="/api/resolve-cache/models/h/slow-body/", times=-1, drip_s=0.05))
    hub.inject(Fault(200, path_contains="/h/slow-head/resolve/", times=-1, drip_s=0.05, drip_headers=True))
    hub.inject(Fault(200, path_contains="author=s", times=-1, drip_s=0.05))  # a listing page too
    monkeypatch.setattr(crawler, "DEFAULT_BOUNDS", Bounds(request_s=1.0))
    result = cli_crawl(tmp_path, hub, ["h", "s"])
    assert result.exit_code == 2, result.output
    out = result.output
    for repo_id in ("h/slow-body", "h/slow-head"):
        assert f"gave up on {repo_id}: no whole answer within 1 s (the server sends too slowly)" in out
    assert "gave up on listing org 's': no whole answer within 1 s" in out
    db = tmp_path / "atlas.duckdb"
    assert rows(db, "SELECT repo_id, fetch_status FROM hub_models ORDER BY repo_id") == [
        ("h/fine", "ok"), ("h/slow-body", "error"), ("h/slow-head", "error")]
    assert rows(db, "SELECT status FROM snapshots") == [("partial",)]
    # nothing was given up for good: without the faults the next crawl gets them all
    hub.faults.clear()
    again = cli_crawl(tmp_path, hub, ["h", "s"])
    assert again.exit_code == 0, again.output
    assert rows(db, "SELECT count(*) FROM mtp_fingerprints WHERE fetch_status = 'ok'") == [(4,)]


@pytest.mark.parametrize("asked", [
    {"Retry-After": "999999999"},
    {"RateLimit": '"resolvers";r=0;t=999999999'},
    {"Retry-After": "9" * 40},  # huggingface_hub would read this one too
])
def test_waits_the_hub_asks_beyond_the_bound_give_up_instead_of_sleeping(tmp_path: Path, make_hub, no_sleep: list[float],
                                                                           asked: dict[str, str]) -> None:
    hub = make_hub(build_mirror(tmp_path / "m", {"h/fine": {"config.json": config()}, "h/limited": {"config.json": config()},
                                          "h/later": {"config.json": config()}, "w/a": {"config.json": config()},
                                          "w/b": {"config.json": config()}, "w/c": {"config.json": config()}},
                         '["h/fine"]\ndownloads = 3\n["h/limited"]\ndownloads = 2\n["h/later"]\ndownloads = 1\n'),
                   page_size=2)
    hub.inject(Fault(429, path_contains="/h/limited/resolve/", headers=asked))
    # a served listing page whose window is spent for 31 years: the next page is never asked for
    hub.inject(Fault(200, path_contains="author=w", headers={"RateLimit": '"api";r=0;t=999999999'}))
    summary = run(tmp_path, hub, ["h", "w"], Bounds(wait_s=600), concurrency=1)
    assert all(w <= 600 for w in no_sleep), no_sleep  # nothing asked for a 31-year sleep, ours or the client's
    lines = list(crawler.iter_summary_lines(summary))
    assert summary.status == "partial"
    assert any(re.fullmatch(r"problem: gave up on listing org 'w': the hub asked to wait 999,999,99\d s for the reset "
                            r"of its api window, over the 600 s this crawl waits at most; gave up on this request", x)
               for x in lines), lines
    limited = next(x for x in lines if x.startswith("gave up on h/limited: "))
    assert "over the 600 s this crawl waits at most" in limited and ("forever" in limited or "999,999,99" in limited)
    # the server closed its resolvers window: the repo after it gives up at once too, and says why
    assert any(x.startswith("gave up on h/later: the hub asked to wait") for x in lines), lines
    status = dict(rows(tmp_path / "atlas.duckdb", "SELECT repo_id, fetch_status FROM hub_models"))
    assert status == {"h/fine": "ok", "h/limited": "error", "h/later": "error"}


def test_listings_without_end_are_given_up_by_name(tmp_path: Path, make_hub) -> None:
    hub = make_hub(build_mirror(tmp_path / "m", {"h/fine": {"config.json": config()}, "same/one": {"config.json": config()}}))
    hub.inject(Fault(200, path_contains="author=empty", times=-1, listing="empty"))  # the reviewer's case
    hub.inject(Fault(200, path_contains="author=same", times=-1, listing="same"))
    hub.inject(Fault(200, path_contains="author=junk", times=-1, listing="junk"))  # new models, none kept
    summary = run(tmp_path, hub, ["h", "empty", "same", "junk"], Bounds(listing_pages=5))
    assert summary.status == "partial" and summary.listed == 1
    assert summary.problems == [
        "gave up on listing org 'empty': page 1 brought no model not already listed, yet links to a next page",
        "gave up on listing org 'same': page 2 brought no model not already listed, yet links to a next page",
        "gave up on listing org 'junk': still more pages after 5, the most one listing may have",
    ]
    pages = [r for r in hub.requests if "author=junk" in r["query"]]
    assert len(pages) == 5  # every listing attempt stopped at its bound; none was retried


def test_a_listing_has_a_deadline_and_a_repeated_cursor_ends_it() -> None:
    now = [0.0]
    guard = ListingGuard(Bounds(listing_s=10.0), clock=lambda: now[0])
    for page in range(3):
        guard.page(f"https://hub/api/models?author=org&cursor={page}")
        guard.item(f"org/m{page}")
        guard.page(f"https://hub/api/models?author=org&cursor={page}")  # a retry of an unanswered page
        guard.answered(200)
    now[0] = 11.0
    with pytest.raises(GaveUp, match="still listing after 10 s \\(3 pages\\)"):
        guard.page("https://hub/api/models?author=org&cursor=3")
    guard = ListingGuard(Bounds())
    guard.page("https://hub/api/models?author=org&cursor=a")
    guard.item("org/x")
    guard.answered(200)
    with pytest.raises(GaveUp, match="links back to a page already listed"):
        guard.page("https://hub/api/models?author=org&cursor=a")


# ---- secrets: the token never lands in the store or the output -------------------------------------


def test_a_token_echoed_by_the_hub_is_never_stored_or_shown(tmp_path: Path, make_hub, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", CANARY)
    mirror = build_mirror(tmp_path / "m", {
        "h/fine": {"config.json": config()},
        "h/forbidden": {"config.json": config()},
        "h/echo-file": {"config.json": config(note=f"Authorization: Bearer {CANARY}")},  # a proxy rewrote the file
        "h/echo-tags": {"config.json": config()},
    }, f'["h/echo-tags"]\ntags = ["{CANARY}", "Bearer {CANARY}"]\nlibrary_name = "{CANARY}"\n')
    hub = make_hub(mirror, echo_headers=True)  # every error answer quotes the request's headers
    hub.inject(Fault(403, path_contains="/h/forbidden/resolve/", times=-1))
    hub.inject(Fault(400, path_contains="author=x", times=-1))
    hub.inject(Fault(409, path_contains="/api/models/h/explicit", times=-1))
    result = cli_crawl(tmp_path, hub, ["h", "x"], repos=["h/explicit"])
    assert result.exit_code == 2, result.output
    db = tmp_path / "atlas.duckdb"
    errors = dict(rows(db, "SELECT repo_id, error FROM hub_models WHERE error IS NOT NULL"))
    # the echo did reach the crawl (so the scrubbing is what kept the token out)
    assert "Authorization: Bearer [token hidden]" in errors["h/forbidden"] and "HTTP 403" in errors["h/forbidden"]
    assert "[token hidden]" in errors["h/explicit"]
    assert "[token hidden]" in rows(db, "SELECT problems FROM snapshots")[0][0]
    assert "[token hidden]" in result.output
    # nowhere in the store: every text column of every table, and the file's bytes
    with duckdb.connect(str(db), read_only=True) as con:
        for table, column in con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                         "WHERE table_schema = 'main'").fetchall():
            hits = con.execute(f'SELECT count(*) FROM "{table}" WHERE CAST("{column}" AS VARCHAR) LIKE ?',
                               [f"%{CANARY}%"]).fetchall()
            assert hits == [(0,)], (table, column)
    assert CANARY.encode() not in db.read_bytes()
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert CANARY not in result.output and CANARY not in (result.stderr or "")
    # credentials no one registered are hidden in their header forms; ordinary words are not
    for form in ("Authorization: Bearer hf_unregistered0123", "{'authorization': 'Bearer abc.def'}",
                 "authorization=hf_unregistered0123", "Authorization: token hf_unregistered0123"):
        assert "unregistered" not in redact.text(form) and "abc.def" not in redact.text(form), form
        assert redact.text(redact.text(form)) == redact.text(form)
    assert redact.text("needs a token of an account with access") == "needs a token of an account with access"
    # an error that ends the crawl (every listing failed) is scrubbed as it is printed
    failed = cli_crawl(tmp_path, hub, ["x"], db=tmp_path / "other.duckdb")
    line = one_clear_line(failed, "no listing of", "[token hidden]")
    assert CANARY not in line


# ---- silently wrong --------------------------------------------------------------------------------


def test_no_anchored_validator_lets_a_trailing_newline_through(tmp_path: Path, make_hub) -> None:
    # the class: no pattern of these modules is anchored with `$` (which matches before a final "\n")
    for module in (crawler, hubserver, fingerprints, pacing, redact, store):
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                assert not value.pattern.endswith("$"), (module.__name__, name, value.pattern)
    # each validator, by its behaviour
    fp = fingerprint({**GOOD, "model_type": "deepseek_v3\n", "architectures": ["DeepseekV3ForCausalLM\n"],
                      "torch_dtype": "bfloat16\n"})
    assert not {"model_type", "architectures", "torch_dtype"} & set(fp.facts)
    assert "model_type has an unusable value" in "; ".join(fp.warnings)
    listed = crawler.to_listed(ModelInfo(id="h/m", sha="a" * 40 + "\n"), set())
    assert listed.sha is None and "malformed commit sha" in listed.row.error
    with pytest.raises(crawler.RepoProblem, match="not a valid Hub repo id") as bad_id:
        crawler.fetch_repo(None, crawler.to_listed(ModelInfo(id="h/m\n", sha="a" * 40), set()))  # type: ignore[arg-type]
    assert bad_id.value.permanent
    assert hubserver._RANGE.fullmatch("bytes=0-1\n") is None and hubserver._parse_range("bytes=0-1", 10) == (0, 2)
    # end to end: "deepseek_v3\n" is refused by name, not a second family beside "deepseek_v3"
    hub = make_hub(build_mirror(tmp_path / "m", {"h/plain": {"config.json": config(model_type="deepseek_v3")},
                                          "h/newline": {"config.json": config(model_type="deepseek_v3\n")}}))
    run(tmp_path, hub, ["h"], repos=["h/other\\n"])  # TOML's escape: the id ends in a newline
    db = tmp_path / "atlas.duckdb"
    assert rows(db, "SELECT DISTINCT model_type FROM model_facts WHERE model_type IS NOT NULL") == [("deepseek_v3",)]
    [(error,)] = rows(db, "SELECT error FROM mtp_fingerprints WHERE repo_id = 'h/newline'")
    assert "model_type has an unusable value" in error
    [(status, error)] = rows(db, "SELECT fetch_status, error FROM hub_models WHERE repo_id LIKE 'h/other%'")
    assert status == "error" and "not a valid Hub repo id: 'h/other\\n'" in error


def test_a_malformed_config_is_a_permanent_error_and_later_crawls_exit_0(tmp_path: Path, make_hub) -> None:
    hub = make_hub(build_mirror(tmp_path / "m", {"h/fine": {"config.json": config()},
                                          "h/malformed": {"config.json": b'{"model_type": "glm4_moe",'},
                                          "h/array": {"config.json": b"[1]"},
                                          "h/latin1": {"config.json": b'{"model_type": "caf\xe9"}'}}))
    for attempt in range(2):
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)  # not the cache: the error itself is permanent
        result = cli_crawl(tmp_path, hub, ["h"])
        assert result.exit_code == 0, (attempt, result.output)
        assert "later crawl may get it" not in result.output
    errors = dict(rows(tmp_path / "atlas.duckdb", "SELECT repo_id, error FROM mtp_fingerprints WHERE error IS NOT NULL"))
    assert set(errors) == {"h/malformed", "h/array", "h/latin1"}
    assert all("a malformed config at this sha" in e for e in errors.values()), errors
    assert errors["h/malformed"].startswith("config.json: malformed JSON")


# ---- faults under the store --------------------------------------------------------------------------


def test_a_store_with_a_damaged_block_is_one_clear_line(tmp_path: Path, make_hub) -> None:
    hub = make_hub(MIRROR)
    good = tmp_path / "good.duckdb"  # the bundled mirror: a store of several data blocks
    assert cli_crawl(tmp_path, hub, sorted({r.split("/")[0] for r in EXPECTED_DECLARED}), db=good).exit_code == 0
    write_watchlist(tmp_path / "w.toml", ["zai-org"])
    block, headers = 256 * 1024, 12 * 1024  # DuckDB's block size, after the file's three 4 KiB headers
    damaged: list[str] = []
    for offset in range(headers + 4096, good.stat().st_size, block):  # 4 KiB into each block
        db = tmp_path / f"bad-{offset}.duckdb"
        shutil.copy(good, db)
        with open(db, "r+b") as fh:  # garbage in the middle of one data block
            fh.seek(offset)
            fh.write(b"\xde\xad\xbe\xef" * 1024)
        for args in (["crawl", "--db", str(db), "--refingerprint"],
                     ["crawl", "--db", str(db), "--endpoint", hub.url, "--no-progress", "--cache-dir", str(tmp_path / "c"),
                      "--watchlist", str(tmp_path / "w.toml")]):
            result = CliRunner().invoke(cli, args)
            if result.exit_code == 0:
                continue  # a block no query reads
            damaged.append(one_clear_line(result, str(db)))
    assert any("is damaged or not an atlas store (Corrupt database file" in line for line in damaged), damaged


class _FullDiskAtCommit:
    """A connection whose COMMIT fails as DuckDB's does on a full disk: the transaction is already
    rolled back when the error comes, so a ROLLBACK after it is refused."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def execute(self, sql: str, *args):
        if sql == "COMMIT":
            self._con.execute("ROLLBACK")
            raise duckdb.IOException('Could not write file "atlas.duckdb.wal": No space left on device')
        return self._con.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._con, name)


NAMESPACE_DRIVER = textwrap.dedent('''
    import json, os, subprocess, sys
    from pathlib import Path
    disk, work, url = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    def crawl(db):
        p = subprocess.run([sys.executable, "-m", "atlas", "crawl", "--db", str(db), "--endpoint", url, "--no-progress",
                            "--cache-dir", str(work / "cache"), "--watchlist", str(work / "w.toml")],
                           capture_output=True, text=True)
        return [p.returncode, p.stdout + p.stderr]
    out = {"first": crawl(disk / "atlas.duckdb")}
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\\0" * 65536)
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"\\0" * 512)
    except OSError:
        os.close(fd)
    out["full"] = crawl(disk / "atlas.duckdb")  # the store opens; its snapshot's commit meets the full disk
    out["new_store"] = crawl(disk / "new.duckdb")
    os.unlink(disk / "filler")
    import duckdb
    con = duckdb.connect(str(disk / "atlas.duckdb"), read_only=True)
    out["snapshots"] = con.execute("SELECT snapshot_id, status FROM snapshots").fetchall()
    con.close()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    out["read_only_folder"] = crawl(disk / "sub" / "atlas.duckdb")
    out["read_only_file"] = crawl(disk / "ro.duckdb")
    print(json.dumps(out))
''')


def _in_a_tiny_tmpfs(work: Path, hub, orgs: list[str], size: str) -> dict | None:
    """Run NAMESPACE_DRIVER on a real tmpfs of `size` in a user + mount namespace (no root
    needed, nothing mounted outside it); None where this machine allows no such namespace."""
    disk = work / "disk"
    disk.mkdir(parents=True)
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=64k tmpfs "{disk}"'], capture_output=True)
    if probe.returncode != 0:
        return None
    write_watchlist(work / "w.toml", orgs)
    (work / "driver.py").write_text(NAMESPACE_DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "{disk}" && '
                           f'exec "{sys.executable}" "{work / "driver.py"}" "{disk}" "{work}" "{hub.url}"'],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_full_or_read_only_disk_is_named_and_the_snapshots_stay_whole(tmp_path: Path, make_hub, monkeypatch) -> None:
    hub = make_hub(copy_mirror(tmp_path / "m", ["zai-org/GLM-4.5", "zai-org/GLM-4.5-Air", "zai-org/GLM-5-FP8"]))
    db = tmp_path / "atlas.duckdb"
    assert cli_crawl(tmp_path, hub, ["zai-org"]).exit_code == 0
    # at the DuckDB boundary (every machine): a COMMIT refused for lack of space
    real_connect = store.connect
    monkeypatch.setattr(store, "connect", lambda *a, **k: _FullDiskAtCommit(real_connect(*a, **k)))
    line = one_clear_line(cli_crawl(tmp_path, hub, ["zai-org"]), f"the disk holding the atlas store {db} is full",
                          "No space left on device", "the snapshots already in the store are intact")
    assert "rollback" not in line.lower()
    monkeypatch.undo()
    assert rows(db, "SELECT snapshot_id, status FROM snapshots") == [(1, "complete")]
    # a folder that cannot be made (as on a read-only file system)
    real_mkdir = Path.mkdir

    def read_only(self: Path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    one_clear_line(cli_crawl(tmp_path, hub, ["zai-org"], db=tmp_path / "ro" / "a.duckdb"),
                   f"cannot create the folder {tmp_path / 'ro'} for the atlas store: Read-only file system")
    monkeypatch.setattr(Path, "mkdir", real_mkdir)
    # and on real file systems, where this machine allows a mount namespace
    real = _in_a_tiny_tmpfs(tmp_path / "ns", hub, ["zai-org"], "6m")
    if real is None:
        pytest.skip("no user + mount namespace here: the real full and read-only disks were not tried")
    assert real["first"][0] == 0, real["first"]
    for case in ("full", "new_store"):
        code, text = real[case]
        assert code == 1 and "is full" in text and "No space left on device" in text, (case, text)
        assert "Traceback" not in text and "damaged" not in text and "rollback" not in text.lower(), (case, text)
    assert real["snapshots"] == [[1, "complete"]]
    code, text = real["read_only_folder"]
    assert code == 1 and "cannot create the folder" in text and "Read-only file system" in text and "Traceback" not in text
    code, text = real["read_only_file"]
    assert code == 1 and "read-only file system" in text.lower() and "Traceback" not in text


# ---- the local hub -----------------------------------------------------------------------------------


def test_hard_links_from_outside_the_mirror_are_never_served(tmp_path: Path, make_hub) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"password": "hunter2"}')
    mirror = build_mirror(tmp_path / "m", {"org/m": {"config.json": config()}, "org/twin": {}})
    os.link(secret, mirror / "org/m/leak.json")  # a file of the host, hard-linked into the mirror
    os.link(mirror / "org/m/config.json", mirror / "org/twin/config.json")  # both names inside: fine
    repos = load_mirror(mirror)
    assert set(repos["org/m"].files) == {"config.json"} and set(repos["org/twin"].files) == {"config.json"}
    hub = make_hub(mirror)
    summary = run(tmp_path, hub, ["org"])
    assert (summary.fetched, summary.failed) == (2, 0)
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download("org/m", "leak.json", endpoint=hub.url, token=False, cache_dir=tmp_path / "hf")
    assert not any("hunter2" in (c or "") for (c,) in rows(tmp_path / "atlas.duckdb", "SELECT content FROM raw_files"))


def test_paging_through_a_listing_reads_each_repo_once_not_once_per_page(tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import HfApi

    repos = {f"org{k}/m{i:03d}": hubserver.MirrorRepo(f"org{k}/m{i:03d}", {"config.json": config()}, {"downloads": i})
             for k in range(2) for i in range(60)}
    calls: list[str] = []
    real = hubserver._pipeline_tag
    monkeypatch.setattr(hubserver, "_pipeline_tag", lambda repo: calls.append(repo.repo_id) or real(repo))
    with hubserver.HubServer(repos, page_size=5) as hub:
        api = HfApi(endpoint=hub.url, token=False)
        for k in range(2):
            listed = list(api.list_models(author=f"org{k}", pipeline_tag="text-generation", sort="downloads",
                                          expand=list(crawler.LISTING_EXPAND)))
            assert [m.id for m in listed] == [f"org{k}/m{i:03d}" for i in reversed(range(60))]
    # once to filter each org's listing, once to serve each model: 2 x 120, where paging 12 pages
    # of 5 through a fresh filter per page cost 12 x 60 per org (quadratic in the mirror's size)
    assert len(calls) == 2 * len(repos), len(calls)
