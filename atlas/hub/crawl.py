"""The crawler: watch list -> Hub listing -> pinned downloads -> fingerprints -> one snapshot.

Same code path for the live Hub and the bundled mirror (served by atlas.hub.server on 127.0.0.1):
only the endpoint differs. Politeness lives in one place, `Pacer`, an HTTP hook on the
huggingface_hub client that sees every request and response: a 429 (or `RateLimit: r=0`) pauses
all workers until the server's reset time, not just the thread that got it. On top of the
client's own retries, `_call` retries 429/5xx/timeouts with backoff; 401/403 become `gated`,
404 `missing`, anything else a per-repo `error`. Nothing stops the crawl.

Incremental and resumable: files are downloaded pinned to the listed sha into the HF cache, so an
unchanged sha costs no request (its raw config is already in the store) and a crawl killed
midway resumes from the cache. The snapshot is written in one transaction at the very end.

Side files (weight index, safetensors header, hf_quant_config.json) never make a repo unread:
their errors go in `side_file_error`. Only errors that cannot change at the same sha (bad bytes,
over a size limit, a listed file that is absent) are stored with it; after a 5xx or timeout the
next crawl asks for the missing side files again, not for the stored config.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import tomllib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # must precede the huggingface_hub import

import duckdb  # noqa: E402
from huggingface_hub import HfApi, hf_hub_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    NotASafetensorsRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)
from huggingface_hub.utils import close_session, set_client_factory  # noqa: E402
from huggingface_hub.utils import logging as hf_logging  # noqa: E402
from huggingface_hub.utils._http import default_client_factory, parse_ratelimit_headers  # noqa: E402
from pydantic import BaseModel, Field, ValidationError  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

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

LIVE_ENDPOINT = "https://huggingface.co"
DEFAULT_WATCHLIST = Path(__file__).with_name("watchlist.toml")
EXPAND = [
    "sha", "lastModified", "createdAt", "downloads", "likes", "gated", "private", "pipeline_tag",
    "library_name", "tags", "baseModels", "cardData", "siblings", "safetensors",
]
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_ATTEMPTS = 4
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}$")
_SHA = re.compile(r"^[0-9a-f]{40}$")

T = TypeVar("T")


# ---- watch list ---------------------------------------------------------------------------------


class OrgScope(BaseModel):
    author: str
    pipeline_tags: list[str] | None = None
    min_downloads: int | None = None
    max_models: int | None = None


class Defaults(BaseModel):
    pipeline_tags: list[str] = Field(default_factory=lambda: ["text-generation"])
    min_downloads: int = 0
    max_models: int = 200


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


# ---- politeness -----------------------------------------------------------------------------


class Pacer:
    """Shared by every request of a crawl: counts requests and 429s, and holds all workers back
    until the server's announced reset when it says the budget is spent."""

    def __init__(self, sleep: Callable[[float], None] | None = None) -> None:
        # looked up at call time, so tests that patch time.sleep patch this too
        self._sleep = sleep or (lambda seconds: time.sleep(seconds))
        self._lock = threading.Lock()
        self._until = 0.0
        self.requests = 0
        self.rate_limited = 0
        self.waited_s = 0.0

    def wait_turn(self) -> None:
        with self._lock:
            self.requests += 1
            delay = self._until - time.monotonic()
        if delay > 0:
            with self._lock:
                self.waited_s += delay
            self._sleep(delay)  # once, not in a loop: a patched sleep must not spin

    def hold(self, seconds: float) -> None:
        with self._lock:
            self._until = max(self._until, time.monotonic() + seconds)

    def observe(self, status: int, headers: Any) -> None:
        """Pause everyone when the server says so."""
        pause = server_pause(headers)  # also on successes: `r=0` there means the next one fails
        if status == 429:
            with self._lock:
                self.rate_limited += 1
            pause = pause if pause is not None else 1.0
        if pause is not None:
            self.hold(pause)

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.waited_s += seconds
        self._sleep(seconds)


def server_pause(headers: Any) -> float | None:
    """Seconds the server asks us to wait: `RateLimit ... r=0;t=N`, else a numeric Retry-After."""
    info = parse_ratelimit_headers(headers) if headers is not None else None
    if info is not None and info.remaining == 0:
        return float(info.reset_in_seconds)
    value = headers.get("Retry-After") if headers is not None else None
    if value is not None and str(value).strip().isdigit():
        return float(value)
    return None


