"""The crawler: watch list -> Hub listing -> pinned downloads -> fingerprints -> one snapshot.

Same code path for the live Hub and the bundled mirror (served by atlas.hub.server on 127.0.0.1):
only the endpoint differs.

Requests, and what each costs (see atlas.hub.pacing for the three rate-limit buckets):
- Listing (api bucket): one `list_models` per pipeline tag per org, filtered by the server and
  sorted by downloads, paged only until downloads fall under the org's minimum. Only expand fields
  the *listing* accepts are asked for (the Hub answers 400 to others, e.g. `baseModels`); base
  models come from the card's `base_model` and `base_model:` tags. Explicit repos: `model_info`.
- Files (resolvers bucket): one GET per file, pinned to the listed sha (the Hub 307s small files to
  its resolve cache, 302s LFS files to a CDN; the client drops Authorization off the Hub). The
  size is checked from Content-Length before the body is read. Repos the listing shows as gated
  or disabled cost no request without a token.
- Every answer is classified by `X-Error-Code` first (RepoNotFound, GatedRepo, RevisionNotFound,
  EntryNotFound, a disabled repo's message), then by status: a 401 + RepoNotFound is `missing`
  (the Hub's answer without a token for missing and private repos alike), not `gated`.

Politeness lives in `Pacer` (HTTP hooks on huggingface_hub's client). On top of the client's own
retries, `_call` retries 429/5xx/timeouts with backoff. A hub that cannot be reached fails the
crawl within seconds, before the store is locked; nothing stops the crawl for one repo.

Every wait has a bound (`Bounds`): one request has a wall-clock deadline however its bytes trickle
in (the client's timeout is per read), no pause is longer than `wait_s`, and one listing has a
deadline, a number of pages, and must bring new models on every page it links on from. Reaching a
bound gives up that request or listing with the reason (`GaveUp`): the repo is a per-repo error, the
listing a problem of a partial snapshot, and the crawl goes on.

The HF token is scrubbed (atlas.hub.redact) from everything the network sends before it is stored,
cached or shown: a proxy that echoes the Authorization header cannot put it in the store.

Incremental and resumable: downloaded files are cached by (sha, repo, file) under the cache dir, so
a killed crawl resumes without asking again, and an unchanged sha costs no request (its raw config
is already in the store). The snapshot is written in one transaction at the very end.

Side files (weight index, safetensors header, hf_quant_config.json) never make a repo unread:
their errors go in `side_file_error`. Only errors that cannot change at the same sha (bad bytes,
over a size limit, a listed file that is absent) are stored with it; after a 5xx or timeout the
next crawl asks for the missing side files again, not for the stored config.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import signal
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # must precede the huggingface_hub import

import duckdb  # noqa: E402
from huggingface_hub import HfApi, hf_hub_url  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    HFValidationError,
    NotASafetensorsRepoError,
    SafetensorsParsingError,
)
from huggingface_hub.utils import build_hf_headers, close_session, get_session, hf_raise_for_status, httpx  # noqa: E402
from huggingface_hub.utils import logging as hf_logging  # noqa: E402
from huggingface_hub.utils import set_client_factory  # noqa: E402
from huggingface_hub.utils._http import default_client_factory  # noqa: E402
from pydantic import BaseModel, Field, ValidationError  # noqa: E402

from atlas import AtlasError, store  # noqa: E402
from atlas.fingerprints import (  # noqa: E402
    MAX_CONFIG_BYTES,
    MAX_INDEX_BYTES,
    RULE_VERSION,
    fingerprint,
    header_tensor_names,
    parse_config_bytes,
    parse_weight_index,
)
from atlas.hub import redact  # noqa: E402
from atlas.hub.pacing import MAX_WAIT_S, GaveUp, Pacer, retry_after  # noqa: E402

LIVE_ENDPOINT = "https://huggingface.co"
DEFAULT_WATCHLIST = Path(__file__).with_name("watchlist.toml")
# What the model listing accepts (not `baseModels`: only repo info does); repo info adds it.
LISTING_EXPAND = [
    "sha", "lastModified", "createdAt", "downloads", "likes", "gated", "private", "disabled",
    "pipeline_tag", "library_name", "tags", "cardData", "siblings", "safetensors",
]
INFO_EXPAND = [*LISTING_EXPAND, "baseModels"]
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_ATTEMPTS = 4
MAX_REDIRECTS = 5
UNREACHABLE_AFTER = 4  # consecutive attempts without any answer: the hub is gone, stop
DISABLED_MESSAGE = "Access to this resource is disabled."
INT64_MAX = 2**63 - 1
# Used with fullmatch: `$` would accept one trailing newline ("org/m\n" as a second repo).
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}")
_SHA = re.compile(r"[0-9a-f]{40}")

T = TypeVar("T")


@dataclass(frozen=True)
class Bounds:
    """How long a crawl waits for anything. A config is < 100 kB and the largest weight index
    ~10 MB, so five minutes per request is generous on a slow link; the Hub's listings of the
    watch list are a few pages each."""

    request_s: float = 300.0  # one HTTP request, first byte sent to last byte read
    wait_s: float = MAX_WAIT_S  # one pause for a rate-limit window or a retry
    listing_pages: int = 1000  # pages of one listing (one org, one pipeline tag)
    listing_s: float = 1800.0  # one listing, all its pages


DEFAULT_BOUNDS = Bounds()


# ---- watch list ---------------------------------------------------------------------------------


class OrgScope(BaseModel):
    author: str
    pipeline_tags: list[str] | None = None
    min_downloads: int | None = Field(default=None, ge=0)
    max_models: int | None = Field(default=None, ge=1)


class Defaults(BaseModel):
    pipeline_tags: list[str] = Field(default_factory=lambda: ["text-generation"])
    min_downloads: int = Field(default=0, ge=0)
    max_models: int = Field(default=200, ge=1)


class Watchlist(BaseModel):
    """The crawl's scope, checked in so that "current models" is reproducible."""

    defaults: Defaults = Field(default_factory=Defaults)
    orgs: list[OrgScope] = Field(default_factory=list)
    repos: list[str] = Field(default_factory=list)  # crawled whatever the filters say
    exemplars: list[str] = Field(default_factory=list)  # the module's worked examples


