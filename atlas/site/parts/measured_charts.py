"""Module 8's measured charts, each drawn by one rule from the records (its title and note name it):

- acceptance by draft position, at the featured run's largest k and lowest temperature, in both
  conventions: conditional (draft i accepted, given drafts 1 … i−1 were) and marginal (draft i
  accepted at all: the product of the conditionals up to i), each the mean over the workloads;
- speed-up by workload and temperature, each at the k the gate chose (else the best median), with
  the paired bounds the gate decided on;
- break-even: for every run that timed its passes, the k = 1 acceptance its own rounds need
  (measured.round_cost; its pass costs' figure, measured.break_even_acceptance, beside it) and
  where its rows' k = 1 acceptance by workload sits (the Measured table's figure,
  measured.workload_acceptance).

The featured run is measured.featured: the one the answer speaks of, so a chart never pairs one
run's speed with another's setup. Each title names the run's engine, threads, kernels and draft
vocabulary (measured.setup_text)."""

from __future__ import annotations

from atlas.evidence.runs import Run
from atlas.records import gating
from atlas.records import record as records
from atlas.site.parts.charts import Point, Series, ThresholdRow, line_chart, threshold_chart
from atlas.site.parts.measured import (GATE_CONFIDENCE_TEXT, gated_cells, break_even_acceptance, evidence_runs,
                                 featured, is_real, round_cost, setup_text, temp_text, workload_acceptance)


def row_cell(group: list[records.Cell], gate: records.GateDecision | None) -> tuple[records.Cell, str]:
    """The cell a summary row shows and the gate text: the gate's k when on; otherwise the best
    median speed-up, labelled with the verdict (off, or undecided: the repeats cannot tell)."""
    if gate is not None and gate.enabled and gate.draft_tokens is not None:
        chosen = next((c for c in group if c.draft_tokens == gate.draft_tokens), None)
        if chosen is not None:
            return chosen, f"on, k={gate.draft_tokens}"
    best = max(group, key=lambda c: c.derived.speedup)
    if gate is None:
        return best, f"— (k={best.draft_tokens})" if len(group) == 1 else f"— (best k={best.draft_tokens})"
    return best, f"{gate.verdict or '—'} (best k={best.draft_tokens})"


NO_CHART = "No real-model run in this build, so there is no measured chart here.\n"


def position_means(cells: list[records.Cell]) -> tuple[list[float | None], list[float]]:
    """Per draft position: the conditional acceptance averaged over the cells that reached it,
    and the marginal acceptance (product of the conditionals up to it; 0 after a position where
    no draft was accepted) averaged over every cell."""
    k = max(len(c.derived.conditional_acceptance or []) for c in cells)
    conditional: list[float | None] = []
    marginal: list[float] = []
    products = [1.0] * len(cells)
    for i in range(k):
        reached = []
        for j, c in enumerate(cells):
            rates = c.derived.conditional_acceptance or []
            a = rates[i] if i < len(rates) else None
            if a is not None:
                reached.append(a)
                products[j] *= a
            else:
                products[j] = 0.0
        conditional.append(sum(reached) / len(reached) if reached else None)
        marginal.append(sum(products) / len(products))
    return conditional, marginal


def _position_chart(n: int, run: Run) -> str:
    cells = [c for c in gated_cells(run) if c.derived.conditional_acceptance]
    if not cells:
        return ""
    t = min(c.temperature for c in cells)
    k = max(c.draft_tokens for c in cells if c.temperature == t)
    chosen = [c for c in cells if c.temperature == t and c.draft_tokens == k]
    conditional, marginal = position_means(chosen)
    series = [Series(name="conditional: given the drafts before it were accepted",
                     points=[Point(x=i + 1, y=a) for i, a in enumerate(conditional) if a is not None]),
              Series(name="marginal: accepted at all", points=[Point(x=i + 1, y=a) for i, a in enumerate(marginal)])]
    return line_chart(
        f"R{n}: acceptance by draft position, T = {temp_text(t)}, k = {k}", series, "draft position",
        "acceptance", [(i, str(i)) for i in range(1, k + 1)], y_max=1.0,
        note=(f"Mean over its {len(chosen)} workloads (conditional: over those whose drafts reached the "
              f"position). The marginal is the product of the conditionals up to i. {setup_text(run)}."))


