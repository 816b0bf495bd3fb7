"""A `measure run` stopped by SIGINT writes no record (issue 25 F10), even where code on the way
catches the KeyboardInterrupt, and a record is written whole or not at all."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from atlas.cli import cli
from atlas.records import record as records
from atlas.engines.ours import engine as atlas_engine
from atlas.checkpoints.oracles import write_checkpoint

TINY = ["--workloads", "templated", "--temperatures", "0", "--draft-tokens", "1", "--max-new-tokens", "8",
        "--repeats", "1", "--prompts-per-workload", "1", "--no-peer"]


def _run(tmp_path: Path) -> object:
    folder = write_checkpoint("mimo", tmp_path / "ckpt", "oracle", depth=2)
    return CliRunner().invoke(cli, ["measure", "run", "--model", str(folder), *TINY, "--out", str(tmp_path / "out")])


def _written(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    return sorted(p.name for p in out.iterdir()) if out.is_dir() else []


def test_a_sigint_that_code_on_the_way_swallows_still_writes_no_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    progress = atlas_engine.progress_line

    def interrupted_here(*args: object) -> str:
        try:  # a real SIGINT to this process mid-run, caught as a library's wait or progress bar may do
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        return progress(*args)

    monkeypatch.setattr(atlas_engine, "progress_line", interrupted_here)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a background job
    result = _run(tmp_path)
    assert result.exit_code == 1 and "interrupted (SIGINT): the run did not finish, so no record was written" in result.output
    assert _written(tmp_path) == []
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back


def test_a_sigint_mid_run_exits_130_without_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atlas_engine, "progress_line", lambda *args: signal.raise_signal(signal.SIGINT))
    result = _run(tmp_path)
    assert result.exit_code == 130 and "Interrupted: the run did not finish, so no record was written." in result.output
    assert _written(tmp_path) == []
    monkeypatch.undo()
    assert _run(tmp_path).exit_code == 0 and len(_written(tmp_path)) == 1  # the next run writes as before


def test_a_sigterm_mid_run_takes_the_interrupts_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kill` or timeout(1) mid-run: no record, no traceback, and the command line's SIGTERM
    handler given back (Python's default would end the process before any cleanup ran)."""
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(atlas_engine, "progress_line", lambda *args: signal.raise_signal(signal.SIGTERM))
    result = _run(tmp_path)
    assert result.exit_code == 130 and "the run did not finish, so no record was written" in result.output
    assert "Traceback" not in result.output and _written(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_record_cut_while_it_is_written_leaves_nothing_import_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_records import make_record

    def cut(src: object, dst: object) -> None:
        raise KeyboardInterrupt  # the signal lands between the bytes and the rename

    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        records.write_record(make_record(model_id="o/m"), tmp_path / "out")
    assert _written(tmp_path) == []
