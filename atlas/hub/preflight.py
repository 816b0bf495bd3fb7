"""Looking before crawling: `atlas crawl --plan` (scope, requests per bucket and duration per
account tier, from the listing alone) and `atlas crawl --probe` (a handful of requests that show
how the hub answers: status, X-Error-Code, RateLimit headers, redirects)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from pathlib import Path
from urllib.parse import urlsplit

import duckdb

from atlas import AtlasError
from atlas.store import db as store
from atlas.hub.client import Silence, install_client, restore_client
from atlas.hub.context import Context
from atlas.hub.crawl import reach
from atlas.hub.fetch import QUANT_SIDECAR, SINGLE_FILE, WEIGHT_INDEX, side_files_pending
from atlas.hub.listing import OrgCoverage, list_scope
from atlas.hub.watchlist import load_watchlist
from atlas.hub.pacing import TIERS, WINDOW_S, Pacer

# Requests one file costs on the Hub: a small file is a GET of /resolve/ answered by a 307 to the
# resolve cache (both count as resolvers); an LFS file's /resolve/ answers a 302 to the CDN, which
# is not rate-limited.
SMALL_FILE_REQUESTS = 2


def _session(endpoint: str, token: str | bool) -> tuple[Context, Pacer]:
    from huggingface_hub import HfApi

    pacer = Pacer(endpoint)
    ctx = Context(HfApi(endpoint=endpoint, token=token), endpoint, token, Path(os.devnull), pacer, Silence(pacer))
    install_client(pacer, 30.0, ctx.silence)
    return ctx, pacer


def _duration(requests: dict[str, int], quotas: dict[str, int]) -> tuple[float, str]:
    """Seconds the buckets' windows impose (the first window's quota goes at once, each further
    quota waits a window), and the bucket that decides it."""
    worst, which = 0.0, "none"
    for bucket, n in requests.items():
        seconds = max(0, n - quotas[bucket]) / quotas[bucket] * WINDOW_S
        if n and (seconds > worst or which == "none"):
            worst, which = seconds, bucket
    return worst, which


def _human(seconds: float) -> str:
    if seconds < 60:
        return "under a minute of waiting"
    return f"~{seconds / 60:.0f} min" if seconds < 5400 else f"~{seconds / 3600:.1f} h"


def plan(db: Path, watchlist: Path, endpoint: str, token: str | bool | None = None) -> Iterator[str]:
    """Lines of the plan; makes the listing requests only (api bucket), never a file request."""
    watch, _ = load_watchlist(watchlist)
    token = (os.environ.get("HF_TOKEN") or False) if token is None else token
    ctx, pacer = _session(endpoint, token)
    try:
        reach(endpoint)
        problems: list[str] = []
        coverage: list[OrgCoverage] = []
        listed = list_scope(ctx, watch, problems, coverage)
        listing_requests = pacer.buckets["api"].requests
    finally:
        restore_client()
    readable = [x for x in listed if x.row.fetch_status == "ok"]
    known: set[tuple[str, str]] = set()
    side_state: dict = {}
    note = ""
    if db.exists():
        try:
            with store.connect(db, read_only=True) as con:
                known = store.stored_pairs(con, [(x.repo_id, x.sha) for x in readable if x.sha])
                side_state = store.side_file_state(con, known)
        except AtlasError as exc:
            note = f" (store not read: {exc}; every model counted as new)"
        except duckdb.Error as exc:  # opened, but damaged
            note = f" (store not read: {store.store_error(db, exc)}; every model counted as new)"
    resolvers = cdn = new = pending = 0
    for x in readable:
        names = x.siblings or {"config.json"}
        if (x.repo_id, x.sha) in known:
            settled, errors = side_state[(x.repo_id, x.sha)]
            if not side_files_pending(x.siblings, settled, errors):
                continue
            pending += 1
            names = {n for n in names if n not in settled and n not in errors} - {"config.json"}
        else:
            new += 1
        resolvers += SMALL_FILE_REQUESTS * sum(1 for f in ("config.json", QUANT_SIDECAR, WEIGHT_INDEX) if f in names)
        if SINGLE_FILE in names and WEIGHT_INDEX not in names:
            resolvers, cdn = resolvers + 1, cdn + 1
    requests = {"api": listing_requests, "resolvers": resolvers, "pages": 0}
    status = {s: sum(1 for x in listed if x.row.fetch_status == s) for s in ("gated", "disabled", "missing", "error")}
    yield f"plan for {endpoint} (watch list {watchlist}; token: {'yes' if token else 'no'})"
    yield (f"scope: {len(watch.orgs)} orgs, {sum(c.seen for c in coverage)} models seen in their listings, "
           f"{sum(c.kept for c in coverage)} kept; {len(watch.repos) + len(watch.exemplars)} named repos "
           f"-> {len(listed)} models in scope")
    for c in coverage:
        if c.error:
            yield f"  {c.author}: listing failed: {c.error}"
        else:
            cut = f", cut to max_models {c.max_models}" if c.capped else ""
            yield (f"  {c.author}: {', '.join(c.pipeline_tags) or 'any task'}, >= {c.min_downloads} downloads: "
                   f"{c.seen} seen, {c.kept} kept{cut}")
    skipped = ", ".join(f"{n} {s}" for s, n in status.items() if n)
    yield (f"to fetch: {new} new or changed, {pending} with side files pending, "
           f"{len(readable) - new - pending} unchanged (no request){note}" + (f"; not requested: {skipped}" if skipped else ""))
    yield (f"expected requests: api {requests['api']} (the listing, made again by the crawl), "
           f"resolvers {requests['resolvers']} (the resolve-cache hop of small files counted here; "
           f"`--probe` shows where the Hub counts it), CDN {cdn} (not rate-limited)")
    for tier, quotas in TIERS.items():
        seconds, bucket = _duration(requests, quotas)
        share = ", ".join(f"{b} {n}/{quotas[b]}" for b, n in requests.items() if n)
        yield (f"  {tier:9} (per 5 min: api {quotas['api']}, resolvers {quotas['resolvers']}): {_human(seconds)} "
               f"from rate limits, decided by {bucket} ({share} of one window) plus transfer time")
    for problem in problems:
        yield f"problem: {problem}"


def probe(watchlist: Path, endpoint: str, token: str | bool | None = None) -> Iterator[str]:
    """A handful of requests (no redirect followed) and what the hub said to each."""
    from huggingface_hub.utils import build_hf_headers, get_session

    watch, _ = load_watchlist(watchlist)
    token = (os.environ.get("HF_TOKEN") or False) if token is None else token
    org = watch.orgs[0].author if watch.orgs else None
    repo = (watch.exemplars or watch.repos or [None])[0]
    if org is None and repo is None:
        raise AtlasError(f"watch list {watchlist} names no org or repo to probe")
    org = org or repo.split("/")[0]
    base = endpoint.rstrip("/")
    lines: list[str] = [f"probe of {endpoint} (token: {'yes' if token else 'no'})"]
    _session(endpoint, token)
    try:
        reach(endpoint)
        headers = build_hf_headers(token=token)
        session = get_session()

        def ask(method: str, path: str, expect: str) -> Any:
            response = session.request(method, base + path, headers=headers, follow_redirects=False, timeout=30)
            message = response.headers.get("X-Error-Message")
            where = response.headers.get("Location")
            host = ""
            if where:
                target = urlsplit(where)
                host = " (another host)" if target.netloc and target.netloc != urlsplit(base).netloc else " (same host)"
            lines.append(
                f"{method} {path} -> {response.status_code}; expected {expect}; "
                f"X-Error-Code: {response.headers.get('X-Error-Code', '-')}; "
                f"RateLimit: {response.headers.get('RateLimit', '-')}; RateLimit-Policy: {response.headers.get('RateLimit-Policy', '-')}"
                + (f"; Location{host}: {where[:100]}" if where else "")
                + (f"; X-Error-Message: {message[:100]}" if message else "")
            )
            return response

        ask("GET", f"/api/models?author={org}&limit=1&expand=sha", "200 with the listing")
        ask("GET", f"/api/models?author={org}&limit=1&expand=baseModels", "400 (baseModels is not a listing field)")
        ask("GET", f"/api/models/{org}/atlas-probe-no-such-repo", "401 RepoNotFound without a token, 404 with one")
        if repo is not None:
            info = ask("GET", f"/api/models/{repo}?" + "&".join(f"expand={e}" for e in ("sha", "siblings")), "200")
            body = info.json() if info.status_code == 200 else {}
            siblings = [s.get("rfilename") for s in body.get("siblings", []) if isinstance(s, dict)]
            small = ask("HEAD", f"/{repo}/resolve/main/config.json", "307 to /api/resolve-cache/ (a small file)")
            hop = small.headers.get("Location", "")
            if small.status_code == 307 and hop.startswith("/"):
                ask("HEAD", hop, "200 (which bucket counts this hop: the crawler assumes resolvers)")
            lfs = next((s for s in siblings if isinstance(s, str) and s.endswith(".safetensors")), None)
            if lfs is not None:
                ask("HEAD", f"/{repo}/resolve/main/{lfs}", "302 to the CDN (an LFS file)")
    except AtlasError:
        raise
    except Exception as exc:  # any failure: the probe reports it, it does not crash
        lines.append(f"probe stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        restore_client()
    yield from lines
