"""The crawler: watch list -> Hub listing -> pinned downloads -> fingerprints -> one snapshot.

Same code path for the live Hub and the bundled mirror (served by atlas.hub.local.server on 127.0.0.1):
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

import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb
from huggingface_hub import HfApi
from huggingface_hub.utils import build_hf_headers, get_session, httpx
from huggingface_hub.utils import logging as hf_logging
from pydantic import BaseModel, Field

from atlas import AtlasError
from atlas.interrupts import sigint_handler
from atlas.store import db as store
from atlas.fingerprints.rules import RULE_VERSION
from atlas.hub import bases, redact
from atlas.hub.client import (
    DEFAULT_BOUNDS,
    MAX_REDIRECTS,
    UNREACHABLE_AFTER,
    Bounds,
    HubUnreachable,
    ListingGuard,
    Silence,
    install_client,
    restore_client,
)
from atlas.hub.context import MAX_ATTEMPTS, Context
from atlas.hub.errors import RETRY_STATUS, ErrorKind, RepoProblem, first_line
from atlas.hub.fetch import Fetched, Listed, fetch_repo, fingerprint_stored, fingerprintable, side_files_pending
from atlas.hub.listing import LISTING_EXPAND, OrgCoverage, list_scope, to_listed
from atlas.hub.pacing import Pacer
from atlas.hub.progress import CrawlProgress
from atlas.hub.watchlist import DEFAULT_WATCHLIST, Watchlist, load_watchlist

# The crawler's front door: what the CLI, the benchmarks and the tests use, whichever part defines it.
__all__ = [
    "DEFAULT_BOUNDS", "DEFAULT_WATCHLIST", "LISTING_EXPAND", "LIVE_ENDPOINT", "MAX_ATTEMPTS", "MAX_REDIRECTS",
    "RULE_VERSION", "UNREACHABLE_AFTER", "Bounds", "CrawlInterrupted", "CrawlSummary", "ListingGuard", "Pacer",
    "RepoProblem", "Silence", "crawl", "fetch_repo", "install_client", "iter_summary_lines", "refingerprint",
    "restore_client", "to_listed",
]

LIVE_ENDPOINT = "https://huggingface.co"


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
    url = f"{endpoint.rstrip('/')}/api/models?limit=1"
    failure: list[BaseException] = []
    answers: list[Any] = []
    get_session()  # built here, outside the deadline: building it (its proxy routes) is no network wait

    def ask() -> None:
        try:
            answers.append(get_session().get(url, timeout=httpx.Timeout(timeout_s), headers=build_hf_headers(token=False)))
        except BaseException as exc:  # whatever it is, the caller reports it
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
        f"{first_line(exc) or 'no detail'}; waited at most {timeout_s + 1.0:.0f} s). Check the network connection, "
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


@dataclass
class RepoState:
    """One repo through the crawl: what the listing said, whether its (repo_id, sha) was in the
    store before (and the side-file errors stored with it then), and what this crawl fetched."""

    listed: Listed
    stored: bool = False
    stored_errors: dict[str, str] = field(default_factory=dict)
    fetched: Fetched | None = None

    @property
    def pair(self) -> tuple[str, str | None]:
        return self.listed.repo_id, self.listed.sha


@dataclass
class CrawlRun:
    """What the snapshot is written from, gathered as the crawl goes."""

    watch: Watchlist
    digest: str
    endpoint_label: str
    pacer: Pacer
    started: datetime
    clock: float  # time.monotonic() at the start
    repos: list[RepoState] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    coverage: list[OrgCoverage] = field(default_factory=list)


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
    bounds = bounds or DEFAULT_BOUNDS
    pacer = Pacer(endpoint, sleep, max_wait_s=bounds.wait_s)
    run = CrawlRun(watch, digest, endpoint_label or redact.text(endpoint), pacer, store.utc_now(), time.monotonic())
    ctx = Context(HfApi(endpoint=endpoint, token=token), endpoint, token, cache_dir or db.parent / "hf-cache",
                  pacer, Silence(pacer), bounds)
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
        with CrawlProgress(pacer, enabled=progress) as bar:
            bar.phase("listing", f"listing {len(watch.orgs)} orgs of {run.endpoint_label}")
            listed = list_scope(ctx, watch, run.problems, run.coverage)
            if watch.orgs and len(run.problems) == len(watch.orgs) and not any(x.row.fetch_status == "ok" for x in listed):
                raise AtlasError(f"no listing of {run.endpoint_label} succeeded, nothing to snapshot: "
                                 + "; ".join(run.problems[:3]))
            todo = _plan(con, run, listed)
            bar.phase("fetching", f"{len(listed)} models in scope, {len(todo)} to fetch", total=len(todo))
            _fetch_all(ctx, todo, concurrency, bar)
            return _finish(con, run, ctx)
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


def _plan(con: duckdb.DuckDBPyConnection, run: CrawlRun, listed: list[Listed]) -> list[tuple[RepoState, set[str] | None]]:
    """Each listed repo's state, and what to fetch: for a new sha everything (None); for a stored
    one only the side files an earlier crawl failed to get (the files settled or failed for good)."""
    run.repos = [RepoState(x) for x in listed]
    readable = [r for r in run.repos if r.listed.row.fetch_status == "ok"]
    known = store.stored_pairs(con, [(r.listed.repo_id, r.listed.sha) for r in readable if r.listed.sha])
    side_state = store.side_file_state(con, known)
    todo: list[tuple[RepoState, set[str] | None]] = []
    for r in readable:
        if r.listed.sha is None or r.pair not in known:
            todo.append((r, None))
            continue
        settled, errors = side_state[(r.listed.repo_id, r.listed.sha)]
        r.stored, r.stored_errors = True, errors
        if side_files_pending(r.listed.siblings, settled, errors):
            todo.append((r, settled | set(errors)))
    return todo


@contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """SIGINT interrupts the crawl even when the process inherited it ignored. A shell without job
    control starts background jobs that way (`atlas crawl &` in a script, a test runner run as such a
    job, some CI runners), and Python then installs no handler: the signal was dropped and the crawl
    ran to its end. An interrupted crawl loses nothing (a snapshot is whole or absent, files are
    cached), so honouring the signal is always safe."""
    with sigint_handler(signal.default_int_handler):
        yield


def _fetch_all(ctx: Context, todo: list[tuple[RepoState, set[str] | None]], concurrency: int, bar: Any) -> None:
    """Fetch `todo` on `concurrency` threads, each repo's outcome kept in its state."""
    jobs: queue.SimpleQueue[tuple[RepoState, set[str] | None]] = queue.SimpleQueue()
    for job in todo:
        jobs.put(job)
    # (state, outcome, None), or (state, None, what it raised): a RepoProblem is an outcome, not a raise
    done: queue.Queue[tuple[RepoState, Fetched | RepoProblem | None, BaseException | None]] = queue.Queue()

    def work() -> None:
        while True:
            try:
                state, settled = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                done.put((state, _fetch_or_problem(ctx, state.listed, settled), None))
            except BaseException as exc:  # re-raised in the main thread
                done.put((state, None, exc))

    # Daemon threads, not an executor's: after Ctrl-C the interpreter exits at once instead of
    # joining a download that sits in a hung read for the whole request timeout.
    workers = [threading.Thread(target=work, name=f"crawl-{i}", daemon=True) for i in range(min(concurrency, len(todo)))]
    for worker in workers:
        worker.start()
    try:
        for _ in todo:
            state, result, raised = done.get()  # a Condition wait: Ctrl-C interrupts it
            if raised is not None:
                raise raised
            item = state.listed
            if isinstance(result, RepoProblem) and state.stored:
                item.row.side_file_error = str(result)  # its config is stored and read
            elif isinstance(result, RepoProblem):
                item.row.fetch_status, item.row.error = result.kind.value, str(result)
                item.transient, item.gave_up = not result.permanent, result.gave_up
            else:
                state.fetched = result
            bar.advance(item.repo_id)
    except BaseException:  # Ctrl-C: wake every waiting worker and leave without them
        ctx.pacer.abort()
        raise
    for worker in workers:
        worker.join()
    if ctx.silence.gone.is_set():
        n_fetched = sum(1 for state, _ in todo if state.fetched is not None)
        raise HubUnreachable(
            f"{ctx.endpoint} stopped answering in the middle of the crawl ({n_fetched} of {len(todo)} models "
            "fetched): no snapshot written; rerun when it answers again, downloaded files are cached"
        )


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
        return RepoProblem(ErrorKind.ERROR, "the hub stopped answering")
    except RepoProblem as exc:
        return exc
    except Exception as exc:  # any one repo's failure is recorded as its error, by design
        return RepoProblem(ErrorKind.ERROR, f"{type(exc).__name__}: {first_line(exc)}")


