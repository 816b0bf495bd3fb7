"""The changelog: what each snapshot and each record changed, from the store and the record files.

`atlas export` collects it (it has the store) into changelog.json beside the exported tables;
`atlas site build` renders that file as the Changelog page (atlas.site.pages.changelog), without the store.

Per complete snapshot, against the one before it: models that newly declare or ship MTP, changed
values (declared and shipped layer counts, declared key, model_type) with the new revision, models
added to or gone from the crawl, and families (model_type) that have a servable model now and had
none before. Per record, in run order: what it added (cells, or verdict rows, for conditions no
earlier record covered) and which earlier records it re-measured: a measured cell re-measures only
a cell of its own experiment (atlas.records.experiment: same revision, head, draft vocabulary,
kernels, engine build with its patches, threads, their wait policy and machine); a build with
run-time patches is its own subject. Per condition: each verdict it took, when one record's differs from an
earlier one's (e.g. a layout's T = 0 result going fails -> inconclusive -> lossless). Models this project made are
left out of the snapshot entries, as out of every Hub count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import duckdb
from pydantic import BaseModel

from atlas.store import db as store
from atlas.evidence import servable as servable_matrix
from atlas.evidence.catalog import Catalog
from atlas.evidence.runs import Run
from atlas.jsonfile import html_safe, read_written
from atlas.conformance import record as conformance
from atlas.paths import published
from atlas.records.experiment import experiment_key

FILE_NAME = "changelog.json"
COMPARED = ("declared_num_mtp_layers", "shipped_mtp_layers", "declared_key", "model_type")


class ValueChange(BaseModel):
    repo_id: str
    field: str
    old: str | None
    new: str | None
    revision: str | None  # the revision the new value was read at


class SnapshotChanges(BaseModel):
    snapshot_id: int
    date: str
    n_models: int
    previous: int | None  # the snapshot compared against; None for the first
    added: list[str]
    removed: list[str]
    new_mtp: list[str]  # declare or ship MTP now, did not in the previous snapshot (or were not in it)
    changed: list[ValueChange]
    newly_servable: list[str]  # families with a servable model now and none in the previous snapshot


class RecordChange(BaseModel):
    kind: Literal["measurement", "conformance"]
    source: str
    record_id: str | None
    date: str
    subject: str  # the model measured, or the engine package and version checked
    n_rows: int
    added: int  # rows for conditions no earlier record covered
    remeasured: dict[str, int]  # earlier record (source) -> rows of it this record measured again


class Step(BaseModel):
    value: str
    source: str  # the record that gave it
    date: str


class Moved(BaseModel):
    """A condition whose verdict changed from one record to a later one: every value it took, in
    run order, with the record of each (a value is listed again only when it changed)."""

    kind: Literal["measurement", "conformance"]
    condition: str
    field: str  # what moved: a conformance result, or the gate's verdict of a measured cell
    steps: list[Step]


class Changelog(BaseModel):
    servable_date: str
    snapshots: list[SnapshotChanges]  # oldest first
    records: list[RecordChange]  # oldest first
    moved: list[Moved]  # in the order the conditions were first recorded


_HISTORY = """
    SELECT snapshot_id, snapshot_date, repo_id, revision, model_type, architectures,
           declared_num_mtp_layers, declared_key, shipped_mtp_layers
    FROM mtp_fingerprints_history WHERE NOT ({ours})
    ORDER BY snapshot_id, repo_id"""


def _mtp(row: dict[str, Any]) -> bool:
    return (row["declared_num_mtp_layers"] or 0) > 0 or (row["shipped_mtp_layers"] or 0) > 0


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _snapshots(con: duckdb.DuckDBPyConnection, matrix: servable_matrix.Matrix) -> list[SnapshotChanges]:
    cur = con.execute(_HISTORY.format(ours=store.ours()))
    cols = [d[0] for d in cur.description]
    by_snap: dict[int, dict[str, dict[str, Any]]] = {}
    dates: dict[int, str] = {}
    for values in cur.fetchall():
        r = dict(zip(cols, values))
        by_snap.setdefault(r["snapshot_id"], {})[r["repo_id"]] = r
        # to the minute: two crawls of one day differ by more than their number
        dates[r["snapshot_id"]] = r["snapshot_date"].strftime("%Y-%m-%d %H:%M")

    def servable_families(rows: dict[str, dict[str, Any]]) -> set[str]:
        return {r["model_type"] or "(no model_type)" for r in rows.values() if matrix.serving(
            r["model_type"], servable_matrix.arch_list(r["architectures"]),
            r["declared_num_mtp_layers"], r["shipped_mtp_layers"])}

    out: list[SnapshotChanges] = []
    before: dict[str, dict[str, Any]] = {}
    previous: int | None = None
    for sid in sorted(by_snap):
        now = by_snap[sid]
        changed = [
            ValueChange(repo_id=rid, field=f, old=_text(before[rid][f]), new=_text(r[f]), revision=r["revision"])
            for rid, r in now.items() if rid in before
            for f in COMPARED if before[rid][f] != r[f]
        ]
        out.append(SnapshotChanges(
            snapshot_id=sid, date=dates[sid], n_models=len(now), previous=previous,
            added=sorted(set(now) - set(before)) if previous is not None else [],
            removed=sorted(set(before) - set(now)),
            new_mtp=sorted(rid for rid, r in now.items() if _mtp(r) and not (rid in before and _mtp(before[rid]))),
            changed=changed,
            newly_servable=sorted(servable_families(now) - servable_families(before)),
        ))
        before, previous = now, sid
    return out


# A row of a record: its condition, a readable name of it, and the verdict it got there.
_Row = tuple[tuple[Any, ...], str, str]


def _entries(runs: list[Run], checked: list[tuple[Path, conformance.ConformanceRecord]],
             root: Path) -> list[tuple[str, RecordChange, str, list[_Row]]]:
    """Every evidence record in run order, with its rows. A row's condition is (model, experiment
    key, workload, T, k) for a measurement, (engine build, hardware, layout, T class, draft sampling)
    for a conformance verdict: a build with run-time patches is its own subject, never a
    re-measurement of the release it patches."""
    entries: list[tuple[str, RecordChange, str, list[_Row]]] = []
    for run in runs:
        r = run.record
        # one series per experiment (records.experiment): a cell re-measures only a cell of the same key
        rows = [((r.model_id, *experiment_key(r, c), c.workload, c.temperature, c.draft_tokens),
                 f"{r.model_id}, {c.engine}, {c.workload}, T = {c.temperature:g}, k = {c.draft_tokens} "
                 f"[experiment {experiment_key(r, c).short}: {experiment_key(r, c).text}]",
                 c.gate_verdict or "—") for c in r.cells]
        entries.append((r.run_date.isoformat(), RecordChange(
            kind="measurement", source=published(run.source_path, root), record_id=run.record_id,
            date=r.run_date.strftime("%Y-%m-%d %H:%M"), subject=r.model_id, n_rows=len(rows),
            added=0, remeasured={}), "gate verdict", rows))
    for path, rec in checked:
        verdicts = conformance.verdicts([(path, rec)], root)
        rows = [(("conformance", v.build, v.hardware, v.layout, v.temperature, v.draft_sampling),
                 f"{v.build} on {v.hardware}: {v.layout}, T {v.temperature}, {v.draft_sampling} drafts", v.result)
                for v in verdicts]
        source = verdicts[0].source if verdicts else path.name
        subject = verdicts[0].build if verdicts else f"{rec.package} {rec.version}"
        entries.append((rec.run_date.isoformat(), RecordChange(
            kind="conformance", source=source, record_id=None, date=rec.run_date.strftime("%Y-%m-%d %H:%M"),
            subject=subject, n_rows=len(rows), added=0, remeasured={}), "result", rows))
    entries.sort(key=lambda e: (e[0], e[1].source))
    return entries


def _records(entries: list[tuple[str, RecordChange, str, list[_Row]]]) -> list[RecordChange]:
    """Each record against the records before it: the conditions it added, and the rows of which
    earlier record it measured again."""
    seen: dict[tuple[Any, ...], str] = {}  # condition -> the newest record that covered it
    out = []
    for _, change, _, rows in entries:
        for key in dict.fromkeys(k for k, _, _ in rows):
            if key in seen:
                change.remeasured[seen[key]] = change.remeasured.get(seen[key], 0) + 1
            else:
                change.added += 1
            seen[key] = change.source
        out.append(change)
    return out


def _moved(entries: list[tuple[str, RecordChange, str, list[_Row]]]) -> list[Moved]:
    """Every condition whose verdict differs between two of its records, with each value it took."""
    chains: dict[tuple[Any, ...], Moved] = {}
    for _, change, field, rows in entries:
        for key, label, value in rows:
            chain = chains.setdefault(key, Moved(kind=change.kind, condition=label, field=field, steps=[]))
            if not chain.steps or chain.steps[-1].value != value:
                chain.steps.append(Step(value=value, source=change.source, date=change.date))
    return [m for m in chains.values() if len(m.steps) > 1]


def collect(con: duckdb.DuckDBPyConnection, cat: Catalog, root: Path) -> Changelog:
    """From the store's snapshots and the evidence catalog (smoke runs left out)."""
    entries = _entries(cat.evidence_runs, cat.conformance_records, root)
    return Changelog(servable_date=cat.matrix.date.isoformat(), snapshots=_snapshots(con, cat.matrix),
                     records=_records(entries), moved=_moved(entries))


def dumps(log: Changelog) -> str:
    """Strict JSON (no NaN), ASCII, with no '<', '>' or '&' left raw (atlas.jsonfile.html_safe)."""
    return html_safe(json.dumps(log.model_dump(mode="json"), indent=1, sort_keys=True, ensure_ascii=True,
                                allow_nan=False)) + "\n"


def read(path: Path) -> Changelog | None:
    return read_written(path, Changelog, "atlas export")
