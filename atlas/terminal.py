"""Text a stranger wrote, made safe to print: a repo's config string, a record's field or a query's
cell reaches a terminal through `safe`, so it can neither drive the terminal (ESC and CSI clear
the screen, OSC retitles the window or writes the clipboard, BEL, NUL) nor reorder what is shown
around it (bidi overrides and isolates). Each such character is shown escaped, as Python writes it
(`\\x1b`, `\\u202e`), on a terminal and in a pipe alike. Newlines and tabs stay: our own messages
hold them, and neither moves the cursor back over text already shown.

CSV, HTML, Markdown and JSON have escaping of their own (the export, the site); this is only for
what the command line prints.
"""

from __future__ import annotations

import re

import click

# C0 controls but tab and newline, DEL, C1 controls; bidi embeddings, overrides and isolates, the
# left-to-right / right-to-left marks and the Arabic letter mark.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """`text` with every character that could drive or reorder a terminal shown escaped."""
    return _UNSAFE.sub(_escaped, text)


def echo(text: str = "", err: bool = False, fg: str | None = None) -> None:
    """click.echo (click.secho with `fg`) of `text` made safe: the one way the command line prints."""
    click.secho(safe(text), err=err, fg=fg)