def _fetched_rows(repos: list[RepoState]) -> tuple[list[store.RawFile], list[store.WeightNames], list[tuple[str, str, str, str]]]:
    """The files, tensor names and side-file errors this crawl fetched, as store rows."""
    files: list[store.RawFile] = []
    weights: list[store.WeightNames] = []
    file_errors: list[tuple[str, str, str, str]] = []
    for r in repos:
        got = r.fetched
        if got is None:
            continue
        repo_id, sha = r.listed.repo_id, r.listed.sha or ""
        files += [store.RawFile(repo_id, sha, name, text) for name, text in got.files.items()]
        if got.weights is not None:
            weights.append(store.WeightNames(repo_id, sha, got.weights[0], got.weights[1]))
        # only errors that will not change at this sha are stored; the others are retried next crawl
        file_errors += [(repo_id, sha, name, e.message) for name, e in got.problems.items() if e.permanent]
    return files, weights, file_errors


def _note_side_file_errors(repos: list[RepoState]) -> None:
    """Side-file errors are the snapshot's word on shipped weights; the config was read all the same."""
    for r in repos:
        row = r.listed.row
        if row.fetch_status != "ok":
            continue
        errors = dict(r.stored_errors)
        errors.update({name: e.message for name, e in r.fetched.problems.items()} if r.fetched else {})
        joined = "; ".join(f"{name}: {err}" for name, err in sorted(errors.items()))
        row.side_file_error = "; ".join(x for x in (joined, row.side_file_error) if x) or None


