"""`--out` never deletes what the command did not write: `atlas export`, `atlas real-model` and
`atlas team-model` refuse a folder of the user's before any work, replace their own folder only
whole (a failed run leaves the previous one as it was), and leave no partial folder behind."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from site_helpers import REPO, crawl_mirror

from atlas import AtlasError, outdir
from atlas.cli import cli


@pytest.fixture(scope="module")
def store_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding a complete crawl of the bundled mirror."""
    db = tmp_path_factory.mktemp("outdir") / "atlas.duckdb"
    crawl_mirror(db)
    return db


def user_folder(path: Path) -> dict[str, bytes]:
    path.mkdir(parents=True)
    (path / "keep").write_text("the user's\n")
    (path / "sub").mkdir()
    (path / "sub" / "notes.md").write_text("also the user's\n")
    return snapshot(path)


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_export_refuses_a_folder_it_did_not_write_and_keeps_every_file(store_db: Path, tmp_path: Path) -> None:
    target = tmp_path / "u"
    before = user_folder(target)
    result = invoke("export", "--db", str(store_db), "--out", str(target))
    assert result.exit_code == 1
    assert "is not replaced" in result.output and outdir.MARKER in result.output
    assert snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u"]  # no partial sibling left


@pytest.mark.parametrize("parent", ["..", "."])
def test_export_into_the_working_folder_or_its_parent_is_refused(store_db: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, parent: str) -> None:
    work = tmp_path / "project" / "work"
    before = user_folder(work)
    monkeypatch.chdir(work)
    result = invoke("export", "--db", str(store_db), "--out", parent)
    assert result.exit_code == 1 and "working folder" in result.output
    assert snapshot(work) == before
    # even when the working folder is empty: it would be swapped away under the shell
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    result = invoke("export", "--db", str(store_db), "--out", ".")
    assert result.exit_code == 1 and "working folder" in result.output and empty.is_dir()


