"""Module 8's measured charts and its folded boxes, from records built here through the records
module (test_measured_answer's builders): each chart's figures recomputed independently of the
chart code, and the box helper refusing a body Markdown would turn into a code block."""

from __future__ import annotations

import re

import pytest
from measured_helpers import GAIN, LOSS, make_run as _run

from atlas import AtlasError
from atlas.site.parts import fold, measured, measured_charts
from atlas.site.pages import render


def _titles(svg: str) -> list[str]:
    return re.findall(r"<circle[^>]*><title>([^<]*)</title>", svg)


def test_position_means_are_conditional_and_marginal_by_their_definitions() -> None:
    a = _run("org/a", GAIN, real=True).record.cells[0]
    b = _run("org/b", GAIN, real=True).record.cells[1]
    a.derived.conditional_acceptance = [0.5, 0.4, 0.2]
    b.derived.conditional_acceptance = [0.25, 0.0, None]  # position 3 never reached
    conditional, marginal = measured_charts.position_means([a, b])
    assert conditional == pytest.approx([0.375, 0.2, 0.2])  # position 3: only the cell that reached it
    assert marginal == pytest.approx([(0.5 + 0.25) / 2, (0.2 + 0.0) / 2, (0.04 + 0.0) / 2])
    # the marginal never exceeds the conditional's product bound, and falls with depth
    assert all(m2 <= m1 for m1, m2 in zip(marginal, marginal[1:]))


def test_the_speed_chart_shows_the_gates_row_with_its_bounds() -> None:
    run = _run("org/real-gain", GAIN, real=True)
    html = measured_charts.featured_charts([run])
    assert html.count('class="atlas-chart"') == 2 and "atlas-chart-pair" in html
    speed = html[html.index("speed-up by workload"):]

    def num(v: float) -> str:
        return f"{v:.2f}".rstrip("0").rstrip(".")

    # every cell is k = 1 here, so each row is its cell: median, and the gate's paired bounds
    expected = [f"T = 0: {num(c.derived.speedup)} ({num(c.derived.speedup_bound_lo)}–{num(c.derived.speedup_bound_hi)})"
                for c in run.record.cells]
    assert _titles(speed) == expected
    assert "atlas 0.1.0, 1 thread, kernels mm (PyTorch matmul), full draft vocabulary" in html
    assert measured_charts.featured_charts([_run("b", GAIN, real=False)]) == measured_charts.NO_CHART


def test_the_break_even_marks_the_acceptance_the_runs_rounds_need() -> None:
    real, loss = _run("org/real-gain", GAIN, real=True), _run("org/real-loss", LOSS, real=True, day=2)
    c = real.record.pass_costs
    by_passes = (c.verify[1] + c.draft) / c.plain - 1  # (1 + a) / (v + c) = 1

    def by_rounds(run) -> float:  # (1 + a) / r = 1, r: seconds per verify pass over seconds per plain token
        reps = [r for cell in run.record.cells if cell.temperature == 0 and cell.draft_tokens == 1 for r in cell.repeats]
        per_round = sum(r.seconds for r in reps) / sum(r.verify_passes for r in reps)
        return per_round / (sum(r.baseline_seconds for r in reps) / sum(r.tokens for r in reps)) - 1

    html = measured_charts.break_even_chart([real, loss])
    for n, run in ((1, real), (2, loss)):
        assert f"R{n}: needs {by_rounds(run):.2f} (its passes alone {by_passes:.2f})" in html
    assert round(by_rounds(real), 2) != round(by_rounds(loss), 2) != round(by_passes, 2)  # three different marks
    # one dot per workload at the Measured table's k = 1 acceptance (accepted ÷ drafted)
    dots = _titles(html)
    assert sorted(dots) == sorted([f"code: {45 / 60:g}", f"chat: {12 / 60:g}", f"code: {12 / 60:g}", f"chat: {12 / 60:g}"])
    # without T = 0, k = 1 cells there are no rounds to time: the pass costs' mark alone
    for cell in real.record.cells:
        cell.temperature = 1.0
    assert f"R1: needs {by_passes:.2f}</text>" in measured_charts.break_even_chart([real])
    # a run that timed no passes has no mark
    real.record.pass_costs = loss.record.pass_costs = None
    assert "no break-even to draw" in measured_charts.break_even_chart([real, loss])


def test_a_box_whose_body_markdown_would_render_as_code_is_refused() -> None:
    env = render._environment(__import__("jinja2").BaseLoader())

    def build(body: str) -> str:
        return env.from_string('{% call more("T") %}\n' + body + "\n{% endcall %}").render(more=fold.more)

    # a box opened inside an admonition: its indented body was shown as a code block
    with pytest.raises(AtlasError, match="would show 1 code block"):
        build("    - Position 1: kept\n    - Position 2: rejected")
    ok = build("!!! example \"x\"\n    - indented inside its admonition\n\n```python\nx = 1\n```\n\n1. a list\n   continued")
    assert ok.startswith('<details class="atlas-more" markdown="1">\n<summary>More: T</summary>')
    assert fold.unasked_code_blocks(ok.split("</summary>", 1)[1].rsplit("</details>", 1)[0]) == 0
    assert measured.plain_answer([]).startswith("The atlas has not yet measured MTP on a real model")
