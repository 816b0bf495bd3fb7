"""Measurement records: the JSON files under evidence/measurements/ and their import into the store.

A record keeps the raw counts of every run (tokens, seconds, drafted/reached/accepted per draft
position, verify passes, the paired baseline's seconds, and pass costs timed between repeats) and
the figures derived from them. Import recomputes every derived figure from the raw counts and
rejects the file when one disagrees, so a hand-edited speed-up cannot reach the site; counts that
cannot happen (more accepted drafts plus verify passes than tokens, efficiency far above 1, absurd
seconds) are rejected by name. These files are also how a GPU box hands results back.
The derivation, the gate and those checks are atlas.records.gating; the bounded field types
atlas.records.fields; the machine, software, settings and engine a run had atlas.records.runcontext.

Acceptance, named precisely (atlas.records.theory has the formulas):
- `acceptance_rate`: accepted / drafted, pooled over positions (every drafted token counts);
- `per_position_acceptance`: accepted_i / drafted_i, unconditional per position;
- `conditional_acceptance`: accepted_i / reached_i, P(draft i accepted | drafts before it accepted),
  the figure the tokens-per-pass formula 1 + a₁ + a₁a₂ + … takes.

Schema 2 added reached counts, per-repeat pass costs, the paired gate rule, efficiency bounds and
the stamp (dirty tree, numpy/BLAS/OS, load average). Schema 1 files still import: their figures are
checked against the fields they had, and their gate fields are kept as recorded under the old rule.
Schema 3 gave the gate's verdict (on / off / undecided) a typed field of its own (`Cell.gate_verdict`,
`GateDecision.verdict`); an older file gets it derived on reading from the word its reason starts
with, and still serialises as it was written, so its identity (record_id) does not change.
Schema 4 keeps each prompt's counts and seconds within each repeat (`Repeat.prompts`: prompts, not
repeats of the same prompts, are the gate's sampling unit) and names the rule its gates were set by
(`gate_rule`, atlas.records.gating.GATE_RULES); older files were set by rule 1 and are checked under it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, ValidationError, field_validator, model_serializer, model_validator

from atlas import AtlasError
from atlas.hub import redact
from atlas.records.fields import (
    MAX_CELLS,
    REVISION,
    Name,
    Strict,
    Text,
)
from atlas.records import experiment
from atlas.records.gating import check_consistency, decide
from atlas.records.cell import Cell, Derived, GateDecision, PassCosts, Repeat  # noqa: F401 (a record's parts, read as record.Cell and the like)
from atlas.records.runcontext import EngineRun, Hardware, RecurrentState, Settings, Software
from atlas.interrupts import sigint_handler
from atlas.paths import ROOT, read_bounded

if TYPE_CHECKING:  # the store's engine is needed to import records, not to write them (a GPU run ships without it)
    import duckdb

SCHEMA_VERSION = 4
# The record folder, relative to the project root: `atlas measure run` writes into it and
# `atlas measure import` reads it. Named here, not with the runner's options, so that the import
# never loads those (and with them torch).
DEFAULT_DIR = "evidence/measurements"
MAX_RECORD_BYTES = 8 * 1024 * 1024  # the largest real record is well under 1 MB; bigger files are refused unread


PROVENANCE_FILE = "atlas-provenance.json"


class Provenance(Strict):
    """How a checkpoint this project made was made, copied into the record from the checkpoint
    folder's atlas-provenance.json (atlas.checkpoints.smollm writes one). `project_made` is what the
    site reads to label every figure of the record (e.g. "project-made MTP head on a real main
    model") and to keep it out of anything about Hub models."""

    kind: Text
    project_made: bool
    model_id: Name  # the record's model id, e.g. mtp-atlas/smollm2-135m-instruct-mtp
    main_model: dict[Name, Text] = Field(max_length=32)  # source, package, package_version, file, sha256, quantization, layout
    mtp_head: dict[Name, Text | int | float] = Field(max_length=32)  # made_by, sha256, recipe, target, steps, data_digest, seed, training tokens, held-out acceptance


def read_provenance(folder: Path) -> Provenance | None:
    """The folder's atlas-provenance.json, validated; None when it has none."""
    path = folder / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        return Provenance.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise AtlasError(f"{path}: not a valid provenance file: {exc}") from None


class Record(Strict):
    schema_version: Literal[1, 2, 3, 4]
    run_date: datetime
    model_id: Name
    revision: str = Field(pattern=REVISION)  # 40-hex commit, or "sha256:<digest of the checkpoint files>"
    hardware: Hardware
    software: Software
    command: Text
    seed: int = Field(ge=-(2**31), lt=2**31)  # the store's column is a 32-bit integer
    prompt_set: Name
    prompt_set_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    settings: Settings
    pass_costs: PassCosts | None  # single forwards timed by our loop; None for an external engine
    cells: list[Cell] = Field(min_length=1, max_length=MAX_CELLS)
    gates: list[GateDecision] = Field(default=[], max_length=MAX_CELLS)  # derived from the gated engine's cells (decide); filled in when absent
    engine_run: EngineRun | None = None  # set when the cells come from an external engine
    recurrent_state: RecurrentState | None = None  # set when the main model has recurrent layers
    # 1/5/15-minute load averages before and after the run
    load_before: list[Annotated[float, Field(ge=0, le=1e6)]] | None = Field(default=None, max_length=3)
    load_after: list[Annotated[float, Field(ge=0, le=1e6)]] | None = Field(default=None, max_length=3)
    provenance: Provenance | None = None  # a checkpoint this project made: how (labelled on the site)
    # The rule the gates were set by (gating.GATE_RULES); absent in files before schema 4, which were
    # set by rule 1 and keep it: their gates are checked under the rule they were made with.
    gate_rule: Literal[1, 2] | None = None

    @property
    def rule(self) -> int:
        return self.gate_rule or 1

    @field_validator("command")
    @classmethod
    def _no_credential(cls, value: str) -> str:
        # evidence and export publish the command: a hand-written one with a password stops here
        if redact.text(value) != value:
            raise ValueError("holds a credential (a URL's user info or a token); record the command without it")
        return value

    @model_validator(mode="after")
    def _unique_cells(self) -> "Record":
        seen: set[tuple[str, str, float, int]] = set()
        for c in self.cells:
            key = (c.engine, c.workload, c.temperature, c.draft_tokens)
            if key in seen:
                raise ValueError(f"duplicated cell {c.engine}/{c.workload}/T={c.temperature}/k={c.draft_tokens}")
            seen.add(key)
        if (self.schema_version >= 4) != (self.gate_rule is not None):
            raise ValueError("gate_rule is named by schema 4 records, and only by them")
        gates = [(g.workload, g.temperature) for g in self.gates]
        if len(set(gates)) != len(gates):
            raise ValueError("duplicated gate decision (one per workload and temperature)")
        return self

    @model_validator(mode="after")
    def _fill_gates(self) -> "Record":
        if not self.gates:
            self.gates = decide(self.cells, self.rule, self.settings.quick)
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A record older than schema 3 serialises without the verdicts derived on reading it, as
        it was written: its canonical bytes, and so its id, stay what they were. A record of a
        checkpoint with no provenance file leaves the field out for the same reason."""
        data = handler(self)
        for key in ("regime", "kernels", "draft_vocab", "shared_tensors"):  # records written before these fields keep their bytes
            if data["settings"].get(key) is None:
                data["settings"].pop(key, None)
        for key in ("omp_wait_policy", "cpu_flags"):  # records stamped before these fields keep their bytes
            if data["hardware"].get(key) is None:
                data["hardware"].pop(key, None)
        if data.get("engine_run") is not None and data["engine_run"].get("build") is None:
            data["engine_run"].pop("build", None)  # vLLM records keep their bytes
        if data.get("recurrent_state") is None:  # absent, not null, in records without recurrent layers
            data.pop("recurrent_state", None)
        if self.provenance is None:
            data.pop("provenance", None)
        if self.gate_rule is None:
            data.pop("gate_rule", None)
        for cell in data["cells"]:  # repeats written before per-prompt counts keep their bytes
            for repeat in cell["repeats"]:
                if repeat.get("prompts") is None:
                    repeat.pop("prompts", None)
        if self.schema_version < 3:
            for cell in data["cells"]:
                cell.pop("gate_verdict", None)
            for g in data["gates"]:
                g.pop("verdict", None)
            if self.engine_run is not None:  # --engine vllm records were written without gates before schema 3
                data["gates"] = []
        return data


def read_record(path: Path) -> Record:
    """Read, parse, validate and check one record file (AtlasError naming the file on any problem)."""
    return parse_record(_read_bounded(path), path)


def _read_bounded(path: Path) -> bytes:
    return read_bounded(path, MAX_RECORD_BYTES, "a measurement record")


def parse_record(data: bytes, path: Path) -> Record:
    """Parse, validate and check the bytes of one record file (AtlasError naming `path`)."""
    try:
        record = Record.model_validate_json(data)
        check_consistency(record)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        where = f"{loc}{_shown_value(first.get('input'))}: " if loc else ""
        raise AtlasError(f"{path}: not a valid measurement record ({exc.error_count()} problem(s); "
                         f"first: {where}{first['msg']})") from None
    except (ValueError, ArithmeticError) as exc:
        what = "" if str(exc).startswith("impossible") else "derived figures do not match the raw counts: "
        raise AtlasError(f"{path}: rejected, {what}{exc}") from None
    return record


def _shown_value(value: object) -> str:
    """` = value` for a scalar a reader can check against the bound in the message (a long string
    is shown by its length only: the message must stay one short line)."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return f" = {value!r}"
    if isinstance(value, str):
        return f" = {redact.text(value)!r}" if len(value) <= 60 else f" ({len(value):,} characters)"  # never a credential
    if isinstance(value, list):
        return f" ({len(value):,} entries)"
    return ""


def canonical_bytes(record: Record) -> bytes:
    """The one serialisation of a record (what write_record writes): its identity is the sha256 of
    these bytes, so the same record re-saved with other whitespace or key order is the same record."""
    return (record.model_dump_json(indent=1) + "\n").encode()


def record_id(record: Record) -> str:
    return hashlib.sha256(canonical_bytes(record)).hexdigest()


_INTERRUPTED = threading.Event()


@contextmanager
def no_record_after_interrupt() -> Iterator[None]:
    """While a run measures, a SIGINT is remembered before it is raised: no record is written after
    it even where code on the way catches the KeyboardInterrupt (a run stopped by SIGINT wrote a
    record that had lost its provenance). Main thread only, as every signal handler."""

    def interrupted(signum: int, frame: object) -> None:
        _INTERRUPTED.set()
        raise KeyboardInterrupt

    _INTERRUPTED.clear()
    with sigint_handler(interrupted):
        yield


def write_record(record: Record, out_dir: Path) -> Path:
    """Write a validated, self-consistent record as <date>-<model>-<digest12>.json, whole or not at
    all: into a sibling that import does not read (*.json.partial), then renamed. When `out_dir`
    cannot take it (it filled up during the run), the record goes to the system's temporary folder
    and one line says where: the run's figures are never lost to the disk they were meant for."""
    if _INTERRUPTED.is_set():
        raise AtlasError("interrupted (SIGINT): the run did not finish, so no record was written")
    check_consistency(record)
    data = canonical_bytes(record)
    slug = "".join(c if c.isalnum() or c in "-." else "-" for c in record.model_id)[-60:]
    name = f"{record.run_date:%Y%m%dT%H%M%SZ}-{slug}-{hashlib.sha256(data).hexdigest()[:12]}.json"
    try:
        return _write_whole(out_dir / name, data)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    aside = Path(tempfile.gettempdir()) / "atlas-records"
    try:
        saved = _write_whole(aside / name, data)
    except OSError:
        raise AtlasError(f"cannot write the record to {out_dir} ({problem}), nor to {aside}: the run's figures "
                         "are lost") from None
    raise AtlasError(f"cannot write the record to {out_dir} ({problem}); it was saved whole as {saved}: move it "
                     f"into {out_dir} once there is room")


def _write_whole(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with partial.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


# ---- the store ---------------------------------------------------------------------------------

TABLE = """
CREATE TABLE IF NOT EXISTS measurement_cells (
    record_id VARCHAR, source_path VARCHAR, run_date TIMESTAMP, model_id VARCHAR, revision VARCHAR,
    hardware VARCHAR, engine VARCHAR, engine_version VARCHAR, workload VARCHAR, temperature DOUBLE,
    draft_tokens INTEGER, drafted BIGINT, accepted BIGINT, acceptance_rate DOUBLE,
    mean_accepted_length DOUBLE, speedup DOUBLE, speedup_slowest_repeat DOUBLE, speedup_fastest_repeat DOUBLE,
    ideal_speedup DOUBLE, efficiency DOUBLE, gate_enabled BOOLEAN, gate_reason VARCHAR,
    greedy_lossless BOOLEAN, command VARCHAR, seed INTEGER, prompt_set VARCHAR,
    prompt_set_digest VARCHAR, baseline VARCHAR, gate_verdict VARCHAR,
    speedup_paired_lower_95 DOUBLE, speedup_paired_upper_95 DOUBLE,
    per_position_acceptance DOUBLE[], conditional_acceptance DOUBLE[],
    pass_plain_seconds DOUBLE, pass_verify_seconds DOUBLE, pass_draft_seconds DOUBLE,
    provenance_recorded BOOLEAN, provenance_project_made BOOLEAN, provenance_kind VARCHAR,
    provenance_main_model VARCHAR, provenance_main_package VARCHAR, provenance_main_sha256 VARCHAR,
    provenance_head_sha256 VARCHAR, threads INTEGER, kernels VARCHAR, draft_vocab VARCHAR, dtype VARCHAR, machine_isa VARCHAR,
    experiment_key VARCHAR, experiment VARCHAR
)"""
COLUMNS = [line.split()[0] for line in TABLE.split("(", 1)[1].rsplit(")", 1)[0].replace("\n", " ").split(",")]
_TYPES = {line.split()[0]: line.split()[1] for line in TABLE.split("(", 1)[1].rsplit(")", 1)[0].replace("\n", " ").split(",")}
# Columns every row fills (never NULL), one per migration that added columns: a record whose rows
# lack one was imported before that column existed and is loaded again to fill the new columns.
FILLED = ("baseline", "provenance_recorded", "experiment_key")
NEWEST = FILLED[-1]
# Renamed columns, old name -> new: a store made before the rename keeps its rows under the new name.
RENAMED = {"speedup_lo": "speedup_slowest_repeat", "speedup_hi": "speedup_fastest_repeat"}


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the table, or bring an older one up to the current columns (renamed ones keep their
    values; added ones stay NULL until their record is imported again, which import_records does)."""
    con.execute(TABLE)
    have = {name for (name,) in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'measurement_cells'").fetchall()}
    for old, new in RENAMED.items():
        if old in have and new not in have:
            con.execute(f"ALTER TABLE measurement_cells RENAME COLUMN {old} TO {new}")
            have = (have - {old}) | {new}
    for name in COLUMNS:
        if name not in have:
            con.execute(f"ALTER TABLE measurement_cells ADD COLUMN {name} {_TYPES[name]}")


def _rows(record: Record, record_id: str, source_path: str) -> list[tuple[object, ...]]:
    rows = []
    prov = record.provenance
    for c in record.cells:
        d = c.derived
        costs = record.pass_costs if c.engine in ("atlas", "llamacpp") else None  # the run's engine's own (the peer and vLLM time none)
        values = {
            "record_id": record_id,
            "source_path": source_path,
            "run_date": record.run_date.replace(tzinfo=None),
            "model_id": record.model_id,
            "revision": record.revision,
            "hardware": record.hardware.label(),
            "engine": c.engine,
            "engine_version": c.engine_version,
            "workload": c.workload,
            "temperature": c.temperature,
            "draft_tokens": c.draft_tokens,
            "drafted": d.drafted,
            "accepted": d.accepted,
            "acceptance_rate": d.acceptance_rate,
            "mean_accepted_length": d.mean_accepted_length,
            "speedup": d.speedup,
            "speedup_slowest_repeat": d.speedup_slowest_repeat,
            "speedup_fastest_repeat": d.speedup_fastest_repeat,
            "ideal_speedup": d.ideal_speedup,
            "efficiency": d.efficiency,
            "gate_enabled": c.gate_enabled,
            "gate_reason": c.gate_reason,
            "greedy_lossless": d.greedy_lossless,
            "command": record.command,
            "seed": record.seed,
            "prompt_set": record.prompt_set,
            "prompt_set_digest": record.prompt_set_digest,
            "baseline": c.baseline,
            "gate_verdict": c.gate_verdict,
            "speedup_paired_lower_95": d.speedup_bound_lo,
            "speedup_paired_upper_95": d.speedup_bound_hi,
            "per_position_acceptance": d.per_position_acceptance,
            "conditional_acceptance": d.conditional_acceptance,
            # the run's pass costs: our loop's timed in it (its ideal speed-up uses them), llama.cpp's by llama-bench
            "pass_plain_seconds": costs.plain if costs else None,
            "pass_verify_seconds": costs.verify.get(c.draft_tokens) if costs else None,
            "pass_draft_seconds": costs.draft if costs else None,
            "provenance_recorded": prov is not None,
            "provenance_project_made": prov.project_made if prov else None,
            "provenance_kind": prov.kind if prov else None,
            "provenance_main_model": prov.main_model.get("source") if prov else None,
            "provenance_main_package": _package(prov.main_model) if prov else None,
            "provenance_main_sha256": prov.main_model.get("sha256") if prov else None,
            "provenance_head_sha256": str(prov.mtp_head["sha256"]) if prov and "sha256" in prov.mtp_head else None,
            **experiment.columns(record, c),
        }
        rows.append(tuple(values[name] for name in COLUMNS))
    return rows


def _package(main_model: dict[str, str]) -> str | None:
    """The package the main weights came from, with its version (pip's name==version)."""
    name = main_model.get("package")
    if name is None:
        return None
    version = main_model.get("package_version")
    return f"{name}=={version}" if version else name


def _repo_relative(path: Path) -> str:
    here = path.resolve()
    return here.relative_to(ROOT).as_posix() if here.is_relative_to(ROOT) else here.as_posix()


def import_records(con: duckdb.DuckDBPyConnection, directory: Path) -> tuple[int, int, list[str]]:
    """Load every *.json under `directory`: (files loaded, files already present, errors).

    Idempotent: a record is keyed by the sha256 of its canonical serialisation (canonical_bytes), so
    a copy re-saved with other whitespace is "already present", and a renamed one keeps its rows
    under its new path. A file whose content changed replaces the rows from its previous version.
    Files over MAX_RECORD_BYTES are refused unread. Each file is its own transaction, so a rejected
    file costs nothing but itself."""
    import duckdb

    ensure_schema(con)
    loaded, present, errors = 0, 0, []
    for path in sorted(directory.glob("*.json")):
        try:
            record = parse_record(_read_bounded(path), path)
        except AtlasError as exc:
            errors.append(str(exc))
            continue
        rid = record_id(record)
        source = _repo_relative(path)
        # rows stored before a column existed are loaded again to fill it
        if con.execute("SELECT 1 FROM measurement_cells WHERE record_id = ? AND "
                       + " AND ".join(f"{c} IS NOT NULL" for c in FILLED) + " LIMIT 1", [rid]).fetchone():
            # a renamed or moved file: its rows follow it (evidence and export read the record from there)
            con.execute("UPDATE measurement_cells SET source_path = ? WHERE record_id = ? AND source_path <> ?", [source, rid, source])
            present += 1
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM measurement_cells WHERE source_path = ? OR record_id = ?", [source, rid])
            con.executemany(
                f"INSERT INTO measurement_cells ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                _rows(record, rid, source),
            )
            con.execute("COMMIT")
        except duckdb.Error as exc:
            con.execute("ROLLBACK")
            errors.append(f"{path}: not stored: {exc}")
            continue
        loaded += 1
    return loaded, present, errors


def forget_record(con: duckdb.DuckDBPyConnection, key: str) -> list[tuple[str, str]]:
    """Remove one imported record's rows: `key` is its id, a prefix of it (12 characters at least,
    as messages show it) or the source path it was imported from. The way out when a record's file
    is gone: evidence and export read every imported record's file. Returns the (record_id,
    source_path) forgotten; AtlasError when `key` names no record or several."""
    ensure_schema(con)
    if len(key) < 12 and not key.endswith(".json"):
        raise AtlasError(f"{key!r}: give a record id (12 characters at least) or the record's source path")
    path = Path(key)
    source = _repo_relative(path) if path.is_absolute() or path.suffix == ".json" else key
    found = con.execute("SELECT DISTINCT record_id, source_path FROM measurement_cells "
                        "WHERE starts_with(record_id, ?) OR source_path = ? OR source_path = ? ORDER BY record_id",
                        [key, key, source]).fetchall()
    if not found:
        raise AtlasError(f"no imported measurement record has the id or source path {key!r}")
    if len({rid for rid, _ in found}) > 1:
        raise AtlasError(f"{key!r} names {len(found)} records; give more of the id: " + ", ".join(rid[:16] for rid, _ in found))
    con.execute("DELETE FROM measurement_cells WHERE record_id = ?", [found[0][0]])
    return found[:1]