def test_a_relative_out_is_written_beside_the_working_files(store_db: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert invoke("export", "--db", str(store_db), "--out", "data").exit_code == 0
    assert outdir.written_by(tmp_path / "data") == "atlas export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_export_replaces_its_own_folder_and_a_pre_marker_export(store_db: Path, tmp_path: Path) -> None:
    target = tmp_path / "data"
    assert invoke("export", "--db", str(store_db), "--out", str(target)).exit_code == 0
    assert outdir.written_by(target) == "atlas export"
    (target / "stale.csv").write_text("from an older export\n")
    assert invoke("export", "--db", str(store_db), "--out", str(target)).exit_code == 0
    assert not (target / "stale.csv").exists()  # rebuilt whole
    # an export written before the marker existed is recognised by its manifest
    (target / outdir.MARKER).unlink()
    assert invoke("export", "--db", str(store_db), "--out", str(target)).exit_code == 0
    assert outdir.written_by(target) == "atlas export"


def test_a_folder_another_command_marked_is_refused_by_name(store_db: Path, tmp_path: Path) -> None:
    target = tmp_path / "model"
    target.mkdir()
    (target / outdir.MARKER).write_text(json.dumps({"command": "atlas real-model"}))
    (target / "model.safetensors").write_bytes(b"weights")
    result = invoke("export", "--db", str(store_db), "--out", str(target))
    assert result.exit_code == 1 and "`atlas real-model` wrote it" in result.output
    assert (target / "model.safetensors").read_bytes() == b"weights"


def test_out_that_is_a_file_or_a_link_is_refused(store_db: Path, tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("x")
    result = invoke("export", "--db", str(store_db), "--out", str(file))
    assert result.exit_code != 0 and file.read_text() == "x"
    real = tmp_path / "real"
    before = user_folder(real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    result = invoke("export", "--db", str(store_db), "--out", str(link))
    assert result.exit_code == 1 and "symbolic link" in result.output
    assert snapshot(real) == before and link.is_symlink()


def test_a_failing_write_leaves_the_previous_folder_and_no_partial_one(tmp_path: Path) -> None:
    target = tmp_path / "out"
    outdir.replace(target, "atlas test", lambda staging: (staging / "v1").write_text("1"))
    before = snapshot(target)

    def fails(staging: Path) -> None:
        (staging / "v2").write_text("2")
        raise RuntimeError("killed half-way")

    with pytest.raises(RuntimeError):
        outdir.replace(target, "atlas test", fails)
    assert snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_folder_that_changes_hands_during_the_build_is_not_swapped(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()  # empty: replaceable at the start

    def user_writes_meanwhile(staging: Path) -> None:
        (staging / "built").write_text("1")
        (target / "theirs").write_text("written during the build")

    with pytest.raises(AtlasError, match="is not replaced"):
        outdir.replace(target, "atlas test", user_writes_meanwhile)
    assert snapshot(target) == {"theirs": b"written during the build"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_swapped_folder_keeps_the_usual_permissions(tmp_path: Path) -> None:
    target = tmp_path / "out"
    outdir.replace(target, "atlas test", lambda staging: None)
    made = tmp_path / "made"
    made.mkdir()
    assert target.stat().st_mode & 0o777 == made.stat().st_mode & 0o777


def test_real_model_refuses_a_user_folder_before_building(tmp_path: Path) -> None:
    target = tmp_path / "u"
    before = user_folder(target)
    result = invoke("real-model", "--out", str(target))
    assert result.exit_code == 1 and "is not replaced" in result.output
    assert "checked" not in result.output  # refused before it read the package
    assert snapshot(target) == before


def test_team_model_refuses_a_user_folder_before_training(tmp_path: Path) -> None:
    target = tmp_path / "u"
    before = user_folder(target)
    result = invoke("team-model", "--out", str(target), "--steps", "1")
    assert result.exit_code == 1 and "is not replaced" in result.output
    assert "corpus:" not in result.output  # refused before it trained
    assert snapshot(target) == before


def test_team_model_accepts_the_bundled_team_model_as_its_own(tmp_path: Path) -> None:
    from atlas.checkpoints.team_checkpoint import _is_team_model

    bundled = REPO / "data" / "hub-mirror" / "mtp-atlas" / "byte-mtp-8l"
    assert _is_team_model(bundled)
    copy = tmp_path / "team"
    shutil.copytree(bundled, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    outdir.check_replaceable(copy, "atlas team-model", legacy=_is_team_model)


def test_two_exports_into_one_folder_at_once_leave_one_whole_export(store_db: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from atlas.export import formats as exportformat

    target = tmp_path / "data"
    command = [sys.executable, "-m", "atlas", "export", "--db", str(store_db), "--out", str(target)]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stdout.read()) for p in runs]
    for code, output in results:
        assert code == 0 or (code == 1 and len(output.strip().splitlines()) == 1 and "Traceback" not in output), output
    assert any(code == 0 for code, _ in results)
    manifest = exportformat.read_manifest(target)
    assert manifest is not None and all((target / f.path).is_file() for f in manifest.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # neither staging folder is left


def test_an_export_killed_mid_write_keeps_the_previous_one_and_the_next_run_sweeps_its_leftovers(
        store_db: Path, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    target = tmp_path / "data"
    assert invoke("export", "--db", str(store_db), "--out", str(target)).exit_code == 0
    before = snapshot(target)
    run = subprocess.Popen([sys.executable, "-m", "atlas", "export", "--db", str(store_db), "--out", str(target)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".data.*.partial")) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)
    run.wait()
    from atlas.export import formats as exportformat

    # the kill lands before the swap (the previous export, byte for byte) or after it (the new one,
    # whole): never between, and never no export at all
    assert snapshot(target) == before or all((target / f.path).is_file() for f in exportformat.read_manifest(target).files)
    live = tmp_path / f".data.{os.getpid()}.x.partial"  # a run of this process, still going: kept
    live.mkdir()
    assert invoke("export", "--db", str(store_db), "--out", str(target)).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "data"])


@pytest.mark.parametrize("moment", ["made", "removed"])
def test_a_ctrl_c_as_the_staging_folder_is_made_or_removed_leaves_no_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                            moment: str) -> None:
    """A Ctrl-C that lands right after the hidden sibling is made (before it has a name to remove) or
    while it is removed (after the swap it holds the previous folder, many files) is held until that
    step is done: the interrupt still stops the command, and no `.partial` folder stays behind."""
    import signal
    import tempfile

    # Python's own SIGINT handler, whatever this process inherited: a shell that starts a job in the
    # background (`nohup make test &`) leaves SIGINT ignored, and a command then never sees a Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        out = tmp_path / "export"
        outdir.replace(out, "atlas export", lambda d: (d / "old").write_text("previous\n"))
        real = {"made": tempfile.mkdtemp, "removed": shutil.rmtree}[moment]

        def interrupted(*args: object, **kwargs: object) -> object:
            done = real(*args, **kwargs) if moment == "made" else None
            os.kill(os.getpid(), signal.SIGINT)  # Python raises it at its next instruction, unless it is held
            return done if moment == "made" else real(*args, **kwargs)

        monkeypatch.setattr(tempfile if moment == "made" else shutil, "mkdtemp" if moment == "made" else "rmtree", interrupted)
        with pytest.raises(KeyboardInterrupt):
            outdir.replace(out, "atlas export", lambda d: (d / "new").write_text("new\n"))
        monkeypatch.undo()
        assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no staging left
        assert sorted(p.name for p in out.iterdir()) == ([".atlas-output.json", "old"] if moment == "made"
                                                         else [".atlas-output.json", "new"])
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_inside_a_pydantic_serializer_is_told_as_a_ctrl_c() -> None:
    """pydantic turns a KeyboardInterrupt raised in a serializer into a ValueError with nothing
    chained (the fresh-clone CI met one as `atlas export` wrote a record): it is an interrupt, one
    line, not a traceback; any other serialization error is not."""
    from pydantic import BaseModel, model_serializer

    from atlas import is_interrupt

    class Cut(BaseModel):
        a: int = 1

        @model_serializer(mode="wrap")
        def _stop(self, handler: object) -> dict:
            raise KeyboardInterrupt

    class Broken(Cut):
        @model_serializer(mode="wrap")
        def _stop(self, handler: object) -> dict:
            raise TypeError("KeyboardInterrupt is only a word here")

    with pytest.raises(ValueError) as cut:
        Cut().model_dump_json()
    with pytest.raises(ValueError) as broken:
        Broken().model_dump_json()
    assert is_interrupt(cut.value) and not is_interrupt(broken.value)
