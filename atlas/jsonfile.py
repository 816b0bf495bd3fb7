"""A JSON file an atlas command wrote (models.json, the export's manifest, the changelog's data),
read back through the pydantic model it was written from."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from atlas import AtlasError

M = TypeVar("M", bound=BaseModel)


def read_written(path: Path, model: type[M], rewrite: str) -> M | None:
    """The file as `model`, or None when it is absent. A file another version of the atlas wrote
    (or one edited by hand) is one error line that names the command which writes it afresh,
    `rewrite`, since the reader cannot mend it."""
    if not path.exists():
        return None
    try:
        return model.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # pydantic's ValidationError among them
        raise AtlasError(f"{path} does not match this version; run `{rewrite}` again: {exc}") from None
