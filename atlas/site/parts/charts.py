"""Inline SVG charts, written at build time so the site needs no chart library at view time.

Each chart is one figure: an HTML title above, the SVG plot, an HTML legend below. Title and
legend are HTML so they reflow on a phone; only axes, ticks and value labels are SVG. The SVG is
drawn in a narrow viewBox with large text, so that scaled down to a 390 px phone the labels stay
about 10 px tall (the browser test measures this). Series colours come from CSS classes
(atlas-s0 … atlas-s7, a colour-blind-safe palette in atlas.css), never inline styles.

Labels come from the store and from measurement records (dates, counts, ids, workload names), and
every one goes through `_text`, mdsafe's escaping: numeric references for every character HTML or
Markdown gives a meaning to. HTML escaping alone is not enough: the figure is one raw HTML block
that Python-Markdown passes through untouched at the top level, but inside a collapsible box
(pymdownx.details) the block is Markdown again, and `[x](javascript:...)` in a label became a
live link."""

from __future__ import annotations

import math
from pydantic import BaseModel

from atlas.site.parts.mdsafe import Markdown, escape as _text
from atlas.site.parts.numbers import tick

WIDTH = 440
HEIGHT = 250
FONT = 14  # px in viewBox units; in a 330 px column (a phone, inside a box) about 10.5 px
_TOP, _BOTTOM, _LEFT, _RIGHT = 22, 44, 52, 14
N_COLOURS = 8


class Bar(BaseModel):
    label: str
    value: float
    # Text shown above the bar (e.g. "3 of 41"); defaults to the value.
    annotation: str | None = None


class Point(BaseModel):
    x: float
    y: float
    lo: float | None = None  # optional range drawn as a whisker
    hi: float | None = None


class Series(BaseModel):
    name: str
    points: list[Point]


class Stack(BaseModel):
    """One layer of a stacked bar chart: a value per category, in category order."""

    name: str
    values: list[float]


def _figure(title: str, svg: list[str], legend: list[str], note: str | None = None) -> Markdown:
    parts = [
        '<div class="atlas-chart">',
        f'<p class="atlas-chart-title">{_text(title)}</p>',
        *svg,
    ]
    if legend:
        items = "".join(
            f'<span class="atlas-chart-key"><span class="atlas-chart-swatch atlas-s{i % N_COLOURS}">'
            f"</span>{_text(name)}</span>"
            for i, name in enumerate(legend)
        )
        parts.append(f'<p class="atlas-chart-legend">{items}</p>')
    if note:
        parts.append(f'<p class="atlas-chart-note">{_text(note)}</p>')
    parts.append("</div>")
    # No blank line inside: Markdown would end the raw HTML block there.
    return Markdown("".join(parts))


def _svg_open(title: str) -> str:
    t = _text(title)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="atlas-chart-svg" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" aria-label="{t}">'
        f"<title>{t}</title>"
    )


def _ticks(top: float, counts: bool = False) -> int:
    """Gridlines at round steps: one per unit when the axis counts a few whole things (no "0.5
    models"); else 4 or 5 so that a step is 1, 2, 2.5 or 5 times a power of ten."""
    if counts and top == int(top) and 1 <= top <= 4:
        return int(top)
    mantissa = top / 10 ** math.floor(math.log10(top)) if top > 0 else 1.0
    return 5 if round(mantissa, 6) in (2.5, 5.0) else 4


