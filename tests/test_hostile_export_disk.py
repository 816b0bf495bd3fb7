"""`atlas export` on a full disk (issue 25 F9): one line naming the cause, no traceback, nothing
half-written left, and a previous export there as it was."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from site_helpers import REPO, crawl_mirror

from atlas.export import tables as export
from atlas.cli import cli


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_full_disk_during_export_is_one_line_and_leaves_nothing_half_written(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "atlas.duckdb"
    crawl_mirror(db)
    out = tmp_path / "exports" / "data"
    runner = CliRunner()
    first = runner.invoke(cli, ["export", "--db", str(db), "--out", str(out)])
    assert first.exit_code == 0, first.output
    before = _tree(out)

    copy, copies = export._copy, []

    def disk_fills(con: duckdb.DuckDBPyConnection, sql: str, path: Path, fmt: str) -> None:
        copies.append(path)
        if len(copies) > 3:  # a few files in: DuckDB's COPY meets the full disk as it does for real
            raise duckdb.IOException(f'Could not write file "{path}": No space left on device')
        copy(con, sql, path, fmt)

    monkeypatch.setattr(export, "_copy", disk_fills)
    for target in (out, tmp_path / "exports" / "new"):  # over a previous export, and into a new folder
        copies.clear()
        result = runner.invoke(cli, ["export", "--db", str(db), "--out", str(target)])
        assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (result.exception, result.output)
        [line] = result.output.strip().splitlines()
        assert line.startswith(f"Error: cannot write the export {target} (Could not write file \"{target}/"), line
        assert "No space left on device" in line and ".partial" not in line and "Traceback" not in line
    assert _tree(out) == before  # the previous export, whole
    assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == ["data"]  # no staging folder, no new one


def test_a_real_full_disk_under_out_is_one_line_and_the_disk_is_left_empty(tmp_path: Path) -> None:
    """The same on a real 64 KiB tmpfs, in a user + mount namespace (nothing mounted outside it)."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=64k tmpfs "{tmp_path}"'], capture_output=True).returncode:
        pytest.skip("no user + mount namespace here: a real full disk was not tried")
    db = tmp_path / "store" / "atlas.duckdb"
    crawl_mirror(db)
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f'mount -t tmpfs -o size=64k tmpfs "{disk}" && "{sys.executable}" -m atlas export --db "{db}" '
              f'--out "{disk}/data"; echo "rc=$?"; ls -A "{disk}"')
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    listing = done.stdout.splitlines()
    assert listing == ["rc=1"], (done.stdout, done.stderr)  # exit 1, and nothing left on the disk
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"Error: cannot write the export {disk}/data (") and "No space left on device" in line, line
