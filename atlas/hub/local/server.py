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
import re
import struct
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from atlas.hub.local.handlers import CdnHandler, Fault, HubHandler, HubHTTPServer
from atlas.hub.local.mirror import MirrorRepo, git_blob_id, is_lfs, load_mirror
from atlas.hub.pacing import TIERS, WINDOW_S

# Fault and MirrorRepo are part of what a test drives the hub with; load_mirror is how it is filled.
__all__ = ["Fault", "HubServer", "MirrorRepo", "load_mirror"]

MAX_HEADER_BYTES = 25_000_000  # as huggingface_hub: a larger safetensors header is not one


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
        # requests being answered: a handler logs its request after the answer is sent, so a client
        # can read the log before its own last request is in it (settle() waits for them)
        self._inflight = 0
        self._settled = threading.Condition(self._lock)
        self._windows: dict[tuple[bool, str], _Window] = {}
        self._pause = threading.Event()  # never set: its wait() is a sleep that tests can't patch away
        self._hold_after: int | None = None  # file requests after this many get no answer until release()
        self._files_started = 0
        self.held = 0
        self._release = threading.Event()
        self._httpd = HubHTTPServer(self, HubHandler)
        self._cdn = HubHTTPServer(self, CdnHandler)
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

    def hold_if_asked(self) -> None:
        """Before a file request is answered: held unanswered while `hold_files` asks for it."""
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

    # ---- what the handlers ask of the hub (atlas.hub.local.handlers.ServedHub) ---------------------

    def pause(self, seconds: float) -> None:
        self._pause.wait(seconds)

    def model_json(self, repo: MirrorRepo, expand: list[str] | tuple[str, ...]) -> dict[str, Any]:
        return _model_json(repo, expand)

    def tree(self, repo: MirrorRepo, folder: str, recursive: bool) -> list[dict[str, Any]] | None:
        return _tree_entries(repo, folder, recursive)

    def byte_range(self, value: str | None, size: int) -> tuple[int, int] | str | None:
        return _parse_range(value, size)

    def blob(self, etag: str) -> tuple[MirrorRepo, str] | None:
        """The LFS file the CDN serves under `etag` (its sha256)."""
        return self._blobs.get(etag)

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

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times != 0 and fault.path_contains in path and fault.method in (None, method):
                    if fault.times > 0:
                        fault.times -= 1
                    return fault
        return None

    def count(self, bucket: str, authed: bool) -> tuple[bool, dict[str, str]]:
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

    def begin(self) -> None:
        """A handler starts answering a request (its log() ends it)."""
        with self._lock:
            self._inflight += 1

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until every request begun has been logged, so the logs hold all that was answered."""
        with self._settled:
            self._settled.wait_for(lambda: self._inflight == 0, timeout)

    def log(self, entry: dict[str, Any], cdn: bool = False) -> None:
        with self._lock:
            self._inflight = max(0, self._inflight - 1)
            self._settled.notify_all()
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
            entries.append({"type": "file", "oid": git_blob_id(pointer, len(pointer)), "size": size, "path": path,
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
        revision = meta.get("base_model_revision")
        if isinstance(revision, str):
            card["base_model_revision"] = revision
        return card
    if field_name == "safetensors":
        return _safetensors_info(repo)
    if field_name == "config":
        return _config_subset(repo)
    raise KeyError(field_name)
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
    """`python -m atlas.hub.local.server DIR`: serve a mirror until interrupted (prints the endpoint)."""
    if len(argv) != 1:
        print("usage: python -m atlas.hub.local.server MIRROR_DIR", file=sys.stderr)
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
