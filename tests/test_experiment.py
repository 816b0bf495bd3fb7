"""One series per experiment: what changes a cell's figures besides its workload, temperature and
draft length is in its experiment key, and the changelog re-measures a cell only within its key."""

from __future__ import annotations

from pathlib import Path

from atlas.engines.stamp import cpu_flags
from atlas.evidence import changelog
from atlas.evidence.runs import Run
from atlas.records.experiment import experiment_key
from atlas.records.record import Provenance, Record, record_id
from atlas.records.runcontext import DraftVocab
from test_records import make_record


def _variant(record: Record, **changes) -> Record:
    """`record` with its settings, hardware or provenance changed as named (settings.x, hardware.x)."""
    data = record.model_dump(by_alias=True)
    for name, value in changes.items():
        where, _, key = name.rpartition(".")
        (data[where] if where else data)[key] = value
    return Record.model_validate(data)


def test_each_condition_that_changes_the_figures_has_its_own_key() -> None:
    base = make_record()
    cell = base.cells[0]
    key = experiment_key(base, cell)
    assert key == experiment_key(_variant(base, seed=7, command="atlas measure run --again"), cell)  # not conditions
    head = Provenance(kind="k", project_made=True, model_id="m", main_model={}, mtp_head={"sha256": "ab" * 32}).model_dump()
    vocab = DraftVocab(size=4096, coverage=0.97, table_sha256="cd" * 32, source="s").model_dump()
    changed = {
        "revision": _variant(base, revision="sha256:" + "ef" * 32),
        "head": _variant(base, provenance=head),
        "draft vocabulary": _variant(base, **{"settings.draft_vocab": vocab}),
        "kernels": _variant(base, **{"settings.kernels": "rows"}),
        "threads": _variant(base, **{"hardware.torch_threads": 2}),
        "machine": _variant(base, **{"hardware.cpu": "Intel Xeon"}),
        "instruction sets": _variant(base, **{"hardware.cpu_flags": ["avx2", "amx_tile"]}),
    }
    for what, other in changed.items():
        assert experiment_key(other, cell) != key, what
    assert experiment_key(base, cell.model_copy(update={"engine_version": "0.2.0"})) != key
    assert key.isa == "unknown" and experiment_key(changed["instruction sets"], cell).isa == "avx2, amx_tile"


def test_cpu_flags_name_the_kernel_changing_sets() -> None:
    info = "processor : 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni amx_tile amx_bf16 other\n"
    assert cpu_flags(info) == ["avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_bf16"]
    assert cpu_flags("flags : fpu sse\n") == []


def test_the_changelog_remeasures_only_within_an_experiment() -> None:
    first = make_record()
    same = _variant(first, run_date="2026-11-30T10:00:00Z")
    other_head = _variant(first, run_date="2026-12-01T10:00:00Z",
                          provenance=Provenance(kind="k", project_made=True, model_id=first.model_id, main_model={},
                                                mtp_head={"sha256": "ab" * 32}).model_dump())
    runs = [Run(r, record_id(r), f"evidence/measurements/r{i}.json") for i, r in enumerate((first, same, other_head))]
    records = changelog._records(changelog._entries(runs, [], Path(".")))
    assert [(r.added, sum(r.remeasured.values())) for r in records] == [(3, 0), (0, 3), (3, 0)]


