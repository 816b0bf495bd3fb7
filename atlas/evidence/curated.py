"""Curated data files (TOML checked in under evidence/) read into pydantic models, so a typo or a
missing field fails loudly with the file's name instead of silently matching nothing."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from atlas import AtlasError

M = TypeVar("M", bound=BaseModel)


def load_toml(path: Path, model: type[M], what: str) -> M:
    """`what` names the file in errors ("support matrix", "reported figures")."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AtlasError(f"{what} not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise AtlasError(f"{what} {path} is not valid TOML: {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise AtlasError(f"{what} {path}: malformed: {exc}") from None
