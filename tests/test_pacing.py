"""The pacer on its own, with a fake clock: buckets, the server's counts, holds at a spent window,
answers from an ended window, 429s, hostile headers."""

from __future__ import annotations

import pytest

import math
import threading

from atlas.hub.pacing import GaveUp, Pacer, bucket_of, parse_ratelimit, retry_after

HUB = "https://huggingface.co"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def headers(bucket: str, remaining: int, reset: int, quota: int = 10, window: int = 300) -> dict[str, str]:
    return {"RateLimit": f'"{bucket}";r={remaining};t={reset}',
            "RateLimit-Policy": f'"fixed window";"{bucket}";q={quota};w={window}'}


@pytest.mark.parametrize(("url", "bucket"), [
    (f"{HUB}/api/models?author=x", "api"),
    (f"{HUB}/api/models/org/m/revision/main", "api"),
    (f"{HUB}/org/m/resolve/abc/config.json", "resolvers"),
    (f"{HUB}/api/resolve-cache/models/org/m/abc/config.json?etag=x", "resolvers"),
    (f"{HUB}/org/m", "pages"),
    ("https://cas-bridge.xethub.hf.co/xet-bridge-us/abc?X-Amz-Signature=x", None),  # the CDN: no bucket
])
def test_bucket_of(url: str, bucket: str | None) -> None:
    assert bucket_of(url, HUB) == bucket


def test_headers_parse_and_hostile_ones_are_ignored() -> None:
    info = parse_ratelimit(headers("resolvers", 2999, 172, 3000, 300))
    assert (info.bucket, info.remaining, info.reset_s, info.quota, info.window_s) == ("resolvers", 2999, 172, 3000, 300)
    assert parse_ratelimit({"RateLimit": '"api";r=' + "9" * 5000 + ";t=1"}) is None  # no 5000-digit int conversion
    assert parse_ratelimit({"RateLimit": "garbage"}) is None and parse_ratelimit({}) is None
    mismatched = parse_ratelimit({"RateLimit": '"api";r=1;t=2', "RateLimit-Policy": '"fixed window";"pages";q=5;w=9'})
    assert mismatched.quota is None  # a policy for another bucket is not this one's
    # a number too long to parse is "forever", not "absent": huggingface_hub's own retry would obey it
    assert retry_after({"Retry-After": "7"}) == 7.0 and retry_after({"Retry-After": "9" * 40}) == math.inf
    assert retry_after({"Retry-After": "\u0663"}) is None  # an Arabic-Indic digit is no number of seconds
    assert retry_after(headers("api", 0, 55)) == 55.0 and retry_after(headers("api", 3, 55)) is None
    assert retry_after({"RateLimit": '"api";r=0;t=' + "9" * 12}) == math.inf
    assert parse_ratelimit({"RateLimit": '"api";r=1;t=1234567890'}) is None  # not read as t=123456789


def test_a_spent_window_holds_its_bucket_until_the_reset_and_only_that_bucket() -> None:
    clock = Clock()
    pacer = Pacer(HUB, sleep=clock.sleep, clock=clock)
    url = f"{HUB}/org/m/resolve/abc/config.json"
    ticket = pacer.before(url)
    pacer.after(ticket, 200, headers("resolvers", 2, 30, quota=3))  # 2 left, window ends in 30 s
    for left in (1, 0):
        pacer.after(pacer.before(url), 200, headers("resolvers", left, 30, quota=3))
    assert clock.slept == []  # the quota is spent as fast as the crawl can use it
    other = pacer.before(f"{HUB}/api/models/org/m")  # another bucket is not held
    assert clock.slept == []
    pacer.after(other, 200, headers("api", 9, 200))
    start = clock.now
    pacer.before(url)  # the window has no room left: wait for its reset, not for a 429
    assert clock.slept and clock.now - start == pytest.approx(30.05, abs=0.01)
    assert pacer.pauses[-1].bucket == "resolvers" and "window spent" in pacer.pauses[-1].reason
    assert pacer.rate_limited == 0


def test_requests_in_flight_count_against_the_window() -> None:
    clock = Clock()
    pacer = Pacer(HUB, sleep=clock.sleep, clock=clock)
    url = f"{HUB}/api/models/org/m"
    first = pacer.before(url)
    in_flight = [pacer.before(url) for _ in range(3)]  # sent before the first answer came back
    pacer.after(first, 200, headers("api", 3, 60))  # the server counted only the first one
    assert pacer.buckets["api"].remaining == 0  # ...but the three in flight will be counted too
    pacer.before(url)
    assert clock.slept  # so the next one waits for the reset
    for ticket in in_flight:
        pacer.after(ticket, 200, headers("api", 0, 60))