def _axes(y_label: str, y_top: float, y_bottom: float = 0.0, ticks: int = 4) -> list[str]:
    plot_h = HEIGHT - _TOP - _BOTTOM
    base = _TOP + plot_h
    mid = _TOP + plot_h / 2
    out = [
        f'<line class="atlas-chart-axis" x1="{_LEFT}" y1="{base}" x2="{WIDTH - _RIGHT}" y2="{base}"/>',
        f'<text class="atlas-chart-label" x="{FONT}" y="{mid:.1f}" '
        f'transform="rotate(-90 {FONT} {mid:.1f})" text-anchor="middle">{_text(y_label)}</text>',
    ]
    for i in range(ticks + 1):
        v = y_bottom + (y_top - y_bottom) * i / ticks
        y = base - plot_h * i / ticks
        if i:
            out.append(f'<line class="atlas-chart-grid" x1="{_LEFT}" y1="{y:.1f}" x2="{WIDTH - _RIGHT}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="atlas-chart-tick" x="{_LEFT - 4}" y="{y + FONT / 3:.1f}" '
            f'text-anchor="end">{_text(tick(v))}</text>'
        )
    return out


def _x_labels(labels: list[tuple[float, str]]) -> list[str]:
    """Category or tick labels under the axis; every n-th one when they would collide, slanted
    when even that is crowded."""
    if not labels:
        return []
    plot_w = WIDTH - _LEFT - _RIGHT
    longest = max(len(text) for _, text in labels)
    room = plot_w / len(labels)
    needed = 0.6 * FONT * longest + 4
    slant = needed > room
    step = 1 if not slant else max(1, math.ceil((FONT * 1.3) / room))
    base = HEIGHT - _BOTTOM
    out = []
    for i, (x, text) in enumerate(labels):
        if i % step and i != len(labels) - 1:
            continue
        if slant:
            out.append(
                f'<text class="atlas-chart-label" x="{x:.1f}" y="{base + FONT + 2}" text-anchor="end" '
                f'transform="rotate(-35 {x:.1f} {base + FONT + 2})">{_text(text)}</text>'
            )
        else:
            out.append(
                f'<text class="atlas-chart-label" x="{x:.1f}" y="{base + FONT + 4}" '
                f'text-anchor="middle">{_text(text)}</text>'
            )
    return out


def bar_chart(title: str, bars: list[Bar], y_label: str, y_max: float | None = None,
              note: str | None = None) -> Markdown:
    """A vertical bar chart. y_max fixes the axis top (e.g. 100 for percentages)."""
    if not bars:
        raise ValueError("a chart needs at least one bar")
    top = y_max if y_max is not None else _nice(max(max(b.value for b in bars), 1.0))
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM
    slot = plot_w / len(bars)
    bar_w = min(48.0, slot * 0.7)
    counts = all(float(b.value).is_integer() for b in bars)
    svg = [_svg_open(title), *_axes(y_label, top, ticks=_ticks(top, counts))]
    centres = []
    for i, bar in enumerate(bars):
        h = 0.0 if top <= 0 else plot_h * max(bar.value, 0.0) / top
        x = _LEFT + slot * i + (slot - bar_w) / 2
        y = _TOP + plot_h - h
        cx = x + bar_w / 2
        centres.append((cx, bar.label))
        note_text = bar.annotation if bar.annotation is not None else tick(bar.value)
        svg.append(
            f'<rect class="atlas-chart-bar atlas-s0" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
            f'height="{h:.1f}"><title>{_text(bar.label)}: {_text(note_text)}</title></rect>'
        )
        if len(bars) <= 12:
            svg.append(
                f'<text class="atlas-chart-value" x="{cx:.1f}" y="{max(y - 4, FONT):.1f}" '
                f'text-anchor="middle">{_text(note_text)}</text>'
            )
    svg += _x_labels(centres)
    svg.append("</svg>")
    return _figure(title, svg, [], note)


