"""The evidence catalog (atlas.evidence.catalog): its tables hold what the files and the imported
records say, each figure checked against an independent reading of the same files."""

from __future__ import annotations

from datetime import timezone
from pathlib import Path

import pytest
from site_helpers import HOSTILE_ID, REPO, hostile_store, plant_measurement

from atlas import AtlasError
from atlas.store import db as store
from atlas.evidence import catalog, reported, servable
from atlas.conformance import record as conformance

EVIDENCE = REPO / "evidence"


def _rows(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    """The hostile store with three records: a Hub model's full run, its smoke run, and a run of a
    checkpoint of the project's own organisation."""
    path = tmp_path / "atlas.duckdb"
    hostile_store(path)
    plant_measurement(path, tmp_path / "full", HOSTILE_ID, day=20)
    plant_measurement(path, tmp_path / "quick", HOSTILE_ID, quick=True, day=21)
    plant_measurement(path, tmp_path / "ours", "mtp-atlas/some-head", day=22)
    return path


def test_the_records_table_says_which_runs_are_smoke_runs_and_which_checkpoints_are_ours(db: Path, tmp_path: Path) -> None:
    with store.reading(db) as con:  # read-only: the catalog's tables are temporary
        cat = catalog.load(con, EVIDENCE, tmp_path)
        rows = _rows(con, "SELECT * FROM evidence_records ORDER BY run_date")
    assert [(r["model_id"], r["quick"], r["is_ours"]) for r in rows] == [
        (HOSTILE_ID, False, False), (HOSTILE_ID, True, False), ("mtp-atlas/some-head", False, True)]
    # published relative to the root the catalog was given
    assert [r["source_path"].split("/")[0] for r in rows] == ["full", "quick", "ours"]
    assert {r.record_id for r in cat.runs} == {r["record_id"] for r in rows}
    assert sorted(r.record.model_id for r in cat.evidence_runs) == sorted([HOSTILE_ID, "mtp-atlas/some-head"])


def test_the_conformance_table_marks_the_rows_the_site_shows_and_each_builds_newest_record(db: Path) -> None:
    folder = EVIDENCE / "conformance"
    with store.reading(db) as con:
        cat = catalog.load(con, EVIDENCE, REPO)
        rows = _rows(con, "SELECT * FROM conformance_verdicts")

    def key(v: dict) -> tuple:
        return (v["source"], v["build"], v["hardware"], v["layout"], v["temperature"], v["draft_sampling"])

    checked = conformance.load_records(folder)
    assert sorted(map(key, rows)) == sorted(key(v.model_dump()) for v in conformance.verdicts(checked, REPO))
    shown = conformance.current_verdicts(checked, REPO)
    assert sorted(key(r) for r in rows if r["shown"]) == sorted(key(v.model_dump()) for v in shown)
    assert cat.verdicts == shown
    newest = conformance.verdicts(conformance.latest_records(folder), REPO)
    assert sorted(key(r) for r in rows if r["latest"]) == sorted(key(v.model_dump()) for v in newest)
    # a record's rows carry its run date (UTC), so a reader orders records without their files
    dates = {v.source: rec.run_date.astimezone(timezone.utc).replace(tzinfo=None)
             for path, rec in checked for v in conformance.verdicts([(path, rec)], REPO)}
    assert rows and all(r["run_date"] == dates[r["source"]] for r in rows)


def test_the_servable_tables_follow_the_matrix_for_every_model_of_the_latest_snapshot(db: Path) -> None:
    matrix = servable.load(EVIDENCE / "servable.toml")
    with store.reading(db) as con:
        catalog.load(con, EVIDENCE, REPO)
        entries = _rows(con, "SELECT * FROM servable_entries")
        engines = {r["repo_id"]: r["servable_engines"] for r in _rows(con, "SELECT * FROM model_servable")}
        facts = _rows(con, "SELECT * FROM mtp_fingerprints")
    assert [e["engine"] for e in entries] == [e.engine for e in matrix.entry]
    assert {e["matrix_date"] for e in entries} == {matrix.date}
    assert set(engines) == {f["repo_id"] for f in facts}
    for f in facts:
        archs = [a.strip() for a in (f["architectures"] or "").split(",") if a.strip()]
        want = [e.engine for e in matrix.serving(f["model_type"], archs, f["declared_num_mtp_layers"], f["shipped_mtp_layers"])]
        assert engines[f["repo_id"]] == want, f["repo_id"]
    assert any(engines.values()) and not all(engines.values())  # the fixture has both kinds


def test_reported_figures_are_optional_unless_the_reader_publishes_them(db: Path, tmp_path: Path) -> None:
    folder = tmp_path / "evidence"
    folder.mkdir()
    (folder / "servable.toml").write_bytes((EVIDENCE / "servable.toml").read_bytes())
    with store.reading(db) as con:
        assert catalog.load(con, folder, REPO).figures == []
        assert _rows(con, "SELECT count(*) AS n FROM reported_figures") == [{"n": 0}]
        with pytest.raises(AtlasError, match="reported figures not found"):
            catalog.load(con, folder, REPO, reported_required=True)
        (folder / "reported.toml").write_bytes((EVIDENCE / "reported.toml").read_bytes())
        figures = catalog.load(con, folder, REPO, reported_required=True).figures
        assert len(_rows(con, "SELECT * FROM reported_figures")) == len(figures) == len(reported.load(folder / "reported.toml").figure)
