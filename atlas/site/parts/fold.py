"""Module pages fold a section's detail into a closed "More:" box with `{% call more("title") %}
… {% endcall %}`. The box is a `<details markdown="1">` block, which Python-Markdown reads as
Markdown inside HTML: there a line indented by four spaces is a code block, so a box opened in the
middle of an admonition (whose body is indented) showed its own Markdown source as code. The
helper writes the box and refuses one whose body would render a code block that no fence in it
asked for, naming the box, so the build fails instead of the page."""

from __future__ import annotations

import re
from typing import Callable

import markdown

from atlas import AtlasError
from atlas.site.parts.mdsafe import Markdown, escape

# the site's Markdown extensions that change block structure (site/mkdocs.yml)
EXTENSIONS = ["tables", "admonition", "md_in_html", "pymdownx.details", "pymdownx.superfences"]
_FENCE = re.compile(r"^\s*(```|~~~)", re.M)
_CODE_BLOCK = re.compile(r"<pre\b")


def fenced_blocks(source: str) -> int:
    """How many code blocks the Markdown asks for: fences open and close in pairs."""
    return len(_FENCE.findall(source)) // 2


def unasked_code_blocks(source: str) -> int:
    """Code blocks the rendered Markdown holds beyond those its fences asked for (indented lines
    Markdown took for code)."""
    html = markdown.markdown(source, extensions=EXTENSIONS)
    return len(_CODE_BLOCK.findall(html)) - fenced_blocks(source)


def more(title: str, caller: Callable[[], str]) -> Markdown:
    """A closed box titled "More: <title>" around what the call block holds."""
    body = caller().strip("\n")
    if not body.strip():
        raise AtlasError(f"the box 'More: {title}' is empty")
    extra = unasked_code_blocks(body)
    if extra > 0:
        raise AtlasError(
            f"the box 'More: {title}' would show {extra} code block(s) its source did not ask for: "
            "its body has lines indented by four spaces (a box opened inside an admonition?); "
            "close the admonition before the box or put the whole admonition in it")
    return Markdown(f'<details class="atlas-more" markdown="1">\n<summary>More: {escape(title)}</summary>\n\n'
                    f"{body}\n\n</details>")