def stacked_bar_chart(title: str, categories: list[str], stacks: list[Stack], y_label: str,
                      note: str | None = None) -> Markdown:
    """Bars per category, each split into layers (one colour per stack, legend below)."""
    if not categories or not stacks:
        raise ValueError("a stacked chart needs categories and stacks")
    if any(len(s.values) != len(categories) for s in stacks):
        raise ValueError("every stack needs one value per category")
    totals = [sum(s.values[i] for s in stacks) for i in range(len(categories))]
    top = _nice(max(max(totals), 1.0))
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM
    slot = plot_w / len(categories)
    bar_w = min(40.0, slot * 0.75)
    counts = all(float(v).is_integer() for st in stacks for v in st.values)
    svg = [_svg_open(title), *_axes(y_label, top, ticks=_ticks(top, counts))]
    centres = []
    for i, cat in enumerate(categories):
        x = _LEFT + slot * i + (slot - bar_w) / 2
        y = _TOP + plot_h
        for j, stack in enumerate(stacks):
            v = stack.values[i]
            if v <= 0:
                continue
            h = plot_h * v / top
            y -= h
            svg.append(
                f'<rect class="atlas-chart-bar atlas-s{j % N_COLOURS}" x="{x:.1f}" y="{y:.1f}" '
                f'width="{bar_w:.1f}" height="{h:.1f}"><title>{_text(cat)} · '
                f"{_text(stack.name)}: {_text(tick(v))}</title></rect>"
            )
        centres.append((x + bar_w / 2, cat))
        if len(categories) <= 12:
            svg.append(
                f'<text class="atlas-chart-value" x="{x + bar_w / 2:.1f}" y="{max(y - 4, FONT):.1f}" '
                f'text-anchor="middle">{_text(tick(totals[i]))}</text>'
            )
    svg += _x_labels(centres)
    svg.append("</svg>")
    return _figure(title, svg, [s.name for s in stacks], note)


def line_chart(title: str, series: list[Series], x_label: str, y_label: str,
               x_ticks: list[tuple[float, str]], y_max: float | None = None, y_min: float = 0.0,
               reference: float | None = None, note: str | None = None) -> Markdown:
    """Lines with markers, one colour per series; optional lo–hi whiskers per point and a dashed
    horizontal reference line (e.g. speed-up 1 = no gain)."""
    points = [p for s in series for p in s.points]
    if not points or not x_ticks:
        raise ValueError("a line chart needs points and x ticks")
    highs = [p.hi if p.hi is not None else p.y for p in points] + ([reference] if reference else [])
    top = y_max if y_max is not None else _nice(max(highs))
    xs = [x for x, _ in x_ticks]
    x_lo, x_hi = min(xs), max(xs)
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM
    pad = plot_w * 0.08

    def px(x: float) -> float:
        span = (x_hi - x_lo) or 1.0
        return _LEFT + pad + (plot_w - 2 * pad) * (x - x_lo) / span

    def py(y: float) -> float:
        span = (top - y_min) or 1.0
        return _TOP + plot_h * (1 - (min(max(y, y_min), top) - y_min) / span)

    svg = [_svg_open(title), *_axes(y_label, top, y_min, ticks=_ticks(top - y_min))]
    if reference is not None and y_min <= reference <= top:
        svg.append(
            f'<line class="atlas-chart-reference" x1="{_LEFT}" y1="{py(reference):.1f}" '
            f'x2="{WIDTH - _RIGHT}" y2="{py(reference):.1f}"/>'
        )
    n = max(len(series), 1)
    for j, s in enumerate(series):
        cls = f"atlas-s{j % N_COLOURS}"
        # series side by side by a few px, so equal values and their whiskers stay visible
        shift = (j - (n - 1) / 2) * min(4.0, 24.0 / n)
        pts = sorted(s.points, key=lambda p: p.x)
        if len(pts) > 1:
            path = " ".join(f"{px(p.x) + shift:.1f},{py(p.y):.1f}" for p in pts)
            svg.append(f'<polyline class="atlas-chart-line {cls}" points="{path}"/>')
        for p in pts:
            x = px(p.x) + shift
            if p.lo is not None and p.hi is not None:
                svg.append(
                    f'<line class="atlas-chart-whisker {cls}" x1="{x:.1f}" y1="{py(p.lo):.1f}" '
                    f'x2="{x:.1f}" y2="{py(p.hi):.1f}"/>'
                )
            label = f"{s.name}: {tick(p.y)}"
            if p.lo is not None and p.hi is not None:
                label += f" ({tick(p.lo)}–{tick(p.hi)})"
            svg.append(
                f'<circle class="atlas-chart-dot {cls}" cx="{x:.1f}" cy="{py(p.y):.1f}" r="3.5">'
                f"<title>{_text(label)}</title></circle>"
            )
    svg += _x_labels([(px(x), text) for x, text in x_ticks])
    svg.append(
        f'<text class="atlas-chart-label" x="{WIDTH - _RIGHT}" y="{HEIGHT - 4}" '
        f'text-anchor="end">{_text(x_label)}</text>'
    )
    svg.append("</svg>")
    return _figure(title, svg, [s.name for s in series], note)


