"""The evidence catalog: what the files under evidence/ say (the support matrix, the reported
figures, the conformance verdicts) and the imported records' provenance, loaded once per store
connection into typed tables that every reader queries.

The tables are temporary, as datasette's internal database is built anew at startup: the files stay
the one source, so the catalog is never staler than they are, and a store opened read-only takes it.
The one strict record reader (atlas.evidence.runs) reads what only a record file holds (the cells'
per-position counts, the pass costs, the head recipe); the catalog keeps the runs it read.

Tables, on the connection that `load` is given:
- `servable_entries`: one row per support-matrix entry, in file order, with the matrix date;
- `model_servable`: per model of the latest complete snapshot, the engines that draft with its MTP;
- `reported_figures`: the published figures (an empty table when there is no reported.toml);
- `conformance_verdicts`: one row per conformance record, layout, temperature class and draft
  sampling, with the record's run date (UTC), whether the record is its build's newest (`latest`) and
  whether the site shows the row (`shown`, atlas.conformance.record.current_verdicts);
- `evidence_records`: one row per imported measurement record: where it was imported from, as
  published, its run date and model, whether it is a smoke run (`quick`) and whether the project
  made the checkpoint (`is_ours`: by the record's provenance or by the repo's organisation).
"""

from __future__ import annotations

import datetime as dt
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel

from atlas import AtlasError
from atlas.store import db as store
from atlas.evidence import reported as reported_figures
from atlas.evidence import servable as servable_matrix
from atlas.evidence.runs import Run, load_runs
from atlas.conformance import record as conformance
from atlas.records import record as records
from atlas.paths import published

SERVABLE, REPORTED, CONFORMANCE = "servable.toml", "reported.toml", "conformance"


@dataclass(frozen=True)
class Catalog:
    """The typed values the tables were filled from, for the readers that compute with them."""

    servable_path: Path  # the support matrix's file (`atlas evidence --servable` may name another)
    matrix: servable_matrix.Matrix
    serving: dict[str, list[servable_matrix.Entry]]  # per model of the latest snapshot (Matrix.serving)
    figures: list[reported_figures.Figure]
    verdicts: list[conformance.Verdict]  # what the site shows (current_verdicts), in its order
    conformance_records: list[tuple[Path, conformance.ConformanceRecord]]  # oldest run first
    runs: list[Run]  # every imported record, smoke runs too, in the measured section's order; [] unless read

    @property
    def evidence_runs(self) -> list[Run]:
        """The records that count as evidence: smoke runs (--quick) left out."""
        return [r for r in self.runs if not r.record.settings.quick]


def load(con: duckdb.DuckDBPyConnection, evidence_dir: Path, root: Path, *, servable: Path | None = None,
         reported_required: bool = False, records: bool = True) -> Catalog:
    """Fill the connection's catalog tables from `evidence_dir` (its servable.toml, or the matrix
    `servable` names) and the store's imported records; `root` is what the records' and the
    conformance verdicts' paths are published relative to. `reported_required`: a missing
    reported.toml is an error (the export publishes the figures) rather than an empty table.
    `records` off: no record file is read and there is no evidence_records table (the model pages
    take their measured cells from the store and read a record only for its calculator default,
    so a record file gone costs them that default, not the page)."""
    servable_path = servable or evidence_dir / SERVABLE
    matrix = servable_matrix.load(servable_path)
    reported_path = evidence_dir / REPORTED
    figures = (reported_figures.load(reported_path).figure
               if reported_required or reported_path.is_file() else [])
    checked = conformance.load_records(evidence_dir / CONFORMANCE)
    shown = conformance.current_verdicts(checked, root)
    runs = load_runs(_measurement_sources(con)) if records else []

    serving = _servable_tables(con, matrix)
    temp_table(con, "reported_figures", reported_figures.Figure, [f.model_dump() for f in figures])
    _conformance_table(con, checked, shown, root)
    if records:
        _records_table(con, runs, root)
    return Catalog(servable_path, matrix, serving, figures, shown, checked, runs)


# ---- the tables ---------------------------------------------------------------------------------


class _ServableEntry(servable_matrix.Entry):
    matrix_date: dt.date


class _ModelServable(BaseModel):
    repo_id: str
    servable_engines: list[str]


class _ConformanceRow(conformance.Verdict):
    run_date: dt.datetime
    latest: bool
    shown: bool


class _EvidenceRecord(BaseModel):
    record_id: str
    source_path: str
    run_date: dt.datetime
    model_id: str
    quick: bool
    is_ours: bool


