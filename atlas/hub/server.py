"""A local stand-in for the Hugging Face Hub: serves a mirror folder on 127.0.0.1 with the Hub's
API shape and answers, so `atlas crawl --mirror DIR` and the tests drive the real `huggingface_hub`
client through the same code path as a live crawl.

Mirror layout: `<org>/<name>/<files>`. Folders whose name starts with `_` or `.` are skipped:
`_unattributed/` holds real configs without a known hub id (test data, not atlas rows). Symlinks
are followed only while they stay inside the mirror. Optional `HUB_METADATA.toml` at the mirror
root gives per-repo hub metadata (base model and its relation, pipeline tag, gated, private,
disabled, downloads, likes, dates); absent or wrongly typed fields are left out, as on the Hub.

What it answers like the real Hub (huggingface_hub 2.4.0's view of it):
- GET /api/models: filters, `expand` (400 for a value the *listing* does not accept, such as
  `baseModels`, which only repo info accepts), `Link` pagination with a cursor. One repo whose
  metadata cannot be served never fails the page: its bad fields are left out.
- GET /api/models/{id}[/revision/{rev}] and /tree/{rev}[/{folder}]: repo info and file tree.
- Missing, private or disabled repos answer **401 + X-Error-Code: RepoNotFound** to a request
  without a token; with one, missing/private answer 404 and disabled 403 "Access to this resource
  is disabled."; gated files answer 401 (no token) or 403 (token without access) + GatedRepo.
- HEAD/GET /{id}/resolve/{rev}/{file}: a small file **307**s to /api/resolve-cache/models/...
  (same host), an LFS file **302**s to a second loopback server, the "CDN", with X-Linked-Size and
  X-Linked-Etag. The CDN rejects a request that still carries `Authorization` (400) and logs the
  `Range` it got. Range requests answer 206, or 416 past the end; files are streamed, never read
  whole.
- `RateLimit` / `RateLimit-Policy` on every answer, per bucket (api, resolvers, pages), fixed
  windows with a tier's quotas (anonymous without a token, `token_tier` with one); over the quota:
  429 with the same headers and Retry-After.

Test hooks: fault injection (status, headers, count; or a served answer with extra headers, sent
a byte at a time, or a listing without end), injected latency, file requests held unanswered
(`hold_files`), error answers that echo the request's Authorization header (as a careless proxy
does), and a request log (memory + optional JSONL file).

Files are served only when they stay inside the mirror: symlinks out of it are skipped, and so are
hard links whose other names are not all inside the mirror (st_nlink counts them).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from atlas import AtlasError
from atlas.hub.pacing import TIERS, WINDOW_S

METADATA_FILE = "HUB_METADATA.toml"
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
_CHUNK = 1 << 20
MAX_HEADER_BYTES = 25_000_000  # as huggingface_hub: a larger safetensors header is not one
DISABLED_MESSAGE = "Access to this resource is disabled."


def _git_blob_id(path_or_bytes: bytes | Path, size: int) -> str:
    digest = hashlib.sha1(b"blob %d\0" % size)
    for chunk in _chunks(path_or_bytes):
        digest.update(chunk)
    return digest.hexdigest()


def _sha256(path_or_bytes: bytes | Path) -> str:
    digest = hashlib.sha256()
    for chunk in _chunks(path_or_bytes):
        digest.update(chunk)
    return digest.hexdigest()


def _chunks(src: bytes | Path, start: int = 0, end: int | None = None):
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
            self.etags[name] = _sha256(src) if is_lfs(name) else _git_blob_id(src, size)
            digest.update(f"{name}\0{self.etags[name]}\n".encode())
        self.sha = digest.hexdigest()

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        return b"".join(_chunks(self.files[name], start, end))


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


@dataclass
class Fault:
    """Answer matching requests with `status` (and headers) instead of serving them; status 0
    drops the connection without an answer; status 200 serves the request as usual, with
    `headers` added. `drip_s`: the answer goes out one byte every drip_s seconds (its body only,
    or from its status line on with drip_headers). `listing` (on /api/models): a listing without
    end: "empty" pages, or "same" page again, each linking to a next one; or "junk", every page
    one new model that no filter keeps."""

    status: int
    path_contains: str = ""  # matched against the path and its query string
    method: str | None = None
    times: int = 1  # how many requests it hits; -1 = every one
    headers: dict[str, str] = field(default_factory=dict)
    error_code: str | None = None
    drip_s: float = 0.0
    drip_headers: bool = False
    listing: str | None = None


class _Drip:
    """A connection's output sent one byte at a time, `seconds` apart, once `on` (a slow link or a
    hostile server; the client must not wait for it without end)."""

    def __init__(self, out: Any, seconds: float, pause: threading.Event, on: bool) -> None:
        self._out, self._seconds, self._pause, self.on = out, seconds, pause, on

    def write(self, data: bytes) -> int:
        if not self.on:
            return self._out.write(data)
        for i in range(len(data)):
            self._out.write(data[i:i + 1])
            self._out.flush()
            self._pause.wait(self._seconds)
        return len(data)

    def flush(self) -> None:
        self._out.flush()

    @property
    def closed(self) -> bool:
        return self._out.closed

    def close(self) -> None:
        self._out.close()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # clients dropping idle keep-alive connections are normal, not worth a traceback
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


@dataclass
class _Window:
    start: float = -math.inf
    count: int = 0


class HubServer:
    """The local hub (plus its CDN). Use as a context manager; `url` is its endpoint."""

    def __init__(
        self,
        repos: dict[str, MirrorRepo],
        log_path: Path | None = None,
        page_size: int = 100,
        latency_s: float = 0.0,
        tier: str = "anonymous",
        token_tier: str = "free",
        window_s: float = WINDOW_S,
        limits: dict[str, int] | None = None,
        echo_headers: bool = False,
    ) -> None:
        self.repos = repos
        self.echo_headers = echo_headers  # error answers quote the request's Authorization header
        self.page_size = page_size
        self.latency_s = latency_s
        self.window_s = window_s
        # quotas per bucket: `limits` overrides the tier's (both for anonymous and token requests)
        self.quotas = {False: dict(limits or TIERS[tier]), True: dict(limits or TIERS[token_tier])}
        self.faults: list[Fault] = []
        self.gated: set[str] = {r for r, repo in repos.items() if repo.meta.get("gated")}
        self.granted: set[str] = set()  # gated repos the token holder has been given access to
        self.requests: list[dict[str, Any]] = []
        self.cdn_requests: list[dict[str, Any]] = []
        self.rate_limited = 0
        self.windows: list[tuple[str, bool, float, int, int]] = []  # ended windows: bucket, token?, start, served, quota
        self._blobs = {repo.etags[name]: (repo, name) for repo in repos.values() for name in repo.files if is_lfs(name)}
        self._by_author: dict[str, list[MirrorRepo]] = {}
        for repo in repos.values():
            self._by_author.setdefault(repo.repo_id.split("/")[0], []).append(repo)
        # one filtered, sorted listing per query (its pages are slices of it): paging through a
        # listing costs its length once, not once per page (which made the listing quadratic)
        self._listings: dict[tuple[Any, ...], list[MirrorRepo]] = {}
        self._log_path = log_path
        self._lock = threading.Lock()
        self._windows: dict[tuple[bool, str], _Window] = {}
        self._pause = threading.Event()  # never set: its wait() is a sleep that tests can't patch away
        self._hold_after: int | None = None  # file requests after this many get no answer until release()
        self._files_started = 0
        self.held = 0
        self._release = threading.Event()
        self._httpd = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        self._cdn = _QuietServer(("127.0.0.1", 0), _make_cdn_handler(self))
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def cdn_url(self) -> str:
        host, port = self._cdn.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        for name, httpd in (("hubserver", self._httpd), ("hubcdn", self._cdn)):
            # a short poll: stop() waits up to one poll interval per server (tests start many hubs)
            thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self.release()
        for httpd in (self._httpd, self._cdn):
            httpd.shutdown()
            httpd.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- test hooks ------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def hold_files(self, after: int) -> None:
        """Answer the first `after` file requests, then hold every later one unanswered until
        `release()`: a crawl is then provably in the middle of its downloads."""
        with self._lock:
            self._hold_after, self._files_started, self.held = after, 0, 0
            self._release.clear()

    def release(self) -> None:
        self._release.set()

    def _maybe_hold(self) -> None:
        with self._lock:
            self._files_started += 1
            hold = self._hold_after is not None and self._files_started > self._hold_after
            if hold:
                self.held += 1
        if hold:
            self._release.wait(120)  # bounded: a test that forgets release() still ends

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self.cdn_requests.clear()

    def all_windows(self) -> list[tuple[str, bool, float, int, int]]:
        """Every window so far, the current ones included (monotonic start times)."""
        with self._lock:
            current = [(b, a, w.start, w.count, self.quotas[a][b]) for (a, b), w in self._windows.items() if w.count]
            return sorted(self.windows + current, key=lambda w: w[2])

    def file_requests(self) -> list[dict[str, Any]]:
        """Requests for a file (the /resolve/ entry points; redirect hops are in the log too)."""
        return [r for r in self.requests if "/resolve/" in r["path"]]

    # ---- internals used by the handlers ------------------------------------------------------

    def listing(self, query: dict[str, list[str]]) -> list[MirrorRepo]:
        """The repos a model listing with these filters and sort returns, in order (cached)."""
        key = tuple(tuple(query.get(k, [])) for k in ("author", "search", "pipeline_tag", "filter", "sort"))
        with self._lock:
            hit = self._listings.get(key)
        if hit is not None:
            return hit
        author = query.get("author")
        pool = self._by_author.get(author[0], []) if author else list(self.repos.values())
        repos = [r for r in pool if r.meta.get("private") is not True]
        if "search" in query:
            repos = [r for r in repos if query["search"][0].lower() in r.repo_id.lower()]
        if "pipeline_tag" in query:
            repos = [r for r in repos if _pipeline_tag(r) == query["pipeline_tag"][0]]
        for tag in query.get("filter", []):
            repos = [r for r in repos if tag in _tags(r)]
        sort = query.get("sort", [""])[0]
        if sort in ("downloads", "likes"):
            repos.sort(key=lambda r: (-(_count_field(r.meta.get(sort)) or 0), r.repo_id))
        else:
            repos.sort(key=lambda r: r.repo_id)
        with self._lock:
            self._listings[key] = repos
        return repos

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times != 0 and fault.path_contains in path and fault.method in (None, method):
                    if fault.times > 0:
                        fault.times -= 1
                    return fault
        return None

    def _count(self, bucket: str, authed: bool) -> tuple[bool, dict[str, str]]:
        """Count one request in its bucket's fixed window: (over the quota?, RateLimit headers)."""
        quota = self.quotas[authed][bucket]
        with self._lock:
            now = time.monotonic()
            window = self._windows.setdefault((authed, bucket), _Window())
            if now - window.start >= self.window_s:
                if window.count:
                    self.windows.append((bucket, authed, window.start, window.count, quota))
                window.start, window.count = now, 0
            over = window.count >= quota
            if not over:
                window.count += 1
            else:
                self.rate_limited += 1
            left = max(0.0, window.start + self.window_s - now)
            remaining = quota - window.count
        headers = {
            "RateLimit": f'"{bucket}";r={remaining};t={math.ceil(left)}',
            "RateLimit-Policy": f'"fixed window";"{bucket}";q={quota};w={math.ceil(self.window_s)}',
        }
        if over:
            headers["Retry-After"] = str(max(1, math.ceil(left)))
        return over, headers

    def _log(self, entry: dict[str, Any], cdn: bool = False) -> None:
        with self._lock:
            (self.cdn_requests if cdn else self.requests).append(entry)
            if self._log_path is not None:
                with open(self._log_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({**entry, "cdn": cdn}) + "\n")


