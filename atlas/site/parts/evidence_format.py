"""How the evidence file shows a revision and its date (a Hub commit after a live crawl, the mirror
folder's content hash after a mirror crawl), a config key, and a claim level's guardrail box."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import quote

from atlas.hub.local.mirror import MIRROR_PREFIX
from atlas.site.parts.evidence_file import Facts
from atlas.site.parts.mdsafe import Markdown, escape


def date_text(value: dt.datetime | dt.date | None) -> str:
    return value.strftime("%Y-%m-%d") if value is not None else "—"


def day_cell(value: dt.datetime | dt.date | None) -> Markdown:
    """A date in a table cell, never broken across lines."""
    return Markdown(f'<span class="atlas-nowrap">{date_text(value)}</span>')


def key_cell(value: str | None) -> Markdown:
    """A config key or weight-name pattern in a cell: breakable after its dots and underscores
    only, so a narrow column wraps it between words instead of letter by letter."""
    if not value:
        return Markdown("—")
    text = str(escape(value))
    for sep in (".", "&#95;", "/"):
        text = text.replace(sep, sep + "<wbr>")
    return Markdown(f"<code>{text}</code>")


def capital(text: str) -> str:
    return text[:1].upper() + text[1:]


class Revisions:
    """How a revision and its date are shown. The revision (one name for it everywhere): after a
    live crawl a Hub commit, linked to the Hub; after a mirror crawl the mirror folder's content
    hash, which is no Hub commit and links nowhere. The date: after a live crawl the day it was
    crawled; after a mirror crawl the mirror's own date (the day its files were fixed), since
    crawling the same files again on a later day does not make them newer."""

    header = "revision"

    def __init__(self, snap: dict[str, Any] | None, mirror_date: dt.date | None = None) -> None:
        endpoint = (snap or {}).get("endpoint") or ""
        self.mirror = endpoint.startswith(MIRROR_PREFIX)
        self.endpoint = endpoint.rstrip("/") if endpoint.startswith(("http://", "https://")) else None
        self.mirror_date = mirror_date if self.mirror else None
        self.date_header = "data of" if self.mirror_date else "crawled"

    def day(self, crawled: dt.datetime | dt.date | None) -> Markdown:
        return day_cell(self.mirror_date or crawled)

    def stamp(self, facts: Facts) -> str:
        """The snapshot as prose: "snapshot #1, crawled D", or for a mirror "mirror crawl #1 of
        D1 (data of D2)"."""
        if not self.mirror:
            return f"snapshot #{facts.snapshot_id}, crawled {facts.snapshot_date}"
        data = f" (data of {facts.data_date})" if self.mirror_date else ""
        return f"mirror crawl #{facts.snapshot_id} of {facts.snapshot_date}{data}"

    def cell(self, repo_id: str, revision: str | None) -> Markdown:
        # 12 hex digits identify a commit unambiguously in practice and keep the tables readable.
        if not revision:
            return Markdown("—")
        short = Markdown(f'<code class="atlas-rev">{escape(revision[:12])}</code>')
        if self.mirror or self.endpoint is None:
            return short
        href = f"{self.endpoint}/{quote(repo_id, safe='/')}/tree/{quote(revision, safe='')}"
        return Markdown(f'<a href="{escape(href)}" title="{escape(revision)}">{short}</a>')


def guardrail(kind: str, title: str, text: str) -> str:
    # Custom admonition types (declared/shipped/servable/measured) are styled in atlas.css.
    return f'!!! {kind} "{title}"\n    {text}\n'


def indent(text: str) -> str:
    return "\n".join(("    " + line) if line else "" for line in text.splitlines())
