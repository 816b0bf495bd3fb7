"""The evidence runs: the measurement records the store imported, read back from their files and
checked against the id they were imported as (records.record_id)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from atlas import AtlasError
from atlas.records import record as records
from atlas.paths import ROOT


@dataclass
class Run:
    """One imported record, with the id the store knows it by (records.record_id)."""

    record: records.Record
    record_id: str
    source_path: str


def load_runs(sources: list[tuple[str, str]]) -> list[Run]:
    """(record_id, source_path) pairs from the store -> parsed records, checked against their id."""
    runs = []
    for record_id, source_path in sources:
        path = Path(source_path)
        path = path if path.is_absolute() else ROOT / path
        if not path.is_file():
            raise AtlasError(
                f"measurement record {source_path} (imported as {record_id[:12]}) is gone: restore the file, "
                f"or forget the record (`atlas measure forget {record_id[:12]}`)"
            )
        record = records.read_record(path)
        # the import's identity is the record's canonical serialisation (records.record_id), so a
        # schema-1 file parsed into the current model is still the record that was imported
        if records.record_id(record) != record_id:
            raise AtlasError(
                f"measurement record {source_path} changed since it was imported as "
                f"{record_id[:12]}: run `atlas measure import` again"
            )
        runs.append(Run(record, record_id, source_path))
    # a record with provenance (a project-made head on a real main model) leads: it is the
    # atlas's measurement on real text; the byte-level team model is the fast fixture after it
    runs.sort(key=lambda r: (r.record.provenance is None, r.record.run_date, r.record.model_id, r.record_id))
    return runs
