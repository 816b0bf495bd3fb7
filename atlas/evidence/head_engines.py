"""Which engines use the MTP head, per family (evidence/head_engines.toml): a reported-level table of
public PRs and source files, dated, each row with its link. Kept beside the support matrix and never
mixed with measured figures: it says what a PR or source file states, not what the atlas ran."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from atlas.evidence.curated import load_toml

FILE_NAME = "head_engines.toml"
NOT_STATED = "not stated"


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engine: str = Field(min_length=1)
    family: str = Field(min_length=1)
    what: str = Field(min_length=1)
    link: str = Field(pattern=r"^https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/(pull/\d+|blob/[0-9a-f]{7,40}/\S+)$")
    state: Literal["merged", "in tree", "released", "open", "closed", "not stated"] = NOT_STATED
    when: str = Field(default=NOT_STATED, pattern=r"^(\d{4}-\d{2}(-\d{2})?|not stated)$")  # the PR's date as the sources give it
    first: str = NOT_STATED  # the first version or build that has it


class HeadEngines(BaseModel):
    model_config = ConfigDict(extra="forbid")

    date: dt.date  # when the sources were read
    gaps: list[str] = []  # engines asked about with no source read
    row: list[Row] = Field(min_length=1)


def load(path: Path) -> HeadEngines:
    return load_toml(path, HeadEngines, "head-engines table")


def beside(servable_path: Path) -> HeadEngines | None:
    """The table kept beside a support matrix file, or None where there is none (a folder holding
    only a matrix of its own)."""
    path = servable_path.parent / FILE_NAME
    return load(path) if path.is_file() else None
