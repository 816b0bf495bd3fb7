"""The reported figures (atlas.evidence.reported) as the site shows them: their own table inside a
"reported" box, never beside a measurement."""

from __future__ import annotations

import html

from atlas.evidence.reported import Figure
from atlas.site.parts.mdsafe import Markdown, escape, table

HEADER = ["reported figure", "conditions as stated", "source, and when we read it"]


def _source(f: Figure) -> Markdown:
    link = f'<a href="{html.escape(f.url, quote=True)}">{escape(f.source)}</a>'
    return Markdown(f"{link}; read in {escape(f.read_in)} on {f.date_read.isoformat()}")


def section(figures: list[Figure], title: str = "Reported: published figures, not ours",
            folded: bool = False) -> Markdown:
    """The reported table inside its own "reported" box, so it can never be mistaken for (or
    merged into) the measured table; `folded`: the box starts closed (a page within its budget)."""
    intro = (
        "Figures as their sources state them, with the conditions the source gives. They are not "
        "measurements of the atlas, they are not comparable with each other or with the measured "
        "rows, and they never count as measured."
    )
    if not figures:
        return Markdown(f'!!! reported "{escape(title)}"\n    No published figure is on record here.\n')
    rows = [
        [Markdown(f"<strong>{escape(f.subject)}</strong>: {escape(f.figure)}"),
         escape(f.conditions()), _source(f)]
        for f in figures
    ]
    body = table(HEADER, rows).replace("\n", "\n    ")
    opener = "???" if folded else "!!!"
    return Markdown(f'{opener} reported "{escape(title)}"\n    {intro}\n\n    {body}\n')
