"""A local stand-in for the Hugging Face Hub: serves a mirror folder on 127.0.0.1 with the Hub's
API shape, so `atlas crawl --mirror DIR` and the tests drive the real `huggingface_hub` client
through the same code path as a live crawl.

Mirror layout: `<org>/<name>/<files>`. Folders whose name starts with `_` or `.` are skipped:
`_unattributed/` holds real configs without a known hub id (test data, not atlas rows).
Optional `HUB_METADATA.toml` at the mirror root gives per-repo hub metadata (base model and its
relation, pipeline tag, gated, downloads, likes, dates); absent fields stay absent, as on the Hub.

Speaks: GET /api/models (filters, `expand`, `Link` pagination with a cursor), GET
/api/models/{id}[/revision/{rev}], GET /api/models/{id}/tree/{rev}[/{folder}][?recursive=true]
(what `snapshot_download` lists; one page, mirror repos are small), HEAD/GET
/{id}/resolve/{rev}/{file} (X-Repo-Commit, ETag, Range), errors through X-Error-Code. A repo's sha
is derived from its files' content. As on the Hub, a gated repo's info and tree are public; only
its files answer 403.

Test hooks: fault injection (status, headers, count), a fixed-window request-rate limit answered
with 429 + Retry-After + RateLimit, injected latency, and a request log (memory + JSONL file).
"""

from __future__ import annotations

import hashlib
import json
import math
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
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

METADATA_FILE = "HUB_METADATA.toml"
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


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
            data = self.read(name)
            self.sizes[name] = len(data)
            if name.endswith(_LFS_SUFFIXES):
                etag = hashlib.sha256(data).hexdigest()  # LFS files: the Hub's ETag is the sha256
            else:
                etag = _git_blob_id(data)
            self.etags[name] = etag
            digest.update(f"{name}\0{etag}\n".encode())
        self.sha = digest.hexdigest()

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        src = self.files[name]
        if isinstance(src, bytes):
            return src[start:end]
        with open(src, "rb") as fh:
            fh.seek(start)
            return fh.read() if end is None else fh.read(max(0, end - start))


def load_mirror(root: Path | str) -> dict[str, MirrorRepo]:
    """Read a mirror folder into repos keyed by repo id."""
    root = Path(root)
    meta_path = root / METADATA_FILE
    meta_all: dict[str, Any] = tomllib.loads(meta_path.read_text()) if meta_path.exists() else {}
    repos: dict[str, MirrorRepo] = {}
    for org in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        for repo_dir in sorted(p for p in org.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
            files = {
                f.relative_to(repo_dir).as_posix(): f
                for f in sorted(repo_dir.rglob("*"))
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(repo_dir).parts)
            }
            repo_id = f"{org.name}/{repo_dir.name}"
            repos[repo_id] = MirrorRepo(repo_id, dict(files), dict(meta_all.get(repo_id, {})))
    return repos


@dataclass
class Fault:
    """Answer matching requests with `status` (and headers) instead of serving them."""

    status: int
    path_contains: str = ""
    method: str | None = None
    times: int = 1  # how many requests it hits; -1 = every one
    headers: dict[str, str] = field(default_factory=dict)
    error_code: str | None = None


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # clients dropping idle keep-alive connections are normal, not worth a traceback
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class HubServer:
    """The local hub. Use as a context manager; `url` is its endpoint."""

    def __init__(
        self,
        repos: dict[str, MirrorRepo],
        log_path: Path | None = None,
        page_size: int = 100,
        latency_s: float = 0.0,
        rate_limit: tuple[int, float] | None = None,
    ) -> None:
        self.repos = repos
        self.page_size = page_size
        self.latency_s = latency_s
        self.rate_limit = rate_limit  # (requests allowed, window seconds)
        self.faults: list[Fault] = []
        self.gated: set[str] = {r for r, repo in repos.items() if repo.meta.get("gated")}
        self.requests: list[dict[str, Any]] = []
        self.rate_limited = 0
        self._log_path = log_path
        self._lock = threading.Lock()
        self._window_start = 0.0
        self._window_count = 0
        self._pause = threading.Event()  # never set: its wait() is a sleep that tests can't patch away
        self._httpd = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hubserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- test hooks ------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    def file_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if "/resolve/" in r["path"]]

    # ---- internals used by the handler -----------------------------------------------------

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times != 0 and fault.path_contains in path and fault.method in (None, method):
                    if fault.times > 0:
                        fault.times -= 1
                    return fault
        return None

    def _rate_check(self) -> int | None:
        """Seconds until the window resets when this request is over the limit, else None."""
        if self.rate_limit is None:
            return None
        quota, window = self.rate_limit
        with self._lock:
            now = time.monotonic()
            if now - self._window_start >= window:
                self._window_start, self._window_count = now, 0
            self._window_count += 1
            if self._window_count <= quota:
                return None
            self.rate_limited += 1
            return max(1, math.ceil(self._window_start + window - now))

    def _log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)
            if self._log_path is not None:
                with open(self._log_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(entry) + "\n")


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        value = value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return value.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return str(value)