def _install_client(pacer: Pacer, timeout_s: float) -> None:
    """huggingface_hub's own client plus our two hooks (its request hook stays first)."""
    from huggingface_hub.utils import httpx

    def factory() -> Any:
        client = default_client_factory()
        client.timeout = httpx.Timeout(timeout_s)

        def on_request(request: Any) -> None:
            pacer.wait_turn()

        def on_response(response: Any) -> None:
            pacer.observe(response.status_code, response.headers)

        client.event_hooks = {
            "request": [*client.event_hooks["request"], on_request],
            "response": [*client.event_hooks["response"], on_response],
        }
        return client

    set_client_factory(factory)


def _restore_client() -> None:
    set_client_factory(default_client_factory)
    close_session()


# ---- error classification -----------------------------------------------------------------------


class RepoProblem(Exception):
    """A per-repo outcome that is not success: kind is 'gated' | 'missing' | 'error'.
    `permanent`: asking again at the same sha cannot help (a 404, bad bytes, over a size limit),
    as opposed to a server or network failure that a later crawl may get past."""

    def __init__(self, kind: str, message: str, permanent: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.permanent = permanent or kind == "missing"


def _status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _classify(exc: BaseException) -> tuple[str, str]:
    """('retry' | 'gated' | 'missing' | 'error', message) for an exception from the client."""
    from huggingface_hub.utils import httpx

    if isinstance(exc, LocalEntryNotFoundError):
        # hf_hub_download wraps the real failure of its HEAD request
        cause = exc.__cause__ or exc.__context__
        if cause is not None and cause is not exc:
            return _classify(cause)
        return "error", "file not available (no response from the hub)"
    status = _status_of(exc)
    if isinstance(exc, GatedRepoError) or status in (401, 403):
        return "gated", f"gated or private (HTTP {status or 403}); needs an HF_TOKEN with access"
    if isinstance(exc, (RepositoryNotFoundError, RevisionNotFoundError)):
        return "missing", f"repository or revision not found (HTTP {status or 404})"
    if isinstance(exc, EntryNotFoundError) or status == 404:
        return "missing", "file not found at this revision (HTTP 404)"
    if status in RETRY_STATUS:
        return "retry", f"HTTP {status}"
    if isinstance(exc, (httpx.TimeoutException, httpx.TransportError, TimeoutError, ConnectionError)):
        return "retry", f"network error: {type(exc).__name__}"
    if isinstance(exc, HFValidationError):
        return "error", f"rejected by the hub client: {str(exc).splitlines()[0]}"
    if isinstance(exc, (SafetensorsParsingError, NotASafetensorsRepoError)):
        return "error", f"safetensors header unreadable: {str(exc).splitlines()[0]}"
    if isinstance(exc, HfHubHTTPError):
        return "error", f"HTTP {status}: {str(exc).splitlines()[0]}"
    return "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _call(pacer: Pacer, fn: Callable[[], T], backoff_s: float = 1.0) -> T:
    """Run one hub call; retry 429/5xx/timeouts honouring the server's pause, else raise RepoProblem."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            return fn()
        except RepoProblem:
            raise
        except AtlasError as exc:
            raise RepoProblem("error", str(exc)) from None
        except Exception as exc:  # the hub client raises many types; _classify sorts them
            kind, message = _classify(exc)
            if kind != "retry":
                unreadable = isinstance(exc, (SafetensorsParsingError, NotASafetensorsRepoError))
                raise RepoProblem(kind, message, permanent=unreadable) from None
            if attempt == MAX_ATTEMPTS:
                raise RepoProblem("error", f"{message} (gave up after {MAX_ATTEMPTS} attempts)") from None
            response = getattr(exc, "response", None) or getattr(exc.__cause__, "response", None)
            pause = server_pause(getattr(response, "headers", None))
            pacer.sleep(pause if pause is not None else min(30.0, backoff_s * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")


# ---- one repo -----------------------------------------------------------------------------------


@dataclass
class Listed:
    """What the listing says about one repo (hub metadata for the snapshot)."""

    repo_id: str
    sha: str | None
    siblings: set[str] | None
    row: store.ModelRow


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


def _download(ctx: Context, repo_id: str, sha: str, filename: str, limit: int) -> bytes:
    path = _call(
        ctx.pacer,
        lambda: hf_hub_download(
            repo_id, filename, revision=sha, endpoint=ctx.endpoint, token=ctx.token, cache_dir=ctx.cache_dir
        ),
    )
    size = os.path.getsize(path)
    if size > limit:
        raise RepoProblem(
            "error", f"{filename}: {size:,} bytes, over the {limit:,}-byte limit for this file", permanent=True
        )
    return Path(path).read_bytes()


def _header_names(ctx: Context, repo_id: str, sha: str) -> list[str]:
    """Tensor names from a single-file checkpoint's header (two Range requests, cached on disk
    because the hub client does not cache headers)."""
    cached = ctx.cache_dir / "atlas-safetensors-headers" / sha / (repo_id.replace("/", "--") + ".json")
    try:
        names = json.loads(cached.read_text(encoding="utf-8"))
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return names
    except (OSError, ValueError):
        pass  # absent, or damaged (e.g. by a disk error): a miss, read the header again
    meta = _call(
        ctx.pacer, lambda: ctx.api.parse_safetensors_file_metadata(repo_id, "model.safetensors", revision=sha)
    )
    names = header_tensor_names(meta.tensors)
    # The cache only saves a later request, so failing to write it must not lose what was read.
    # Written aside and renamed: a crawl killed mid-write leaves no half file under the real name.
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(names), encoding="utf-8")
        os.replace(partial, cached)
    except OSError:
        partial.unlink(missing_ok=True)
    return names


QUANT_SIDECAR = "hf_quant_config.json"
WEIGHT_INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def fetch_repo(ctx: Context, item: Listed, settled: set[str] | None = None) -> Fetched:
    """Download what the fingerprints need at the listed sha. Raises RepoProblem when the config
    itself can't be had; problems with side files are recorded and the rest kept. With `settled`
    (the config is stored already), only the side files not in it are asked for."""
    if not _REPO_ID.match(item.repo_id):
        raise RepoProblem("error", f"not a valid Hub repo id: {item.repo_id!r}")
    if item.sha is None or not _SHA.match(item.sha):
        raise RepoProblem("error", f"the listing gave no commit sha for this repo (got {item.sha!r})")
    sha = item.sha
    out = Fetched()
    siblings = item.siblings
    if settled is None:
        if siblings is not None and "config.json" not in siblings:
            raise RepoProblem("missing", "no config.json in this repo")
        data = _download(ctx, item.repo_id, sha, "config.json", MAX_CONFIG_BYTES)
        try:
            parse_config_bytes(data)
        except AtlasError as exc:
            raise RepoProblem("error", str(exc)) from None
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
    config = json.loads(files["config.json"])
    sidecar = None
    if "hf_quant_config.json" in files:
        parsed = json.loads(files["hf_quant_config.json"])
        sidecar = parsed if isinstance(parsed, dict) else None
    source, names = weights if weights is not None else (None, None)
    return fingerprint(config, names, source, sidecar).rows()


# ---- listing ------------------------------------------------------------------------------------


def _naive_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo else value


def _base_models(info: Any) -> tuple[list[str], str | None]:
    """Base models and the relation (quantized, finetune, adapter, merge) from the hub metadata:
    `baseModels`, then the card's `base_model`, then `base_model:` tags."""
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
        parts = tag.split(":")
        if parts[0] == "base_model" and len(parts) == 3:
            relation = relation or parts[1]
            bases = bases or [parts[2]]
        elif parts[0] == "base_model" and len(parts) == 2 and not bases:
            bases = [parts[1]]
    return [b for b in bases if b], relation


