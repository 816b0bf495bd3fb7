"""Escaping untrusted text (model ids, config strings) for Markdown that mkdocs turns into HTML.

Every character that could end a table cell, open a code span, emphasis, a link, an attribute
list (`{: onclick=...}`) or an HTML tag becomes a numeric character reference. Python-Markdown
passes references through untouched and the browser shows the original character, so the value
reads the same but can neither break a table nor inject markup. Line breaks become spaces: a
newline inside a table row would end the row. Bidi controls and zero-width characters are
shown as their code points, so an id cannot reorder the text around it or pass for another id.
"""

from __future__ import annotations

import re
from typing import Iterable
from urllib.parse import quote

# A translate table replaces each character once, so `&` needs no special ordering.
_ENTITIES = {c: f"&#{ord(c)};" for c in "&<>\"'|`*_[]{}\\~#"}
_LINE_BREAKS = re.compile(r"[\r\n\u0085\u2028\u2029\x0b\x0c]+")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
# Bidi overrides/isolates/marks and zero-width characters: invisible, yet they reorder what is shown
# or make two different ids look the same. Each is shown as its code point, e.g. [U+202E].
_INVISIBLE = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
_TABLE = str.maketrans(_ENTITIES)


class Markdown(str):
    """Markdown that is already safe to emit as is (built by this module from escaped parts)."""


def escape(value: object) -> Markdown:
    """Untrusted value -> inline Markdown text that renders as exactly that text."""
    if isinstance(value, Markdown):
        return value
    text = _CONTROL.sub("", _LINE_BREAKS.sub(" ", str(value)))
    text = _INVISIBLE.sub(lambda m: f"[U+{ord(m.group()):04X}]", text)
    return Markdown(text.translate(_TABLE))


def code(value: object) -> Markdown:
    """Untrusted value shown in a monospace span. An HTML <code> element instead of backticks,
    because a backtick inside the value would end a Markdown code span early."""
    return Markdown(f"<code>{escape(value)}</code>")


# What a URL may keep as it is; every other character is percent-encoded, so a URL a record cites
# can neither close its link nor start markup.
_URL_SAFE = "/:?#&=%@+,;~"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def link(text: object, url: str) -> Markdown:
    """A Markdown link to an untrusted URL: the text escaped, the URL percent-encoded. A URL with a
    scheme other than http(s) (javascript:, data:) is no link: the text is shown alone."""
    scheme = _SCHEME.match(url)
    if not scheme or scheme.group().lower() not in ("http:", "https:"):
        return escape(text)
    return Markdown(f"[{escape(text)}]({quote(url, safe=_URL_SAFE)})")


def file_link(text: object, path: str) -> Markdown:
    """A Markdown link to a file of the site by its relative path, whatever characters its name
    holds: each is percent-encoded but '/', so the link reaches exactly that file and ends there."""
    return Markdown(f"[{escape(text)}]({quote(path, safe='/')})")


def cell(value: object) -> Markdown:
    """One table cell: None shows as an em dash so an empty cell is never ambiguous."""
    if value is None:
        return Markdown("—")
    return escape(value)


def table(headers: Iterable[str], rows: Iterable[Iterable[object]]) -> Markdown:
    """A Markdown pipe table. Cells that are `Markdown` are trusted (built here); others are escaped.
    Columns whose header starts with '#' are right-aligned numbers (the '#' is dropped)."""
    heads = list(headers)
    aligns = ["---:" if h.startswith("#") else "---" for h in heads]
    names = [escape(h.removeprefix("#")) for h in heads]
    lines = ["| " + " | ".join(names) + " |", "| " + " | ".join(aligns) + " |"]
    for row in rows:
        cells = [c if isinstance(c, Markdown) else cell(c) for c in row]
        if len(cells) != len(heads):
            raise ValueError(f"row has {len(cells)} cells, table has {len(heads)} columns")
        lines.append("| " + " | ".join(cells) + " |")
    return Markdown("\n".join(lines))
