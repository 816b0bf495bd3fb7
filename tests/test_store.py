"""The store contract: schema, views, one transaction per snapshot, one writer at a time."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from atlas import AtlasError
from atlas.store.db import (
    ModelRow,
    RawFile,
    SnapshotRow,
    StoreLockedError,
    WeightNames,
    connect,
    fingerprint_versions,
    load_inputs,
    side_file_state,
    stored_pairs,
    write_snapshot,
)

MTP_COLUMNS = [
    "repo_id", "revision", "snapshot_id", "snapshot_date", "model_type", "architectures",
    "declared_num_mtp_layers", "declared_key", "shipped_mtp_layers", "shipped_evidence",
    "is_exemplar", "is_derivative", "base_model", "fetch_status", "error", "downloads", "likes",
    "last_modified", "rule_version",
]
FACT_COLUMNS = [
    "repo_id", "revision", "snapshot_id", "snapshot_date", "model_type", "architectures",
    "num_hidden_layers", "hidden_size", "vocab_size", "torch_dtype", "quant_method", "num_experts",
]
SHA = "a" * 40


def snapshot_row(status: str = "complete") -> SnapshotRow:
    now = datetime(2026, 11, 29, 10, 0, 0)
    return SnapshotRow(now, now, "mirror:test", "d" * 64, status, 1, 1, 0, 0, 0, 0, "fp-test", 3, 0, None)


def model_row(repo_id: str = "org/model", downloads: object = 12_345_678_901) -> ModelRow:
    return ModelRow(
        repo_id, SHA, datetime(2026, 1, 2, 3, 4, 5), None, downloads, 7, None, False, "text-generation",
        "transformers", ["safetensors"], ["org/base"], "quantized", True, False, None, "ok", None,
    )


def fp_rows(version: str = "fp-test") -> list[tuple]:
    return [
        ("org/model", SHA, version, "declared_num_mtp_layers", "1", "num_nextn_predict_layers"),
        ("org/model", SHA, version, "shipped_mtp_layers", "1", "mtp.*"),
        ("org/model", SHA, version, "model_type", "deepseek_v3", "model_type"),
        ("org/model", SHA, version, "architectures", "A,B", "architectures"),
        ("org/model", SHA, version, "num_hidden_layers", "61", "num_hidden_layers"),
    ]


def columns(con, view: str) -> list[str]:
    return [row[0] for row in con.execute(f"DESCRIBE {view}").fetchall()]


def test_schema_is_idempotent_and_views_have_the_contract_columns(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "atlas.duckdb"
    connect(db).close()
    con = connect(db)  # second time: no error, nothing duplicated
    assert columns(con, "mtp_fingerprints")[: len(MTP_COLUMNS)] == MTP_COLUMNS
    assert columns(con, "mtp_fingerprints_history")[: len(MTP_COLUMNS)] == MTP_COLUMNS
    assert columns(con, "model_facts") == FACT_COLUMNS
    snap = [c for c in columns(con, "snapshots")][:12]
    assert snap == ["snapshot_id", "started_at", "finished_at", "endpoint", "watchlist_digest", "status",
                    "n_listed", "n_fetched", "n_unchanged", "n_gated", "n_missing", "n_failed"]
    con.close()


def test_snapshot_round_trip_through_the_views(tmp_path: Path) -> None:
    con = connect(tmp_path / "a.duckdb")
    files = [RawFile("org/model", SHA, "config.json", '{"model_type": "deepseek_v3"}')]
    weights = [WeightNames("org/model", SHA, "index", ["mtp.fc.weight", "model.norm.weight"])]
    sid = write_snapshot(con, snapshot_row(), [model_row()], files, weights, fp_rows())
    assert sid == 1
    row = con.execute(f"SELECT {', '.join(MTP_COLUMNS)} FROM mtp_fingerprints").fetchall()
    assert len(row) == 1
    got = dict(zip(MTP_COLUMNS, row[0]))
    assert got["revision"] == SHA and got["declared_num_mtp_layers"] == 1
    assert got["declared_key"] == "num_nextn_predict_layers" and got["shipped_evidence"] == "mtp.*"
    assert got["downloads"] == 12_345_678_901 and got["base_model"] == "org/base" and got["is_derivative"]
    assert got["snapshot_date"] == datetime(2026, 11, 29, 10, 0, 0)
    facts = con.execute("SELECT model_type, architectures, num_hidden_layers FROM model_facts").fetchall()
    assert facts == [("deepseek_v3", "A,B", 61)]
    names = con.execute("SELECT names FROM weight_names").fetchall()
    assert names == [(["mtp.fc.weight", "model.norm.weight"],)]
    # a second snapshot with the same raw file stores it once and shows only the latest rows
    assert write_snapshot(con, snapshot_row(), [model_row()], files, weights, fp_rows()) == 2
    assert con.execute("SELECT count(*) FROM raw_files").fetchall() == [(1,)]
    assert con.execute("SELECT snapshot_id FROM mtp_fingerprints").fetchall() == [(2,)]
    assert con.execute("SELECT count(*) FROM mtp_fingerprints_history").fetchall() == [(2,)]
    con.close()


def test_reads_return_only_the_pairs_asked_for(tmp_path: Path) -> None:
    con = connect(tmp_path / "a.duckdb")
    other = "b" * 40
    files = [RawFile("org/model", SHA, "config.json", "{}"), RawFile("org/other", other, "config.json", '{"a": 1}')]
    weights = [WeightNames("org/other", other, "header", ["mtp.fc.weight"])]
    errors = [("org/model", SHA, "model.safetensors.index.json", "bad JSON")]
    write_snapshot(con, snapshot_row(), [model_row()], files, weights, fp_rows(), errors)
    # the same rows again add nothing (raw files, names and errors are immutable per sha)
    write_snapshot(con, snapshot_row(), [model_row()], files, weights, fp_rows(), errors)
    for table, expected in (("raw_files", 2), ("weight_names", 1), ("file_errors", 1)):
        assert con.execute(f"SELECT count(*) FROM {table}").fetchall() == [(expected,)], table
    assert stored_pairs(con, []) == set() and load_inputs(con, []) == {} and fingerprint_versions(con, []) == {}
    assert stored_pairs(con, [("org/other", other), ("org/absent", SHA)]) == {("org/other", other)}
    assert load_inputs(con, [("org/other", other)]) == {
        ("org/other", other): {"files": {"config.json": '{"a": 1}'}, "weights": ("header", ["mtp.fc.weight"])}}
    assert set(load_inputs(con)) == {("org/model", SHA), ("org/other", other)}
    assert fingerprint_versions(con, [("org/model", SHA), ("org/other", other)]) == {("org/model", SHA): "fp-test"}
    assert side_file_state(con, [("org/model", SHA), ("org/other", other)]) == {
        ("org/model", SHA): ({"config.json"}, {"model.safetensors.index.json": "bad JSON"}),
        ("org/other", other): ({"config.json", "model.safetensors"}, {}),
    }
    con.close()


def test_partial_snapshots_are_not_what_the_views_show(tmp_path: Path) -> None:
    con = connect(tmp_path / "a.duckdb")
    write_snapshot(con, snapshot_row(), [model_row()], [], [], fp_rows())
    write_snapshot(con, snapshot_row("partial"), [model_row("org/other")], [], [], [])
    assert con.execute("SELECT repo_id, snapshot_id FROM mtp_fingerprints").fetchall() == [("org/model", 1)]
    con.close()


def test_a_failing_snapshot_write_leaves_nothing_behind(tmp_path: Path) -> None:
    con = connect(tmp_path / "a.duckdb")
    write_snapshot(con, snapshot_row(), [model_row()], [], [], fp_rows())
    bad = model_row(downloads="not a number")  # the cast fails inside the transaction
    with pytest.raises(Exception):
        write_snapshot(con, snapshot_row(), [bad], [RawFile("org/x", SHA, "config.json", "{}")], [], fp_rows("v2"))
    assert con.execute("SELECT count(*) FROM snapshots").fetchall() == [(1,)]
    assert con.execute("SELECT count(*) FROM raw_files").fetchall() == [(0,)]
    assert con.execute("SELECT DISTINCT rule_version FROM fingerprints").fetchall() == [("fp-test",)]
    con.close()


def test_read_only_on_a_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AtlasError, match="no atlas store at .*run `atlas crawl` first"):
        connect(tmp_path / "absent.duckdb", read_only=True)


def test_second_writer_gets_store_locked_error(tmp_path: Path) -> None:
    db = tmp_path / "locked.duckdb"
    connect(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from atlas.store.db import connect
            con = connect({str(db)!r})
            print("ready", flush=True)
            sys.stdin.readline()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        for read_only in (False, True):
            with pytest.raises(StoreLockedError, match="in use by another process"):
                connect(db, read_only=read_only)
    finally:
        holder.communicate("done\n", timeout=30)
    connect(db).close()  # free again once the holder is gone
