"""The mirror folder a local hub serves: `<org>/<name>/<files>` read into repos, each file with the
Hub's ETag and the repo with a sha over them; files stay on disk (read in pieces, on demand), and
only files that stay inside the mirror are served (no symlink or hard link out of it)."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atlas import AtlasError

METADATA_FILE = "HUB_METADATA.toml"
# A crawl of a mirror folder records its endpoint as this prefix + the folder (`atlas crawl --mirror`).
MIRROR_PREFIX = "mirror:"
# The bundled mirror's own metadata beside its SOURCES.tsv: the date its files were last fixed.
MIRROR_FILE = "MIRROR.toml"
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
_CHUNK = 1 << 20


def git_blob_id(path_or_bytes: bytes | Path, size: int) -> str:
    digest = hashlib.sha1(b"blob %d\0" % size)
    for chunk in chunks(path_or_bytes):
        digest.update(chunk)
    return digest.hexdigest()


def _sha256(path_or_bytes: bytes | Path) -> str:
    digest = hashlib.sha256()
    for chunk in chunks(path_or_bytes):
        digest.update(chunk)
    return digest.hexdigest()


def chunks(src: bytes | Path, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The bytes [start, end) of `src` in pieces of at most 1 MiB: big files are never read whole."""
    if isinstance(src, bytes):
        data = src[start:end]
        for i in range(0, len(data), _CHUNK):
            yield data[i:i + _CHUNK]
        return
    with open(src, "rb") as fh:
        fh.seek(start)
        left = None if end is None else max(0, end - start)
        while left is None or left > 0:
            chunk = fh.read(_CHUNK if left is None else min(_CHUNK, left))
            if not chunk:
                return
            if left is not None:
                left -= len(chunk)
            yield chunk


@dataclass
class MirrorRepo:
    """One repo: file name -> content (bytes, or a Path read on demand) plus hub metadata."""

    repo_id: str
    files: dict[str, bytes | Path]
    meta: dict[str, Any] = field(default_factory=dict)
    sha: str = ""
    etags: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            src = self.files[name]
            size = len(src) if isinstance(src, bytes) else src.stat().st_size
            self.sizes[name] = size
            # the Hub's ETag: an LFS file's sha256, else git's blob id (both streamed)
            self.etags[name] = _sha256(src) if is_lfs(name) else git_blob_id(src, size)
            digest.update(f"{name}\0{self.etags[name]}\n".encode())
        self.sha = digest.hexdigest()

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        return b"".join(chunks(self.files[name], start, end))


def is_lfs(filename: str) -> bool:
    return filename.endswith(_LFS_SUFFIXES)


def _inside(path: Path, root: Path) -> bool:
    """Whether `path`, symlinks resolved, stays under `root` (a link out of the mirror is skipped)."""
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a link loop
        return False


class _HardLinks:
    """Whether every name of a hard-linked file lies inside the mirror: its st_nlink names must all
    be found by a walk of the mirror, else one lies outside it (a file of the host, linked in)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._names: dict[tuple[int, int], int] | None = None  # (device, inode) -> names in the mirror

    def inside(self, path: Path) -> bool:
        try:
            st = path.stat()
        except OSError:
            return False
        if st.st_nlink <= 1:
            return True
        if self._names is None:  # walked once, and only for a mirror that has hard links at all
            self._names = {}
            for folder, _, names in os.walk(self._root):
                for name in names:
                    try:
                        other = os.lstat(os.path.join(folder, name))
                    except OSError:
                        continue
                    if other.st_nlink > 1:
                        key = (other.st_dev, other.st_ino)
                        self._names[key] = self._names.get(key, 0) + 1
        return self._names.get((st.st_dev, st.st_ino), 0) >= st.st_nlink


def load_metadata(path: Path) -> dict[str, Any]:
    """HUB_METADATA.toml, or AtlasError naming the file and the problem in one line."""
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AtlasError(f"mirror metadata {path} is not valid TOML: {exc}") from None
    bad = [k for k, v in data.items() if not isinstance(v, dict)]
    if bad:
        raise AtlasError(f"mirror metadata {path}: entry {bad[0]!r} is not a table of fields")
    return data


def load_mirror(root: Path | str) -> dict[str, MirrorRepo]:
    """Read a mirror folder into repos keyed by repo id."""
    root = Path(root)
    real_root = root.resolve()
    meta_all = load_metadata(root / METADATA_FILE)
    repos: dict[str, MirrorRepo] = {}
    links = _HardLinks(real_root)

    def dirs(parent: Path) -> list[Path]:
        return sorted(p for p in parent.iterdir()
                      if p.is_dir() and not p.name.startswith(("_", ".")) and _inside(p, real_root))

    for org in dirs(root):
        for repo_dir in dirs(org):
            files: dict[str, bytes | Path] = {}
            for f in sorted(repo_dir.rglob("*")):
                rel = f.relative_to(repo_dir)
                if (any(part.startswith(".") for part in rel.parts) or not _inside(f, real_root) or not f.is_file()
                        or not links.inside(f)):
                    continue
                files[rel.as_posix()] = f
            repo_id = f"{org.name}/{repo_dir.name}"
            repos[repo_id] = MirrorRepo(repo_id, files, dict(meta_all.get(repo_id, {})))
    return repos


def load_mirror_date(folder: Path | None) -> dt.date | None:
    """`fixed` of the mirror's MIRROR.toml (the day its files were last changed); None without one."""
    path = folder / MIRROR_FILE if folder is not None else None
    if path is None or not path.exists():
        return None
    try:
        fixed = tomllib.loads(path.read_text(encoding="utf-8")).get("fixed")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AtlasError(f"{path}: not valid TOML: {exc}") from None
    if not isinstance(fixed, dt.date) or isinstance(fixed, dt.datetime):
        raise AtlasError(f"{path}: `fixed` must be a date (YYYY-MM-DD), got {fixed!r}")
    return fixed