def load_watchlist(path: Path) -> tuple[Watchlist, str]:
    """The watch list and the sha256 of its bytes (stored with each snapshot)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise AtlasError(f"cannot read watch list {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
        return Watchlist.model_validate(data), hashlib.sha256(raw).hexdigest()
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AtlasError(f"watch list {path} is not valid TOML: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise AtlasError(f"watch list {path}: {where}: {first['msg']}") from None


# ---- the HTTP client ----------------------------------------------------------------------------


class HubUnreachable(AtlasError):
    """No answer at all from the hub, repeatedly: the crawl stops (and writes no snapshot)."""


class Silence:
    """Counts consecutive requests that got no answer at all, every attempt included (the hub
    client's own retries too, which it would otherwise spend minutes on); after
    UNREACHABLE_AFTER of them the hub is taken as gone: every waiting request is woken and every
    new one refused, so the crawl ends in seconds."""

    def __init__(self, pacer: Pacer) -> None:
        self.gone = threading.Event()
        self._pacer = pacer
        self._streak = 0
        self._lock = threading.Lock()

    def answered(self) -> None:
        with self._lock:
            self._streak = 0

    def unanswered(self) -> None:
        with self._lock:
            self._streak += 1
            if self._streak >= UNREACHABLE_AFTER:
                self.gone.set()
                self._pacer.abort()


class _Deadline(threading.local):
    """The wall-clock end of the request this thread is sending or reading (the sync client does
    a request's I/O, body included, in the thread that sent it)."""

    at: float = float("inf")
    seconds: float = 0.0

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise self.passed()
        return left

    def passed(self) -> GaveUp:
        return GaveUp(f"no whole answer within {self.seconds:g} s (the server sends too slowly); gave up on this request")


_DEADLINE = _Deadline()


def _bounded(timeout: float | None) -> float:
    left = _DEADLINE.left()
    return left if timeout is None else min(timeout, left)


class _DeadlineStream:
    """A connection whose every read and write ends by the request's deadline: an answer sent a
    byte a second (each read well inside the client's per-read timeout) still ends."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return self._inner.read(max_bytes, _bounded(timeout))
        except Exception:  # a read timed out by the deadline is the deadline, not a timeout to retry
            if time.monotonic() >= _DEADLINE.at:
                raise _DEADLINE.passed() from None
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            self._inner.write(buffer, _bounded(timeout))
        except Exception:
            if time.monotonic() >= _DEADLINE.at:
                raise _DEADLINE.passed() from None
            raise

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _bounded(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend:
    """The connection pool's network backend, every connection it opens under the deadline."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_tcp(host, port, _bounded(timeout), local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None) -> _DeadlineStream:
        return _DeadlineStream(self._inner.connect_unix_socket(path, _bounded(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(min(seconds, _DEADLINE.left()))


class ListingGuard:
    """Bounds one listing, all its pages: a number of pages, a deadline, and every page that links
    on must have brought a model not seen on an earlier one (an empty page linking to another, or
    one repeating itself, is a listing without end)."""

    def __init__(self, bounds: Bounds, clock: Callable[[], float] = time.monotonic) -> None:
        self._bounds = bounds
        self._clock = clock
        self._ends = clock() + bounds.listing_s
        self.pages = 0
        self._new = 0
        self._seen: set[str] = set()
        self._cursors: set[str] = set()
        self._pending = False  # a page was asked for and has not been read whole yet

    def page(self, url: str) -> None:
        """Before each page's request (GaveUp instead of asking for it). A request while the last
        page is not read whole is the client retrying it (a 5xx, a broken body), not a next page."""
        if self._pending:
            return
        if self.pages and not self._new:
            raise GaveUp(f"page {self.pages} brought no model not already listed, yet links to a next page")
        if self.pages >= self._bounds.listing_pages:
            raise GaveUp(f"still more pages after {self.pages}, the most one listing may have")
        if self._clock() > self._ends:
            raise GaveUp(f"still listing after {self._bounds.listing_s:g} s ({self.pages} pages), the longest one listing may take")
        cursor = "&".join(parse_qs(urlsplit(url).query).get("cursor", []))
        if cursor and cursor in self._cursors:
            raise GaveUp(f"page {self.pages} links back to a page already listed (cursor {cursor[:40]!r})")
        self._cursors.add(cursor)
        self.pages += 1
        self._new = 0
        self._pending = True

    def answered(self, status: int) -> None:
        """The last page's answer was read to its end."""
        if status == 200:
            self._pending = False

    def item(self, repo_id: object) -> None:
        key = str(repo_id)
        if key not in self._seen:
            self._seen.add(key)
            self._new += 1


class _ReadToTheEnd(httpx.SyncByteStream):
    """A response body that calls `done` once it has been read to its end."""

    def __init__(self, inner: Any, done: Callable[[], None]) -> None:
        self._inner, self._done = inner, done

    def __iter__(self) -> Any:
        yield from self._inner
        self._done()

    def close(self) -> None:
        self._inner.close()


_LISTING = threading.local()  # .guard: the ListingGuard of the listing this thread is paging through


def _is_listing(url: str) -> bool:
    return urlsplit(url).path.rstrip("/").endswith("/api/models")


LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def install_client(pacer: Pacer, timeout_s: float, silence: Silence, request_s: float = DEFAULT_BOUNDS.request_s) -> None:
    """huggingface_hub's client (its own request hook first) with our hooks and a transport that
    tells `silence` whether each attempt got an answer and holds every request to `request_s`."""
    from huggingface_hub.utils._http import hf_request_event_hook

    class Watched(httpx.HTTPTransport):
        def __init__(self, proxy: str | None = None) -> None:
            super().__init__(proxy=proxy)
            # httpx2 offers no public hook below its per-read timeout: the pool's network backend is it
            self._pool._network_backend = _DeadlineBackend(self._pool._network_backend)

        def handle_request(self, request: Any) -> Any:
            try:
                response = super().handle_request(request)
            except httpx.TransportError:
                pacer.forget(request.extensions.get("atlas_ticket"))
                silence.unanswered()
                raise
            except GaveUp:  # the server answers, too slowly: not silence
                pacer.forget(request.extensions.get("atlas_ticket"))
                raise
            silence.answered()
            guard = getattr(_LISTING, "guard", None)
            if guard is not None and _is_listing(str(request.url)):
                status = response.status_code
                response.stream = _ReadToTheEnd(response.stream, lambda: guard.answered(status))
            return response

    def on_request(request: Any) -> None:
        if silence.gone.is_set() or pacer.aborted:  # not a network error type: no client retries it
            raise HubUnreachable("the hub stopped answering" if silence.gone.is_set() else "crawl interrupted")
        guard = getattr(_LISTING, "guard", None)
        if guard is not None and _is_listing(str(request.url)):
            guard.page(str(request.url))
        request.extensions["atlas_ticket"] = pacer.before(str(request.url))
        _DEADLINE.at, _DEADLINE.seconds = time.monotonic() + request_s, request_s  # from now, not from the hold

    def on_response(response: Any) -> None:
        ticket = response.request.extensions.get("atlas_ticket")
        if ticket is not None:
            pacer.after(ticket, response.status_code, response.headers)
        if response.status_code in RETRY_STATUS:
            # huggingface_hub's own retry would sleep whatever the server asks: bounded here
            asked = retry_after(response.headers)
            if asked is not None:
                pacer.check_wait(asked, f"after its HTTP {response.status_code}")

    def factory() -> Any:
        # A client given its own transport drops the environment's proxies (HTTPS_PROXY, HTTP_PROXY,
        # ALL_PROXY, NO_PROXY): they are mounted again here, one watched transport per distinct
        # proxy. Every NO_PROXY entry routes to the one direct transport: a transport per entry,
        # each with its own TLS context, took 20 s for 100 entries and over 300 s for 1000. A hub
        # on this machine (the mirror's server, a test hub) is always reached direct: a proxy
        # elsewhere cannot reach this machine's loopback.
        transports: dict[str | None, Watched] = {None: Watched()}

        def through(proxy: str | None) -> Watched:
            if proxy not in transports:
                transports[proxy] = Watched(proxy)
            return transports[proxy]

        mounts = {pattern: through(proxy) for pattern, proxy in httpx._utils.get_environment_proxies().items()}
        mounts.update({f"all://{host}": transports[None] for host in LOOPBACK} if mounts else {})
        return httpx.Client(  # the Hub redirects once (307 or 302): a loop is cut short, not followed 20 times
            transport=transports[None], mounts=mounts, follow_redirects=True, max_redirects=MAX_REDIRECTS,
            timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)),
            event_hooks={"request": [hf_request_event_hook, on_request], "response": [on_response]},
        )

    set_client_factory(factory)


def restore_client() -> None:
    set_client_factory(default_client_factory)
    close_session()


# ---- error classification -----------------------------------------------------------------------


class RepoProblem(Exception):
    """A per-repo outcome that is not success: kind is 'gated' | 'missing' | 'disabled' | 'error'.
    `permanent`: asking again at the same sha cannot help (a 404, bad bytes, over a size limit),
    as opposed to a server or network failure that a later crawl may get past."""

    def __init__(self, kind: str, message: str, permanent: bool = False, gave_up: bool = False) -> None:
        super().__init__(redact.text(message))
        self.kind = kind
        self.permanent = permanent or kind in ("missing", "disabled")
        self.gave_up = gave_up  # a bound of the crawl was reached (see Bounds)


def _response(exc: BaseException) -> Any:
    """The HTTP answer behind an exception from the client (also when wrapped), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        response = getattr(exc, "response", None)
        if response is not None and hasattr(response, "status_code"):
            return response
        exc = exc.__cause__ or exc.__context__
    return None


def classify(exc: BaseException) -> tuple[str, str]:
    """('retry' | 'gated' | 'missing' | 'disabled' | 'error' | 'unreachable', message) for an
    exception from the client: the server's X-Error-Code first, then the status."""
    from huggingface_hub.utils import httpx

    response = _response(exc)
    if response is None:
        if isinstance(exc, (httpx.TimeoutException, httpx.TransportError, TimeoutError, ConnectionError)):
            return "unreachable", f"no answer ({type(exc).__name__}: {_first_line(exc)})"
        if isinstance(exc, HFValidationError):
            return "error", f"rejected by the hub client: {_first_line(exc)}"
        if isinstance(exc, (SafetensorsParsingError, NotASafetensorsRepoError)):
            return "error", f"safetensors header unreadable: {_first_line(exc)}"
        return "error", f"{type(exc).__name__}: {_first_line(exc)}"
    status = response.status_code
    code = response.headers.get("X-Error-Code")
    message = redact.text(response.headers.get("X-Error-Message") or "")  # before it is cut short
    if code == "GatedRepo":
        return "gated", f"gated (HTTP {status} GatedRepo): needs an HF_TOKEN of an account with access"
    if message == DISABLED_MESSAGE:
        return "disabled", f"disabled on the Hub (HTTP {status})"
    if code == "RepoNotFound":
        why = "missing, or private without a token" if status == 401 else "missing"
        return "missing", f"repository not found (HTTP {status} RepoNotFound: {why})"
    if code == "RevisionNotFound":
        return "missing", f"revision not found (HTTP {status} RevisionNotFound)"
    if code == "EntryNotFound":
        return "missing", f"file not found at this revision (HTTP {status} EntryNotFound)"
    if status in RETRY_STATUS:
        return "retry", f"HTTP {status}"
    if status == 401:
        return "missing", "HTTP 401 without an error code: missing, or private without a token"
    if status == 404:
        return "missing", "not found (HTTP 404)"
    return "error", f"HTTP {status}{': ' + message[:200] if message else ''}"


def _first_line(exc: BaseException) -> str:
    text = redact.text(str(exc))  # before it is cut short: no half token survives
    return text.splitlines()[0][:300] if text else ""


# ---- one repo -----------------------------------------------------------------------------------


@dataclass
class Listed:
    """What the listing says about one repo (hub metadata for the snapshot)."""

    repo_id: str
    sha: str | None
    siblings: set[str] | None
    row: store.ModelRow
    transient: bool = False  # not fetched for a reason a later crawl may get past (5xx, timeouts)
    gave_up: bool = False  # ...because a bound of the crawl was reached (see Bounds)


@dataclass
class SideError:
    message: str
    permanent: bool  # stored with the (repo_id, sha) when true; else tried again next crawl


@dataclass
class Fetched:
    files: dict[str, str] = field(default_factory=dict)
    weights: tuple[str, list[str]] | None = None
    problems: dict[str, SideError] = field(default_factory=dict)  # side file -> why it was not read


@dataclass
class Context:
    api: HfApi
    endpoint: str
    token: str | bool
    cache_dir: Path
    pacer: Pacer
    silence: Silence
    bounds: Bounds = DEFAULT_BOUNDS


def _call(ctx: Context, fn: Callable[[], T], backoff_s: float = 1.0) -> T:
    """Run one hub call; retry 429/5xx/timeouts honouring the server's pause, else raise RepoProblem
    (or HubUnreachable when the hub has stopped answering altogether)."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        if ctx.silence.gone.is_set():
            raise HubUnreachable(f"{ctx.endpoint} stopped answering")
        try:
            return fn()
        except (RepoProblem, HubUnreachable):
            raise
        except GaveUp as exc:  # asking again would reach the same bound
            raise RepoProblem("error", str(exc), gave_up=True) from None
        except AtlasError as exc:
            raise RepoProblem("error", str(exc)) from None
        except Exception as exc:  # the hub client raises many types; classify sorts them
            kind, message = classify(exc)
            if ctx.silence.gone.is_set():
                raise HubUnreachable(f"{ctx.endpoint} stopped answering: {message}") from None
            if kind not in ("retry", "unreachable"):
                unreadable = isinstance(exc, (SafetensorsParsingError, NotASafetensorsRepoError))
                raise RepoProblem(kind, message, permanent=unreadable) from None
            if attempt == MAX_ATTEMPTS:
                raise RepoProblem("error", f"{message} (gave up after {MAX_ATTEMPTS} attempts)") from None
            response = _response(exc)
            pause = retry_after(getattr(response, "headers", None))
            try:
                ctx.pacer.pause(pause if pause is not None else min(30.0, backoff_s * 2 ** (attempt - 1)))
            except GaveUp as too_long:
                raise RepoProblem("error", str(too_long), gave_up=True) from None
    raise AssertionError("unreachable")


def _get(ctx: Context, repo_id: str, sha: str, filename: str, limit: int) -> bytes:
    """One GET of a file pinned to `sha` (redirects followed by the client), refusing more than
    `limit` bytes: by the announced length before the body is read, or while it streams."""
    url = hf_hub_url(repo_id, filename, revision=sha, endpoint=ctx.endpoint)
    with get_session().stream("GET", url, headers=build_hf_headers(token=ctx.token)) as response:
        if response.status_code >= 400:
            response.read()  # error answers are small; the client's error mapping reads them
            hf_raise_for_status(response)
        announced = response.headers.get("Content-Length", "")
        if announced.isdigit() and len(announced) < 19 and int(announced) > limit:
            raise RepoProblem("error", f"{filename}: {int(announced):,} bytes, over the {limit:,}-byte limit "
                                       "for this file (not downloaded)", permanent=True)
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > limit:
                raise RepoProblem("error", f"{filename}: over the {limit:,}-byte limit for this file "
                                           "(download stopped)", permanent=True)
        return bytes(body)


def _cached_path(ctx: Context, repo_id: str, sha: str, filename: str) -> Path:
    return ctx.cache_dir / "atlas-files" / sha / repo_id.replace("/", "--") / filename.replace("/", "--")


def _write_aside(path: Path, data: bytes) -> None:
    """Best effort: a cache that cannot be written only costs a later request. Written aside and
    renamed, so a crawl killed mid-write leaves no half file under the real name."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)


def _download(ctx: Context, repo_id: str, sha: str, filename: str, limit: int) -> bytes:
    """A file at `sha`, from the cache when an earlier crawl got it (or found for good that it
    cannot be had: absent, over the limit), else by one GET."""
    cached = _cached_path(ctx, repo_id, sha, filename)
    failed = cached.with_name(cached.name + ".error")
    try:
        if cached.is_file() and cached.stat().st_size <= limit:
            return cached.read_bytes()
        if failed.is_file():
            known = json.loads(failed.read_text(encoding="utf-8"))
            raise RepoProblem(str(known["kind"]), str(known["message"]), permanent=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # unreadable cache entry: a miss
    try:
        data = redact.data(_call(ctx, lambda: _get(ctx, repo_id, sha, filename, limit)))
    except RepoProblem as exc:
        if exc.permanent:  # the same answer at the same sha next time: not asked again
            _write_aside(failed, json.dumps({"kind": exc.kind, "message": str(exc)}).encode("utf-8"))
        raise
    _write_aside(cached, data)
    return data


def _header_names(ctx: Context, repo_id: str, sha: str) -> list[str]:
    """Tensor names from a single-file checkpoint's header (one Range request through the CDN
    redirect, cached on disk because the hub client does not cache headers)."""
    cached = ctx.cache_dir / "atlas-safetensors-headers" / sha / (repo_id.replace("/", "--") + ".json")
    try:
        names = json.loads(cached.read_text(encoding="utf-8"))
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return names
    except (OSError, ValueError):
        pass  # absent, or damaged (e.g. by a disk error): a miss, read the header again
    meta = _call(ctx, lambda: ctx.api.parse_safetensors_file_metadata(repo_id, SINGLE_FILE, revision=sha))
    names = [redact.text(n) for n in header_tensor_names(meta.tensors)]
    _write_aside(cached, json.dumps(names).encode("utf-8"))
    return names


QUANT_SIDECAR = "hf_quant_config.json"
WEIGHT_INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def fetch_repo(ctx: Context, item: Listed, settled: set[str] | None = None) -> Fetched:
    """Download what the fingerprints need at the listed sha. Raises RepoProblem when the config
    itself can't be had; problems with side files are recorded and the rest kept. With `settled`
    (the config is stored already), only the side files not in it are asked for."""
    if not _REPO_ID.fullmatch(item.repo_id):  # the listing names it so each time: permanent
        raise RepoProblem("error", f"not a valid Hub repo id: {item.repo_id!r}", permanent=True)
    if item.sha is None or not _SHA.fullmatch(item.sha):
        raise RepoProblem("error", f"the listing gave no commit sha for this repo (got {item.sha!r:.60})")
    sha = item.sha
    out = Fetched()
    siblings = item.siblings
    if settled is None:
        if siblings is not None and "config.json" not in siblings:
            raise RepoProblem("missing", "no config.json in this repo")
        data = _download(ctx, item.repo_id, sha, "config.json", MAX_CONFIG_BYTES)
        try:
            parse_config_bytes(data)
        except AtlasError as exc:  # the same bytes at the same sha every time: no later crawl can do better
            raise RepoProblem("error", f"{exc} (a malformed config at this sha; that changes only with the repo)",
                              permanent=True) from None
        out.files["config.json"] = data.decode("utf-8")
        settled = set()

    def wanted(filename: str) -> bool:
        return filename not in settled and (siblings is None or filename in siblings)

    def record(filename: str, exc: RepoProblem | AtlasError) -> None:
        if isinstance(exc, RepoProblem) and exc.kind == "missing" and siblings is None:
            return  # without a file list, absent is the normal case, not a problem
        permanent = not isinstance(exc, RepoProblem) or exc.permanent  # AtlasError: the bytes are bad
        out.problems[filename] = SideError(str(exc).removeprefix(f"{filename}: "), permanent)

    def side(filename: str, limit: int, parse: Callable[[bytes], Any]) -> Any:
        try:
            raw = _download(ctx, item.repo_id, sha, filename, limit)
            return raw, parse(raw)
        except (RepoProblem, AtlasError) as exc:
            record(filename, exc)
            return None

    if wanted(QUANT_SIDECAR):
        got = side(QUANT_SIDECAR, MAX_CONFIG_BYTES, lambda b: parse_config_bytes(b, QUANT_SIDECAR))
        if got is not None:
            out.files[QUANT_SIDECAR] = got[0].decode("utf-8")
    if wanted(WEIGHT_INDEX):
        got = side(WEIGHT_INDEX, MAX_INDEX_BYTES, parse_weight_index)
        if got is not None:
            out.weights = ("index", got[1])
    if out.weights is None and siblings is not None and wanted(SINGLE_FILE):
        try:
            out.weights = ("header", _header_names(ctx, item.repo_id, sha))
        except RepoProblem as exc:
            record(SINGLE_FILE, exc)
    return out


def side_files_pending(siblings: set[str] | None, settled: set[str], errors: dict[str, str]) -> bool:
    """Whether a stored (repo_id, sha) still lacks a listed side file that a new request could
    bring: one neither stored nor failed for good (a 5xx or timeout last time)."""
    if siblings is None:
        return False  # no file list: a failed side file and an absent one look alike
    done = settled | set(errors)
    if QUANT_SIDECAR in siblings and QUANT_SIDECAR not in done:
        return True
    if settled & set(store.WEIGHT_SOURCE_FILES.values()):
        return False  # tensor names are stored
    return any(f in siblings and f not in done for f in (WEIGHT_INDEX, SINGLE_FILE))


def fingerprint_stored(files: dict[str, str], weights: tuple[str, list[str]] | None) -> list[tuple[str, str, str | None]]:
    """Fingerprint rows for one (repo_id, sha) from what the store holds (pure)."""
    config = parse_config_bytes(files["config.json"].encode("utf-8"))
    sidecar = None
    if "hf_quant_config.json" in files:
        try:
            parsed = parse_config_bytes(files["hf_quant_config.json"].encode("utf-8"), QUANT_SIDECAR)
            sidecar = parsed if isinstance(parsed, dict) else None
        except AtlasError:
            sidecar = None  # a bad side file never loses the valid config
    source, names = weights if weights is not None else (None, None)
    return fingerprint(config, names, source, sidecar).rows()


# ---- listing ------------------------------------------------------------------------------------


def _naive_utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo else value


def _base_models(info: Any) -> tuple[list[str], str | None]:
    """Base models and the relation (quantized, finetune, adapter, merge) from the hub metadata:
    `baseModels` (repo info only), then the card's `base_model`, then `base_model:` tags."""
    bases: list[str] = []
    relation: str | None = None
    raw = getattr(info, "base_models", None)
    if isinstance(raw, dict):
        relation = raw.get("relation") if isinstance(raw.get("relation"), str) else None
        bases = [m["id"] for m in raw.get("models", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    elif isinstance(raw, list):
        bases = [b if isinstance(b, str) else b.get("id") for b in raw if isinstance(b, (str, dict))]
    card = getattr(info, "card_data", None)
    if not bases and card is not None:
        value = card.get("base_model") if hasattr(card, "get") else None
        bases = [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
        rel = card.get("base_model_relation") if hasattr(card, "get") else None
        relation = rel if isinstance(rel, str) else relation
    for tag in getattr(info, "tags", None) or []:
        parts = tag.split(":") if isinstance(tag, str) else []
        if parts and parts[0] == "base_model" and len(parts) == 3:
            relation = relation or parts[1]
            bases = bases or [parts[2]]
        elif parts and parts[0] == "base_model" and len(parts) == 2 and not bases:
            bases = [parts[1]]
    return [b for b in bases if isinstance(b, str) and b], relation


def _gated(value: Any) -> str | None:
    return None if value in (None, False) else str(value)[:20]


def _text(value: Any, limit: int = 200) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _int64(value: Any, name: str, notes: list[str]) -> int | None:
    """A count from the hub metadata if it fits the store's BIGINT; else dropped with a note."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX:
        return value
    shown = f"{len(str(value))}-digit number" if isinstance(value, int) and abs(value) > INT64_MAX else f"{value!r:.40}"
    notes.append(f"hub metadata {name} = {shown} is not a count; dropped")
    return None


def to_listed(info: Any, exemplars: set[str], token: str | bool = False) -> Listed:
    """One repo of a listing (or repo info) as a store row; nothing the hub sends can raise here."""
    notes: list[str] = []
    bases, relation = _base_models(info)
    safetensors = getattr(info, "safetensors", None)
    siblings = getattr(info, "siblings", None)
    sha = getattr(info, "sha", None)
    row = store.ModelRow(
        repo_id=info.id,
        sha=sha if isinstance(sha, str) and _SHA.fullmatch(sha) else None,
        last_modified=_naive_utc(getattr(info, "last_modified", None)),
        created_at=_naive_utc(getattr(info, "created_at", None)),
        downloads=_int64(getattr(info, "downloads", None), "downloads", notes),
        likes=_int64(getattr(info, "likes", None), "likes", notes),
        gated=_gated(getattr(info, "gated", None)),
        private=getattr(info, "private", None) if isinstance(getattr(info, "private", None), bool) else None,
        pipeline_tag=_text(getattr(info, "pipeline_tag", None)),
        library_name=_text(getattr(info, "library_name", None)),
        tags=[t[:200] for t in getattr(info, "tags", None) or [] if isinstance(t, str)],
        base_models=[b[:200] for b in bases],
        base_relation=_text(relation),
        is_derivative=bool(bases),
        is_exemplar=info.id in exemplars,
        param_total=_int64(getattr(safetensors, "total", None), "safetensors.total", notes),
        fetch_status="ok",
        error="; ".join(notes) or None,
    )
    if sha is not None and row.sha is None:
        row.fetch_status, row.error = "error", f"the hub sent a malformed commit sha ({sha!r:.60})"
    if getattr(info, "disabled", None) is True:
        row.fetch_status, row.error = "disabled", "disabled on the Hub (listing says so; not requested)"
    elif row.gated and not token:
        # its files answer 401 GatedRepo without a token: a request that cannot succeed is not sent
        row.fetch_status, row.error = "gated", f"gated ({row.gated}); not requested: needs an HF_TOKEN with access"
    try:
        names = None if siblings is None else {s.rfilename for s in siblings if isinstance(s.rfilename, str)}
    except (AttributeError, TypeError):
        names = None
    return Listed(info.id, row.sha, names, row)


def _missing_row(repo_id: str, problem: RepoProblem, exemplars: set[str]) -> Listed:
    row = store.ModelRow(
        repo_id, None, None, None, None, None, None, None, None, None, [], [], None, False,
        repo_id in exemplars, None, problem.kind, str(problem),
    )
    return Listed(repo_id, None, None, row, transient=not problem.permanent, gave_up=problem.gave_up)


class OrgCoverage(BaseModel):
    """How one org's listing went: models seen on the pages fetched, and kept after the filters."""

    author: str
    pipeline_tags: list[str]
    min_downloads: int
    max_models: int
    seen: int = 0
    kept: int = 0
    capped: bool = False  # max_models cut the list
    error: str | None = None


def list_org(ctx: Context, org: OrgScope, defaults: Defaults, exemplars: set[str]) -> tuple[list[Listed], OrgCoverage]:
    """One listing per pipeline tag, filtered by the server and sorted by downloads, paged until
    the downloads fall under the minimum (or max_models are kept)."""
    tags = org.pipeline_tags if org.pipeline_tags is not None else defaults.pipeline_tags
    cover = OrgCoverage(
        author=org.author, pipeline_tags=tags,
        min_downloads=org.min_downloads if org.min_downloads is not None else defaults.min_downloads,
        max_models=org.max_models if org.max_models is not None else defaults.max_models,
    )
    kept: dict[str, tuple[int, Listed]] = {}
    for tag in tags or [None]:
        def one_listing(tag: str | None = tag) -> tuple[int, list[Any]]:
            seen, out = 0, []
            guard = _LISTING.guard = ListingGuard(ctx.bounds)  # a fresh one per attempt
            try:
                for info in ctx.api.list_models(author=org.author, pipeline_tag=tag, sort="downloads", expand=LISTING_EXPAND):
                    seen += 1
                    guard.item(getattr(info, "id", None))
                    downloads = getattr(info, "downloads", None)
                    downloads = downloads if isinstance(downloads, int) else 0
                    if downloads < cover.min_downloads:
                        break  # sorted by downloads: every later one is under the minimum too
                    if tag is not None and getattr(info, "pipeline_tag", None) != tag:
                        continue  # the server's filter is trusted, but not blindly
                    out.append(info)
                    if len(out) >= cover.max_models:
                        cover.capped = True  # more may be eligible: max_models cuts the list here
                        break
            finally:
                _LISTING.guard = None
            return seen, out

        seen, infos = _call(ctx, one_listing)
        cover.seen += seen
        for info in infos:
            listed = to_listed(info, exemplars, ctx.token)
            downloads = listed.row.downloads or 0
            kept.setdefault(info.id, (downloads, listed))
    ranked = sorted(kept.values(), key=lambda pair: -pair[0])
    cover.capped = cover.capped or len(ranked) > cover.max_models
    chosen = [listed for _, listed in ranked[: cover.max_models]]
    cover.kept = len(chosen)
    return chosen, cover


def list_scope(ctx: Context, watch: Watchlist, problems: list[str],
               coverage: list[OrgCoverage] | None = None) -> list[Listed]:
    """Every repo in scope, in watch-list order, each once."""
    exemplars = set(watch.exemplars)
    seen: dict[str, Listed] = {}
    for org in watch.orgs:
        try:
            listed, cover = list_org(ctx, org, watch.defaults, exemplars)
        except RepoProblem as exc:
            problems.append(f"gave up on listing org {org.author!r}: {exc}" if exc.gave_up
                            else f"org {org.author!r}: listing failed: {exc}")
            if coverage is not None:
                coverage.append(OrgCoverage(author=org.author, pipeline_tags=[], min_downloads=0, max_models=0,
                                            error=str(exc)))
            continue
        if coverage is not None:
            coverage.append(cover)
        for item in listed:
            seen.setdefault(item.repo_id, item)
    for repo_id in [*watch.repos, *watch.exemplars]:
        if repo_id in seen:
            continue
        if not _REPO_ID.fullmatch(repo_id):
            problem = RepoProblem("error", f"not a valid Hub repo id: {repo_id!r}", permanent=True)
            seen[repo_id] = _missing_row(repo_id, problem, exemplars)
            continue
        try:
            info = _call(ctx, lambda repo_id=repo_id: ctx.api.model_info(repo_id, expand=INFO_EXPAND))
            seen[repo_id] = to_listed(info, exemplars, ctx.token)
        except RepoProblem as exc:
            seen[repo_id] = _missing_row(repo_id, exc, exemplars)
    return list(seen.values())


# ---- the crawl ----------------------------------------------------------------------------------


class CrawlSummary(BaseModel):
    snapshot_id: int
    status: str
    endpoint: str
    listed: int
    fetched: int
    unchanged: int
    gated: int
    missing: int
    failed: int
    requests: int
    rate_limited: int
    waited_s: float
    elapsed_s: float
    problems: list[str]
    seen: int = 0
    coverage: list[OrgCoverage] = Field(default_factory=list)
    requests_by_bucket: dict[str, int] = Field(default_factory=dict)
    incomplete: list[str] = Field(default_factory=list)  # repos a later crawl may still get, and why
    gave_up: list[str] = Field(default_factory=list)  # those of them a bound of the crawl gave up on


class CrawlInterrupted(AtlasError):
    """Ctrl-C: says truthfully whether the snapshot was committed before it."""

    def __init__(self, snapshot_id: int | None) -> None:
        self.snapshot_id = snapshot_id
        if snapshot_id is None:
            text = ("crawl interrupted before its snapshot was written: no snapshot written (the last one is "
                    "intact); rerun to resume, downloaded files are cached")
        else:
            text = (f"crawl interrupted after snapshot {snapshot_id} was committed: the snapshot is whole "
                    "and in the store")
        super().__init__(text)


def reach(endpoint: str, timeout_s: float = 5.0) -> None:
    """One request that proves the hub answers at all (any HTTP status will do), before the store
    is locked; else one line saying what was tried and what to check. The request runs in a
    daemon thread with a deadline, because a DNS lookup that hangs is bounded by no HTTP timeout."""
    from huggingface_hub.utils import httpx

    url = f"{endpoint.rstrip('/')}/api/models?limit=1"
    failure: list[BaseException] = []
    answers: list[Any] = []

    def ask() -> None:
        try:
            answers.append(get_session().get(url, timeout=httpx.Timeout(timeout_s), headers=build_hf_headers(token=False)))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            failure.append(exc)

    asking = threading.Thread(target=ask, name="reach", daemon=True)
    asking.start()
    asking.join(timeout_s + 1.0)
    if asking.is_alive():
        failure.append(TimeoutError(f"no answer, DNS lookup included, within {timeout_s + 1.0:.0f} s"))
    if not failure:
        _looks_like_a_hub(endpoint, url, answers[0])
        return
    exc = failure[0]
    if isinstance(exc, HubUnreachable):
        raise exc
    raise AtlasError(
        f"cannot reach {endpoint}: GET {url} got no answer ({type(exc).__name__}: "
        f"{_first_line(exc) or 'no detail'}; waited at most {timeout_s + 1.0:.0f} s). Check the network connection, "
        "DNS, a proxy (HTTPS_PROXY) or --endpoint; to crawl the bundled offline mirror instead run "
        "`make crawl-mirror` (atlas crawl --mirror data/hub-mirror). No snapshot was written."
    ) from None


def _looks_like_a_hub(endpoint: str, url: str, response: Any) -> None:
    """Something answered: a Hub's listing is a JSON array (or a 429/5xx, which the crawl's pacing
    and retries handle). A proxy, captive portal or wrong --endpoint answers otherwise: say so
    before the store is opened."""
    if response.status_code in RETRY_STATUS:
        return
    try:
        listing_ok = response.status_code == 200 and isinstance(response.json(), list)
    except ValueError:
        listing_ok = False
    if not listing_ok:
        kind = response.headers.get("Content-Type", "no content type").split(";")[0]
        raise AtlasError(
            f"{endpoint} answered GET {url} with HTTP {response.status_code} ({kind}), not with a Hugging Face Hub "
            "model listing: check --endpoint, a proxy (HTTPS_PROXY) or a captive portal; to crawl the bundled "
            "offline mirror instead run `make crawl-mirror`. No snapshot was written."
        )


def crawl(
    db: Path,
    watchlist: Path,
    endpoint: str = LIVE_ENDPOINT,
    endpoint_label: str | None = None,
    token: str | bool | None = None,
    cache_dir: Path | None = None,
    concurrency: int = 8,
    timeout_s: float = 30.0,
    progress: bool = True,
    sleep: Callable[[float], None] | None = None,
    bounds: Bounds | None = None,
) -> CrawlSummary:
    """Crawl the watch list's scope at `endpoint` and write one snapshot to the store at `db`."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise AtlasError("HF_HUB_OFFLINE is set: huggingface_hub then refuses every request, the local mirror's too. Unset it to crawl.")
    if concurrency < 1:
        raise AtlasError("--concurrency must be at least 1")
    watch, digest = load_watchlist(watchlist)
    if token is None:
        token = os.environ.get("HF_TOKEN") or False  # used, never stored or logged
    redact.keep_secret(token)
    # the endpoint's own credentials are used to connect and never shown: a hub may echo them too
    redact.keep_secret(urlsplit(endpoint).password)
    endpoint_label = endpoint_label or redact.text(endpoint)
    bounds = bounds or DEFAULT_BOUNDS
    cache_dir = cache_dir or db.parent / "hf-cache"
    started = store.utc_now()
    clock = time.monotonic()
    pacer = Pacer(endpoint, sleep, max_wait_s=bounds.wait_s)
    ctx = Context(HfApi(endpoint=endpoint, token=token), endpoint, token, cache_dir, pacer, Silence(pacer), bounds)
    install_client(pacer, timeout_s, ctx.silence, bounds.request_s)
    # the client logs every retry; our summary counts them instead of scrolling past the bar
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    stack = ExitStack()
    con: duckdb.DuckDBPyConnection | None = None
    last_before: int | None = None
    try:
        stack.enter_context(ctrl_c_interrupts())
        reach(endpoint)  # seconds, not minutes, when there is no route to the hub; no lock held
        con = store.connect(db)  # before the listing: a second concurrent crawl fails at once
        last_before = _last_snapshot(con)  # we hold the lock: any newer snapshot is this crawl's
        from atlas.hub.progress import CrawlProgress

        with CrawlProgress(pacer, enabled=progress) as bar:
            problems: list[str] = []
            coverage: list[OrgCoverage] = []
            bar.phase("listing", f"listing {len(watch.orgs)} orgs of {endpoint_label}")
            listed = list_scope(ctx, watch, problems, coverage)
            if watch.orgs and len(problems) == len(watch.orgs) and not any(x.row.fetch_status == "ok" for x in listed):
                raise AtlasError(f"no listing of {endpoint_label} succeeded, nothing to snapshot: " + "; ".join(problems[:3]))
            readable = [x for x in listed if x.row.fetch_status == "ok"]
            known = store.stored_pairs(con, [(x.repo_id, x.sha) for x in readable if x.sha])
            side_state = store.side_file_state(con, known)
            stored_errors = {pair: errors for pair, (_, errors) in side_state.items() if errors}
            # a new sha: everything; a stored one: only side files an earlier crawl failed to get
            todo: list[tuple[Listed, set[str] | None]] = []
            for x in readable:
                if x.sha is None or (x.repo_id, x.sha) not in known:
                    todo.append((x, None))
                    continue
                settled, errors = side_state[(x.repo_id, x.sha)]
                if side_files_pending(x.siblings, settled, errors):
                    todo.append((x, settled | set(errors)))
            bar.phase("fetching", f"{len(listed)} models in scope, {len(todo)} to fetch", total=len(todo))
            fetched = _fetch_all(ctx, todo, known, concurrency, bar)
            return _finish(con, watch, digest, listed, known, stored_errors, fetched, problems, pacer,
                           started, clock, endpoint_label, coverage)
    except KeyboardInterrupt:
        pacer.abort()
        newest = _last_snapshot(con) if con is not None else None
        raise CrawlInterrupted(newest if newest is not None and newest != last_before else None) from None
    except duckdb.Error as exc:  # a damaged file or a full disk under a store that opened fine
        raise store.store_error(db, exc) from None
    finally:
        hf_logging.set_verbosity(verbosity)
        restore_client()
        if con is not None:
            con.close()
        stack.close()


@contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """SIGINT interrupts the crawl even when the process inherited it ignored. A shell without job
    control starts background jobs that way (`atlas crawl &` in a script, a test runner run as such a
    job, some CI runners), and Python then installs no handler: the signal was dropped and the crawl
    ran to its end. An interrupted crawl loses nothing (a snapshot is whole or absent, files are
    cached), so honouring the signal is always safe."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _fetch_all(ctx: Context, todo: list[tuple[Listed, set[str] | None]], known: set[tuple[str, str]],
               concurrency: int, bar: Any) -> dict[str, Fetched]:
    fetched: dict[str, Fetched] = {}
    jobs: queue.SimpleQueue[tuple[Listed, set[str] | None]] = queue.SimpleQueue()
    for job in todo:
        jobs.put(job)
    # (item, outcome, None), or (item, None, what it raised): a RepoProblem is an outcome, not a raise
    done: queue.Queue[tuple[Listed, Fetched | RepoProblem | None, BaseException | None]] = queue.Queue()

    def work() -> None:
        while True:
            try:
                item, settled = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((item, _fetch_or_problem(ctx, item, settled), None))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                done.put((item, None, exc))

    # Daemon threads, not an executor's: after Ctrl-C the interpreter exits at once instead of
    # joining a download that sits in a hung read for the whole request timeout.
    workers = [threading.Thread(target=work, name=f"crawl-{i}", daemon=True) for i in range(min(concurrency, len(todo)))]
    for worker in workers:
        worker.start()
    try:
        for _ in todo:
            item, result, raised = done.get()  # a Condition wait: Ctrl-C interrupts it
            if raised is not None:
                raise raised
            if isinstance(result, RepoProblem) and (item.repo_id, item.sha) in known:
                item.row.side_file_error = str(result)  # its config is stored and read
            elif isinstance(result, RepoProblem):
                item.row.fetch_status, item.row.error = result.kind, str(result)
                item.transient, item.gave_up = not result.permanent, result.gave_up
            else:
                fetched[item.repo_id] = result
            bar.advance(item.repo_id)
    except BaseException:  # Ctrl-C: wake every waiting worker and leave without them
        ctx.pacer.abort()
        raise
    for worker in workers:
        worker.join()
    if ctx.silence.gone.is_set():
        raise HubUnreachable(
            f"{ctx.endpoint} stopped answering in the middle of the crawl ({len(fetched)} of {len(todo)} models "
            "fetched): no snapshot written; rerun when it answers again, downloaded files are cached"
        )
    return fetched


def _last_snapshot(con: duckdb.DuckDBPyConnection) -> int | None:
    """The newest snapshot id in the store (asked of the store, so an interrupted crawl can say
    truthfully whether its own snapshot was committed)."""
    try:
        return con.execute("SELECT max(snapshot_id) FROM snapshots").fetchall()[0][0]
    except duckdb.Error:
        return None


def _fetch_or_problem(ctx: Context, item: Listed, settled: set[str] | None) -> Fetched | RepoProblem:
    """One repo's outcome; nothing a single repo does (a disk error, bytes no parser expected)
    may abort the whole crawl."""
    try:
        return fetch_repo(ctx, item, settled)
    except HubUnreachable:
        return RepoProblem("error", "the hub stopped answering")
    except RepoProblem as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - any one repo's failure is recorded as its error, by design
        return RepoProblem("error", f"{type(exc).__name__}: {_first_line(exc)}")


def _finish(
    con: duckdb.DuckDBPyConnection,
    watch: Watchlist,
    digest: str,
    listed: list[Listed],
    known: set[tuple[str, str]],
    stored_errors: dict[tuple[str, str], dict[str, str]],
    fetched: dict[str, Fetched],
    problems: list[str],
    pacer: Pacer,
    started: datetime,
    clock: float,
    endpoint_label: str,
    coverage: list[OrgCoverage],
) -> CrawlSummary:
    files: list[store.RawFile] = []
    weights: list[store.WeightNames] = []
    file_errors: list[tuple[str, str, str, str]] = []
    for item in listed:
        got = fetched.get(item.repo_id)
        if got is None:
            continue
        sha = item.sha or ""
        files += [store.RawFile(item.repo_id, sha, name, text) for name, text in got.files.items()]
        if got.weights is not None:
            weights.append(store.WeightNames(item.repo_id, sha, got.weights[0], got.weights[1]))
        # only errors that will not change at this sha are stored; the others are retried next crawl
        file_errors += [(item.repo_id, sha, name, e.message) for name, e in got.problems.items() if e.permanent]
    # side-file errors are the snapshot's word on shipped weights; the config was read all the same
    for item in listed:
        if item.row.fetch_status != "ok":
            continue
        errors = dict(stored_errors.get((item.repo_id, item.sha or ""), {}))
        got = fetched.get(item.repo_id)
        errors.update({name: e.message for name, e in got.problems.items()} if got else {})
        joined = "; ".join(f"{name}: {err}" for name, err in sorted(errors.items()))
        item.row.side_file_error = "; ".join(x for x in (joined, item.row.side_file_error) if x) or None

    # fingerprints for pairs fetched now (config or side files), or fingerprinted by an older rule version
    pairs = {(x.repo_id, x.sha) for x in listed if x.sha and ((x.repo_id, x.sha) in known or x.repo_id in fetched)}
    versions = store.fingerprint_versions(con, pairs)
    stale = {p for p in pairs if versions.get(p) != RULE_VERSION or p[0] in fetched}
    inputs = store.load_inputs(con, stale & known)
    for f in files:
        inputs.setdefault((f.repo_id, f.sha), {"files": {}, "weights": None})["files"][f.filename] = f.content
    for w in weights:
        inputs[(w.repo_id, w.sha)]["weights"] = (w.source, w.names)
    rows_by_pair = {(x.repo_id, x.sha): x.row for x in listed}
    fp_rows: store.FingerprintRows = []
    for (repo, sha), entry in inputs.items():
        if (repo, sha) in stale and "config.json" in entry["files"]:
            try:
                fp_rows += [(repo, sha, RULE_VERSION, n, v, p) for n, v, p in fingerprint_stored(entry["files"], entry["weights"])]
            except Exception as exc:  # noqa: BLE001 - one repo's values never cost the snapshot
                row = rows_by_pair.get((repo, sha))
                if row is not None:
                    row.fetch_status, row.error = "error", f"cannot fingerprint: {_first_line(exc)}"

    rows = [x.row for x in listed]
    count = lambda status: sum(1 for r in rows if r.fetch_status == status)  # noqa: E731
    summary_counts = dict(
        n_listed=len(rows),
        n_fetched=len(fetched),
        n_unchanged=sum(1 for x in listed if (x.repo_id, x.sha) in known and x.repo_id not in fetched),
        n_gated=count("gated"),
        n_missing=count("missing") + count("disabled"),
        n_failed=count("error"),
    )
    status = "complete" if not problems else "partial"
    snapshot = store.SnapshotRow(
        started_at=started, finished_at=store.utc_now(), endpoint=endpoint_label,
        watchlist_digest=digest, status=status, rule_version=RULE_VERSION, n_requests=pacer.requests,
        n_rate_limited=pacer.rate_limited, problems="; ".join(problems) or None, **summary_counts,
        n_seen=sum(c.seen for c in coverage),
        coverage=json.dumps([c.model_dump() for c in coverage]),
    )
    snapshot_id = store.write_snapshot(con, snapshot, rows, files, weights, fp_rows, file_errors, scrub=redact.text)
    incomplete = [f"{x.repo_id}: {x.row.error}" for x in listed if x.transient]
    gave_up = [f"{x.repo_id}: {x.row.error}" for x in listed if x.transient and x.gave_up]
    return CrawlSummary(
        snapshot_id=snapshot_id, status=status, endpoint=endpoint_label, listed=summary_counts["n_listed"],
        fetched=summary_counts["n_fetched"], unchanged=summary_counts["n_unchanged"],
        gated=summary_counts["n_gated"], missing=summary_counts["n_missing"], failed=summary_counts["n_failed"],
        requests=pacer.requests, rate_limited=pacer.rate_limited, waited_s=round(pacer.waited_s, 3),
        elapsed_s=round(time.monotonic() - clock, 3), problems=problems, seen=snapshot.n_seen or 0,
        coverage=coverage, requests_by_bucket={**{n: b.requests for n, b in pacer.buckets.items()}, "cdn": pacer.cdn_requests},
        incomplete=incomplete, gave_up=gave_up,
    )


def refingerprint(db: Path) -> int:
    """Recompute every stored (repo_id, sha)'s fingerprints with the current rules; no network."""
    con = store.connect(db)
    try:
        inputs = store.load_inputs(con)
        rows: store.FingerprintRows = []
        for (repo, sha), entry in inputs.items():
            if "config.json" in entry["files"]:
                try:
                    rows += [(repo, sha, RULE_VERSION, n, v, p) for n, v, p in fingerprint_stored(entry["files"], entry["weights"])]
                except Exception:  # noqa: BLE001 - a config the rules cannot read keeps no fingerprint
                    continue
        store.write_fingerprints(con, rows)
        return len({(r[0], r[1]) for r in rows})
    except duckdb.Error as exc:
        raise store.store_error(db, exc) from None
    finally:
        con.close()


def iter_summary_lines(summary: CrawlSummary) -> Iterable[str]:
    yield (
        f"snapshot {summary.snapshot_id} ({summary.status}) from {summary.endpoint}: "
        f"listed {summary.listed}, fetched {summary.fetched}, unchanged {summary.unchanged}, "
        f"gated {summary.gated}, missing {summary.missing}, failed {summary.failed}"
    )
    if summary.coverage:
        capped = [c.author for c in summary.coverage if c.capped]
        yield (f"coverage: {len(summary.coverage)} orgs, {summary.seen} models seen in their listings, "
               f"{sum(c.kept for c in summary.coverage)} kept by the filters"
               + (f" (max_models cut: {', '.join(capped)})" if capped else ""))
    by_bucket = ", ".join(f"{n} {k}" for n, k in summary.requests_by_bucket.items() if k)
    yield (
        f"{summary.requests} requests ({by_bucket or 'none'}), {summary.rate_limited} rate-limited (429), "
        f"{summary.waited_s:.1f} s waited, {summary.elapsed_s:.1f} s in all"
    )
    for problem in summary.problems:
        yield f"problem: {problem}"
    for line in summary.incomplete:
        yield (f"gave up on {line}" if line in summary.gave_up
               else f"not fetched (a later crawl may get it): {line}")