# ---- metadata as the Hub serves it ----------------------------------------------------------------


def _iso(value: Any) -> str | None:
    if isinstance(value, datetime):
        value = value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return value.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", value):
        return value
    return None  # anything else is not a date the Hub would send


def _count_field(value: Any) -> int | None:
    """A count as the Hub sends it (a JSON integer in int64 range), else absent."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else None


def _json_file(repo: MirrorRepo, name: str, limit: int = 8 * 1024 * 1024) -> Any:
    if name not in repo.files or repo.sizes[name] > limit:
        return None
    try:
        return json.loads(repo.read(name))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _config_subset(repo: MirrorRepo) -> dict[str, Any] | None:
    """What the Hub's `config` expand returns: a small subset, not config.json itself."""
    cfg = _json_file(repo, "config.json")
    if not isinstance(cfg, dict):
        return None
    out = {k: cfg[k] for k in ("architectures", "model_type") if k in cfg}
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and "quant_method" in quant:
        out["quantization_config"] = {"quant_method": quant["quant_method"]}
    return out


def _pipeline_tag(repo: MirrorRepo) -> str | None:
    tag = repo.meta.get("pipeline_tag")
    if isinstance(tag, str):
        return tag
    cfg = _json_file(repo, "config.json")
    return "image-text-to-text" if isinstance(cfg, dict) and "vision_config" in cfg else "text-generation"