def _gated(value: Any) -> str | None:
    return None if value in (None, False) else str(value)


def to_listed(info: Any, exemplars: set[str]) -> Listed:
    bases, relation = _base_models(info)
    safetensors = getattr(info, "safetensors", None)
    siblings = getattr(info, "siblings", None)
    row = store.ModelRow(
        repo_id=info.id,
        sha=info.sha,
        last_modified=_naive_utc(getattr(info, "last_modified", None)),
        created_at=_naive_utc(getattr(info, "created_at", None)),
        downloads=getattr(info, "downloads", None),
        likes=getattr(info, "likes", None),
        gated=_gated(getattr(info, "gated", None)),
        private=getattr(info, "private", None),
        pipeline_tag=getattr(info, "pipeline_tag", None),
        library_name=getattr(info, "library_name", None),
        tags=[t for t in getattr(info, "tags", None) or [] if isinstance(t, str)],
        base_models=bases,
        base_relation=relation,
        is_derivative=bool(bases),
        is_exemplar=info.id in exemplars,
        param_total=getattr(safetensors, "total", None),
        fetch_status="ok",
        error=None,
    )
    names = None if siblings is None else {s.rfilename for s in siblings}
    return Listed(info.id, info.sha, names, row)


def _missing_row(repo_id: str, kind: str, message: str, exemplars: set[str]) -> Listed:
    row = store.ModelRow(
        repo_id, None, None, None, None, None, None, None, None, None, [], [], None, False,
        repo_id in exemplars, None, kind, message,
    )
    return Listed(repo_id, None, None, row)