def _speed_chart(n: int, run: Run) -> str:
    cells = gated_cells(run)
    gates = {(g.workload, g.temperature): g for g in run.record.gates}
    workloads = list(dict.fromkeys(c.workload for c in cells))
    series = []
    for t in sorted({c.temperature for c in cells}):
        points = []
        for i, w in enumerate(workloads):
            group = [c for c in cells if c.workload == w and c.temperature == t]
            if group:
                d = row_cell(group, gates.get((w, t)))[0].derived
                points.append(Point(x=i, y=d.speedup, lo=d.speedup_bound_lo, hi=d.speedup_bound_hi))
        series.append(Series(name=f"T = {temp_text(t)}", points=points))
    short = [w if len(w) <= 6 else w[:5] + "." for w in workloads]
    named = "; ".join(f"{a} = {w}" for a, w in zip(short, workloads) if a != w)
    return line_chart(
        f"R{n}: speed-up by workload, with the gate's {GATE_CONFIDENCE_TEXT} bounds", series, "workload",
        "speed-up ×", list(enumerate(short)), reference=1.0,
        note=(f"Median speed-up at the k the gate chose (else the best median); whiskers: the paired "
              f"one-sided {GATE_CONFIDENCE_TEXT} bounds, on where the lower one clears the dashed line at 1"
              + (f" ({named})" if named else "") + f". {setup_text(run)}."))


def featured_charts(runs: list[Run]) -> str:
    """The featured run's two charts, side by side where the column allows."""
    chosen = featured(runs)
    if chosen is None:
        return NO_CHART
    n, run = chosen
    charts = [c for c in (_position_chart(n, run), _speed_chart(n, run)) if c]
    return '<div class="atlas-chart-pair">' + "".join(charts) + "</div>\n"


def break_even_chart(runs: list[Run]) -> str:
    """Every run with pass costs: the k = 1 acceptance needed to break even, and its rows. The mark
    is what the run's own k = 1 rounds needed (measured.round_cost: the passes and everything the
    engine does between them); the pass costs alone, which leave that out, are named beside it."""
    rows, setups = [], []
    for n, run in evidence_runs(runs):
        by_passes = break_even_acceptance(run.record.pass_costs)
        by_workload = workload_acceptance(gated_cells(run))
        if by_passes is None or not by_workload:
            continue
        rounds = round_cost(gated_cells(run))
        even = by_passes if rounds is None else rounds - 1
        who = "" if is_real(run) else ", teaching model"
        label = f"R{n}{who}: needs {even:.2f}" + ("" if rounds is None else f" (its passes alone {by_passes:.2f})")
        rows.append(ThresholdRow(label=label, needed=even, values=list(by_workload.items())))
        setups.append(f"R{n}: {setup_text(run)}")
    if not rows:
        return "No run in this build timed its passes, so there is no break-even to draw.\n"
    engine = gating.GATED_ENGINES[0]
    return '<div class="atlas-chart-narrow">' + threshold_chart(
        "Break-even at k = 1: the acceptance each run's rounds need, and the measured rows",
        rows, "k = 1 acceptance",
        note=(f"Mark: the acceptance a at which (1 + a) ÷ r = 1, with r the run's k = 1 round as it timed it, in "
              f"plain steps (T = 0 cells pooled); in brackets the same from its timed verify and draft passes alone, "
              f"(1 + a) ÷ (v + c) = 1, which leave out what the engine does between passes; shaded: where drafting "
              f"pays. Dots: the run's k = 1 acceptance by workload "
              f"({engine} cells, temperatures pooled), as in the Measured table. " + "; ".join(setups) + ".")) + "</div>\n"