def _safetensors_info(repo: MirrorRepo) -> dict[str, Any] | None:
    """Per-dtype parameter counts of a single-file checkpoint's header; None when it has none
    readable (a git-LFS pointer, a header over the size limit, shapes that are not counts)."""
    name = "model.safetensors"
    if name not in repo.files or repo.sizes[name] < 8:
        return None
    (n,) = struct.unpack("<Q", repo.read(name, 0, 8))
    if n > MAX_HEADER_BYTES or 8 + n > repo.sizes[name]:
        return None
    try:
        header = json.loads(repo.read(name, 8, 8 + n))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    params: dict[str, int] = {}
    for key, info in header.items():
        if key == "__metadata__" or not isinstance(info, dict):
            continue
        shape, dtype = info.get("shape"), info.get("dtype")
        if not isinstance(dtype, str) or not isinstance(shape, list) or not all(_count_field(d) is not None for d in shape):
            return None
        params[dtype] = params.get(dtype, 0) + math.prod(shape)
    total = sum(params.values())
    return {"parameters": params, "total": total} if total < 2**63 else None


def _tree_entries(repo: MirrorRepo, folder: str, recursive: bool) -> list[dict[str, Any]] | None:
    """The Hub's tree listing of `folder` ("" = the root), None when no such folder. Files:
    {type, oid (git blob id), size, path} plus, for LFS files, lfs {oid (sha256), size, pointerSize},
    where git holds the LFS pointer, so the blob id is the pointer's. Folders: {type: "directory",
    oid, size: 0, path}; their oid stands in for git's tree id (a digest of what lies below)."""
    folders = {"/".join(name.split("/")[:i]) for name in repo.files for i in range(1, name.count("/") + 1)}
    if folder and folder not in folders:
        return None
    prefix = f"{folder}/" if folder else ""
    entries: list[dict[str, Any]] = []
    for path in sorted(folders | set(repo.files)):
        if not path.startswith(prefix) or (not recursive and "/" in path[len(prefix):]):
            continue
        if path in folders:
            below = "".join(f"{n}\0{repo.etags[n]}\n" for n in sorted(repo.files) if n.startswith(f"{path}/"))
            entries.append({"type": "directory", "oid": hashlib.sha1(below.encode()).hexdigest(), "size": 0, "path": path})
        elif is_lfs(path):
            size = repo.sizes[path]
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{repo.etags[path]}\nsize {size}\n".encode()
            entries.append({"type": "file", "oid": _git_blob_id(pointer, len(pointer)), "size": size, "path": path,
                            "lfs": {"oid": repo.etags[path], "size": size, "pointerSize": len(pointer)}})
        else:
            entries.append({"type": "file", "oid": repo.etags[path], "size": repo.sizes[path], "path": path})
    return entries


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _base(repo: MirrorRepo) -> tuple[str | None, str | None]:
    base, relation = repo.meta.get("base_model"), repo.meta.get("base_relation")
    return (base if isinstance(base, str) and base else None), (relation if isinstance(relation, str) else None)