class ThresholdRow(BaseModel):
    """One row of a threshold chart: a label, the value needed (a marker) and measured values (dots)."""

    label: str
    needed: float
    values: list[tuple[str, float]]  # (name, value)


def threshold_chart(title: str, rows: list[ThresholdRow], x_label: str, x_max: float = 1.0,
                    note: str | None = None) -> Markdown:
    """One horizontal scale per row from 0 to x_max: the part at or above the row's needed value
    shaded (where it pays), a marker at the needed value, a dot per measured value."""
    if not rows:
        raise ValueError("a threshold chart needs at least one row")
    row_h, label_h = 46, FONT + 4
    height = _TOP + len(rows) * (row_h + label_h) + 40
    left, right = 16, WIDTH - _RIGHT

    def px(v: float) -> float:
        return left + (right - left) * min(max(v, 0.0), x_max) / x_max

    svg = [_svg_open(title).replace(f'0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}"',
                                    f'0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}"')]
    y = _TOP
    for row in rows:
        svg.append(f'<text class="atlas-chart-label" x="{left}" y="{y + FONT:.1f}">{_text(row.label)}</text>')
        base = y + label_h + row_h / 2
        svg.append(f'<rect class="atlas-chart-pays" x="{px(row.needed):.1f}" y="{base - 10:.1f}" '
                   f'width="{px(x_max) - px(row.needed):.1f}" height="20"/>')
        svg.append(f'<line class="atlas-chart-axis" x1="{left}" y1="{base:.1f}" x2="{right}" y2="{base:.1f}"/>')
        svg.append(f'<line class="atlas-chart-reference" x1="{px(row.needed):.1f}" y1="{base - 14:.1f}" '
                   f'x2="{px(row.needed):.1f}" y2="{base + 14:.1f}"><title>needed: {_text(tick(row.needed))}'
                   f'</title></line>')
        for name, v in row.values:
            svg.append(f'<circle class="atlas-chart-dot atlas-s0" cx="{px(v):.1f}" cy="{base:.1f}" '
                       f'r="4.5"><title>{_text(name)}: {_text(tick(v))}</title></circle>')
        y += row_h + label_h
    for v in (0.0, x_max / 2, x_max):
        svg.append(f'<text class="atlas-chart-tick" x="{px(v):.1f}" y="{height - 24}" '
                   f'text-anchor="{"start" if v == 0 else "end" if v == x_max else "middle"}">{_text(tick(v))}</text>')
    svg.append(f'<text class="atlas-chart-label" x="{WIDTH / 2:.0f}" y="{height - 4}" '
               f'text-anchor="middle">{_text(x_label)}</text>')
    svg.append("</svg>")
    return _figure(title, svg, [], note)


def _nice(v: float) -> float:
    """A round axis top at or above v (1, 2, 2.5, 5 × 10^n)."""
    if v <= 0:
        return 1.0
    if 1 <= v <= 4 and float(v).is_integer():
        return float(v)  # a few whole things: the axis ends at the largest
    mag = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= v:
            return m * mag
    return 10 * mag
