"""A JSON file an atlas command wrote (models.json, the export's manifest, the changelog's data),
read back through the pydantic model it was written from."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from atlas import AtlasError

M = TypeVar("M", bound=BaseModel)


# '<', '>' and '&' occur in JSON text only inside strings, so their \u escapes are always valid JSON
# of the same value. Written so, a file holding hostile record text (a file name with a tag in it)
# stays inert wherever a reader pastes it: into an HTML <script>, a page, a Markdown card.
_HTML_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def html_safe(json_text: str) -> str:
    """JSON text with '<', '>' and '&' written as \\u escapes: the same data, no markup."""
    return json_text.translate(_HTML_SAFE)


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