def _tags(repo: MirrorRepo) -> list[str]:
    tags = _strings(repo.meta.get("tags"))
    base, relation = _base(repo)
    if base:
        tags.append(f"base_model:{base}")
        if relation:
            tags.append(f"base_model:{relation}:{base}")
    if "model.safetensors" in repo.files or "model.safetensors.index.json" in repo.files:
        tags.append("safetensors")
    return tags


def _gated_value(repo: MirrorRepo) -> Any:
    gated = repo.meta.get("gated", False)
    return gated if gated in ("auto", "manual", False) else ("manual" if gated else False)


def _expand(repo: MirrorRepo, field_name: str) -> Any:
    meta = repo.meta
    base, relation = _base(repo)
    if field_name == "sha":
        return repo.sha
    if field_name == "lastModified":
        return _iso(meta.get("last_modified"))
    if field_name == "createdAt":
        return _iso(meta.get("created_at"))
    if field_name in ("downloads", "likes"):
        return _count_field(meta.get(field_name))
    if field_name == "gated":
        return _gated_value(repo)
    if field_name in ("private", "disabled"):
        return meta.get(field_name) is True
    if field_name == "pipeline_tag":
        return _pipeline_tag(repo)
    if field_name == "library_name":
        value = meta.get("library_name", "transformers")
        return value if isinstance(value, str) else None
    if field_name == "tags":
        return _tags(repo)
    if field_name == "author":
        return repo.repo_id.split("/")[0]
    if field_name == "siblings":
        return [{"rfilename": name} for name in sorted(repo.files)]
    if field_name == "baseModels":
        return {"relation": relation or "finetune", "models": [{"id": base}]} if base else None
    if field_name == "cardData":
        card: dict[str, Any] = {}
        if base:
            card["base_model"] = base
            if relation:
                card["base_model_relation"] = relation
        return card
    if field_name == "safetensors":
        return _safetensors_info(repo)
    if field_name == "config":
        return _config_subset(repo)
    raise KeyError(field_name)


