"""A hostile corpus of our own: repos, files and values built to hurt a crawl. Each must become that
repo's own error (or a dropped value with a note) while every other repo is kept, and nothing may
break a query over the whole store. Crawled through the local hub with the real client."""

from __future__ import annotations

import errno
import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_fixtures import GOOD, build_mirror, config, rows, write_watchlist
from huggingface_hub.hf_api import ModelInfo

from atlas import AtlasError
from atlas.store import db as store
from atlas.cli import cli
from atlas.evidence import catalog
from atlas.hub import crawl as crawler
from atlas.hub.local.server import Fault
from atlas.site.pages import write_evidence as evidence
from atlas.site.parts import evidence_file, mdsafe


def raw_config(text: str) -> bytes:
    """GLM-4.5's config with `text` spliced in as raw JSON (for numbers json.dumps cannot write)."""
    return json.dumps(GOOD)[:-1].encode() + b", " + text.encode() + b"}"


def safetensors(header: dict) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw


def crawl(tmp_path: Path, hub, orgs: list[str]) -> crawler.CrawlSummary:
    return crawler.crawl(tmp_path / "atlas.duckdb", write_watchlist(tmp_path / "w.toml", orgs), endpoint=hub.url,
                         token=False, cache_dir=tmp_path / "cache", concurrency=4, progress=False)