def _fingerprint_rows(con: duckdb.DuckDBPyConnection, repos: list[RepoState], files: list[store.RawFile],
                      weights: list[store.WeightNames]) -> store.FingerprintRows:
    """Fingerprints for pairs fetched now (config or side files), or fingerprinted by an older rule
    version; a repo whose values cannot be computed is marked as an error, never the snapshot."""
    by_pair = {(r.listed.repo_id, r.listed.sha): r for r in repos if r.listed.sha and (r.stored or r.fetched is not None)}
    versions = store.fingerprint_versions(con, set(by_pair))
    stale = {p for p, r in by_pair.items() if versions.get(p) != RULE_VERSION or r.fetched is not None}
    inputs = store.load_inputs(con, {p for p in stale if by_pair[p].stored})
    for f in files:
        inputs.setdefault((f.repo_id, f.sha), {"files": {}, "weights": None})["files"][f.filename] = f.content
    for w in weights:
        inputs[(w.repo_id, w.sha)]["weights"] = (w.source, w.names)
    rows_by_pair = {r.pair: r.listed.row for r in repos}
    fp_rows: store.FingerprintRows = []
    for (repo, sha), entry in inputs.items():
        if (repo, sha) in stale and fingerprintable(entry["files"]):
            try:
                fp_rows += [(repo, sha, RULE_VERSION, n, v, p) for n, v, p in fingerprint_stored(entry["files"], entry["weights"])]
            except Exception as exc:  # one repo's values never cost the snapshot
                row = rows_by_pair.get((repo, sha))
                if row is not None:
                    row.fetch_status, row.error = "error", f"cannot fingerprint: {first_line(exc)}"
    return fp_rows


