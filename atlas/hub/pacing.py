"""Pacing a crawl to the Hub's rate limits.

The Hub counts requests in three buckets per fixed 5-minute window: `api` (/api/..., listings and
repo info), `resolvers` (any /resolve/ URL and the /api/resolve-cache/ hop it redirects small files
to) and `pages` (HTML). Every answer carries the bucket's state:

    RateLimit: "resolvers";r=2999;t=172              (r requests left, t seconds to the reset)
    RateLimit-Policy: "fixed window";"resolvers";q=3000;w=300

`Pacer` is shared by every request of a crawl (installed as hooks on huggingface_hub's HTTP client).
Per bucket it keeps the server's last word, minus the requests sent since (still unanswered ones
included), and the tightest estimate of the window's end. A window's quota is used as fast as the
crawl can use it; a request that the window has no room for is not sent but held, with every other
request of that bucket (only that bucket), until the reset, so a crawl runs at the bucket's
allowance instead of earning 429s and backing off. A 429 still pauses the bucket for the
announced time.

Every wait has a bound (`max_wait_s`, MAX_WAIT_S by default): the Hub's windows are 5 minutes, so a
server that asks for more (`RateLimit: ...;t=999999999`, `Retry-After: 999999999`) is not obeyed
for 31 years; the request that would have to wait gives up at once with `GaveUp`, saying why.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from atlas import AtlasError

BUCKETS = ("api", "resolvers", "pages")
WINDOW_S = 300
RESET_MARGIN_S = 0.05  # after a reset, so that our clock and the server's agree it has happened
# The longest any request of a crawl waits for its turn: twice the Hub's window. Longer asks are
# hostile or broken, and the request gives up instead.
MAX_WAIT_S = 2.0 * WINDOW_S
# Requests per 5-minute window (huggingface/hub-docs rate-limits.md, September 2025; anonymous and
# free are marked "subject to change"). Organisation limits apply per member.
TIERS: dict[str, dict[str, int]] = {
    "anonymous": {"api": 500, "resolvers": 3000, "pages": 100},
    "free": {"api": 1000, "resolvers": 5000, "pages": 200},
    "pro": {"api": 2500, "resolvers": 12000, "pages": 400},
}
# Digits are bounded so that a hostile header cannot cost a huge int conversion; `(?!\d)`: a longer
# number is not read as its first digits.
_RATELIMIT = re.compile(r'"(?P<bucket>[A-Za-z_-]{1,32})"\s*;\s*r\s*=\s*(?P<r>\d{1,12})\s*;\s*t\s*=\s*(?P<t>\d{1,9})(?!\d)')
_POLICY = re.compile(r'"(?P<bucket>[A-Za-z_-]{1,32})"\s*;\s*q\s*=\s*(?P<q>\d{1,12})\s*;\s*w\s*=\s*(?P<w>\d{1,9})(?!\d)')
# A spent window whose reset is a number too long to parse: huggingface_hub's own retry reads it
# (any length of digits) and would sleep that long, so it counts as "forever", not as garbage.
_ENDLESS_RESET = re.compile(r'"\w+"\s*;\s*r\s*=\s*0+\s*;\s*t\s*=\s*\d{10}')
_ASCII_DIGITS = re.compile(r"[0-9]+")


class GaveUp(AtlasError):
    """A bound of the crawl was reached on one request or one listing (a wait too long, an answer
    too slow, a listing without end): that request is given up, with the reason, and the crawl
    goes on. Raised inside the HTTP client's hooks and transport, where no retry catches it."""


@dataclass(frozen=True)
class RateLimit:
    bucket: str
    remaining: int
    reset_s: int
    quota: int | None = None
    window_s: int | None = None