def test_a_cut_draft_is_the_measured_engines_never_a_peers() -> None:
    """llama.cpp drafting over a cut vocabulary (its nextn-d2t patch) is its own experiment; a peer's
    cells beside our loop's (transformers' generate) never take our loop's cut."""
    from atlas.records.experiment import OWN
    from atlas.records.record import read_record

    vocab = DraftVocab(size=8192, coverage=0.97, table_sha256="cd" * 32, source="s").model_dump()
    stock = read_record(Path(__file__).resolve().parents[1] / "evidence" / "measurements"
                        / "20261205T035801Z-mtp-atlas-smollm2-135m-instruct-mtp-5590d70ba230.json")
    assert stock.engine_run is not None and stock.engine_run.name == "llamacpp"
    cut = _variant(stock, **{"settings.draft_vocab": vocab})
    assert {experiment_key(stock, c).draft_vocab for c in stock.cells} == {OWN}
    assert {experiment_key(cut, c).draft_vocab for c in cut.cells} == {"cd" * 32}
    ours = _variant(make_record(), **{"settings.draft_vocab": vocab})
    peer = ours.cells[0].model_copy(update={"engine": "transformers", "engine_version": "transformers 4.57"})
    assert experiment_key(ours, ours.cells[0]).draft_vocab == "cd" * 32 and experiment_key(ours, peer).draft_vocab == OWN


def _engine_variant(record: Record, *, patches: list[dict] | None = None, threads: int | None = None,
                    policy: object = "absent", stamped: str | None = "PASSIVE") -> Record:
    """A llama.cpp record with its build's patches, its engine's threads, the wait policy its
    servers recorded ("absent": a record from before they recorded it) and the atlas's own stamp."""
    data = record.model_dump(by_alias=True)
    run = data["engine_run"]
    run["build"] = {**(run.get("build") or {}), "patches": patches or []}
    if threads is not None:
        run["engine_args"]["threads"] = threads
        data["hardware"]["torch_threads"] = threads
    run["engine_args"].pop("omp_wait_policy", None)
    if policy != "absent":
        run["engine_args"]["omp_wait_policy"] = policy
    data["hardware"]["omp_wait_policy"] = stamped
    return Record.model_validate(data)


def test_a_patched_build_and_a_sleeping_thread_pool_each_start_a_series() -> None:
    """The atlas's llama.cpp patches change the engine's figures (the repacked 2-row GEMV), as did
    the OpenMP wait policy its servers inherited at 2 threads: each is part of the key; a policy
    cannot matter to one thread, so 1-thread series stay whole."""
    from atlas.records.experiment import engine_wait_policy
    from atlas.records.record import read_record

    stock = read_record(Path(__file__).resolve().parents[1] / "evidence" / "measurements"
                        / "20261205T035801Z-mtp-atlas-smollm2-135m-instruct-mtp-5590d70ba230.json")
    cell = stock.cells[0]
    d2t = {"file": "llamacpp-b11434-nextn-d2t.patch", "sha256": "aa" * 32}
    rows = {"file": "llamacpp-b11434-repack-gemv-rows.patch", "sha256": "bb" * 32}
    keys = {name: experiment_key(_engine_variant(stock, patches=p), cell)
            for name, p in {"none": [], "d2t": [d2t], "both": [d2t, rows],
                            "d2t edited": [{**d2t, "sha256": "cc" * 32}, rows]}.items()}
    assert len({k.short for k in keys.values()}) == 4
    assert keys["none"] == experiment_key(stock, cell)  # a stock build's key is as before
    assert "atlas patches llamacpp-b11434-nextn-d2t, llamacpp-b11434-repack-gemv-rows" in keys["both"].text
    # 2 threads: the servers' own record of the policy wins; an older record's is the atlas's stamp
    inherited = _engine_variant(stock, threads=2)
    unset = _engine_variant(stock, threads=2, policy=None)
    told = _engine_variant(stock, threads=2, policy="ACTIVE", stamped="PASSIVE")
    assert [engine_wait_policy(r) for r in (inherited, unset, told)] == ["PASSIVE", None, "ACTIVE"]
    assert len({experiment_key(r, cell) for r in (inherited, unset, told)}) == 3
    assert "OpenMP wait PASSIVE" in experiment_key(inherited, cell).text
    one = _engine_variant(stock, threads=1)
    assert engine_wait_policy(one) is None and experiment_key(one, cell) == experiment_key(_engine_variant(stock, threads=1, policy=None), cell)
    # our loop's own runs keep their series: the policy is its process's, the same in every record
    ours = make_record()
    assert engine_wait_policy(ours) is None
