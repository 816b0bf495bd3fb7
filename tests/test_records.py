"""Measurement records: schema round trip, idempotent import, rejection of bad or tampered files."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from atlas import AtlasError
from atlas.measure.records import (
    Cell,
    Hardware,
    PassCosts,
    Record,
    Repeat,
    Settings,
    Software,
    derive,
    gate,
    import_records,
    read_record,
    write_record,
)
from atlas.store import connect


def make_record(model_id: str = "mtp-atlas/byte-mtp-8l", speed: float = 1.3) -> Record:
    costs = PassCosts(plain=0.002, verify={1: 0.0024, 2: 0.0026}, draft=0.0004)
    cells = []
    for workload, k, temperature in (("code", 1, 0.0), ("code", 2, 1.0), ("random", 2, 0.0)):
        repeats = [
            Repeat(
                tokens=64,
                seconds=0.1 + 0.01 * i,
                baseline_seconds=(0.1 + 0.01 * i) * speed * (1 if workload == "code" else 0.5),
                drafted_per_position=[20] * k,
                accepted_per_position=[15, 9][:k],
                verify_passes=20,
                identical_to_baseline=True if temperature == 0 else None,
            )
            for i in range(3)
        ]
        derived = derive(repeats, temperature, k, costs)
        enabled, reason = gate(derived, len(repeats))
        cells.append(
            Cell(engine="atlas", engine_version="0.1.0", baseline="atlas plain decoder (same cache)",
                 workload=workload, temperature=temperature, draft_tokens=k, repeats=repeats,
                 derived=derived, gate_enabled=enabled, gate_reason=reason)
        )
    return Record(
        schema_version=1,
        run_date=datetime(2026, 11, 29, 10, 0, tzinfo=timezone.utc),
        model_id=model_id,
        revision="sha256:" + "ab" * 32,
        hardware=Hardware(text="CPU: test (2 cores)", cpu="test", cpu_cores=2, memory_gib=8.0, torch_threads=1),
        software=Software(python="3.11", torch="2.13.0", transformers="5.24.0", atlas="0.1.0", atlas_commit=None),
        command="atlas measure run --quick",
        seed=0,
        prompt_set="atlas-entropy-v1",
        prompt_set_digest="0" * 64,
        settings=Settings(device="cpu", dtype="float32", workloads=["code", "random"], temperatures=[0.0, 1.0],
                          draft_tokens=[1, 2], max_new_tokens=64, repeats=3, prompts_per_workload=1),
        pass_costs=costs,
        cells=cells,
    )


def test_round_trip_and_gate(tmp_path: Path) -> None:
    record = make_record()
    path = write_record(record, tmp_path)
    again = read_record(path)
    assert again == record
    by_workload = {c.workload: c for c in again.cells if c.draft_tokens == 2}
    assert by_workload["code"].gate_enabled and by_workload["code"].derived.speedup_lo > 1
    assert not by_workload["random"].gate_enabled and "not above 1" in by_workload["random"].gate_reason
    decisions = {(g.workload, g.temperature): g for g in again.gates}
    assert decisions[("code", 1.0)].enabled and decisions[("code", 1.0)].draft_tokens == 2
    assert not decisions[("random", 0.0)].enabled and decisions[("random", 0.0)].draft_tokens is None
    first = again.cells[0].derived
    assert first.mean_accepted_length == pytest.approx(1 + 45 / 60)
    assert first.ideal_speedup == pytest.approx(first.mean_accepted_length * 0.002 / (0.0024 + 0.0004))


def test_import_is_idempotent(tmp_path: Path) -> None:
    write_record(make_record(), tmp_path / "m")
    write_record(make_record(model_id="other/model"), tmp_path / "m")
    con = connect(tmp_path / "db.duckdb")
    assert import_records(con, tmp_path / "m") == (2, 0, [])
    assert import_records(con, tmp_path / "m") == (0, 2, [])
    rows = con.execute("SELECT count(*), count(DISTINCT record_id) FROM measurement_cells").fetchone()
    assert rows == (6, 2)
    lossless = con.execute(
        "SELECT greedy_lossless FROM measurement_cells WHERE temperature > 0 LIMIT 1").fetchone()
    assert lossless == (None,)


def _tamper(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d["cells"][0]["derived"].update(speedup=9.9), "speedup"),
        (lambda d: d["cells"][0]["repeats"][0].update(accepted_per_position=[20]), "raw counts give"),
        (lambda d: d["cells"][1].update(gate_enabled=not d["cells"][1]["gate_enabled"]), "gate"),
        (lambda d: d["pass_costs"].update(draft=0.004), "ideal_speedup"),
        (lambda d: d["gates"][0].update(draft_tokens=3), "gate decisions"),
        (lambda d: d.pop("seed"), "seed"),
        (lambda d: d["cells"][0]["repeats"][0].update(accepted_per_position=[21]), "accepted exceeds drafted"),
        (lambda d: d.update(prompt_set_digest="not-a-digest"), "prompt_set_digest"),
    ],
    ids=["derived-speedup", "raw-count", "gate", "pass-cost", "gate-decision", "missing-field", "impossible-count", "bad-digest"],
)
def test_tampered_records_are_rejected_and_others_load(tmp_path: Path, edit, message: str) -> None:
    good = write_record(make_record(model_id="good/model"), tmp_path)
    bad = write_record(make_record(), tmp_path)
    _tamper(bad, edit)
    with pytest.raises(AtlasError, match=message) as info:
        read_record(bad)
    assert bad.name in str(info.value)
    con = connect(tmp_path / "db.duckdb")
    loaded, present, errors = import_records(con, tmp_path)
    assert (loaded, present) == (1, 0) and len(errors) == 1 and bad.name in errors[0]
    assert con.execute("SELECT DISTINCT model_id FROM measurement_cells").fetchall() == [("good/model",)]


def test_bad_json_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    write_record(make_record(), tmp_path)
    con = connect(tmp_path / "db.duckdb")
    loaded, _, errors = import_records(con, tmp_path)
    assert loaded == 1 and len(errors) == 1 and "broken.json" in errors[0]


def test_a_changed_file_replaces_its_previous_rows(tmp_path: Path) -> None:
    path = write_record(make_record(speed=1.3), tmp_path)
    con = connect(tmp_path / "db.duckdb")
    import_records(con, tmp_path)
    path.write_text(make_record(speed=2.0).model_dump_json())
    assert import_records(con, tmp_path)[0] == 1
    assert con.execute("SELECT count(DISTINCT record_id), count(*) FROM measurement_cells").fetchone() == (1, 3)


def test_gate_needs_three_repeats() -> None:
    fast = [Repeat(tokens=64, seconds=0.1, baseline_seconds=0.2, drafted_per_position=[20], accepted_per_position=[15],
                   verify_passes=20, identical_to_baseline=True)]
    assert gate(derive(fast * 2, 0.0, 1, None), 2) == (False, "off: too few repeats (2; the gate needs 3)")
    enabled, reason = gate(derive(fast * 3, 0.0, 1, None), 3)
    assert enabled and reason.startswith("on:")


def test_import_names_the_baseline_and_migrates_an_old_table(tmp_path: Path) -> None:
    write_record(make_record(), tmp_path / "m")
    con = connect(tmp_path / "db.duckdb")
    import_records(con, tmp_path / "m")
    # the table as an older version left it: no baseline column, this record's rows already in it
    con.execute("ALTER TABLE measurement_cells DROP COLUMN baseline")
    assert import_records(con, tmp_path / "m") == (1, 0, [])  # old rows are loaded again to fill the column
    assert con.execute("SELECT DISTINCT baseline FROM measurement_cells").fetchall() == [("atlas plain decoder (same cache)",)]
    assert import_records(con, tmp_path / "m") == (0, 1, [])


def test_an_unreadable_file_does_not_stop_the_others(tmp_path: Path) -> None:
    (tmp_path / "a-folder.json").mkdir()
    write_record(make_record(), tmp_path)
    con = connect(tmp_path / "db.duckdb")
    loaded, _, errors = import_records(con, tmp_path)
    assert loaded == 1 and len(errors) == 1 and "a-folder.json: cannot read" in errors[0]
