"""Issue 40 §4: Ctrl-C anywhere in `atlas export` ends with one line (exit 130), and the export
that was there before is whole, byte for byte; no staging folder is left. A real SIGINT is raised
at points spread over the whole export (every N-th call into the atlas's own code), and, in a
child process, at moments spread over its run, where it may land inside a DuckDB query."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from site_helpers import REPO, crawl_mirror, import_folder

from atlas.cli import cli

ATLAS = str(REPO / "atlas")
GENERATORS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("export-interrupt") / "atlas.duckdb"
    crawl_mirror(db)
    assert import_folder(db, REPO / "evidence" / "measurements")
    return db


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def previous(store: Path, tmp_path: Path) -> Iterator[tuple[Path, dict[str, bytes]]]:
    out = tmp_path / "export"
    assert CliRunner().invoke(cli, ["export", "--db", str(store), "--out", str(out)]).exit_code == 0
    yield out, _files(out)


def _atlas_calls(limit: int | None, start: str = "export", signum: int = signal.SIGINT) -> tuple[list[int], object]:
    """A trace function counting calls into the atlas's code from the call of atlas.export.export on
    (before it, a Ctrl-C gets the command line's generic line), raising a real SIGINT at call `limit`
    (at 1 it would be raised on the function's entry, before its first line)."""
    seen = [0]

    def trace(frame, event, arg):
        # a generator's frame is left out: its "call" may be its close() as it is freed, where CPython
        # drops any exception ("Exception ignored in: <generator ...>"), a Ctrl-C included
        if frame.f_code.co_flags & GENERATORS:
            return None
        if event == "call" and frame.f_code.co_filename.startswith(ATLAS) and (seen[0] or frame.f_code.co_name == start):
            seen[0] += 1
            if seen[0] == limit:
                signal.raise_signal(signum)
        return None

    return seen, trace


def _export(store: Path, out: Path, limit: int | None, command: str = "export", start: str = "export",
            signum: int = signal.SIGINT) -> tuple[object, int]:
    seen, trace = _atlas_calls(limit, start, signum)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    sys.settrace(trace)
    try:
        result = CliRunner().invoke(cli, [command, "--db", str(store), "--out", str(out)])
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, handler)
    return result, seen[0]


def _assert_whole(out: Path, before: dict[str, bytes]) -> None:
    """The export folder holds an export whole: the files `before` names, byte for byte, but for the
    marker's time of writing (an interrupt that lands after the swap leaves the new export, whose
    marker was written seconds later; the same store writes every other byte the same)."""
    assert _unstamped(_files(out)) == _unstamped(before)
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # no staging left


def _unstamped(files: dict[str, bytes]) -> dict[str, object]:
    marker = json.loads(files[".atlas-output.json"])
    assert marker["command"] == "atlas export" and marker.pop("written")
    return {**files, ".atlas-output.json": marker}


def test_ctrl_c_at_any_point_of_the_export_is_one_line_and_the_previous_export_stays_whole(store: Path, previous) -> None:
    out, before = previous
    _, total = _export(store, out, None)  # a whole export, counting the calls
    assert total > 100
    before = _files(out)
    for limit in sorted({2, 3, total // 50, total // 10, total // 4, total // 2, 3 * total // 4, total - 50, total - 5}):
        result, _ = _export(store, out, limit)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 130 and len(lines) == 1, (limit, result.output)
        # the same store writes the same bytes, so either answer leaves `before` there
        assert lines[0] in (f"Error: interrupted: the export to {out} was not written; a previous export there is as it was",
                            f"Error: interrupted after the export to {out} was written: it is whole"), limit
        _assert_whole(out, before)


def _child(args: list[str]) -> subprocess.Popen:
    """`atlas export` in a child with Ctrl-C's handler as in a terminal, once its modules are imported
    (a Ctrl-C during Python's own imports is Python's, before any atlas code runs)."""
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from atlas.cli import cli; sys.argv[0] = 'atlas'; print('ready', flush=True); cli()")
    child = subprocess.Popen([sys.executable, "-c", code, *args], env={**os.environ, "PYTHONPATH": str(REPO)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def test_ctrl_c_from_outside_while_the_export_runs_is_one_line(store: Path, previous) -> None:
    """A child `atlas export`, SIGINT at moments over its run (some land inside a DuckDB query, which
    DuckDB's client raises as RuntimeError 'Query interrupted'): never a traceback, never a lost export."""
    out, before = previous
    args = ["export", "--db", str(store), "--out", str(out)]
    child = _child(args)
    started = time.monotonic()
    assert child.wait(timeout=300) == 0
    whole = time.monotonic() - started
    before = _files(out)
    for share in (0.1, 0.3, 0.5, 0.7, 0.9):
        child = _child(args)
        time.sleep(whole * share)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=300)
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) <= 1, (share, stderr)
        # it finished first: the new export, whole (-2, silent: the signal came as Python was exiting,
        # after it had given SIGINT back to the system, the way any finished program ends)
        if child.returncode == 0 or (child.returncode == -signal.SIGINT and not stderr):
            assert sorted(_files(out)) == sorted(before)
            before = _files(out)
        else:
            assert child.returncode == 130, (share, child.returncode, stderr)
            assert stderr.strip() in ("Interrupted (Ctrl-C).", f"Error: interrupted: the export to {out} was not "
                                      "written; a previous export there is as it was",
                                      f"Error: interrupted after the export to {out} was written: it is whole"), stderr
            _assert_whole(out, before)


def test_ctrl_c_at_any_point_of_atlas_evidence_is_one_line_and_each_file_stays_whole(store: Path, tmp_path: Path) -> None:
    """`atlas evidence` writes two files, each aside and renamed: a Ctrl-C anywhere is one line, and
    each file is the previous one or the new one, whole; nothing half-written is left."""
    out = tmp_path / "ev" / "module-08.evidence.md"
    out.parent.mkdir()
    _export(store, out, None, "evidence", "evidence_cmd")  # warm: the first run fills caches, and calls more
    _, total = _export(store, out, None, "evidence", "evidence_cmd")
    assert total > 100
    whole = _files(out.parent)
    assert sorted(whole) == ["models.json", "module-08.evidence.md"]
    for limit in sorted({2, 3, total // 10, total // 3, total // 2, 2 * total // 3, total - 20, total - 3}):
        result, _ = _export(store, out, limit, "evidence", "evidence_cmd")
        assert result.exit_code == 130 and result.output.strip() == "Interrupted (Ctrl-C).", (limit, result.output)
        assert _files(out.parent) == whole  # the same store writes the same bytes: old or new, each is whole


def test_a_sigterm_in_atlas_evidence_is_one_line_exit_143_and_each_file_stays_whole(store: Path, tmp_path: Path) -> None:
    """`kill` (or timeout(1)) takes Ctrl-C's way out: the same cleanup, its own line and status."""
    out = tmp_path / "ev" / "module-08.evidence.md"
    out.parent.mkdir()
    _, total = _export(store, out, None, "evidence", "evidence_cmd")
    whole = _files(out.parent)
    for limit in (total // 3, 2 * total // 3):
        result, _ = _export(store, out, limit, "evidence", "evidence_cmd", signal.SIGTERM)
        assert result.exit_code == 143 and result.output.strip() == "Terminated (SIGTERM).", (limit, result.output)
        assert _files(out.parent) == whole


def test_ctrl_c_just_after_the_swap_says_the_new_export_is_whole(store: Path, previous) -> None:
    """SIGINT as the new folder has just been swapped in (the old one not yet removed): the line
    says the export was written, and it is there whole."""
    out, _ = previous

    def on_swap_return(frame, event, arg):
        if event == "return":
            signal.raise_signal(signal.SIGINT)
        return on_swap_return

    def trace(frame, event, arg):
        return on_swap_return if event == "call" and frame.f_code.co_name == "_swap_in" else None

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.settrace(trace)
    try:
        result = CliRunner().invoke(cli, ["export", "--db", str(store), "--out", str(out)])
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, handler)
    assert result.exit_code == 130, result.output
    assert result.output.strip() == f"Error: interrupted after the export to {out} was written: it is whole"
    assert (out / "manifest.json").is_file() and (out / "README.md").is_file()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []  # the previous one removed
