"""Measurement records: schema round trip, idempotent import, rejection of bad or tampered files."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from atlas import AtlasError
from atlas.records.gating import GATE_RULE, derive, gate, judge
from atlas.records.record import (
    COLUMNS,
    SCHEMA_VERSION,
    Cell,
    PassCosts,
    Record,
    Repeat,
    canonical_bytes,
    forget_record,
    import_records,
    parse_record,
    read_record,
    record_id,
    write_record,
)
from atlas.records.runcontext import Hardware, Settings, Software
from atlas.paths import ROOT
from atlas.store.db import connect


def make_record(model_id: str = "mtp-atlas/byte-mtp-8l", speed: float = 1.3) -> Record:
    costs = PassCosts(plain=0.002, verify={1: 0.0024, 2: 0.0026}, draft=0.0004)
    cells = []
    for workload, k, temperature in (("code", 1, 0.0), ("code", 2, 1.0), ("random", 2, 0.0)):
        repeats = [
            Repeat(
                tokens=20 + [15, 9][:k][-1] + (15 if k == 2 else 0),  # accepted drafts + verify passes
                seconds=0.1 + 0.01 * i,
                baseline_seconds=(0.1 + 0.01 * i) * speed * (1 if workload == "code" else 0.5) * (1 + 0.02 * i),
                drafted_per_position=[20] * k,
                reached_per_position=[20, 15][:k],
                accepted_per_position=[15, 9][:k],
                verify_passes=20,
                identical_to_baseline=True if temperature == 0 else None,
                pass_costs=PassCosts(plain=0.002 * (1 + 0.01 * i), verify={1: 0.0024, 2: 0.0026}, draft=0.0004),
            )
            for i in range(3)
        ]
        derived, g = judge(repeats, temperature, k, costs)
        cells.append(
            Cell(engine="atlas", engine_version="0.1.0", baseline="atlas plain decoder (same cache)",
                 workload=workload, temperature=temperature, draft_tokens=k, repeats=repeats,
                 derived=derived, gate_enabled=g.enabled, gate_verdict=g.verdict, gate_reason=g.reason)
        )
    return Record(
        schema_version=SCHEMA_VERSION,
        run_date=datetime(2026, 11, 29, 10, 0, tzinfo=timezone.utc),
        model_id=model_id,
        revision="sha256:" + "ab" * 32,
        hardware=Hardware(text="CPU: test (2 cores)", cpu="test", cpu_cores=2, memory_gib=8.0, torch_threads=1),
        software=Software(python="3.11", torch="2.13.0", transformers="5.24.0", atlas="0.1.0", atlas_commit=None,
                          atlas_tree_dirty=False, numpy="2.3", blas="openblas", os="Linux"),
        command="atlas measure run",
        seed=0,
        prompt_set="atlas-entropy-v1",
        prompt_set_digest="0" * 64,
        settings=Settings(device="cpu", dtype="float32", workloads=["code", "random"], temperatures=[0.0, 1.0],
                          draft_tokens=[1, 2], max_new_tokens=64, repeats=3, prompts_per_workload=1),
        pass_costs=costs,
        cells=cells,
        load_before=[0.5, 0.4, 0.3],
        load_after=[0.6, 0.4, 0.3],
        gate_rule=GATE_RULE,
    )


def test_round_trip_and_gate(tmp_path: Path) -> None:
    record = make_record()
    path = write_record(record, tmp_path)
    again = read_record(path)
    assert again == record
    by_workload = {c.workload: c for c in again.cells if c.draft_tokens == 2}
    assert by_workload["code"].gate_enabled and by_workload["code"].derived.speedup_slowest_repeat > 1
    assert not by_workload["random"].gate_enabled and by_workload["random"].gate_reason.startswith("off: 95 % bounds")
    decisions = {(g.workload, g.temperature): g for g in again.gates}
    assert decisions[("code", 1.0)].enabled and decisions[("code", 1.0)].draft_tokens == 2
    assert not decisions[("random", 0.0)].enabled and decisions[("random", 0.0)].draft_tokens is None
    first = again.cells[0].derived
    assert first.mean_accepted_length == pytest.approx(1 + 45 / 60)
    tokens = sum(r.tokens for r in again.cells[0].repeats)
    passes = sum(r.verify_passes for r in again.cells[0].repeats)
    assert first.mean_accepted_length == pytest.approx(tokens / passes)  # counted independently: tokens per pass
    assert first.ideal_speedup == pytest.approx(first.mean_accepted_length * 0.002 / (0.0024 + 0.0004))
    k2 = again.cells[1].derived
    assert k2.acceptance_rate == pytest.approx(24 / 40)  # pooled accepted / drafted
    assert k2.per_position_acceptance == pytest.approx([15 / 20, 9 / 20])
    assert k2.conditional_acceptance == pytest.approx([15 / 20, 9 / 15])  # accepted_i / reached_i


def test_a_cpu_is_named_with_its_widest_instruction_set() -> None:
    # two machines report "AMD EPYC (2 cores)": one with AVX2 only, one with AVX-512; their pass costs differ
    hw = Hardware(text="CPU: AMD EPYC (2 cores)", cpu="AMD EPYC", cpu_cores=2, memory_gib=8.0, torch_threads=1, cpu_flags=["avx2"])
    assert hw.label() == "CPU: AMD EPYC (2 cores, AVX2)"
    flags = {"AVX-512": ["avx2", "avx512f", "avx512_vnni"], "AMX": ["avx2", "avx512f", "amx_tile"], "no AVX2": []}
    for isa, have in flags.items():
        assert hw.model_copy(update={"cpu_flags": have}).label() == f"CPU: AMD EPYC (2 cores, {isa})"
    assert hw.model_copy(update={"cpu_flags": None}).label() == "CPU: AMD EPYC (2 cores)"  # stamped before flags were
    gpu = hw.model_copy(update={"text": "GPU: NVIDIA H200", "gpu": "NVIDIA H200"})
    assert gpu.label() == "GPU: NVIDIA H200"


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


def test_a_renamed_record_keeps_its_rows_under_its_new_path(tmp_path: Path) -> None:
    path = write_record(make_record(), tmp_path / "m")
    con = connect(tmp_path / "db.duckdb")
    assert import_records(con, tmp_path / "m")[0] == 1
    moved = path.rename(path.with_name("renamed.json"))
    assert import_records(con, tmp_path / "m") == (0, 1, [])
    paths = {r[0] for r in con.execute("SELECT DISTINCT source_path FROM measurement_cells").fetchall()}
    assert paths == {moved.resolve().as_posix()}, paths
    assert forget_record(con, paths.pop()) and con.execute("SELECT count(*) FROM measurement_cells").fetchone() == (0,)


def _tamper(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d["cells"][0]["derived"].update(speedup=9.9), "speedup"),
        (lambda d: d["cells"][0]["repeats"][0].update(accepted_per_position=[14]), "raw counts give"),
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
    write_record(make_record(model_id="good/model"), tmp_path)
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


def fast(ratio: float, i: int = 0) -> Repeat:
    return Repeat(tokens=35, seconds=0.1, baseline_seconds=0.1 * ratio, drafted_per_position=[20], reached_per_position=[20],
                  accepted_per_position=[15], verify_passes=20, identical_to_baseline=True)


def test_gate_is_a_paired_confidence_rule() -> None:
    assert gate(derive([fast(2.0)] * 2, 0.0, 1, None), 2) == ("undecided", "undecided: too few repeats (2; the gate needs 3)")
    g = gate(derive([fast(r) for r in (1.30, 1.32, 1.28, 1.31, 1.29)], 0.0, 1, None), 5)
    assert g.enabled and g.verdict == "on" and g.reason.startswith("on: 95 % bounds")
    g = gate(derive([fast(r) for r in (0.80, 0.82, 0.79)], 0.0, 1, None), 3)
    assert not g.enabled and g.verdict == "off" and g.reason.startswith("off:")
    # a noisy cell whose median is above 1 is neither on nor off: it could flip on a rerun
    g = gate(derive([fast(r) for r in (1.4, 0.8, 1.1, 0.9, 1.3)], 0.0, 1, None), 5)
    assert not g.enabled and g.verdict == "undecided" and g.reason.startswith("undecided:")
    assert gate(derive([fast(1.3)] * 5, 0.0, 1, None), 5, quick=True) == ("undecided", "undecided: a --quick run never sets a gate")


def test_headline_speedup_is_the_median_and_efficiency_has_bounds() -> None:
    costs = PassCosts(plain=0.002, verify={1: 0.0024}, draft=0.0004)
    repeats = [fast(r).model_copy(update={"pass_costs": costs}) for r in (1.1, 1.5, 1.2)]
    d = derive(repeats, 0.0, 1, costs)
    assert d.speedup == pytest.approx(1.2) and (d.speedup_slowest_repeat, d.speedup_fastest_repeat) == pytest.approx((1.1, 1.5))
    ideal = (35 / 20) * 0.002 / (0.0024 + 0.0004)
    assert d.efficiency == pytest.approx(1.2 / ideal)
    assert (d.efficiency_lo, d.efficiency_hi) == pytest.approx((1.1 / ideal, 1.5 / ideal))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["cells"][0]["repeats"][0].update(tokens=30), "accepted drafts \\+ verify passes \\(15 \\+ 20\\) exceed its tokens \\(30\\)"),
    (lambda d: d["cells"][0]["repeats"][0].update(seconds=1e-9), "is impossible"),
    (lambda d: d["cells"][1]["repeats"][0].update(reached_per_position=[20, 18]), "reached counts impossible"),
    (lambda d: d["cells"][0]["repeats"][0].update(verify_passes=10, tokens=25), "first drafts but only 10 verify passes"),
], ids=["tokens", "seconds", "reached", "passes"])
def test_impossible_counts_are_rejected_by_name(tmp_path: Path, edit, message: str) -> None:
    path = write_record(make_record(), tmp_path)
    _tamper(path, edit)
    with pytest.raises(AtlasError, match=f"rejected, impossible figures: .*{message}"):
        read_record(path)


def test_efficiency_far_above_one_is_rejected(tmp_path: Path) -> None:
    record = make_record(speed=300.0)  # 300 times faster than its own acceptance and pass costs allow
    with pytest.raises(ValueError, match="efficiency"):
        write_record(record, tmp_path)


def test_identity_is_the_canonical_content(tmp_path: Path) -> None:
    path = write_record(make_record(), tmp_path / "m")
    con = connect(tmp_path / "db.duckdb")
    assert import_records(con, tmp_path / "m")[:2] == (1, 0)
    (tmp_path / "m" / "same-record-other-whitespace.json").write_text(json.dumps(json.loads(path.read_text()), indent=4))
    assert import_records(con, tmp_path / "m") == (0, 2, [])
    assert con.execute("SELECT count(DISTINCT record_id), count(*) FROM measurement_cells").fetchone() == (1, 3)


def test_an_oversized_file_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from atlas.records import record as records

    path = write_record(make_record(), tmp_path)
    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 1000)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read an oversized file"))
    with pytest.raises(AtlasError, match="over the 1,000-byte limit"):
        read_record(path)


def test_the_committed_schema_1_record_still_imports(tmp_path: Path) -> None:
    committed = sorted((ROOT / "evidence" / "measurements").glob("*.json"))
    v1 = [p for p in committed if json.loads(p.read_text())["schema_version"] == 1]
    for path in v1:
        record = read_record(path)
        assert record.schema_version == 1 and record.cells
    con = connect(tmp_path / "db.duckdb")
    loaded, _, errors = import_records(con, ROOT / "evidence" / "measurements")
    assert loaded == len(committed) and not errors


def test_older_records_get_the_typed_verdict_and_keep_their_identity() -> None:
    """Files written before schema 3 have the gate's verdict only as the first word of its reason:
    it is derived on reading, and they still serialise byte for byte as written (same record id)."""
    committed = sorted((ROOT / "evidence" / "measurements").glob("*.json"))
    old = [p for p in committed if json.loads(p.read_text())["schema_version"] < 3]
    assert old
    for path in old:
        raw = json.loads(path.read_text())
        record = read_record(path)
        assert canonical_bytes(record) == path.read_bytes()
        assert record_id(record).startswith(path.stem.rsplit("-", 1)[1])
        for cell, stored in zip(record.cells, raw["cells"]):
            assert "gate_verdict" not in stored
            assert cell.gate_verdict == stored["gate_reason"].split(":")[0].split()[0]
            assert cell.gate_enabled == (cell.gate_verdict == "on")
        for g, stored in zip(record.gates, raw["gates"]):
            assert g.verdict == stored["reason"].split(":")[0].split()[0]


def test_the_verdict_is_a_field_of_new_records_and_must_follow_the_rule(tmp_path: Path) -> None:
    record = make_record()
    data = json.loads(read_record(write_record(record, tmp_path)).model_dump_json())
    assert [c["gate_verdict"] for c in data["cells"]] == [c.gate_verdict for c in record.cells]
    assert {c["gate_verdict"] for c in data["cells"]} == {"on", "off"}
    assert [g["verdict"] for g in data["gates"]] == [g.verdict for g in record.gates] == ["on", "on", "off"]
    data["cells"][1]["gate_verdict"] = "undecided"
    with pytest.raises(AtlasError, match="the gate does not follow"):
        parse_record(json.dumps(data).encode(), tmp_path / "x.json")
    data["cells"][1]["gate_verdict"] = "maybe"
    with pytest.raises(AtlasError, match="gate_verdict"):
        parse_record(json.dumps(data).encode(), tmp_path / "x.json")


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


def test_a_table_from_before_issue_23_keeps_its_speedup_range_under_the_new_names_and_fills_the_new_columns(
        tmp_path: Path) -> None:
    """speedup_lo / speedup_hi became speedup_slowest_repeat / _fastest_repeat (they are the range of
    the repeats, not confidence bounds); the verdict, paired bounds, acceptance lists, pass costs and
    provenance columns came with them. A store as the older version left it is migrated in place."""
    record = make_record()
    write_record(record, tmp_path / "m")
    con = connect(tmp_path / "db.duckdb")
    import_records(con, tmp_path / "m")
    con.execute("ALTER TABLE measurement_cells RENAME COLUMN speedup_slowest_repeat TO speedup_lo")
    con.execute("ALTER TABLE measurement_cells RENAME COLUMN speedup_fastest_repeat TO speedup_hi")
    added = COLUMNS[COLUMNS.index("baseline") + 1:]
    for name in added:
        con.execute(f"ALTER TABLE measurement_cells DROP COLUMN {name}")
    assert import_records(con, tmp_path / "m") == (1, 0, [])
    have = {n for (n,) in con.execute("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'measurement_cells'").fetchall()}
    assert have == set(COLUMNS) and not have & {"speedup_lo", "speedup_hi"}
    got = con.execute("SELECT workload, temperature, draft_tokens, speedup_slowest_repeat, speedup_fastest_repeat, "
                      "gate_verdict, speedup_paired_lower_95, pass_verify_seconds, provenance_recorded "
                      "FROM measurement_cells ORDER BY ALL").fetchall()
    want = sorted((c.workload, c.temperature, c.draft_tokens,
                   min(r.baseline_seconds / r.seconds for r in c.repeats),
                   max(r.baseline_seconds / r.seconds for r in c.repeats),
                   c.gate_verdict, c.derived.speedup_bound_lo, record.pass_costs.verify[c.draft_tokens], False)
                  for c in record.cells)
    assert got == want
    assert import_records(con, tmp_path / "m") == (0, 1, [])