def parse_ratelimit(headers: Mapping[str, str] | None) -> RateLimit | None:
    """The `RateLimit` (+ `RateLimit-Policy`) headers of one answer, or None when absent/garbled."""
    if headers is None:
        return None
    m = _RATELIMIT.search(str(headers.get("RateLimit") or ""))
    if m is None:
        return None
    quota = window = None
    p = _POLICY.search(str(headers.get("RateLimit-Policy") or ""))
    if p is not None and p.group("bucket") == m.group("bucket"):
        quota, window = int(p.group("q")), int(p.group("w"))
    return RateLimit(m.group("bucket"), int(m.group("r")), int(m.group("t")), quota, window)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asks us to wait: `RateLimit ... r=0;t=N`, else a numeric Retry-After;
    math.inf for a number of ten digits or more (no wait that long is meant to be kept)."""
    info = parse_ratelimit(headers)
    if info is not None and info.remaining == 0:
        return float(info.reset_s)
    if info is None and _ENDLESS_RESET.search(str((headers or {}).get("RateLimit") or "")):
        return math.inf
    value = str((headers or {}).get("Retry-After") or "").strip()
    if not _ASCII_DIGITS.fullmatch(value):
        return None
    return float(value) if len(value) < 10 else math.inf


def seconds_text(seconds: float) -> str:
    return "forever (a number too long to be seconds)" if math.isinf(seconds) else f"{seconds:,.0f} s"


def route_of(url: str, endpoint: str) -> str | None:
    """What kind of request `url` is: "resolve", "resolve-cache", "api" or "pages"; None off the
    Hub's origin (the LFS CDN, which no bucket counts)."""
    target, hub = urlsplit(url), urlsplit(endpoint)
    if (target.scheme, target.netloc) != (hub.scheme, hub.netloc):
        return None
    path = target.path
    if path.startswith("/api/resolve-cache/"):
        return "resolve-cache"
    if "/resolve/" in path:
        return "resolve"
    return "api" if path.startswith("/api/") else "pages"


# The bucket each kind of request is expected to count in. The Hub's answers name the bucket that
# counted them, and the pacer follows the answers where they differ (the resolve-cache hop is not
# documented; it is taken as a resolver until the Hub says otherwise).
ROUTES = {"resolve": "resolvers", "resolve-cache": "resolvers", "api": "api", "pages": "pages"}


def bucket_of(url: str, endpoint: str) -> str | None:
    """Which bucket a request to `url` is expected to count in; None off the Hub's origin."""
    route = route_of(url, endpoint)
    return None if route is None else ROUTES[route]


@dataclass
class Bucket:
    """What we know of one bucket's current window."""

    quota: int | None = None
    reset_at: float | None = None  # monotonic time of the window's end (tightest estimate)
    remaining: int | None = None  # the server's last count minus what we sent since
    held_until: float = 0.0  # requests of this bucket wait until then (a window's reset)
    inflight: set[int] = field(default_factory=set)  # numbers of the requests sent, not yet answered
    requests: int = 0
    rate_limited: int = 0
    waited_s: float = 0.0


@dataclass
class Pause:
    bucket: str
    seconds: float
    reason: str


