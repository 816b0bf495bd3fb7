"""The local hub's HTTP side: request handlers for the hub and its CDN, at module level. They
answer from the hub they serve (`self.hub`, the `ServedHub` interface), never from its internals;
faults a test injects (`Fault`) are applied here, on the wire."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from atlas.hub.errors import DISABLED_MESSAGE
from atlas.hub.local.mirror import MirrorRepo, chunks, is_lfs



# What the model *listing* accepts in `expand` (huggingface_hub 2.4.0's list_models docstring);
# repo info accepts these plus the ones only it can compute.
LISTING_EXPAND = (
    "author", "cardData", "config", "createdAt", "disabled", "downloads", "gated", "lastModified",
    "library_name", "likes", "pipeline_tag", "private", "safetensors", "sha", "siblings", "tags",
)
INFO_ONLY_EXPAND = ("baseModels", "childrenModelCount", "usedStorage")


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



class ServedHub(Protocol):
    """What the handlers ask of the hub they serve (atlas.hub.local.server.HubServer)."""

    repos: dict[str, MirrorRepo]
    gated: set[str]
    granted: set[str]
    echo_headers: bool
    latency_s: float
    page_size: int

    @property
    def url(self) -> str: ...
    @property
    def cdn_url(self) -> str: ...
    def pause(self, seconds: float) -> None: ...
    def hold_if_asked(self) -> None: ...
    def take_fault(self, method: str, path: str) -> Fault | None: ...
    def count(self, bucket: str, authed: bool) -> tuple[bool, dict[str, str]]: ...
    def log(self, entry: dict[str, Any], cdn: bool = False) -> None: ...
    def listing(self, query: dict[str, list[str]]) -> list[MirrorRepo]: ...
    def model_json(self, repo: MirrorRepo, expand: list[str] | tuple[str, ...]) -> dict[str, Any]: ...
    def tree(self, repo: MirrorRepo, folder: str, recursive: bool) -> list[dict[str, Any]] | None: ...
    def byte_range(self, value: str | None, size: int) -> tuple[int, int] | str | None: ...
    def blob(self, etag: str) -> tuple[MirrorRepo, str] | None: ...


class _Drip:
    """A connection's output sent one byte at a time, `seconds` apart, once `on` (a slow link or a
    hostile server; the client must not wait for it without end)."""

    def __init__(self, out: Any, seconds: float, pause: Callable[[float], None], on: bool) -> None:
        self._out, self._seconds, self._pause, self.on = out, seconds, pause, on

    def write(self, data: bytes) -> int:
        if not self.on:
            return self._out.write(data)
        for i in range(len(data)):
            self._out.write(data[i:i + 1])
            self._out.flush()
            self._pause(self._seconds)
        return len(data)

    def flush(self) -> None:
        self._out.flush()

    @property
    def closed(self) -> bool:
        return self._out.closed

    def close(self) -> None:
        self._out.close()



class HubHTTPServer(ThreadingHTTPServer):
    """One listening socket on 127.0.0.1 (any free port) answering for `hub`."""

    daemon_threads = True

    def __init__(self, hub: ServedHub, handler: type[BaseHTTPRequestHandler]) -> None:
        self.hub = hub
        super().__init__(("127.0.0.1", 0), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # clients dropping idle keep-alive connections are normal, not worth a traceback
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


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

    @property
    def hub(self) -> ServedHub:
        return cast(HubHTTPServer, self.server).hub

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
        rng = self.hub.byte_range(self.headers.get("Range"), size)
        if rng == "unsatisfiable":
            self._error(416, None, "Requested range not satisfiable", head, {**headers, "Content-Range": f"bytes */{size}"})
            return
        start, end = rng if rng is not None else (0, size)
        if rng is not None:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self._send(206 if rng is not None else 200, b"", headers, head=True, length=end - start)
        if not head:
            for chunk in chunks(src, start, end):
                self.wfile.write(chunk)



class HubHandler(_Handler):
    """The hub's API and file endpoints, as the Hub answers them."""

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _serve(self, head: bool) -> None:
        self.hub.begin()
        self._status, self._limits, self._bucket, self._extra = 0, {}, None, {}
        started, mono = time.time(), time.monotonic()
        split = urlsplit(self.path)
        path = unquote(split.path, errors="replace")
        authed = bool(self.headers.get("Authorization"))
        try:
            if self.hub.latency_s:
                self.hub.pause(self.hub.latency_s)
            if "/resolve/" in path:
                self.hub.hold_if_asked()
            self._dispatch(path, parse_qs(split.query), head, authed)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a server bug must reach the client as a 500, not a dropped socket
            if not self._status:
                self._error(500, None, f"hubserver error: {type(exc).__name__}", head)
        finally:
            self.hub.log({
                "ts": round(started, 4), "ts_mono": mono, "method": self.command, "path": path,
                "query": split.query, "status": self._status, "range": self.headers.get("Range"),
                "auth": authed, "bucket": self._bucket,
            })

    def _dispatch(self, path: str, query: dict[str, list[str]], head: bool, authed: bool) -> None:
        fault = self.hub.take_fault(self.command, f"{path}?{urlsplit(self.path).query}")
        if fault is not None and fault.status == 0:
            self.close_connection = True  # no answer at all: the client sees a dropped connection
            return
        if fault is not None and fault.drip_s:
            self.wfile = _Drip(self.wfile, fault.drip_s, self.hub.pause, on=fault.drip_headers)
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
        over, self._limits = self.hub.count(bucket, authed)
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
        repo = self.hub.repos.get(repo_id)
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
        repos = self.hub.listing(query)
        page = self.hub.page_size
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
            headers["Link"] = f'<{self.hub.url}/api/models?{urlencode(params)}>; rel="next"'
        self._json(200, [self.hub.model_json(r, expand) for r in chunk], headers, head)

    def _endless(self, kind: str, query: dict[str, list[str]], head: bool) -> None:
        """A listing page of a listing without end (see Fault.listing), linking to a next one."""
        raw = query.get("cursor", ["0"])[0]
        cursor = int(raw) if raw.isdigit() and len(raw) < 10 else 0
        author = query.get("author", ["endless"])[0]
        if kind == "same":  # the first page of the real listing, linking to itself
            items = [self.hub.model_json(r, query.get("expand", [])) for r in self.hub.listing(query)[:self.hub.page_size]]
        elif kind == "junk":  # one new model a page, of a pipeline tag no one asks for
            items = [{"id": f"{author}/junk-{cursor}", "pipeline_tag": "junk", "downloads": 10**6}]
        else:
            items = []
        params = [(k, v) for k, vs in query.items() if k != "cursor" for v in vs]
        params.append(("cursor", str(cursor if kind == "same" else cursor + 1)))
        self._json(200, items, {"Link": f'<{self.hub.url}/api/models?{urlencode(params)}>; rel="next"'}, head)

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
        self._json(200, self.hub.model_json(repo, fields), None, head)

    def _tree(self, repo: MirrorRepo, rest: str, query: dict[str, list[str]], head: bool) -> None:
        rev, _, folder = rest.partition("/")
        if not self._revision(repo, rev, head):
            return
        entries = self.hub.tree(repo, folder.strip("/"), query.get("recursive", ["false"])[0].lower() == "true")
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
        if repo.repo_id in self.hub.gated and not (authed and repo.repo_id in self.hub.granted):
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
            location = f"{self.hub.cdn_url}/repos/{repo.sha[:2]}/{etag}?X-Amz-Expires=3600&X-Amz-Signature=local"
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


class CdnHandler(_Handler):
    """The CDN an LFS file redirects to: blobs by sha256, no Authorization accepted."""

    server_version = "atlas-hubcdn"

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _serve(self, head: bool) -> None:
        self.hub.begin()
        self._status = 0
        split = urlsplit(self.path)
        auth = self.headers.get("Authorization") is not None
        try:
            etag = split.path.rsplit("/", 1)[-1]
            found = self.hub.blob(etag)
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
            self.hub.log({"ts": round(time.time(), 4), "method": self.command, "path": split.path,
                      "status": self._status, "range": self.headers.get("Range"), "auth": auth}, cdn=True)
