"""Output folders a command may replace: only a folder the same command wrote (its marker file says
so), and only whole. The new folder is written as a hidden sibling and swapped in at the end, so an
interrupted or failed run leaves the previous folder as it was, and a folder of the user's is never
touched: the command refuses before it starts its work."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from glob import escape as glob_escape
from pathlib import Path
from typing import TypeVar

from atlas import AtlasError, __version__

MARKER = ".atlas-output.json"
T = TypeVar("T")


def written_by(folder: Path) -> str | None:
    """The command whose marker `folder` holds, or None."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    command = marker.get("command") if isinstance(marker, dict) else None
    return command if isinstance(command, str) else None


def check_replaceable(out: Path, command: str, legacy: Callable[[Path], bool] | None = None) -> None:
    """Refuse, before any work, to replace `out` unless it is absent, empty, or written by `command`
    (its marker, or for folders written before markers existed, `legacy`: the command's own manifest)."""
    if out.is_symlink():
        raise AtlasError(f"--out {out} is a symbolic link; give the folder itself")
    if Path.cwd().is_relative_to(out.resolve()):
        raise AtlasError(f"--out {out} is the working folder or holds it; give a folder of its own")
    if not out.exists():
        return
    if not out.is_dir():
        raise AtlasError(f"--out {out} exists and is not a folder")
    if not any(out.iterdir()) or written_by(out) == command or (legacy is not None and legacy(out)):
        return
    owner = written_by(out)
    whose = f"`{owner}` wrote it" if owner else f"it has files `{command}` did not write (no {MARKER})"
    raise AtlasError(f"--out {out} is not replaced: {whose}. Give a new or empty folder, or remove it yourself")


def replace(out: Path, command: str, write: Callable[[Path], T], legacy: Callable[[Path], bool] | None = None,
            mark: bool = True) -> T:
    """Run `write(staging)` into a fresh sibling of `out`, mark it as `command`'s (unless `mark` is off:
    a folder whose own manifest is `legacy`'s proof), then swap it in for `out` in one step. On any
    failure the sibling goes and `out` stays as it was."""
    check_replaceable(out, command, legacy)
    out = Path(os.path.abspath(out))  # `out.parent` of a relative name such as "x" is "."
    staging: Path | None = None
    try:
        with _uninterrupted():  # a Ctrl-C between making the sibling and naming it would leave it behind
            out.parent.mkdir(parents=True, exist_ok=True)
            _sweep_stale(out)
            staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".partial", dir=out.parent))
            umask = os.umask(0)
            os.umask(umask)
            staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would outlive the swap
        result = write(staging)
        if mark:
            (staging / MARKER).write_text(json.dumps({
                "command": command, "atlas_version": __version__,
                "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }, indent=1) + "\n", encoding="utf-8")
        check_replaceable(out, command, legacy)  # the folder may have changed hands during a long build
        with _uninterrupted():  # where the kernel cannot exchange two paths, the swap is three renames
            _swap_in(staging, out)
    except OSError as exc:
        raise AtlasError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        if staging is not None:
            with _uninterrupted():  # after the swap it holds the previous folder: removed whole, not cut off by a Ctrl-C
                shutil.rmtree(staging, ignore_errors=True)
    return result


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back while a step runs that must not stop halfway, and deliver it to the
    handler it would have met the moment the step ends. A Python-level handler, not a signal mask:
    the process's other threads (DuckDB's, OpenMP's) would take a masked signal in its place. Python
    lets only its main thread set handlers, and runs them there only, so elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # None: a handler set outside Python, which could not be put back
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held and callable(previous):
            previous(signal.SIGINT, None)  # Python's default raises KeyboardInterrupt here
        elif held and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def _sweep_stale(out: Path) -> None:
    """Remove the staging siblings of `out` that a killed run left (its pid is in the name and no
    longer runs); a live run's staging folder is left alone."""
    for path in out.parent.glob(f".{glob_escape(out.name)}.*.partial"):
        pid = path.name[len(out.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_RENAME_EXCHANGE = 2


def _swap_in(staging: Path, out: Path) -> None:
    """`staging` becomes `out`; a previous `out` ends up at `staging`'s path. Where the kernel can
    exchange two paths atomically (Linux renameat2), no moment exists without an `out`."""
    if not out.exists():
        staging.rename(out)
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd = -100
        if renameat2(at_fdcwd, os.fsencode(staging), at_fdcwd, os.fsencode(out), _RENAME_EXCHANGE) == 0:
            return
    aside = staging.with_name(staging.name + ".old")
    out.rename(aside)
    staging.rename(out)
    aside.rename(staging)