# What the model *listing* accepts in `expand` (huggingface_hub 2.4.0's list_models docstring);
# repo info accepts these plus the ones only it can compute.
LISTING_EXPAND = (
    "author", "cardData", "config", "createdAt", "disabled", "downloads", "gated", "lastModified",
    "library_name", "likes", "pipeline_tag", "private", "safetensors", "sha", "siblings", "tags",
)
INFO_ONLY_EXPAND = ("baseModels", "childrenModelCount", "usedStorage")
_DEFAULT_FIELDS = ("author", "createdAt", "downloads", "likes", "library_name", "pipeline_tag", "private", "tags")


def _model_json(repo: MirrorRepo, expand: list[str] | tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"_id": repo.sha[:24], "id": repo.repo_id, "modelId": repo.repo_id}
    for name in expand or _DEFAULT_FIELDS:
        try:
            value = _expand(repo, name)
            json.dumps(value)  # a value JSON cannot carry (an int of thousands of digits) is left out
        except (KeyError, ValueError, TypeError, RecursionError, OSError):
            continue  # one bad field of one repo never fails the answer
        if value is not None:
            out[name] = value
    return out


# ---- HTTP plumbing shared by the hub and the CDN --------------------------------------------------

_UNSAFE_HEADER = re.compile(r"[\x00-\x1f\x7f]")


def _header_value(value: str) -> str:
    """A header value that cannot split the answer (CR/LF) or fail to encode (non-Latin-1):
    control characters and anything outside printable ASCII are percent-encoded."""
    value = _UNSAFE_HEADER.sub(lambda m: quote(m.group()), str(value))
    return value if value.isascii() else quote(value, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~%")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "atlas-hubserver"
    _status = 0
    hub: HubServer

    @property
    def echo_headers(self) -> bool:
        return self.hub.echo_headers

    def log_message(self, format: str, *args: Any) -> None:  # the JSON log replaces stderr noise
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              head: bool = False, length: int | None = None) -> None:
        self._status = status
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, _header_value(value))
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if isinstance(self.wfile, _Drip):
            self.wfile.on = True  # the headers went out at once: the body trickles
        if not head and body:
            self.wfile.write(body)

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None, head: bool = False) -> None:
        body = json.dumps(payload).encode()
        self._send(status, body, {"Content-Type": "application/json", **(headers or {})}, head)

    def _error(self, status: int, code: str | None, message: str, head: bool, extra: dict[str, str] | None = None) -> None:
        if self.echo_headers and self.headers.get("Authorization"):
            message += f" (credentials refused: Authorization: {self.headers['Authorization']})"
        headers = {"X-Error-Message": message, **(extra or {})}
        if code:
            headers["X-Error-Code"] = code
        self._json(status, {"error": message}, headers, head)

    def _file(self, src: bytes | Path, size: int, headers: dict[str, str], head: bool) -> None:
        """200 with the whole file, 206 with a Range of it, 416 for a Range past its end; streamed."""
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        rng = _parse_range(self.headers.get("Range"), size)
        if rng == "unsatisfiable":
            self._error(416, None, "Requested range not satisfiable", head, {**headers, "Content-Range": f"bytes */{size}"})
            return
        start, end = rng if rng is not None else (0, size)
        if rng is not None:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self._send(206 if rng is not None else 200, b"", headers, head=True, length=end - start)
        if not head:
            for chunk in _chunks(src, start, end):
                self.wfile.write(chunk)


