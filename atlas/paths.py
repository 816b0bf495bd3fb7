"""Where the project's own files live. Every default path (the bundled model, the store, the
measurement records, the evidence file, the site) resolves from the source checkout the package
runs from, so a command behaves the same from any working directory. Paths a user types stay
relative to the working directory, as usual."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from atlas import AtlasError

ROOT = Path(__file__).resolve().parents[1]
# Native builds and engine environments live here, outside any clone (llama.cpp, vLLM, the one-pass kernel)
CACHE = Path.home() / ".cache" / "mtp-atlas"


def project_root() -> Path:
    """The checkout holding atlas/, evidence/ and data/; AtlasError when the package was installed
    without it (then every default path must be given explicitly)."""
    if not (ROOT / "pyproject.toml").is_file() or not (ROOT / "evidence").is_dir():
        raise AtlasError(
            f"atlas is not running from its source checkout ({ROOT} has no pyproject.toml and evidence/), "
            "so it has no default paths: give them explicitly (--db, --out, --model ...) or install with `pip install -e`"
        )
    return ROOT


def project_path(relative: str) -> Path:
    return project_root() / relative


DEFAULT_DB = Path("data/atlas.duckdb")


def default_db_path() -> Path:
    return Path(os.environ.get("ATLAS_DB") or DEFAULT_DB)


def default_db() -> Path:
    """$ATLAS_DB as given (relative to the working directory), else the store's default file under
    the project root."""
    path = default_db_path()
    return path if os.environ.get("ATLAS_DB") or path.is_absolute() else project_root() / path


def published(path: str | Path, root: Path = ROOT) -> str:
    """A path as the atlas may publish it (export, card, changelog): relative to the repository
    `root`, or the file or folder's name alone. An absolute path, or a relative one that climbs out
    with '..', would publish the importer's own folders and means nothing to a reader."""
    given = Path(path)
    if given.is_absolute():
        here, top = given.resolve(), root.resolve()
        return here.relative_to(top).as_posix() if here.is_relative_to(top) else here.name
    return given.name if ".." in given.parts else given.as_posix()


def replace_text(path: Path, text: str, what: str) -> bool:
    """Write a generated file only when its content changes; returns whether it did. Written aside
    and renamed, so a full disk or a kill mid-write never leaves a torn file. `what` names the
    file in the error ("the evidence file")."""
    try:
        old = path.read_text(encoding="utf-8") if path.exists() else None
    except (OSError, UnicodeDecodeError) as exc:
        raise AtlasError(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if old != text:
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, path)
        except BaseException as exc:  # a Ctrl-C mid-write too: no partial file is left behind
            partial.unlink(missing_ok=True)
            if not isinstance(exc, OSError):
                raise
            raise AtlasError(f"cannot write {what} {path}: {exc.strerror or exc}; the old one is intact") from None
    return old != text


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """A file's bytes, `limit` at most, for a file a stranger may have made (a record, a prompt set,
    a vocabulary table). The size is checked before anything is read, and no more than limit + 1
    bytes are read, should the file grow meanwhile; either way one line names the file and `what`
    it should have been. Any OSError is one line too."""
    try:
        size = path.stat().st_size
        if size <= limit:
            with path.open("rb") as fh:
                raw = fh.read(limit + 1)
            size = len(raw)
    except OSError as exc:
        raise AtlasError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if size > limit:
        raise AtlasError(f"{path}: {size:,} bytes, over the {limit:,}-byte limit for {what}; not read")
    return raw


def sha256_file(path: Path) -> str:
    """A file's sha256, read a MiB at a time (GGUF and weight files run to gigabytes)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