def list_scope(ctx: Context, watch: Watchlist, problems: list[str]) -> list[Listed]:
    """Every repo in scope, in watch-list order, each once."""
    exemplars = set(watch.exemplars)
    seen: dict[str, Listed] = {}
    for org in watch.orgs:
        tags = org.pipeline_tags if org.pipeline_tags is not None else watch.defaults.pipeline_tags
        min_dl = org.min_downloads if org.min_downloads is not None else watch.defaults.min_downloads
        limit = org.max_models if org.max_models is not None else watch.defaults.max_models
        server_tag = tags[0] if len(tags) == 1 else None
        try:
            infos = _call(
                ctx.pacer,
                lambda: list(
                    ctx.api.list_models(
                        author=org.author, pipeline_tag=server_tag, sort="downloads", limit=limit, expand=EXPAND
                    )
                ),
            )
        except RepoProblem as exc:
            problems.append(f"listing {org.author!r} failed: {exc}")
            continue
        for info in infos:
            if tags and getattr(info, "pipeline_tag", None) not in tags:
                continue
            if min_dl and (getattr(info, "downloads", None) or 0) < min_dl:
                continue
            seen.setdefault(info.id, to_listed(info, exemplars))
    for repo_id in [*watch.repos, *watch.exemplars]:
        if repo_id in seen:
            continue
        if not _REPO_ID.match(repo_id):
            seen[repo_id] = _missing_row(repo_id, "error", f"not a valid Hub repo id: {repo_id!r}", exemplars)
            continue
        try:
            info = _call(ctx.pacer, lambda: ctx.api.model_info(repo_id, expand=EXPAND))
            seen[repo_id] = to_listed(info, exemplars)
        except RepoProblem as exc:
            seen[repo_id] = _missing_row(repo_id, exc.kind, str(exc), exemplars)
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
) -> CrawlSummary:
    """Crawl the watch list's scope at `endpoint` and write one snapshot to the store at `db`."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise AtlasError("HF_HUB_OFFLINE is set: huggingface_hub then refuses every request, the local mirror's too. Unset it to crawl.")
    if concurrency < 1:
        raise AtlasError("--concurrency must be at least 1")
    watch, digest = load_watchlist(watchlist)
    if token is None:
        token = os.environ.get("HF_TOKEN") or False  # used, never stored or logged
    cache_dir = cache_dir or db.parent / "hf-cache"
    started = store.utc_now()
    clock = time.monotonic()
    con = store.connect(db)  # taken first: a second concurrent crawl fails before any request
    pacer = Pacer(sleep)
    _install_client(pacer, timeout_s)
    # the client logs every retry; our summary counts them instead of scrolling past the bar
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        ctx = Context(HfApi(endpoint=endpoint, token=token), endpoint, token, cache_dir, pacer)
        problems: list[str] = []
        listed = list_scope(ctx, watch, problems)
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
        fetched: dict[str, Fetched] = {}
        console = Console(stderr=True)
        with Progress(
            TextColumn("crawl"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=console, disable=not progress, transient=False,
        ) as bar:
            task = bar.add_task("", total=len(todo))
            with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="crawl") as pool:
                futures = {pool.submit(_fetch_or_problem, ctx, x, settled): x for x, settled in todo}
                try:
                    for fut in as_completed(futures):
                        item = futures[fut]
                        result = fut.result()
                        if isinstance(result, RepoProblem) and (item.repo_id, item.sha) in known:
                            item.row.side_file_error = str(result)  # its config is stored and read
                        elif isinstance(result, RepoProblem):
                            item.row.fetch_status, item.row.error = result.kind, str(result)
                        else:
                            fetched[item.repo_id] = result
                        bar.update(task, advance=1, description=item.repo_id[:60])
                except BaseException:
                    for f in futures:
                        f.cancel()
                    raise
        return _finish(con, watch, digest, listed, known, stored_errors, fetched, problems, pacer,
                       started, clock, endpoint_label or endpoint)
    finally:
        hf_logging.set_verbosity(verbosity)
        _restore_client()
        con.close()


def _fetch_or_problem(ctx: Context, item: Listed, settled: set[str] | None) -> Fetched | RepoProblem:
    """One repo's outcome; nothing a single repo does (a disk error, bytes no parser expected)
    may abort the whole crawl."""
    try:
        return fetch_repo(ctx, item, settled)
    except RepoProblem as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - any one repo's failure is recorded as its error, by design
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return RepoProblem("error", f"{type(exc).__name__}: {detail}")


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
    fp_rows: store.FingerprintRows = []
    for (repo, sha), entry in inputs.items():
        if (repo, sha) in stale and "config.json" in entry["files"]:
            fp_rows += [(repo, sha, RULE_VERSION, n, v, p) for n, v, p in fingerprint_stored(entry["files"], entry["weights"])]

    rows = [x.row for x in listed]
    count = lambda status: sum(1 for r in rows if r.fetch_status == status)  # noqa: E731
    summary_counts = dict(
        n_listed=len(rows),
        n_fetched=len(fetched),
        n_unchanged=sum(1 for x in listed if (x.repo_id, x.sha) in known and x.repo_id not in fetched),
        n_gated=count("gated"),
        n_missing=count("missing"),
        n_failed=count("error"),
    )
    status = "complete" if not problems else "partial"
    snapshot = store.SnapshotRow(
        started_at=started, finished_at=store.utc_now(), endpoint=endpoint_label,
        watchlist_digest=digest, status=status, rule_version=RULE_VERSION, n_requests=pacer.requests,
        n_rate_limited=pacer.rate_limited, problems="; ".join(problems) or None, **summary_counts,
    )
    snapshot_id = store.write_snapshot(con, snapshot, rows, files, weights, fp_rows, file_errors)
    return CrawlSummary(
        snapshot_id=snapshot_id, status=status, endpoint=endpoint_label, listed=summary_counts["n_listed"],
        fetched=summary_counts["n_fetched"], unchanged=summary_counts["n_unchanged"],
        gated=summary_counts["n_gated"], missing=summary_counts["n_missing"], failed=summary_counts["n_failed"],
        requests=pacer.requests, rate_limited=pacer.rate_limited, waited_s=round(pacer.waited_s, 3),
        elapsed_s=round(time.monotonic() - clock, 3), problems=problems,
    )


def refingerprint(db: Path) -> int:
    """Recompute every stored (repo_id, sha)'s fingerprints with the current rules; no network."""
    con = store.connect(db)
    try:
        inputs = store.load_inputs(con)
        rows: store.FingerprintRows = []
        for (repo, sha), entry in inputs.items():
            if "config.json" in entry["files"]:
                rows += [(repo, sha, RULE_VERSION, n, v, p) for n, v, p in fingerprint_stored(entry["files"], entry["weights"])]
        store.write_fingerprints(con, rows)
        return len({(r[0], r[1]) for r in rows})
    finally:
        con.close()


def iter_summary_lines(summary: CrawlSummary) -> Iterable[str]:
    yield (
        f"snapshot {summary.snapshot_id} ({summary.status}) from {summary.endpoint}: "
        f"listed {summary.listed}, fetched {summary.fetched}, unchanged {summary.unchanged}, "
        f"gated {summary.gated}, missing {summary.missing}, failed {summary.failed}"
    )
    yield (
        f"{summary.requests} requests, {summary.rate_limited} rate-limited (429), "
        f"{summary.waited_s:.1f} s waited, {summary.elapsed_s:.1f} s in all"
    )
    for problem in summary.problems:
        yield f"problem: {problem}"
