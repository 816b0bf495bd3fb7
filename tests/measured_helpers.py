"""Measurement records built through the records module for the measured-section tests (several
prompts and repeats, the real derive and gate): a k = 1 cell at T = 0 per workload, of a real model
(with provenance) or of the teaching model."""

from __future__ import annotations

from datetime import datetime, timezone

from atlas.evidence.runs import Run
from atlas.records import gating, record as records, runcontext

COSTS = records.PassCosts(plain=0.010, verify={1: 0.0153}, draft=0.0021)


def make_cell(workload: str, speeds: list[float], accepted: int) -> records.Cell:
    """One k = 1 cell at T = 0: one repeat per speed-up (plain seconds ÷ speculative seconds), each
    over 3 prompts' drafts (60 drafted, `accepted` kept)."""
    repeats = [
        records.Repeat(tokens=60 + accepted, seconds=1.0, baseline_seconds=s, drafted_per_position=[60],
                       reached_per_position=[60], accepted_per_position=[accepted], verify_passes=60,
                       identical_to_baseline=True, pass_costs=COSTS)
        for s in speeds
    ]
    derived = gating.derive(repeats, 0.0, 1, COSTS, rule=1)
    g = gating.gate(derived, len(repeats), False)
    return records.Cell(engine="atlas", engine_version="0.1.0", baseline="atlas plain decoder", workload=workload,
                        temperature=0.0, draft_tokens=1, repeats=repeats, derived=derived,
                        gate_enabled=g.enabled, gate_reason=g.reason)


def make_run(model_id: str, speeds: dict[str, list[float]], *, real: bool, day: int = 1) -> Run:
    provenance = records.Provenance(
        kind="project-made MTP head on a real main model", project_made=True, model_id=model_id,
        main_model={"source": "Org/Real-Main"}, mtp_head={"made_by": "the test", "steps": 150},
    ) if real else None
    record = records.Record(
        schema_version=3, run_date=datetime(2026, 12, day, 9, 0, tzinfo=timezone.utc), model_id=model_id,
        revision="sha256:" + "cd" * 32,
        hardware=runcontext.Hardware(text="CPU: test box (8 cores)", cpu="test", cpu_cores=8, memory_gib=8.0,
                                  torch_threads=1),
        software=runcontext.Software(python="3.11", torch="2.13.0", transformers="5.24.0", atlas="0.1.0",
                                  atlas_commit=None, atlas_tree_dirty=False, numpy="2.3", blas="openblas", os="Linux"),
        command="atlas measure run", seed=0, prompt_set="p", prompt_set_digest="0" * 64,
        settings=runcontext.Settings(device="cpu", dtype="float32", workloads=list(speeds), temperatures=[0.0],
                                  draft_tokens=[1], max_new_tokens=64, repeats=4, prompts_per_workload=3),
        pass_costs=COSTS, provenance=provenance,
        cells=[make_cell(w, s, 45 if min(s) > 1 else 12) for w, s in speeds.items()],
    )
    return Run(record, records.record_id(record), f"evidence/measurements/{model_id.replace('/', '-')}-{day}.json")


GAIN = {"code": [1.30, 1.34, 1.28, 1.31], "chat": [0.80, 0.82, 0.79, 0.81]}
LOSS = {"code": [0.71, 0.69, 0.70, 0.72], "chat": [0.60, 0.62, 0.61, 0.59]}
# faster by the median, but repeats too scattered for the paired bound: the gate stays undecided
UNSURE = {"code": [1.50, 0.80, 1.40, 0.70], "chat": [0.60, 0.62, 0.61, 0.59]}
BIG_GAIN = {"code": [1.90, 1.95, 1.92, 1.91], "chat": [1.50, 1.52, 1.49, 1.51]}