def _make_handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def _serve(self, head: bool) -> None:
            self._status, self._limits, self._bucket, self._extra = 0, {}, None, {}
            started, mono = time.time(), time.monotonic()
            split = urlsplit(self.path)
            path = unquote(split.path, errors="replace")
            authed = bool(self.headers.get("Authorization"))
            try:
                if hub.latency_s:
                    hub._pause.wait(hub.latency_s)
                if "/resolve/" in path:
                    hub._maybe_hold()
                self._dispatch(path, parse_qs(split.query), head, authed)
            except (BrokenPipeError, ConnectionResetError):
                pass
            except Exception as exc:  # a server bug must reach the client as a 500, not a dropped socket
                if not self._status:
                    self._error(500, None, f"hubserver error: {type(exc).__name__}", head)
            finally:
                hub._log({
                    "ts": round(started, 4), "ts_mono": mono, "method": self.command, "path": path,
                    "query": split.query, "status": self._status, "range": self.headers.get("Range"),
                    "auth": authed, "bucket": self._bucket,
                })

        def _dispatch(self, path: str, query: dict[str, list[str]], head: bool, authed: bool) -> None:
            fault = hub._take_fault(self.command, f"{path}?{urlsplit(self.path).query}")
            if fault is not None and fault.status == 0:
                self.close_connection = True  # no answer at all: the client sees a dropped connection
                return
            if fault is not None and fault.drip_s:
                self.wfile = _Drip(self.wfile, fault.drip_s, hub._pause, on=fault.drip_headers)
                self.close_connection = True  # this connection's output is spoilt for any later answer
            if fault is not None and fault.listing and path == "/api/models":
                self._endless(fault.listing, query, head)
                return
            if fault is not None and fault.status != 200:
                self._error(fault.status, fault.error_code, f"injected {fault.status}", head, fault.headers)
                return
            if fault is not None:
                self._extra = fault.headers
            if path.startswith("/api/resolve-cache/") or "/resolve/" in path:
                bucket = "resolvers"
            else:
                bucket = "api" if path.startswith("/api/") else "pages"
            self._bucket = bucket
            over, self._limits = hub._count(bucket, authed)
            if over:
                wait = self._limits["Retry-After"]
                self._error(429, None, f"You have been rate-limited: retry after {wait} seconds", head, self._limits)
                return
            if path == "/api/models":
                self._list(query, head)
            elif path.startswith("/api/resolve-cache/models/"):
                self._resolve_cache(path[len("/api/resolve-cache/models/"):], head, authed)
            elif path.startswith("/api/models/"):
                self._info(path[len("/api/models/"):], query, head, authed)
            elif "/resolve/" in path:
                self._resolve(path, head, authed)
            else:
                self._error(404, None, "not found", head, self._limits)

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  head: bool = False, length: int | None = None) -> None:
            extra = {**getattr(self, "_limits", {}), **(headers or {}), **getattr(self, "_extra", {})}
            super()._send(status, body, extra, head, length)

        # -- access as the Hub decides it ---------------------------------------------------

        def _repo(self, repo_id: str, head: bool, authed: bool) -> MirrorRepo | None:
            """The repo if this request may see it; else the Hub's answer is sent and None returned."""
            repo = hub.repos.get(repo_id)
            hidden = repo is None or repo.meta.get("private") is True
            if hidden or (repo is not None and repo.meta.get("disabled") is True and not authed):
                # without a token the Hub cannot tell missing from private or disabled: 401 for all
                self._error(401 if not authed else 404, "RepoNotFound", "Repository not found", head)
                return None
            if repo.meta.get("disabled") is True:
                self._error(403, None, DISABLED_MESSAGE, head)
                return None
            return repo

        def _revision(self, repo: MirrorRepo, rev: str, head: bool) -> bool:
            if rev in ("main", repo.sha):
                return True
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return False

        # -- endpoints ------------------------------------------------------------------------

        def _list(self, query: dict[str, list[str]], head: bool) -> None:
            expand = query.get("expand", [])
            unknown = [e for e in expand if e not in LISTING_EXPAND]
            if unknown:
                self._error(400, None, f'"expand" must be one of the listing\'s fields; got {unknown}', head)
                return
            repos = hub.listing(query)
            page = hub.page_size
            limit = query.get("limit", [""])[0]
            if limit.isdigit() and len(limit) < 10:
                page = max(1, min(page, int(limit)))
            raw_cursor = query.get("cursor", ["0"])[0]
            cursor = int(raw_cursor) if raw_cursor.isdigit() and len(raw_cursor) < 10 else 0
            chunk = repos[cursor:cursor + page]
            headers: dict[str, str] = {}
            if cursor + page < len(repos):
                params = [(k, v) for k, vs in query.items() if k != "cursor" for v in vs]
                params.append(("cursor", str(cursor + page)))
                headers["Link"] = f'<{hub.url}/api/models?{urlencode(params)}>; rel="next"'
            self._json(200, [_model_json(r, expand) for r in chunk], headers, head)

        def _endless(self, kind: str, query: dict[str, list[str]], head: bool) -> None:
            """A listing page of a listing without end (see Fault.listing), linking to a next one."""
            raw = query.get("cursor", ["0"])[0]
            cursor = int(raw) if raw.isdigit() and len(raw) < 10 else 0
            author = query.get("author", ["endless"])[0]
            if kind == "same":  # the first page of the real listing, linking to itself
                items = [_model_json(r, query.get("expand", [])) for r in hub.listing(query)[:hub.page_size]]
            elif kind == "junk":  # one new model a page, of a pipeline tag no one asks for
                items = [{"id": f"{author}/junk-{cursor}", "pipeline_tag": "junk", "downloads": 10**6}]
            else:
                items = []
            params = [(k, v) for k, vs in query.items() if k != "cursor" for v in vs]
            params.append(("cursor", str(cursor if kind == "same" else cursor + 1)))
            self._json(200, items, {"Link": f'<{hub.url}/api/models?{urlencode(params)}>; rel="next"'}, head)

        def _info(self, rest: str, query: dict[str, list[str]], head: bool, authed: bool) -> None:
            parts = rest.split("/")
            repo = self._repo("/".join(parts[:2]), head, authed)
            if repo is None:
                return
            tail = "/".join(parts[2:])
            if tail.startswith("tree/"):
                self._tree(repo, tail[len("tree/"):], query, head)
                return
            if tail and not self._revision(repo, tail[len("revision/"):] if tail.startswith("revision/") else "", head):
                return
            expand = query.get("expand", [])
            unknown = [e for e in expand if e not in LISTING_EXPAND + INFO_ONLY_EXPAND]
            if unknown:
                self._error(400, None, f'"expand" must be one of the repo fields; got {unknown}', head)
                return
            fields = expand or [e for e in LISTING_EXPAND + ("baseModels",) if e not in ("safetensors", "config")]
            self._json(200, _model_json(repo, fields), None, head)

        def _tree(self, repo: MirrorRepo, rest: str, query: dict[str, list[str]], head: bool) -> None:
            rev, _, folder = rest.partition("/")
            if not self._revision(repo, rev, head):
                return
            entries = _tree_entries(repo, folder.strip("/"), query.get("recursive", ["false"])[0].lower() == "true")
            if entries is None:
                self._error(404, "EntryNotFound", f"{folder} does not exist at this revision", head, {"X-Repo-Commit": repo.sha})
                return
            self._json(200, entries, None, head)

        def _file_of(self, repo_id: str, rev: str, filename: str, head: bool, authed: bool) -> MirrorRepo | None:
            """Checks shared by /resolve/ and /api/resolve-cache/: the repo, its revision, the gate, the file."""
            repo = self._repo(repo_id, head, authed)
            if repo is None or not self._revision(repo, rev, head):
                return None
            commit = {"X-Repo-Commit": repo.sha}
            if repo.repo_id in hub.gated and not (authed and repo.repo_id in hub.granted):
                self._error(
                    403 if authed else 401, "GatedRepo",
                    f"Access to model {repo.repo_id} is restricted. You must have access to it and be authenticated.",
                    head, commit,
                )
                return None
            if filename not in repo.files:
                self._error(404, "EntryNotFound", f"{filename} does not exist at this revision", head, commit)
                return None
            return repo

        def _resolve(self, path: str, head: bool, authed: bool) -> None:
            before, _, after = path.lstrip("/").partition("/resolve/")
            rev, _, filename = after.partition("/")
            repo = self._file_of(before, rev, filename, head, authed)
            if repo is None:
                return
            etag, size = repo.etags[filename], repo.sizes[filename]
            headers = {"X-Repo-Commit": repo.sha, "X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(size),
                       "ETag": f'"{etag}"'}
            if is_lfs(filename):  # LFS: a signed URL on another host; the Authorization stays behind
                location = f"{hub.cdn_url}/repos/{repo.sha[:2]}/{etag}?X-Amz-Expires=3600&X-Amz-Signature=local"
                self._send(302, b"", {**headers, "Location": location}, head)
            else:  # a small file: the commit-pinned resolve cache on the same host
                location = (f"/api/resolve-cache/models/{quote(repo.repo_id)}/{repo.sha}/{quote(filename)}"
                            f"?etag={quote(chr(34) + etag + chr(34))}")
                self._send(307, b"", {**headers, "Location": location}, head)

        def _resolve_cache(self, rest: str, head: bool, authed: bool) -> None:
            parts = rest.split("/")
            if len(parts) < 4:
                self._error(404, "EntryNotFound", "no such file", head)
                return
            repo = self._file_of("/".join(parts[:2]), parts[2], "/".join(parts[3:]), head, authed)
            if repo is None:
                return
            filename = "/".join(parts[3:])
            headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.etags[filename]}"'}
            self._file(repo.files[filename], repo.sizes[filename], headers, head)

    Handler.hub = hub
    return Handler


