"""The watch list: the crawl's scope (orgs, filters, explicit repos, exemplars), read from TOML."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from atlas import AtlasError

DEFAULT_WATCHLIST = Path(__file__).with_name("watchlist.toml")


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