class Pacer:
    """Shared by every request of a crawl; thread-safe."""

    def __init__(self, endpoint: str, sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, max_wait_s: float = MAX_WAIT_S) -> None:
        self.endpoint = endpoint
        self.max_wait_s = max_wait_s
        self._abort = threading.Event()
        self._sleep = sleep or (lambda seconds: wait(self._abort, seconds))
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self.buckets: dict[str, Bucket] = {b: Bucket() for b in BUCKETS}
        self._routes = dict(ROUTES)
        self.cdn_requests = 0
        self.pauses: list[Pause] = []
        self.on_pause: Callable[[Pause], None] | None = None

    # -- totals ------------------------------------------------------------------------------

    @property
    def requests(self) -> int:
        return sum(b.requests for b in self.buckets.values()) + self.cdn_requests

    @property
    def rate_limited(self) -> int:
        return sum(b.rate_limited for b in self.buckets.values())

    @property
    def waited_s(self) -> float:
        return sum(b.waited_s for b in self.buckets.values())

    def pause(self, seconds: float) -> None:
        """A backoff of our own (a retry after a 5xx or a timeout, maybe as long as the server asked)."""
        self.check_wait(seconds, "before retrying this request")
        self._sleep(seconds)

    def check_wait(self, seconds: float, what: str) -> None:
        """GaveUp when `seconds` is over this crawl's bound on any one wait."""
        if seconds > self.max_wait_s:
            raise GaveUp(f"the hub asked to wait {seconds_text(seconds)} {what}, over the "
                         f"{self.max_wait_s:,.0f} s this crawl waits at most; gave up on this request")

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    def abort(self) -> None:
        """Wake every waiting request (Ctrl-C): they go out at once and the crawl ends."""
        self._abort.set()

    # -- the two hooks -------------------------------------------------------------------------

    def before(self, url: str) -> tuple[str | None, int]:
        """Called before each request: waits for its bucket's turn; returns its ticket."""
        route = route_of(url, self.endpoint)
        with self._lock:
            self._seq += 1
            seq = self._seq
            if route is None:
                self.cdn_requests += 1
                return None, seq
            bucket_name = self._routes[route]
            b = self.buckets[bucket_name]
            now = self._clock()
            delay, reason = self._reserve(b, now, bucket_name)  # GaveUp before anything is claimed
            b.requests += 1
            b.inflight.add(seq)
            if delay > 0:
                b.waited_s += delay
        if delay > 0.05 and reason:
            self._note(Pause(bucket_name, delay, reason))
        if delay > 0:
            self._sleep(delay)  # once, never in a loop: a patched sleep must not spin
        return route, seq

    def _reserve(self, b: Bucket, now: float, name: str) -> tuple[float, str]:
        """Claim one request of `b`'s window (under the lock): (seconds to wait, why). The window's
        quota is spent as fast as the crawl can use it; once it is spent (by the server's count
        and ours since), requests of that bucket wait for the reset instead of earning 429s. A reset
        beyond the bound is GaveUp, and the bucket stays spent: every later request gives up too."""
        if b.reset_at is not None and now >= b.reset_at:
            self._roll(b)
        delay, reason = 0.0, ""
        if b.remaining is not None and b.remaining <= 0 and b.reset_at is not None:
            delay, reason = b.reset_at - now + RESET_MARGIN_S, "window spent, waiting for its reset"
            self.check_wait(delay, f"for the reset of its {name} window")
            self._roll(b)  # after this wait the window is new, whatever the clock says then
            b.held_until = now + delay
        elif b.held_until > now:  # others already wait for this reset: so does this one
            delay = b.held_until - now
        if b.remaining is not None:
            b.remaining -= 1
        return delay, reason

    @staticmethod
    def _roll(b: Bucket) -> None:
        """The window ended: until the server speaks again, assume a full quota."""
        b.reset_at = None
        b.remaining = b.quota

    def forget(self, ticket: tuple[str | None, int] | None) -> None:
        """A request that got no answer: it is no longer in flight."""
        if ticket is not None:
            with self._lock:
                for b in self.buckets.values():
                    b.inflight.discard(ticket[1])

    def after(self, ticket: tuple[str | None, int], status: int, headers: Mapping[str, str] | None) -> None:
        """Called with each answer: learn the bucket's state; a 429 pauses the bucket."""
        route, seq = ticket
        info = parse_ratelimit(headers)
        pause: Pause | None = None
        with self._lock:
            now = self._clock()
            for b in self.buckets.values():
                b.inflight.discard(seq)
            if route is None:
                return
            if info is not None and info.bucket in self.buckets:
                self._routes[route] = info.bucket  # the Hub says where this kind of request counts
            name = self._routes[route]
            b = self.buckets[name]
            if status == 429:
                b.rate_limited += 1
            if info is not None:
                self._learn(b, info, seq, now)
            if status == 429:
                wait_s = retry_after(headers)
                wait_s = 1.0 if wait_s is None else wait_s
                b.remaining, b.reset_at = 0, max(b.reset_at or 0.0, now + wait_s)
                if wait_s <= self.max_wait_s:  # a longer one is never waited: no pause to show
                    pause = Pause(name, wait_s, f"HTTP 429 from the {name} bucket")
        if pause is not None:
            self._note(pause)

    def _learn(self, b: Bucket, info: RateLimit, seq: int, now: float) -> None:
        if info.quota:
            b.quota = info.quota
        end = now + info.reset_s  # t is rounded up to whole seconds: the smallest end seen is the truest
        later = sum(1 for k in b.inflight if k > seq)  # sent after this one, maybe not yet counted
        left = max(0, info.remaining - later)
        if end <= now or (b.reset_at is not None and end < b.reset_at - 1.0):
            return  # an answer from a window that has already ended
        if b.reset_at is None or end > b.reset_at + 1.0:
            b.reset_at, b.remaining = end, left  # a new window
        else:
            b.reset_at = min(b.reset_at, end)
            b.remaining = left if b.remaining is None else min(b.remaining, left)

    def _note(self, pause: Pause) -> None:
        with self._lock:
            self.pauses.append(pause)
        if self.on_pause is not None:
            self.on_pause(pause)

    def snapshot(self) -> dict[str, tuple[int, int | None, int | None]]:
        """Per bucket: (requests sent, remaining as we estimate it, quota)."""
        with self._lock:
            return {name: (b.requests, b.remaining, b.quota) for name, b in self.buckets.items()}


def wait(event: threading.Event, seconds: float) -> None:
    """Every pause of a crawl goes through here (tests replace it, so nothing waits for real)."""
    event.wait(seconds)