def _servable_tables(con: duckdb.DuckDBPyConnection,
                     matrix: servable_matrix.Matrix) -> dict[str, list[servable_matrix.Entry]]:
    temp_table(con, "servable_entries", _ServableEntry,
               [e.model_dump() | {"matrix_date": matrix.date} for e in matrix.entry])
    facts = con.execute("SELECT repo_id, model_type, architectures, declared_num_mtp_layers, "
                        "shipped_mtp_layers FROM mtp_fingerprints").fetchall()
    serving = {rid: matrix.serving(mt, servable_matrix.arch_list(arch), declared, shipped)
               for rid, mt, arch, declared, shipped in facts}
    temp_table(con, "model_servable", _ModelServable,
               [{"repo_id": rid, "servable_engines": [e.engine for e in entries]} for rid, entries in serving.items()])
    return serving


def _conformance_table(con: duckdb.DuckDBPyConnection, checked: list[tuple[Path, conformance.ConformanceRecord]],
                       shown: list[conformance.Verdict], root: Path) -> None:
    newest: dict[tuple[str, str], Path] = {}
    for path, rec in checked:  # oldest run first: the last one of a build and hardware wins
        newest[(rec.build, rec.hardware)] = path
    on_site = {_row_key(v) for v in shown}
    temp_table(con, "conformance_verdicts", _ConformanceRow, [
        v.model_dump() | {"run_date": rec.run_date, "latest": newest[(rec.build, rec.hardware)] == path,
                          "shown": _row_key(v) in on_site}
        for path, rec in checked for v in conformance.verdicts([(path, rec)], root)])


def _row_key(v: conformance.Verdict) -> tuple[str, ...]:
    return (v.source, v.build, v.hardware, v.layout, v.temperature, v.draft_sampling)


def _records_table(con: duckdb.DuckDBPyConnection, runs: list[Run], root: Path) -> None:
    temp_table(con, "evidence_records", _EvidenceRecord, [
        {"record_id": r.record_id, "source_path": published(r.source_path, root), "run_date": r.record.run_date,
         "model_id": r.record.model_id, "quick": r.record.settings.quick,
         "is_ours": bool(r.record.provenance and r.record.provenance.project_made) or store.is_ours(r.record.model_id)}
        for r in runs])


def _measurement_sources(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """(record_id, source_path) of every imported record; an empty measurement_cells table of the
    right columns, as a temporary one, when nothing was imported yet (a read-only store cannot
    take the real one)."""
    found = con.execute("SELECT count(*) FROM information_schema.tables "
                        "WHERE table_name = 'measurement_cells'").fetchone()
    if not (found and found[0]):
        con.execute(records.TABLE.replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"))
        return []
    have = {n for (n,) in con.execute("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'measurement_cells'").fetchall()}
    if missing := [c for c in records.COLUMNS if c not in have]:
        # the store is open read-only here; the import migrates the table in place
        raise AtlasError(f"the store's measurements predate its current columns ({', '.join(missing[:3])}"
                         f"{', ...' if len(missing) > 3 else ''}): run `atlas measure import` first")
    return [(r, s) for r, s in con.execute(
        "SELECT record_id, any_value(source_path) FROM measurement_cells GROUP BY record_id "
        "ORDER BY record_id").fetchall()]


# ---- typed temporary tables ---------------------------------------------------------------------


_PY_TYPES = {str: "VARCHAR", bool: "BOOLEAN", int: "BIGINT", float: "DOUBLE", dt.date: "DATE",
             dt.datetime: "TIMESTAMP"}


def _sql_type(annotation: Any) -> str:
    """The column type of a pydantic field; nested models are kept as JSON text."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return _PY_TYPES[type(typing.get_args(annotation)[0])]
    if origin is list:
        inner = _sql_type(typing.get_args(annotation)[0])
        return "JSON" if inner == "JSON" else inner + "[]"
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args and origin is not None:  # X | None
        return _sql_type(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "JSON"
    return _PY_TYPES[annotation]


def temp_table(con: duckdb.DuckDBPyConnection, name: str, model: type[BaseModel], rows: list[dict[str, Any]]) -> None:
    """A temporary table with the pydantic model's fields as typed columns (nested models as JSON
    text); `rows` are the models' model_dump()s."""
    columns = {f: _sql_type(info.annotation) for f, info in model.model_fields.items()}
    as_json = {c for c, t in columns.items() if t == "JSON"}
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ("
                + ", ".join(f'"{c}" {"VARCHAR" if c in as_json else t}' for c, t in columns.items()) + ")")
    if rows:
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(columns))})",
                        [[json.dumps(r[c], sort_keys=True) if c in as_json else r[c] for c in columns]
                         for r in rows])

