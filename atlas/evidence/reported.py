"""The "reported" claim level (evidence/reported.toml): figures other people published about MTP
decoding, each with the conditions its source states, the source with section or page, and the
date it was read. Validated at load, like the servable matrix, so a missing condition or a
non-https link fails loudly.

Reported figures are never measurements: the site renders them in their own table, inside a
"reported" box (atlas.site.parts.reported), and the export in their own file, never beside a measured cell.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from atlas.evidence.curated import load_toml

# A plain https URL: no spaces, quotes, brackets or angle brackets, so it cannot leave an href.
# Both are used with fullmatch: an anchored `$` would also match before a final newline.
_URL = re.compile(r"https://[A-Za-z0-9.-]+(?:/[A-Za-z0-9._~:/?#@!$&*+,;=%-]*)?")
_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,79}")


class Figure(BaseModel):
    """One published figure. Every condition is required: a source that does not state one says
    so ("not stated"), so a reader can tell an unknown from a forgotten field."""

    model_config = ConfigDict(extra="forbid")

    id: str
    subject: str = Field(min_length=1)
    models: list[str] = []  # Hub repo ids the figure is about (links it to per-model pages)
    metric: Literal["acceptance", "speed-up", "accepted length", "throughput", "quality"]
    figure: str = Field(min_length=1)
    draft_tokens: str = Field(min_length=1)
    engine: str = Field(min_length=1)
    hardware: str = Field(min_length=1)
    batch: str = Field(min_length=1)
    workload: str = Field(min_length=1)
    source: str = Field(min_length=1)
    url: str
    read_in: str = Field(min_length=1)  # what text we actually read: the source, or a verbatim quote
    date_read: dt.date

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.fullmatch(value):
            raise ValueError("id: lower-case letters, digits and '-', at most 80 characters")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not _URL.fullmatch(value):
            raise ValueError(f"url must be a plain https:// address, got {value!r}")
        return value

    def conditions(self) -> str:
        return (
            f"draft tokens: {self.draft_tokens}; engine: {self.engine}; hardware: {self.hardware}; "
            f"batch: {self.batch}; workload: {self.workload}"
        )


class Reported(BaseModel):
    model_config = ConfigDict(extra="forbid")

    figure: list[Figure] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "Reported":
        ids = [f.id for f in self.figure]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate figure ids: {', '.join(dupes)}")
        return self

    def about(self, repo_id: str) -> list[Figure]:
        return [f for f in self.figure if repo_id in f.models]


def load(path: Path) -> Reported:
    return load_toml(path, Reported, "reported figures")