def _config_subset(repo: MirrorRepo) -> dict[str, Any] | None:
    """What the Hub's `config` expand returns: a small subset, not config.json itself."""
    if "config.json" not in repo.files:
        return None
    try:
        cfg = json.loads(repo.read("config.json"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(cfg, dict):
        return None
    out = {k: cfg[k] for k in ("architectures", "model_type") if k in cfg}
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and "quant_method" in quant:
        out["quantization_config"] = {"quant_method": quant["quant_method"]}
    return out


def _pipeline_tag(repo: MirrorRepo) -> str | None:
    if "pipeline_tag" in repo.meta:
        return repo.meta["pipeline_tag"]
    has_vision = _config_subset(repo) is not None and b'"vision_config"' in repo.read("config.json")
    return "image-text-to-text" if has_vision else "text-generation"


def _safetensors_info(repo: MirrorRepo) -> dict[str, Any] | None:
    if "model.safetensors" not in repo.files:
        return None
    try:
        (n,) = struct.unpack("<Q", repo.read("model.safetensors", 0, 8))
        header = json.loads(repo.read("model.safetensors", 8, 8 + n))
    except (struct.error, ValueError, UnicodeDecodeError):
        return None
    params: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        params[info.get("dtype", "?")] = params.get(info.get("dtype", "?"), 0) + math.prod(info.get("shape", []))
    return {"parameters": params, "total": sum(params.values())}


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
        elif path.endswith(_LFS_SUFFIXES):
            size = repo.sizes[path]
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{repo.etags[path]}\nsize {size}\n".encode()
            entries.append({"type": "file", "oid": _git_blob_id(pointer), "size": size, "path": path,
                            "lfs": {"oid": repo.etags[path], "size": size, "pointerSize": len(pointer)}})
        else:
            entries.append({"type": "file", "oid": repo.etags[path], "size": repo.sizes[path], "path": path})
    return entries


def _tags(repo: MirrorRepo) -> list[str]:
    tags = list(repo.meta.get("tags", []))
    base = repo.meta.get("base_model")
    if base:
        tags.append(f"base_model:{base}")
        if repo.meta.get("base_relation"):
            tags.append(f"base_model:{repo.meta['base_relation']}:{base}")
    if "model.safetensors" in repo.files or "model.safetensors.index.json" in repo.files:
        tags.append("safetensors")
    return tags


def _expand(repo: MirrorRepo, field_name: str) -> Any:
    meta = repo.meta
    base = meta.get("base_model")
    if field_name == "sha":
        return repo.sha
    if field_name == "lastModified":
        return _iso(meta.get("last_modified"))
    if field_name == "createdAt":
        return _iso(meta.get("created_at"))
    if field_name in ("downloads", "likes"):
        return meta.get(field_name)
    if field_name == "gated":
        return meta.get("gated", False)
    if field_name == "private":
        return False
    if field_name == "pipeline_tag":
        return _pipeline_tag(repo)
    if field_name == "library_name":
        return meta.get("library_name", "transformers")
    if field_name == "tags":
        return _tags(repo)
    if field_name == "author":
        return repo.repo_id.split("/")[0]
    if field_name == "siblings":
        return [{"rfilename": name} for name in sorted(repo.files)]
    if field_name == "baseModels":
        if not base:
            return None
        return {"relation": meta.get("base_relation", "finetune"), "models": [{"id": base}]}
    if field_name == "cardData":
        card: dict[str, Any] = {}
        if base:
            card["base_model"] = base
            if meta.get("base_relation"):
                card["base_model_relation"] = meta["base_relation"]
        return card
    if field_name == "safetensors":
        return _safetensors_info(repo)
    if field_name == "config":
        return _config_subset(repo)
    raise KeyError(field_name)


EXPANDABLE = (
    "author", "baseModels", "cardData", "config", "createdAt", "downloads", "gated", "lastModified",
    "library_name", "likes", "pipeline_tag", "private", "safetensors", "sha", "siblings", "tags",
)
_DEFAULT_FIELDS = ("author", "createdAt", "downloads", "likes", "library_name", "pipeline_tag", "private", "tags")


def _model_json(repo: MirrorRepo, expand: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"_id": repo.sha[:24], "id": repo.repo_id, "modelId": repo.repo_id}
    for name in expand or _DEFAULT_FIELDS:
        value = _expand(repo, name)
        if value is not None:
            out[name] = value
    return out


def _make_handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "atlas-hubserver"

        def log_message(self, format: str, *args: Any) -> None:  # the JSONL log replaces stderr noise
            pass

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        # -- plumbing -------------------------------------------------------------------------

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
            self._status = status
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head and body:
                self.wfile.write(body)

        def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None, head: bool = False) -> None:
            body = json.dumps(payload).encode()
            self._send(status, body, {"Content-Type": "application/json", **(headers or {})}, head)

        def _error(self, status: int, code: str | None, message: str, head: bool, extra: dict[str, str] | None = None) -> None:
            headers = {"X-Error-Message": message, **(extra or {})}
            if code:
                headers["X-Error-Code"] = code
            self._json(status, {"error": message}, headers, head)

        def _serve(self, head: bool) -> None:
            self._status = 0
            started = time.time()
            split = urlsplit(self.path)
            path = unquote(split.path)
            try:
                if hub.latency_s:
                    hub._pause.wait(hub.latency_s)
                self._dispatch(path, parse_qs(split.query), head)
            except (BrokenPipeError, ConnectionResetError):
                pass
            except Exception as exc:  # a server bug must reach the client as a 500, not a dropped socket
                if not self._status:
                    self._error(500, None, f"hubserver error: {type(exc).__name__}", head)
            finally:
                hub._log(
                    {
                        "ts": round(started, 4), "method": self.command, "path": path,
                        "query": split.query, "status": self._status, "range": self.headers.get("Range"),
                        "auth": self.headers.get("Authorization") is not None,
                    }
                )

        def _dispatch(self, path: str, query: dict[str, list[str]], head: bool) -> None:
            fault = hub._take_fault(self.command, path)
            if fault is not None:
                self._error(fault.status, fault.error_code, f"injected {fault.status}", head, fault.headers)
                return
            wait = hub._rate_check()
            if wait is not None:
                bucket = "resolvers" if "/resolve/" in path else "api"
                quota, window = hub.rate_limit or (0, 0)
                self._error(
                    429, None, f"You have been rate-limited: retry after {wait} seconds", head,
                    {
                        "Retry-After": str(wait),
                        "RateLimit": f'"{bucket}";r=0;t={wait}',
                        "RateLimit-Policy": f'"fixed window";"{bucket}";q={quota};w={math.ceil(window)}',
                    },
                )
                return
            if path == "/api/models":
                self._list(query, head)
            elif path.startswith("/api/models/"):
                self._info(path[len("/api/models/"):], query, head)
            elif "/resolve/" in path:
                self._resolve(path, head)
            else:
                self._error(404, None, "not found", head)

        # -- endpoints ------------------------------------------------------------------------

        def _list(self, query: dict[str, list[str]], head: bool) -> None:
            expand = query.get("expand", [])
            unknown = [e for e in expand if e not in EXPANDABLE]
            if unknown:
                self._error(400, None, f"invalid expand value(s): {unknown}", head)
                return
            repos = list(hub.repos.values())
            if "author" in query:
                repos = [r for r in repos if r.repo_id.split("/")[0] == query["author"][0]]
            if "search" in query:
                repos = [r for r in repos if query["search"][0].lower() in r.repo_id.lower()]
            if "pipeline_tag" in query:
                repos = [r for r in repos if _pipeline_tag(r) == query["pipeline_tag"][0]]
            for tag in query.get("filter", []):
                repos = [r for r in repos if tag in _tags(r)]
            sort = query.get("sort", [""])[0]
            if sort in ("downloads", "likes"):
                repos.sort(key=lambda r: (-(r.meta.get(sort) or 0), r.repo_id))
            else:
                repos.sort(key=lambda r: r.repo_id)
            page = hub.page_size
            if "limit" in query and query["limit"][0].isdigit():
                page = max(1, min(page, int(query["limit"][0])))
            raw_cursor = query.get("cursor", ["0"])[0]
            cursor = int(raw_cursor) if raw_cursor.isdigit() else 0
            chunk = repos[cursor:cursor + page]
            headers: dict[str, str] = {}
            if cursor + page < len(repos):
                params = [(k, v) for k, vs in query.items() if k != "cursor" for v in vs]
                params.append(("cursor", str(cursor + page)))
                host = self.headers.get("Host", "127.0.0.1")
                headers["Link"] = f'<http://{host}/api/models?{urlencode(params)}>; rel="next"'
            self._json(200, [_model_json(r, expand) for r in chunk], headers, head)

        def _find(self, rest: str) -> tuple[MirrorRepo | None, str]:
            parts = rest.split("/")
            repo = hub.repos.get("/".join(parts[:2]))
            return repo, "/".join(parts[2:])

        def _info(self, rest: str, query: dict[str, list[str]], head: bool) -> None:
            repo, tail = self._find(rest)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found", head)
                return
            if tail.startswith("tree/"):
                self._tree(repo, tail[len("tree/"):], query, head)
                return
            if tail:
                rev = tail[len("revision/"):] if tail.startswith("revision/") else None
                if rev not in ("main", repo.sha):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                    return
            expand = query.get("expand", []) or [e for e in EXPANDABLE if e not in ("safetensors", "config")]
            self._json(200, _model_json(repo, expand), None, head)

        def _tree(self, repo: MirrorRepo, rest: str, query: dict[str, list[str]], head: bool) -> None:
            rev, _, folder = rest.partition("/")
            if rev not in ("main", repo.sha):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                return
            entries = _tree_entries(repo, folder.strip("/"), query.get("recursive", ["false"])[0].lower() == "true")
            if entries is None:
                self._error(404, "EntryNotFound", f"{folder} does not exist at this revision", head, {"X-Repo-Commit": repo.sha})
                return
            self._json(200, entries, None, head)

        def _resolve(self, path: str, head: bool) -> None:
            before, _, after = path.lstrip("/").partition("/resolve/")
            repo = hub.repos.get(before)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found", head)
                return
            rev, _, filename = after.partition("/")
            if rev not in ("main", repo.sha):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                return
            commit = {"X-Repo-Commit": repo.sha}
            if repo.repo_id in hub.gated:
                self._error(
                    403, "GatedRepo",
                    f"Access to model {repo.repo_id} is restricted. You must have access to it and be authenticated.",
                    head, commit,
                )
                return
            if filename not in repo.files:
                self._error(404, "EntryNotFound", f"{filename} does not exist at this revision", head, commit)
                return
            size = repo.sizes[filename]
            headers = {**commit, "ETag": f'"{repo.etags[filename]}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            rng = _parse_range(self.headers.get("Range"), size)
            if rng is None:
                if head:
                    self._status = 200
                    self.send_response(200)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    return
                self._send(200, repo.read(filename), headers)
                return
            start, end = rng
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            self._send(206, repo.read(filename, start, end), headers, head)

    return Handler


_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def _parse_range(value: str | None, size: int) -> tuple[int, int] | None:
    """A single `bytes=a-b` range as [start, end); anything else serves the whole file."""
    m = _RANGE.match(value or "")
    if not m:
        return None
    start = int(m.group(1))
    end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    return (min(start, size), max(min(start, size), end))


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
