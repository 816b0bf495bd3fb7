"""Inline SVG bar charts, written at build time so the site needs no chart library at view time.

Labels come from the store (dates, counts) and are escaped as XML text; the chart is wrapped in a
<div> so Python-Markdown passes the whole block through as raw HTML without touching its text."""

from __future__ import annotations

from html import escape as xml_escape

from pydantic import BaseModel

from atlas.site.mdsafe import Markdown

WIDTH = 640
HEIGHT = 260
# _TOP leaves room for the title plus the value label above the tallest bar.
_TOP, _BOTTOM, _LEFT, _RIGHT = 42, 46, 44, 12


class Bar(BaseModel):
    label: str
    value: float
    # Text shown above the bar (e.g. "3 of 41"); defaults to the value.
    annotation: str | None = None


def bar_chart(title: str, bars: list[Bar], y_label: str, y_max: float | None = None) -> Markdown:
    """A vertical bar chart. y_max fixes the axis top (e.g. 100 for percentages)."""
    if not bars:
        raise ValueError("a chart needs at least one bar")
    top = y_max if y_max is not None else max(max(b.value for b in bars), 1.0)
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM
    slot = plot_w / len(bars)
    bar_w = min(56.0, slot * 0.7)
    t = xml_escape(title)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="atlas-chart-svg" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" aria-label="{t}">',
        f"<title>{t}</title>",
        f'<text class="atlas-chart-title" x="{_LEFT}" y="16">{t}</text>',
        f'<line class="atlas-chart-axis" x1="{_LEFT}" y1="{_TOP + plot_h}" '
        f'x2="{WIDTH - _RIGHT}" y2="{_TOP + plot_h}"/>',
        f'<text class="atlas-chart-label" x="4" y="{_TOP + plot_h / 2:.1f}" '
        f'transform="rotate(-90 10 {_TOP + plot_h / 2:.1f})" text-anchor="middle">'
        f"{xml_escape(y_label)}</text>",
    ]
    for i, bar in enumerate(bars):
        h = 0.0 if top <= 0 else plot_h * max(bar.value, 0.0) / top
        x = _LEFT + slot * i + (slot - bar_w) / 2
        y = _TOP + plot_h - h
        cx = x + bar_w / 2
        note = bar.annotation if bar.annotation is not None else _number(bar.value)
        parts += [
            f'<rect class="atlas-chart-bar" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
            f'height="{h:.1f}"><title>{xml_escape(bar.label)}: {xml_escape(note)}</title></rect>',
            f'<text class="atlas-chart-value" x="{cx:.1f}" y="{y - 4:.1f}" '
            f'text-anchor="middle">{xml_escape(note)}</text>',
            f'<text class="atlas-chart-label" x="{cx:.1f}" y="{_TOP + plot_h + 16}" '
            f'text-anchor="middle">{xml_escape(bar.label)}</text>',
        ]
    parts.append("</svg>")
    # No blank line inside: Markdown would end the raw HTML block there.
    return Markdown('<div class="atlas-chart">' + "".join(parts) + "</div>")


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.1f}"