HUGE = "9" * 5000  # an integer Python refuses to convert (over 4300 digits)
HOSTILE = {
    "h/fine": {"config.json": config()},
    "h/huge-int": {"config.json": raw_config(f'"num_nextn_predict_layers": {HUGE}')},
    "h/int64": {"config.json": raw_config(f'"vocab_size": {2**64}, "hidden_size": {2**63}')},
    "h/three-billion": {"config.json": config(num_hidden_layers=3_000_000_000, n_routed_experts=3_000_000_000)},
    "h/float-count": {"config.json": config(num_hidden_layers=3e9, num_nextn_predict_layers=1.0)},
    "h/layer-digits": {"config.json": config(), "model.safetensors.index.json": json.dumps(
        {"weight_map": {f"model.layers.{'7' * 3000}.eh_proj.weight": "a.safetensors", "model.norm.weight": "a.safetensors"}}).encode()},
    "h/index-huge-int": {"config.json": config(), "model.safetensors.index.json": raw_config(f'"weight_map": {HUGE}')},
    "h/bad-quant": {"config.json": config(), "hf_quant_config.json": b'{"quantization": '},
    "h/pointer": {"config.json": config(), "model.safetensors":
                  b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 9\n"},
    "h/header-2-63": {"config.json": config(), "model.safetensors": safetensors(
        {"__metadata__": {"n": str(2**64)}, "mtp.fc.weight": {"dtype": "F32", "shape": [2**63, 2**64], "data_offsets": [0, 0]}})},
    "h/nested": {"config.json": b'{"a": ' * 100_000 + b"1" + b"}" * 100_000},
    "h/nul-and-bidi": {"config.json": config(model_type="deep\u202eseek\u0000", architectures=["A\u200bB"])},
}
HOSTILE_META = """
["h/fine"]
downloads = 5
["h/three-billion"]
downloads = "lots"
likes = 1.5
last_modified = "not a date"
tags = "x"
base_model = 3
"""


def test_hostile_repos_each_become_their_own_error_and_the_rest_is_kept(tmp_path: Path, make_hub) -> None:
    hub = make_hub(build_mirror(tmp_path / "m", HOSTILE, HOSTILE_META))
    summary = crawl(tmp_path, hub, ["h"])
    db = tmp_path / "atlas.duckdb"
    assert summary.status == "complete" and summary.listed == len(HOSTILE)
    got = {r[0]: r[1:] for r in rows(db, "SELECT repo_id, fetch_status, error, side_file_error, "
                                          "declared_num_mtp_layers, shipped_mtp_layers FROM mtp_fingerprints")}
    assert got["h/fine"] == ("ok", None, None, 1, None)
    for repo_id, why in (("h/huge-int", "a number with too many digits to be a value"), ("h/nested", "JSON nested too deeply")):
        status, error = got[repo_id][:2]
        assert status == "error" and error.startswith(f"config.json: {why}") and "malformed config" in error
    # values no typed view can hold are dropped with a warning, and the view still answers
    assert got["h/int64"][0] == "ok" and "vocab_size has an unusable value" in got["h/int64"][1]
    assert got["h/three-billion"][0] == "ok" and "num_hidden_layers has an unusable value" in got["h/three-billion"][1]
    assert got["h/float-count"][0] == "ok" and "num_nextn_predict_layers is not a count" in got["h/float-count"][1]
    facts = dict(rows(db, "SELECT repo_id, num_hidden_layers FROM model_facts"))
    assert facts["h/three-billion"] is None and facts["h/fine"] == GOOD["num_hidden_layers"]
    # a tensor name with a 3000-digit layer index is ignored, with a warning; the rest is read
    assert got["h/layer-digits"][0] == "ok" and got["h/layer-digits"][4] == 0
    assert "3000" not in (got["h/layer-digits"][1] or "") and "layer indices of over 6 digits" in got["h/layer-digits"][1]
    # bad side files never lose the valid config
    for repo_id, side in (("h/index-huge-int", "model.safetensors.index.json"), ("h/bad-quant", "hf_quant_config.json"),
                          ("h/pointer", "model.safetensors")):
        status, error, side_error, declared, _ = got[repo_id]
        assert (status, declared) == ("ok", 1) and side_error.startswith(side), (repo_id, side_error)
    # a header with values of 2^63 and more still names its tensors
    assert got["h/header-2-63"][:2] == ("ok", None) and got["h/header-2-63"][4] == 1
    # hub metadata of the wrong type never costs the repo
    assert rows(db, "SELECT downloads, likes FROM hub_models WHERE repo_id = 'h/three-billion'") == [(None, None)]
    # a second crawl asks for nothing: every failure above is permanent at its sha
    hub.clear_log()
    crawl(tmp_path, hub, ["h"])
    assert hub.file_requests() == []


def test_hub_values_of_2_63_and_more_are_dropped_with_a_note(tmp_path: Path) -> None:
    info = ModelInfo(id="org/m", sha="a" * 40, downloads=2**70, likes=-3,
                     safetensors={"parameters": {"F32": 2**64}, "total": 2**64})
    listed = crawler.to_listed(info, set())
    assert (listed.row.downloads, listed.row.likes, listed.row.param_total) == (None, None, None)
    assert listed.row.fetch_status == "ok"
    assert "downloads = 22-digit number is not a count" in listed.row.error and "safetensors.total" in listed.row.error
    with store.connect(tmp_path / "a.duckdb") as con:  # and the row can be stored
        snap = store.SnapshotRow(store.utc_now(), store.utc_now(), "t", "d", "complete", 1, 0, 0, 0, 0, 0, "r", 0, 0, None)
        store.write_snapshot(con, snap, [listed.row], [], [], [])


def test_a_malformed_sha_from_the_hub_is_the_repos_error() -> None:
    listed = crawler.to_listed(ModelInfo(id="org/m", sha="../../etc/passwd"), set())
    assert listed.row.fetch_status == "error" and "malformed commit sha" in listed.row.error and listed.sha is None


def test_disk_full_while_writing_the_evidence_never_tears_the_file(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "module-08.evidence.md"
    out.write_text("the previous evidence\n")
    ev = _any_evidence()
    real_write_text = Path.write_text

    def full(self: Path, text: str, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)  # half of it lands...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(AtlasError, match="cannot write the evidence file .*No space left on device; the old one is intact"):
        evidence_file.write(ev, out)
    monkeypatch.undo()
    assert out.read_text() == "the previous evidence\n"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no partial file left behind


def _any_evidence():
    """An Evidence object as `atlas evidence` builds it, from an empty store (no snapshot needed here)."""
    import tempfile

    db = Path(tempfile.mkdtemp()) / "e.duckdb"
    store.connect(db).close()
    with store.connect(db, read_only=True) as con:
        root = Path(__file__).resolve().parents[1]
        return evidence.collect(con, catalog.load(con, root / "evidence", root))


@pytest.mark.parametrize("content", [b"this is not a database", b"\0" * 4096, b"DUCK" + b"\xff" * 5000])
def test_a_corrupt_store_is_one_line_naming_the_file(tmp_path: Path, content: bytes) -> None:
    db = tmp_path / "atlas.duckdb"
    db.write_bytes(content)
    for args in (["crawl", "--refingerprint", "--db", str(db)], ["evidence", "--db", str(db), "--out", str(tmp_path / "e.md")]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1, result.output
        [line] = result.output.strip().splitlines()
        assert str(db) in line and "Traceback" not in line


def test_malformed_metadata_toml_in_a_mirror_crawl_is_one_line(tmp_path: Path) -> None:
    mirror = build_mirror(tmp_path / "m", {"h/fine": HOSTILE["h/fine"]}, '["h/fine"\ndownloads = 1\n')
    result = CliRunner().invoke(cli, ["crawl", "--mirror", str(mirror), "--db", str(tmp_path / "a.duckdb"),
                                      "--watchlist", str(write_watchlist(tmp_path / "w.toml", ["h"])), "--no-progress"])
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert "HUB_METADATA.toml is not valid TOML" in line


@pytest.mark.parametrize("char", ["\u202e", "\u202d", "\u2066", "\u2069", "\u200b", "\u200d", "\u200e", "\u2060", "\ufeff", "\u061c"])
def test_bidi_and_zero_width_characters_are_shown_not_obeyed(char: str) -> None:
    shown = mdsafe.escape(f"org/mo{char}del")
    assert char not in shown and f"U+{ord(char):04X}" in shown
    assert mdsafe.escape("org/model") != shown  # cannot pass for the plain id
    assert char not in mdsafe.code(f"x{char}y") and char not in mdsafe.table(["id"], [[f"a{char}b"]])


def test_a_redirect_loop_is_cut_short_and_is_the_repos_error(tmp_path: Path, make_hub) -> None:
    hub = make_hub(build_mirror(tmp_path / "m", {"h/fine": HOSTILE["h/fine"], "h/loop": HOSTILE["h/fine"]}))
    hub.inject(Fault(307, path_contains="/h/loop/resolve/", times=-1, headers={"Location": "/h/loop/resolve/main/config.json"}))
    summary = crawl(tmp_path, hub, ["h"])
    got = dict(rows(tmp_path / "atlas.duckdb", "SELECT repo_id, error FROM mtp_fingerprints"))
    assert got["h/fine"] is None and summary.fetched == 1
    assert got["h/loop"].startswith("TooManyRedirects")
    hops = [r for r in hub.requests if r["path"].startswith("/h/loop/")]
    assert len(hops) == crawler.MAX_REDIRECTS + 1  # not the client's default 20, and not retried
