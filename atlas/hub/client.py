"""The HTTP client of a crawl: huggingface_hub's own client with our hooks. Every request is paced
(atlas.hub.pacing), held to a wall-clock deadline however its bytes trickle in, and counted as
answered or not (`Silence`); a listing is held to its `Bounds` page by page (`ListingGuard`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from huggingface_hub.utils import close_session, httpx, set_client_factory
from huggingface_hub.utils._http import default_client_factory, hf_request_event_hook

from atlas import AtlasError
from atlas.hub.errors import RETRY_STATUS
from atlas.hub.pacing import MAX_WAIT_S, GaveUp, Pacer, retry_after

MAX_REDIRECTS = 5
UNREACHABLE_AFTER = 4  # consecutive attempts without any answer: the hub is gone, stop
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


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


@contextmanager
def paging(bounds: Bounds) -> Iterator[ListingGuard]:
    """A fresh ListingGuard over the listing requests this thread sends inside the block."""
    guard = _LISTING.guard = ListingGuard(bounds)
    try:
        yield guard
    finally:
        _LISTING.guard = None


def _is_listing(url: str) -> bool:
    return urlsplit(url).path.rstrip("/").endswith("/api/models")


# httpx turns each NO_PROXY entry into a route that it builds once (seconds per thousand: 20,000
# took 10 s before the first request) and matches on every request: past this many, one line asks
# for a shorter list instead of a crawl that spends its time on routing.
MAX_NO_PROXY = 4096


def check_no_proxy() -> None:
    """One line when NO_PROXY (or no_proxy, as httpx reads it) lists more entries than the crawl takes."""
    entries = [e for e in (os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or "").split(",") if e.strip()]
    if len(entries) > MAX_NO_PROXY:
        raise AtlasError(f"NO_PROXY lists {len(entries):,} entries; the crawl takes at most {MAX_NO_PROXY:,} (each is "
                         "a route the HTTP client builds and matches on every request): shorten it, e.g. to domain "
                         "suffixes such as .example.com, or unset it when no proxy is set")


def install_client(pacer: Pacer, timeout_s: float, silence: Silence, request_s: float = DEFAULT_BOUNDS.request_s) -> None:
    """huggingface_hub's client (its own request hook first) with our hooks and a transport that
    tells `silence` whether each attempt got an answer and holds every request to `request_s`.
    A NO_PROXY too long to route is refused here, before anything is built."""
    check_no_proxy()
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
