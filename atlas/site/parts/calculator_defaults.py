"""The calculator's default (widgets.Prefill) from the newest full measurement record: read at
evidence time, with the model pages' data, from the cells the store imported and their record files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atlas import AtlasError
from atlas.records import record as records
from atlas.site.parts.evidence_format import date_text
from atlas.site.parts.measured import record_setup
from atlas.site.parts.widgets import Prefill


def calculator_prefill(rows: list[dict[str, Any]], root: Path) -> Prefill | None:
    """The calculator's default: from the newest full (not --quick) record, the atlas-engine cell
    with the largest k at the highest temperature (the honest, sampled reading), on the first
    workload in name order. Its conditional acceptance and pass costs come from the record file."""
    by_record: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["engine"] == "atlas":
            by_record.setdefault(r["record_id"], []).append(r)
    newest_first = sorted(by_record.values(), key=lambda rs: (rs[0]["run_date"], rs[0]["record_id"]),
                          reverse=True)
    for mine in newest_first:
        path = Path(mine[0]["source_path"])
        try:
            record = records.read_record(path if path.is_absolute() else root / path)
        except (AtlasError, OSError):
            continue  # the tables still show its cells; only the calculator looks elsewhere
        if record.settings.quick:
            continue  # a smoke run is not evidence
        best = max(mine, key=lambda r: (r["temperature"], r["draft_tokens"],
                                        [-ord(c) for c in r["workload"]]))
        found = _prefill_from(record, best)
        if found is not None:
            return found
    return None


def _prefill_from(record: Any, best: dict[str, Any]) -> Prefill | None:
    cell = next((c for c in record.cells if c.engine == "atlas" and c.workload == best["workload"]
                 and c.temperature == best["temperature"] and c.draft_tokens == best["draft_tokens"]), None)
    verify = record.pass_costs.verify.get(best["draft_tokens"])
    if cell is None or verify is None:
        return None
    conditional = _conditional(cell)
    if not conditional:
        return None
    return Prefill(
        record_id=best["record_id"], run_date=date_text(best["run_date"]), model_id=record.model_id,
        hardware=record.hardware.label(), engine=cell.engine, workload=cell.workload,
        temperature=cell.temperature, conditional=conditional,
        draft_cost=record.pass_costs.draft / record.pass_costs.plain,
        verify_cost=verify / record.pass_costs.plain,
        verify_costs={k: v / record.pass_costs.plain for k, v in record.pass_costs.verify.items()},
        measured_tokens_per_pass=cell.derived.mean_accepted_length,
        measured_speedup=cell.derived.speedup,
        ideal_speedup=cell.derived.ideal_speedup,
        setup=record_setup(record),
    )


def _conditional(cell: Any) -> list[float]:
    """Per-position conditional acceptance: the record's own (accepted_i / reached_i, schema 2)
    where it has reached counts; for older records an estimate from the raw counts, where the
    rounds reaching draft i are accepted_(i-1) * drafted_i / drafted_(i-1) (a round reaches i when
    draft i-1 passed and it drafts that deep; the last rounds of a generation draft fewer)."""
    own = cell.derived.conditional_acceptance
    if own:
        out: list[float] = []
        for a in own:
            if a is None:
                break
            out.append(a)
        return out
    width = len(cell.repeats[0].accepted_per_position)
    accepted = [sum(r.accepted_per_position[i] for r in cell.repeats) for i in range(width)]
    drafted = [sum(r.drafted_per_position[i] for r in cell.repeats) for i in range(width)]
    conditional: list[float] = []
    for i in range(width):
        reached = drafted[0] if i == 0 else (
            accepted[i - 1] * drafted[i] / drafted[i - 1] if drafted[i - 1] else 0)
        if reached <= 0:
            break
        conditional.append(min(1.0, accepted[i] / reached))
    return conditional