def test_an_answer_from_an_ended_window_does_not_undo_the_new_one() -> None:
    clock = Clock()
    pacer = Pacer(HUB, sleep=clock.sleep, clock=clock)
    url = f"{HUB}/api/models/org/m"
    old = pacer.before(url)
    pacer.after(pacer.before(url), 200, headers("api", 5, 10))
    clock.now += 11  # the window ended; a new one starts with the next request
    pacer.after(pacer.before(url), 200, headers("api", 9, 10))
    pacer.after(old, 200, headers("api", 0, 0))  # a late answer from the old window
    assert pacer.buckets["api"].remaining == 9


def test_a_429_pauses_the_bucket_for_the_announced_time() -> None:
    clock = Clock()
    pacer = Pacer(HUB, sleep=clock.sleep, clock=clock)
    url = f"{HUB}/org/m/resolve/abc/config.json"
    pacer.after(pacer.before(url), 429, {**headers("resolvers", 0, 12), "Retry-After": "12"})
    assert pacer.rate_limited == 1 and "429" in pacer.pauses[-1].reason
    start = clock.now
    pacer.before(url)
    assert clock.now - start == pytest.approx(12.05, abs=0.01)


def test_abort_wakes_the_default_wait() -> None:
    """An interrupted crawl does not wait out a reset: abort() ends a wait already under way, and
    a wait asked for after it returns at once. Run in a thread joined with a bound (a tenth of the
    wait), so a regression fails here instead of hanging the suite for the whole wait."""
    pacer = Pacer(HUB)
    bound_s = pacer.max_wait_s / 10
    waits = [threading.Thread(target=pacer.pause, args=(pacer.max_wait_s,), daemon=True) for _ in range(2)]
    waits[0].start()  # waiting (or about to) when abort() comes
    pacer.abort()
    waits[1].start()  # asked for after abort()
    for wait in waits:
        wait.join(bound_s)
        assert not wait.is_alive(), f"pause() still waiting {bound_s:g} s after abort()"
    assert pacer.aborted


def test_the_hubs_answers_decide_which_bucket_a_kind_of_request_counts_in() -> None:
    clock = Clock()
    pacer = Pacer(HUB, sleep=clock.sleep, clock=clock)
    hop = f"{HUB}/api/resolve-cache/models/org/m/abc/config.json?etag=x"
    assert pacer.before(hop)[0] == "resolve-cache" and pacer.buckets["resolvers"].requests == 1
    pacer.after(("resolve-cache", 1), 200, headers("api", 0, 30))  # the Hub counted it as api
    assert pacer.buckets["api"].remaining == 0
    pacer.before(hop)  # so the next hop waits for the api window, not the resolvers one
    assert pacer.buckets["api"].requests == 1 and clock.slept


@pytest.mark.parametrize("answer", [
    (200, headers("resolvers", 0, 999_999_999)),  # a spent window that resets in 31 years
    (429, {"Retry-After": "999999999"}),
    (429, {**headers("resolvers", 0, 999_999_999), "Retry-After": "999999999"}),
    (429, {"Retry-After": "9" * 40}),
])
def test_no_wait_is_longer_than_the_bound_the_request_gives_up_instead(answer: tuple[int, dict]) -> None:
    clock = Clock()
    pacer = Pacer(HUB, sleep=clock.sleep, clock=clock, max_wait_s=600)
    url = f"{HUB}/org/m/resolve/abc/config.json"
    pacer.after(pacer.before(url), *answer)
    for _ in range(2):  # the bucket stays closed: each later request gives up at once, too
        with pytest.raises(GaveUp, match="over the 600 s this crawl waits at most"):
            pacer.before(url)
    assert clock.slept == [] and pacer.buckets["resolvers"].requests == 1  # nothing waited, nothing sent
    pacer.after(pacer.before(f"{HUB}/api/models/org/m"), 200, headers("api", 9, 30))  # other buckets go on
    with pytest.raises(GaveUp, match="forever|999,999,999 s"):
        pacer.pause(retry_after(answer[1]) or 999_999_999)
    pacer.pause(600)  # up to the bound, a wait is kept
    assert clock.slept == [600]