def _base_lookups(ctx: Context, con: duckdb.DuckDBPyConnection, run: CrawlRun,
                  fp_rows: store.FingerprintRows) -> list[store.BaseLookup]:
    """The bases the snapshot's repos name and the snapshot lacks, each asked of the hub
    (atlas.hub.bases); the fingerprints are this crawl's where it made them, else the store's."""
    ok = {(r.listed.repo_id, r.listed.sha): r.listed for r in run.repos if r.listed.row.fetch_status == "ok" and r.listed.sha}
    fresh: dict[tuple[str, str], dict[str, str]] = {}
    made = {(repo, sha) for repo, sha, *_ in fp_rows}
    for repo, sha, _, name, value, _ in fp_rows:
        if name in bases.NEEDED:
            fresh.setdefault((repo, sha), {})[name] = value
    stored = store.fingerprint_values(con, [p for p in ok if p not in made], bases.NEEDED)
    pairs = [(listed, fresh.get(p) or stored.get(p) or {}) for p, listed in ok.items()]
    names = bases.wanted(pairs)
    settled = store.recent_base_lookups(con, names, run.started - timedelta(days=bases.REUSE_DAYS))
    out: list[store.BaseLookup] = []
    for base in names:
        if base.lower() in settled:
            out.append(settled[base.lower()])
            continue
        try:
            out.append(bases.look_up(ctx, base))
        except HubUnreachable as exc:
            out.append(store.BaseLookup(base, None, "error", str(exc), None, None))
    return out


def _finish(con: duckdb.DuckDBPyConnection, run: CrawlRun, ctx: Context) -> CrawlSummary:
    """Write the snapshot in one transaction and say what it holds."""
    files, weights, file_errors = _fetched_rows(run.repos)
    _note_side_file_errors(run.repos)
    fp_rows = _fingerprint_rows(con, run.repos, files, weights)
    lookups = _base_lookups(ctx, con, run, fp_rows)
    rows = [r.listed.row for r in run.repos]
    by_status = {status: sum(1 for row in rows if row.fetch_status == status) for status in ErrorKind}
    n_fetched = sum(1 for r in run.repos if r.fetched is not None)
    n_unchanged = sum(1 for r in run.repos if r.stored and r.fetched is None)
    n_missing = by_status[ErrorKind.MISSING] + by_status[ErrorKind.DISABLED]
    status = "complete" if not run.problems else "partial"
    pacer = run.pacer
    snapshot = store.SnapshotRow(
        started_at=run.started, finished_at=store.utc_now(), endpoint=run.endpoint_label,
        watchlist_digest=run.digest, status=status, rule_version=RULE_VERSION, n_requests=pacer.requests,
        n_rate_limited=pacer.rate_limited, problems="; ".join(run.problems) or None, n_listed=len(rows),
        n_fetched=n_fetched, n_unchanged=n_unchanged, n_gated=by_status[ErrorKind.GATED], n_missing=n_missing,
        n_failed=by_status[ErrorKind.ERROR], n_seen=sum(c.seen for c in run.coverage),
        coverage=json.dumps([c.model_dump() for c in run.coverage]),
    )
    snapshot_id = store.write_snapshot(con, snapshot, rows, files, weights, fp_rows, file_errors, scrub=redact.text,
                                       base_lookups=lookups)
    transient = [r.listed for r in run.repos if r.listed.transient]
    return CrawlSummary(
        snapshot_id=snapshot_id, status=status, endpoint=run.endpoint_label, listed=len(rows), fetched=n_fetched,
        unchanged=n_unchanged, gated=by_status[ErrorKind.GATED], missing=n_missing, failed=by_status[ErrorKind.ERROR],
        requests=pacer.requests, rate_limited=pacer.rate_limited, waited_s=round(pacer.waited_s, 3),
        elapsed_s=round(time.monotonic() - run.clock, 3), problems=run.problems, seen=snapshot.n_seen or 0,
        coverage=run.coverage, requests_by_bucket={**{n: b.requests for n, b in pacer.buckets.items()}, "cdn": pacer.cdn_requests},
        incomplete=[f"{x.repo_id}: {x.row.error}" for x in transient],
        gave_up=[f"{x.repo_id}: {x.row.error}" for x in transient if x.gave_up],
    )


def refingerprint(db: Path) -> int:
    """Recompute every stored (repo_id, sha)'s fingerprints with the current rules; no network."""
    con = store.connect(db)
    try:
        inputs = store.load_inputs(con)
        rows: store.FingerprintRows = []
        for (repo, sha), entry in inputs.items():
            if fingerprintable(entry["files"]):
                try:
                    rows += [(repo, sha, RULE_VERSION, n, v, p) for n, v, p in fingerprint_stored(entry["files"], entry["weights"])]
                except Exception:  # a config the rules cannot read keeps no fingerprint
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
