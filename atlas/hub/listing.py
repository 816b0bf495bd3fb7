"""The listing: the watch list's scope as repos, one `list_models` per pipeline tag per org (sorted
by downloads, paged only until they fall under the org's minimum), plus `model_info` for the
explicit repos; each repo's hub metadata becomes its store row."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from atlas.store import db as store
from atlas.hub.client import paging
from atlas.hub.context import Context, call
from atlas.hub.errors import ErrorKind, RepoProblem
from atlas.hub.fetch import REPO_ID, SHA, Listed
from atlas.hub.watchlist import Defaults, OrgScope, Watchlist

# What the model listing accepts (not `baseModels`: only repo info does); repo info adds it.
LISTING_EXPAND = [
    "sha", "lastModified", "createdAt", "downloads", "likes", "gated", "private", "disabled",
    "pipeline_tag", "library_name", "tags", "cardData", "siblings", "safetensors",
]
INFO_EXPAND = [*LISTING_EXPAND, "baseModels"]
INT64_MAX = 2**63 - 1

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


def _base_revision(info: Any) -> str | None:
    """The base commit the card says this repo matches (`base_model_revision`: a sidecar or drafter
    trained against one revision of a base whose weights were replaced later), when it is a commit sha."""
    card = getattr(info, "card_data", None)
    value = card.get("base_model_revision") if card is not None and hasattr(card, "get") else None
    return value if isinstance(value, str) and SHA.fullmatch(value) else None


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
        sha=sha if isinstance(sha, str) and SHA.fullmatch(sha) else None,
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
        base_revision=_base_revision(info),
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
        repo_id in exemplars, None, problem.kind.value, str(problem),
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
            with paging(ctx.bounds) as guard:  # a fresh guard per attempt
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
            return seen, out

        seen, infos = call(ctx, one_listing)
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
        if not REPO_ID.fullmatch(repo_id):
            problem = RepoProblem(ErrorKind.ERROR, f"not a valid Hub repo id: {repo_id!r}", permanent=True)
            seen[repo_id] = _missing_row(repo_id, problem, exemplars)
            continue
        try:
            info = call(ctx, lambda repo_id=repo_id: ctx.api.model_info(repo_id, expand=INFO_EXPAND))
            seen[repo_id] = to_listed(info, exemplars, ctx.token)
        except RepoProblem as exc:
            seen[repo_id] = _missing_row(repo_id, exc, exemplars)
    return list(seen.values())