def _make_cdn_handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class CdnHandler(_Handler):
        server_version = "atlas-hubcdn"

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def _serve(self, head: bool) -> None:
            self._status = 0
            split = urlsplit(self.path)
            auth = self.headers.get("Authorization") is not None
            try:
                etag = split.path.rsplit("/", 1)[-1]
                found = hub._blobs.get(etag)
                if auth:  # a client that forwards the Hub token to a CDN leaks it
                    self._error(400, None, "Authorization header must not be sent to the CDN", head)
                elif found is None:
                    self._error(404, None, "no such blob", head)
                else:
                    repo, name = found
                    self._file(repo.files[name], repo.sizes[name], {"ETag": f'"{etag}"'}, head)
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                hub._log({"ts": round(time.time(), 4), "method": self.command, "path": split.path,
                          "status": self._status, "range": self.headers.get("Range"), "auth": auth}, cdn=True)

    CdnHandler.hub = hub
    return CdnHandler


_RANGE = re.compile(r"bytes=(\d{0,18})-(\d{0,18})")  # fullmatch: `$` lets a trailing newline through


def _parse_range(value: str | None, size: int) -> tuple[int, int] | str | None:
    """A single `bytes=a-b` / `bytes=a-` / `bytes=-n` range as [start, end); "unsatisfiable" when it
    starts past the end; None (serve the whole file) for no or an unparsable header."""
    m = _RANGE.fullmatch((value or "").strip())
    if not m or not (m.group(1) or m.group(2)):
        return None
    first, last = m.group(1), m.group(2)
    if not first:  # suffix: the last n bytes
        n = int(last)
        return "unsatisfiable" if n == 0 or size == 0 else (max(0, size - n), size)
    start = int(first)
    if start >= size:
        return "unsatisfiable"
    end = min(size, int(last) + 1) if last else size
    return None if end <= start else (start, end)


def _main(argv: list[str]) -> int:
    """`python -m atlas.hub.server DIR`: serve a mirror until interrupted (prints the endpoint)."""
    if len(argv) != 1:
        print("usage: python -m atlas.hub.server MIRROR_DIR", file=sys.stderr)
        return 2
    with HubServer(load_mirror(argv[0])) as hub:
        print(hub.url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
