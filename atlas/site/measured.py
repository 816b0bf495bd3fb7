"""The measured section: imported measurement records -> a summary a reader can read, the per-k
detail beneath it, one legend of runs and baselines, and charts drawn from the same records.

Which records count is decided by the store (`measurement_cells`: what `atlas measure import`
accepted); their content is read back from the record files it names, because the per-position
counts and the per-(workload, temperature) gate live only there. A file whose record no longer
has the imported record id (records.record_id) is refused: the page would otherwise show figures
nobody imported.

Layout: module 8 shows one row per run (compact_summary) and the generated answer (answer_text);
each run (one record: one model revision on one machine, one date) has a page of its own
(run_pages): a stamp line, its provenance and head recipe, the gate's rule as gating.gate
computes it, one summary table per baseline (speed-ups over different baselines never share a
table) with one row per (engine, workload, temperature) at the draft length the gate chose (or,
where the gate is not on, the best median speed-up, labelled so) and the paired bound the gate
decided on, then every cell, the pass costs and the charts.

Module 8's verdict reads its measured facts from here too: the cells slower than plain decoding
(`backfires_text`) and the dated line of what the atlas itself measured (`measured_line`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from atlas.evidence import reported as reported_figures
from atlas.evidence.runs import Run
from atlas.measure import gating, records
from atlas.site.charts import Point, Series, line_chart
from atlas.site.mdsafe import Markdown, code, escape, table

NO_MEASUREMENT = "No measurement yet."
ENGINE_NAMES = {"atlas": "atlas", "transformers-use_mtp": "transformers use_mtp"}


def engine_name(engine: str) -> Markdown:
    """A cell's engine as the pages name it, escaped here: the name is the record's own text."""
    return escape(ENGINE_NAMES.get(engine, engine))


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _speed(d: records.Derived) -> Markdown:
    # the range on its own line (atlas.css), still "1.23 (1.10–1.35)" as text for sorting
    return Markdown(f'{d.speedup:.2f}<span class="atlas-range"> ({d.speedup_slowest_repeat:.2f}–{d.speedup_fastest_repeat:.2f})</span>')


def _greedy(d: records.Derived) -> str:
    return {True: "yes", False: "NO"}.get(d.greedy_lossless, "n/a (T > 0)")


def _temp(t: float) -> str:
    return f"{t:g}"


def _baseline_ids(runs: list[Run]) -> dict[str, str]:
    """Each distinct baseline text -> a short id B1, B2, … in order of first appearance."""
    ids: dict[str, str] = {}
    for run in runs:
        for c in run.record.cells:
            ids.setdefault(c.baseline, f"B{len(ids) + 1}")
    return ids


def _row_cell(group: list[records.Cell], gate: records.GateDecision | None) -> tuple[records.Cell, str]:
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


def _by_position(d: records.Derived) -> tuple[list[float | None], bool]:
    """Acceptance at each draft depth: conditional (accepted_i ÷ reached_i, schema 2) where the
    record has it, else the older accepted_i ÷ drafted_i; and which one it is."""
    if d.conditional_acceptance is not None:
        return d.conditional_acceptance, True
    return d.per_position_acceptance, False


def _efficiency(d: records.Derived) -> Markdown | str:
    if d.efficiency is None:
        return "—"
    if d.efficiency_lo is None or d.efficiency_hi is None:
        return f"{d.efficiency:.2f}"
    return Markdown(f'{d.efficiency:.2f}<span class="atlas-range"> ({d.efficiency_lo:.2f}–{d.efficiency_hi:.2f})</span>')


def _groups(record: records.Record) -> dict[tuple[str, str, float], list[records.Cell]]:
    """Cells by (engine, workload, temperature), ordered engine, temperature, then workload in
    the record's order, so a reader compares workloads at one temperature."""
    groups: dict[tuple[str, str, float], list[records.Cell]] = {}
    for c in record.cells:
        groups.setdefault((c.engine, c.workload, c.temperature), []).append(c)
    engines = list(dict.fromkeys(c.engine for c in record.cells))
    workloads = list(dict.fromkeys(c.workload for c in record.cells))
    return dict(sorted(groups.items(), key=lambda kv: (
        engines.index(kv[0][0]), kv[0][2], workloads.index(kv[0][1]))))


def label(run: Run) -> str:
    """The words every figure of a project-made checkpoint carries (its record's provenance kind),
    after its run's name; empty for a record without provenance."""
    p = run.record.provenance
    return f" ({p.kind})" if p is not None and p.project_made else ""


def provenance_note(p: records.Provenance) -> Markdown:
    """How a project-made checkpoint was made, from its record's provenance, as a warning box."""
    main, head = p.main_model, p.mtp_head
    return Markdown(
        f'!!! warning "{escape(p.kind)}"\n'
        f"    Not a Hub model and in no crawl: the atlas made this checkpoint, so it is never counted in "
        f"adoption, declared or shipped figures. Main model {escape(main.get('source', '—'))} from the "
        f"package {code(main.get('package', '—'))} {escape(main.get('package_version', '—'))} "
        f"(GGUF sha256 {code(main.get('sha256', '—'))}, {escape(main.get('quantization', '—'))}); "
        f"MTP head made by {escape(str(head.get('made_by', '—')))}, digest {code(str(head.get('sha256', '—')))}, "
        f"recipe {code(str(head.get('recipe', '—')))}.")


def break_even_acceptance(costs: records.PassCosts | None, k: int = 1) -> float | None:
    """The acceptance at which k = 1 drafting only pays for itself with the measured pass costs:
    (1 + a) / (verify + draft) = 1, costs in units of one plain step; None for a run that timed no
    passes (an engine's own, like vLLM's)."""
    if costs is None:
        return None
    verify = costs.verify.get(k)
    return None if verify is None or k != 1 else (verify + costs.draft) / costs.plain - 1


def _stamp(run: Run, n: int, baselines: dict[str, str]) -> str:
    r = run.record
    s = r.settings
    used = sorted({baselines[c.baseline] for c in r.cells}, key=lambda b: int(b[1:]))
    return (
        f"**Run R{n}**{escape(label(run))} — {code(r.model_id)} at {code(_short_rev(r.revision))} · "
        f"{escape(r.hardware.text)} · {escape(s.device)} {escape(s.dtype)} · run "
        f"{r.run_date:%Y-%m-%d %H:%M} UTC · {s.repeats} repeats × {s.prompts_per_workload} prompts × "
        f"{s.max_new_tokens} tokens per workload · baselines {', '.join(used)} · record "
        f"{code(run.record_id[:12])} ({code(shown_source(run.source_path))}, made by {code(r.command)})"
    )


def shown_source(source_path: str) -> str:
    """Where a record file is, as the site may show it: relative to the checkout as stored; a record
    imported from outside the checkout by its file name only (its absolute path would publish the
    importer's folders, and means nothing to a reader)."""
    path = Path(source_path)
    return f"{path.name}, imported from outside the checkout" if path.is_absolute() else source_path


def _short_rev(revision: str) -> str:
    scheme, _, digest = revision.rpartition(":")
    return f"{scheme}:{digest[:12]}" if scheme else digest[:12]


def _bound(d: records.Derived) -> Markdown | str:
    """The paired one-sided 95 % bounds the gate used: the lower one decides "on", the upper one
    "off" (gating.gate); "—" where the record has none (schema 1, fewer than two repeats)."""
    if d.speedup_bound_lo is None or d.speedup_bound_hi is None:
        return "—"
    return Markdown(f'{d.speedup_bound_lo:.2f}<span class="atlas-range"> (upper {d.speedup_bound_hi:.2f})</span>')


def _gate_at_k(c: records.Cell) -> Markdown | str:
    """A cell's own gate verdict with the lower bound it was decided on, in one cell."""
    d = c.derived
    word = c.gate_verdict or "—"
    if d.speedup_bound_lo is None:
        return word
    return Markdown(f'{word}<span class="atlas-range"> (lower {d.speedup_bound_lo:.2f})</span>')


SUMMARY_HEADERS = ["workload", "#T", "engine", "gate (k shown)", "#gate's lower bound",
                   "#acceptance", "#accepted length", "#speed-up (range)", "#ideal", "#efficiency",
                   "greedy identical"]


def _summary(run: Run, baselines: dict[str, str]) -> list[tuple[str, Markdown]]:
    """One summary table per baseline of the run (speed-ups over different baselines never share
    a table): (baseline id, table)."""
    gates = {(g.workload, g.temperature): g for g in run.record.gates}
    by_baseline: dict[str, list[list[object]]] = {}
    for (engine, workload, t), group in _groups(run.record).items():
        gate = gates.get((workload, t)) if engine == gating.gated_engine(run.record.cells) else None
        cell, gate_text = _row_cell(group, gate)
        d = cell.derived
        by_baseline.setdefault(baselines[cell.baseline], []).append([
            escape(workload),
            _temp(t),
            engine_name(engine),
            gate_text,
            _bound(d) if gate is not None else "—",
            _num(d.acceptance_rate, 3),
            _num(d.mean_accepted_length, 2),
            _speed(d),
            _num(d.ideal_speedup, 2),
            _efficiency(d),
            _greedy(d),
        ])
    order = sorted(by_baseline, key=lambda b: int(b[1:]))
    return [(b, table(SUMMARY_HEADERS, by_baseline[b])) for b in order]


def _detail(run: Run, baselines: dict[str, str]) -> str:
    """Every cell of the run, one table per engine (its version and baseline above it)."""
    by_engine: dict[str, list[list[object]]] = {}
    heads: dict[str, str] = {}
    for (engine, workload, t), group in _groups(run.record).items():
        for c in sorted(group, key=lambda c: c.draft_tokens):
            d = c.derived
            heads.setdefault(engine, f"*{engine_name(engine)} "
                                     f"{escape(c.engine_version)}, baseline {baselines[c.baseline]}*")
            by_pos = " / ".join(_num(p, 2) for p in _by_position(d)[0]) or "—"
            by_engine.setdefault(engine, []).append([
                escape(workload),
                _temp(t),
                c.draft_tokens,
                _num(d.acceptance_rate, 3),
                by_pos,
                _num(d.mean_accepted_length, 2),
                _speed(d),
                _num(d.ideal_speedup, 2),
                _efficiency(d),
                _greedy(d),
                _gate_at_k(c) if engine == "atlas" else c.gate_verdict or "—",
            ])
    headers = ["workload", "#T", "#k", "#acceptance", "acceptance by depth", "#accepted length",
               "#speed-up (range)", "#ideal", "#efficiency", "greedy identical",
               "gate at this k (lower bound)"]
    return "\n\n".join(heads[e] + "\n\n" + table(headers, rows) for e, rows in by_engine.items())


def _indent(text: str) -> str:
    return "\n".join(("    " + line) if line else "" for line in text.splitlines())


def _charts(run: Run, n: int) -> list[str]:
    """Per-position acceptance vs draft depth, speed-up vs k at each temperature, and acceptance
    by workload — all from our own loop's cells of this run (a peer engine has no draft depth)."""
    cells = [c for c in run.record.cells if c.engine == "atlas"]
    if not cells:
        return []
    temps = sorted({c.temperature for c in cells})
    workloads = list(dict.fromkeys(c.workload for c in cells))
    ks = sorted({c.draft_tokens for c in cells})
    k_max = ks[-1]
    out = []
    for t in temps:
        deepest = [c for c in cells if c.temperature == t and c.draft_tokens == k_max]
        series = [
            Series(name=c.workload, points=[
                Point(x=i + 1, y=p) for i, p in enumerate(_by_position(c.derived)[0]) if p is not None
            ])
            for c in deepest
        ]
        conditional = all(_by_position(c.derived)[1] for c in deepest)
        if any(s.points for s in series):
            out.append(line_chart(
                f"R{n}{label(run)}: acceptance by draft position, T = {_temp(t)}, k = {k_max}",
                [s for s in series if s.points], "draft position", "acceptance",
                [(i, str(i)) for i in range(1, k_max + 1)], y_max=1.0,
                note=("Conditional acceptance at depth i: of the drafts at depth i whose earlier "
                      "drafts were all accepted, the share accepted." if conditional else
                      "Accepted ÷ drafted at depth i (this record predates conditional "
                      "acceptance: a draft after a rejection counts as drafted, not accepted)."),
            ))
    for t in temps:
        series = []
        for w in workloads:
            pts = [Point(x=c.draft_tokens, y=c.derived.speedup, lo=c.derived.speedup_slowest_repeat,
                         hi=c.derived.speedup_fastest_repeat)
                   for c in cells if c.workload == w and c.temperature == t]
            if pts:
                series.append(Series(name=w, points=pts))
        out.append(line_chart(
            f"R{n}{label(run)}: speed-up vs draft length k, T = {_temp(t)}", series, "draft length k",
            "speed-up ×", [(k, str(k)) for k in ks], reference=1.0,
            note="Median over repeats, whiskers from the slowest to the fastest repeat; the "
                 "dashed line is 1 (as fast as plain decoding).",
        ))
    k_low = ks[0]
    series = [
        Series(name=f"T = {_temp(t)}", points=[
            Point(x=i, y=c.derived.acceptance_rate)
            for i, w in enumerate(workloads)
            for c in cells
            if c.workload == w and c.temperature == t and c.draft_tokens == k_low
            and c.derived.acceptance_rate is not None
        ])
        for t in temps
    ]
    out.append(line_chart(
        f"R{n}{label(run)}: acceptance by workload, k = {k_low}", [s for s in series if s.points], "workload",
        "acceptance", [(i, w) for i, w in enumerate(workloads)], y_max=1.0,
        note="Accepted ÷ drafted at the shortest draft length measured, one point per workload.",
    ))
    return out


def evidence_runs(runs: list[Run]) -> list[tuple[int, Run]]:
    """The runs that are evidence (not --quick), numbered R1, R2, … as the section shows them."""
    return list(enumerate((r for r in runs if not r.record.settings.quick), start=1))


def _engine_text(run: Run, cell: records.Cell) -> str:
    """The engine and version a cell ran on, as plain text: a table header or `escape` takes it."""
    er = run.record.engine_run
    if er is not None:
        return f"{er.package} {er.version}"
    return f"{ENGINE_NAMES.get(cell.engine, cell.engine)} {cell.engine_version}"


def below_one(runs: list[Run]) -> list[tuple[int, Run, records.Cell]]:
    """Every measured cell whose median speed-up is below 1 (slower than plain decoding)."""
    return [(n, run, c) for n, run in evidence_runs(runs) for c in run.record.cells
            if c.derived.speedup < 1]


def backfires_text(runs: list[Run]) -> str:
    """The page's own slower-than-plain cells, for "When it backfires"; says so when there are none."""
    numbered = evidence_runs(runs)
    if not numbered:
        return "This build has no measurement, so it cannot show a cell where MTP was slower."
    slow = below_one(runs)
    n_cells = sum(len(r.record.cells) for _, r in numbered)
    if not slow:
        return (f"None of the {n_cells} measured cells of this build ran slower than plain "
                f"decoding (median speed-up below 1×); that says nothing about other models, "
                f"workloads or hardware.")
    per_run = []
    for n, run in numbered:
        mine = [c for m, _, c in slow if m == n]
        if mine:
            worst = min(mine, key=lambda c: c.derived.speedup)
            where = ", ".join(escape(w) for w in dict.fromkeys(c.workload for c in mine))
            per_run.append(f"R{n}{escape(label(run))}: {len(mine)} of {len(run.record.cells)} cells (on {where}), the slowest "
                           f"{escape(worst.workload)} at T = {_temp(worst.temperature)}, k = {worst.draft_tokens}: "
                           f"{worst.derived.speedup:.2f}× ({escape(_engine_text(run, worst))})")
    lead = "".join(_real_backfires(n, run) for n, run in numbered if label(run))
    return (lead + f"In this build's own measurements, {len(slow)} of {n_cells} cells ran slower than "
            f"plain decoding (median speed-up below 1×): " + "; ".join(per_run) + ". Every cell is on its "
            "run's page, in its table of every draft length k.")


def _real_backfires(n: int, run: Run) -> str:
    """Where MTP backfires on real text: a labelled run's speed-up range, and its k = 1 acceptance
    against the break-even its own pass costs set."""
    cells = run.record.cells
    k1 = [c.derived.acceptance_rate for c in cells if c.draft_tokens == 1 and c.derived.acceptance_rate is not None]
    even = break_even_acceptance(run.record.pass_costs)
    below = sum(1 for c in cells if c.derived.speedup < 1)
    text = (f"**On real text (R{n}{escape(label(run))}, {code(run.record.model_id)}):** {below} of "
            f"{len(cells)} cells ran below 1×, median speed-ups {_speed_range(cells)}")
    if k1 and even is not None:
        text += (f"; at k = 1 its head's acceptance was {min(k1):.2f}–{max(k1):.2f}, where breaking even "
                 f"with this run's measured pass costs needs about {even:.2f}")
    by_workload = workload_acceptance(cells)
    if len(by_workload) > 1:
        low, high = min(by_workload, key=by_workload.get), max(by_workload, key=by_workload.get)
        temps = " and ".join(_temp(t) for t in sorted({c.temperature for c in cells}))
        text += (f"; acceptance collapses on {escape(low)}: {by_workload[low]:.2f} of k = 1 drafts accepted "
                 f"(T = {temps}{' pooled' if ' and ' in temps else ''}), against {by_workload[high]:.2f} on {escape(high)}")
    return text + ". "


def workload_acceptance(cells: list[records.Cell]) -> dict[str, float]:
    """Per workload, the share of k = 1 drafts accepted, pooled over temperatures and engines
    (accepted / drafted summed, so a cell with more drafts weighs more)."""
    drafted: dict[str, int] = {}
    accepted: dict[str, int] = {}
    for c in cells:
        if c.draft_tokens == 1 and c.derived.drafted:
            drafted[c.workload] = drafted.get(c.workload, 0) + c.derived.drafted
            accepted[c.workload] = accepted.get(c.workload, 0) + c.derived.accepted
    return {w: accepted[w] / drafted[w] for w in drafted}


def anchor_text(runs: list[Run], anchors: list[reported_figures.Figure]) -> str:
    """A labelled run's T = 1 chat acceptance at k = 1, with the reported anchor beside it and
    the reasons the two are not the same measurement."""
    out = []
    for n, run in evidence_runs(runs):
        if not label(run):
            continue
        chat = [c for c in run.record.cells if c.temperature == 1 and c.draft_tokens == 1
                and "chat" in c.workload and c.derived.acceptance_rate is not None]
        for c in chat:
            line = (f"R{n}{escape(label(run))}, {escape(c.workload)} at T = 1, k = 1: acceptance "
                    f"{c.derived.acceptance_rate:.3f} ({engine_name(c.engine)}).")
            for f in anchors:
                line += (f" Reported beside it, not compared as if equal: {escape(f.subject)}, "
                         f"\"{escape(f.figure)}\" ({escape(f.source)}; engine {escape(f.engine)}, workload "
                         f"{escape(f.workload)}). That figure is {escape(f.subject)}'s own MTP module, trained "
                         f"with its model, under that source's conditions; this one is "
                         f"{code(run.record.model_id)}, a head made by "
                         f"{escape(str(run.record.provenance.mtp_head.get('made_by', '—')))}, on the "
                         f"atlas's prompts and hardware.")
            out.append(f"- {line}")
    return ("**Real-model acceptance beside a reported anchor**\n\n" + "\n".join(out)) if out else ""


def across_engines(runs: list[Run]) -> list[str]:
    """Per checkpoint (model id and revision) that more than one engine ran: acceptance at k = 1 per
    workload and temperature, one column per engine, with greedy identity at T = 0. Acceptance does
    not depend on a baseline, so engines share this table; their speed-ups do not, and stay in
    their runs' own tables."""
    out = []
    numbered = evidence_runs(runs)
    for model_id, revision in dict.fromkeys((r.record.model_id, r.record.revision) for _, r in numbered):
        columns: dict[str, dict[tuple[str, float], records.Cell]] = {}
        for n, run in numbered:
            if (run.record.model_id, run.record.revision) != (model_id, revision):
                continue
            for c in run.record.cells:
                if c.draft_tokens == 1:
                    columns.setdefault(f"R{n} {_engine_text(run, c)}", {})[(c.workload, c.temperature)] = c
        if len(columns) < 2:
            continue
        keys = list(dict.fromkeys(key for cells in columns.values() for key in cells))
        rows = []
        for workload, t in keys:
            row: list[object] = [workload, _temp(t)]
            for cells in columns.values():
                c = cells.get((workload, t))
                if c is None or c.derived.acceptance_rate is None:
                    row.append("—")
                    continue
                same = {True: "; greedy identical", False: "; greedy DIFFERED", None: ""}[c.derived.greedy_lossless]
                row.append(f"{c.derived.acceptance_rate:.3f} ({c.derived.accepted}/{c.derived.drafted}{same})")
            rows.append(row)
        out.append(f"**The same checkpoint on {len(columns)} engines** ({code(model_id)}, revision {code(revision[:19])}): "
                   "acceptance at k = 1 (accepted ÷ drafted), and at T = 0 whether every repeat's output equalled "
                   "that engine's own plain decoding. Acceptance needs no baseline, so the engines share this table; "
                   "their speed-ups are each over the engine's own plain decoding and stay in the runs' tables. "
                   "Where counts differ at T = 0, the engines' drafts or outputs differed, each output still equal to "
                   "that engine's own plain decoding. A dash: the engine did not run that cell.\n\n"
                   + table(["workload", "T", *columns], rows))
    return out


def _speed_range(cells: list[records.Cell]) -> str:
    lo = min(c.derived.speedup for c in cells)
    hi = max(c.derived.speedup for c in cells)
    return f"{lo:.2f}×" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}×"


def run_lines(runs: list[Run]) -> list[str]:
    """One dated, cited line per run: which model, where, when, with what, the range of median
    speed-ups over its cells and whether greedy output stayed identical (Markdown)."""
    out = []
    for n, run in evidence_runs(runs):
        r = run.record
        greedy = [c for c in r.cells if c.derived.greedy_lossless is not None]
        identical = sum(1 for c in greedy if c.derived.greedy_lossless)
        engines = ", ".join(dict.fromkeys(_engine_text(run, c) for c in r.cells))
        line = (f"R{n}{escape(label(run))}: {code(r.model_id)} at {code(_short_rev(r.revision))}, through {escape(engines)}, "
                f"on {escape(r.hardware.text)}, run {r.run_date:%Y-%m-%d} (record "
                f"{code(run.record_id[:12])}): median speed-ups {_speed_range(r.cells)} over "
                f"{len(r.cells)} cells")
        if greedy:
            line += f"; greedy output identical to plain decoding in {identical} of {len(greedy)} T = 0 cells"
        out.append(line + ".")
    return out


def measured_line(runs: list[Run]) -> str:
    """The verdict's closing line: what the atlas itself measured, dated and cited, not generalised."""
    lines = run_lines(runs)
    if not lines:
        return ("**What the atlas itself measured:** nothing yet. No dated run record is imported, "
                "so this page makes no claim of its own about any speed-up.\n")
    models = sorted({r.record.model_id for _, r in evidence_runs(runs)})
    return ("**What the atlas itself measured** — " + ", ".join(code(m) for m in models)
            + ", and nothing else:\n\n" + "\n".join(f"- {line}" for line in lines)
            + "\n\nThese are runs of the model(s) named, on that hardware, at those dates; they are "
            "not generalised to any other model, engine or machine.\n")


# The gate's confidence as the site writes a percentage ("95 %").
GATE_CONFIDENCE_TEXT = f"{gating.GATE_CONFIDENCE:.0%}".replace("%", " %")
# The gate as gating.gate and gating.decide compute it (schema 2); constants from that module.
GATE_RULE = (
    f"**The gate.** For each draft length k the run has one speed-up per repeat (plain time ÷ "
    f"speculative time of the same prompts, run back to back). From these paired speed-ups it "
    f"takes one-sided {GATE_CONFIDENCE_TEXT} bounds on their geometric mean (Student's t "
    f"over their logarithms). A draft length is *off* when greedy output differed from plain "
    f"decoding; otherwise *undecided* with fewer than {gating.MIN_GATE_REPEATS} repeats; "
    f"otherwise *on* when the lower bound is above 1, *off* when the upper bound is below 1, "
    f"and *undecided* in between. Per workload and "
    f"temperature the gate is on with the k of the best median speed-up among the k that are on, "
    f"off when every k is off, undecided otherwise. The *gate's lower bound* column shows the "
    f"lower bound (and the upper one) of the k the row shows; the speed-up range beside it is "
    f"the slowest and fastest single repeat, which can dip below 1 while the bound stays above. "
    f"Records of schema 1 were gated by an older rule (on where the slowest repeat was still "
    f"faster) and carry no bounds."
)

_COLUMNS = (
    "**Columns.** *Gate*: the run's decision for that workload and temperature (the rule above). "
    "Where it is not on, the row shows the k with the best median, not a recommendation. "
    "*Acceptance*: accepted ÷ drafted drafts. *Acceptance by depth* (under each "
    "run): at depth i, the share accepted of the drafts whose earlier drafts were all accepted "
    "(records before schema 2: accepted ÷ drafted at depth i). *Accepted length*: tokens per verify "
    "pass, bonus included. *Speed-up*: plain time ÷ speculative time for the same tokens, median "
    "(slowest–fastest repeat). *Ideal*: what the measured acceptance allows with the measured "
    "pass costs; *efficiency*: speed-up ÷ ideal (range over repeats where recorded). *Greedy "
    "identical*: at T = 0, whether every repeat's output equalled plain decoding token for token."
)


# ---- the Runs pages and module 8's compact summary ---------------------------------------------
# Module 8 keeps one row per run and the generated answer; each run's tables, charts, pass costs,
# gate and provenance are on a page of its own (docs/runs/<slug>.md), so the course page stays
# readable while no figure is cut.

RUNS_DIR = "runs"  # under docs/: one page per evidence run; the index is docs/runs.md
_PAGE_MARK = re.compile(r"^<!-- atlas-run-page: ([0-9a-f]{12}) (\{.*\}) -->$", re.M)


def run_slug(run: Run) -> str:
    """A run page's file name: its record id's first 12 hex digits (stable, and id-safe)."""
    return run.record_id[:12]


def _run_title(n: int, run: Run) -> str:
    # the title reaches the theme's <title> unescaped: only id-safe characters (the body escapes)
    return re.sub(r"[^A-Za-z0-9._/ -]", "?", f"R{n} {run.record.model_id} {run.record.run_date:%Y-%m-%d}")


def _gate_counts(run: Run) -> str:
    """The run's gate over its (workload, temperature) pairs: how many on, off, undecided."""
    words = [("on" if g.enabled else (g.verdict or "undecided")) for g in run.record.gates]
    if not words:
        return "— (no gate)"
    counts = {w: words.count(w) for w in dict.fromkeys(sorted(words))}
    return " · ".join(f"{w} {n}" for w, n in counts.items()) + f" of {len(words)}"


def _gated_cells(run: Run) -> list[records.Cell]:
    """The cells of the engine the run's gate decides for; every cell when no engine is gated."""
    engine = gating.gated_engine(run.record.cells)
    return [c for c in run.record.cells if c.engine == engine] or list(run.record.cells)


def _best_with_bounds(cell: records.Cell) -> Markdown:
    d = cell.derived
    bounds = ("" if d.speedup_bound_lo is None or d.speedup_bound_hi is None else
              f", {GATE_CONFIDENCE_TEXT} bounds {d.speedup_bound_lo:.2f}–{d.speedup_bound_hi:.2f}")
    return Markdown(f"{d.speedup:.2f}×<span class=\"atlas-range\"> ({escape(cell.workload)}, "
                    f"T = {_temp(cell.temperature)}, k = {cell.draft_tokens}{bounds})</span>")


def _k1_acceptance(run: Run) -> str:
    by_workload = workload_acceptance(_gated_cells(run))
    return "; ".join(f"{w} {a:.2f}" for w, a in by_workload.items()) or "—"


def compact_summary(runs: list[Run], link: str) -> str:
    """Module 8's Measured table: one row per evidence run, each linked to its page under `link`
    (a relative URL prefix); the backfire line and the Runs page follow it in the module."""
    numbered = evidence_runs(runs)
    if not numbered:
        return NO_MEASUREMENT + "\n"
    baselines = _baseline_ids([r for _, r in numbered])
    rows = []
    for n, run in numbered:
        r = run.record
        best = max(_gated_cells(run), key=lambda c: c.derived.speedup)
        rows.append([
            Markdown(f"[R{n}]({link}{run_slug(run)}.md)"),
            code(r.model_id),
            escape(r.provenance.kind) if r.provenance is not None else "—",
            escape(", ".join(dict.fromkeys(_engine_text(run, c) for c in r.cells))),
            escape(f"{r.settings.device}: {r.hardware.text}"),
            f"{r.run_date:%Y-%m-%d}",
            baselines[best.baseline],
            _best_with_bounds(best),
            escape(_k1_acceptance(run)),
            _gate_counts(run),
        ])
    legend = "; ".join(f"**{bid}** {escape(text)}" for text, bid in baselines.items())
    return (table(["run", "model", "label", "engine", "device", "date", "baseline",
                   "best median speed-up (paired bounds)", "k = 1 acceptance by workload",
                   "gate (workload × T)"], rows)
            + f"\n\nBaselines (what a speed-up divides by): {legend}. Each row's speed-up is over its "
            "own baseline; the run's page has every cell.\n")


def _is_real(run: Run) -> bool:
    """A run of a real main model (its record's provenance names one), not the byte-level
    teaching model."""
    p = run.record.provenance
    return p is not None and bool(p.main_model.get("source"))


def answer_text(runs: list[Run], link: str) -> str:
    """The answer up front, by rule from the records: one dated, linked sentence on what the atlas
    measured on a real model and whether it paid (the gate on for at least one workload and
    temperature), then one on where a gain came from (or why there was none)."""
    numbered = evidence_runs(runs)
    real = [(n, r) for n, r in numbered if _is_real(r)]
    if not real:
        first = ("**Measured on a real model:** nothing in this build. "
                 + (f"Its {len(numbered)} run(s) are of the atlas's own teaching model only, so this page "
                    "makes no measured claim about a real model." if numbered else
                    "It holds no measurement record at all."))
    else:
        n, run = max(real, key=lambda nr: (nr[1].record.run_date, nr[0]))
        r = run.record
        cells = _gated_cells(run)
        faster = sum(1 for c in cells if c.derived.speedup > 1)
        on = sum(1 for g in r.gates if g.enabled)
        paid = "it paid" if on else "it did not pay"
        first = (f"**Measured on a real model:** on {r.run_date:%Y-%m-%d} the atlas ran "
                 f"{code(r.model_id)} ({escape(r.provenance.kind)}) on {escape(r.hardware.text)} "
                 f"([R{n}]({link}{run_slug(run)}.md)), and **{paid}**: the gate switched MTP on for "
                 f"{on} of {len(r.gates)} workload × temperature pairs, and {faster} of {len(cells)} "
                 f"cells ran faster than plain decoding (median speed-ups {_speed_range(cells)}).")
        if len(real) > 1:
            first += f" It is the newest of {len(real)} real-model runs in the Measured table."
    return first + " " + _gain_source(numbered, real, link) + "\n"


def _gain_source(numbered: list[tuple[int, Run]], real: list[tuple[int, Run]], link: str) -> str:
    """Where a gain came from: the gated-on row with the best median (real runs first), named with
    its acceptance and its run's pass costs; with no gain anywhere, the acceptance against the
    break-even that the real run's own pass costs set."""
    for pool in (real, [nr for nr in numbered if nr not in real]):
        found = []
        for n, run in pool:
            for g in run.record.gates:
                if g.enabled and g.draft_tokens is not None:
                    c = next((c for c in _gated_cells(run) if (c.workload, c.temperature, c.draft_tokens)
                              == (g.workload, g.temperature, g.draft_tokens)), None)
                    if c is not None:
                        found.append((c.derived.speedup, n, run, c))
        if found:
            _, n, run, c = max(found, key=lambda f: f[0])
            d = c.derived
            where = "" if _is_real(run) else " (the atlas's teaching model, not a real one)"
            text = (f"**Where the gain came from:** the best gated-on row is [R{n}]({link}{run_slug(run)}.md)"
                    f"{where}, {escape(c.workload)} at T = {_temp(c.temperature)}, k = {c.draft_tokens}: "
                    f"{d.speedup:.2f}×, with {_num(d.acceptance_rate, 2)} of its drafts accepted "
                    f"({_num(d.mean_accepted_length, 2)} tokens per verify pass)")
            costs = run.record.pass_costs
            verify = costs.verify.get(c.draft_tokens) if costs else None
            if costs and verify is not None:
                text += (f" against a round that cost {(verify + c.draft_tokens * costs.draft) / costs.plain:.2f} "
                         f"plain steps on {escape(run.record.hardware.text)}")
            return text + "."
    if not real:
        return ""
    n, run = real[-1]
    k1 = [c.derived.acceptance_rate for c in _gated_cells(run)
          if c.draft_tokens == 1 and c.derived.acceptance_rate is not None]
    even = break_even_acceptance(run.record.pass_costs)
    text = f"**Where a gain would come from:** no gate turned on in R{n}"
    if k1 and even is not None:
        text += (f"; at k = 1 its head's drafts were accepted {min(k1):.2f}–{max(k1):.2f} of the time, and "
                 f"with that run's pass costs breaking even needs about {even:.2f}")
    return text + "."


def head_recipe_text(run: Run) -> str:
    """Why a project-made head accepts what it does, from the record's provenance: how long and on
    what it was trained, and what it agreed on held-out text; says which of these the record lacks."""
    p = run.record.provenance
    if p is None:
        return ""
    head = p.mtp_head
    facts = []
    if "steps" in head:
        facts.append(f"trained for {escape(str(head['steps']))} optimiser steps")
    if "training_answer_tokens" in head:
        facts.append(f"on {escape(str(head['training_answer_tokens']))} answer tokens")
    if "target" in head:
        facts.append(f"towards {escape(str(head['target']))}")
    held = [(k, v) for k, v in (("T = 0", head.get("heldout_first_draft_t0")),
                                ("T = 1", head.get("heldout_first_draft_t1"))) if v is not None]
    text = f"**Why its acceptance is what it is.** The MTP head ({escape(str(head.get('made_by', '—')))}) was "
    text += (", ".join(facts) if facts else "made by a recipe this record does not describe") + "."
    if held:
        text += (" On held-out answers, teacher-forced, its first draft agreed with the main model "
                 + " and ".join(f"{escape(str(v))} at {k}" for k, v in held) + ".")
    else:
        text += " The record carries no held-out agreement for the head."
    missing = [w for w, key in (("training tokens", "training_answer_tokens"), ("steps", "steps")) if key not in head]
    if missing:
        text += f" It does not record the head's {' or '.join(missing)}."
    text += (" A head trained this briefly, after the main model was frozen, agrees with it far less "
             "often than an MTP module trained with its model from the start, and a draft is only "
             "accepted where it agrees.")
    return text


def pass_costs_table(run: Run) -> str:
    """The run's pass costs, timed in isolation: seconds and plain steps per forward."""
    costs = run.record.pass_costs
    if costs is None:
        return "This run timed no passes of its own (an engine's run): no pass costs."
    rows = [["plain step (1 row)", f"{costs.plain * 1000:.2f}", "1.00"],
            ["draft step (MTP layer, 1 row)", f"{costs.draft * 1000:.2f}", f"{costs.draft / costs.plain:.2f}"]]
    rows += [[f"verify pass, k = {k} ({k + 1} rows)", f"{v * 1000:.2f}", f"{v / costs.plain:.2f}"]
             for k, v in sorted(costs.verify.items())]
    even = break_even_acceptance(costs)
    note = "" if even is None else f"\n\nAt k = 1 drafting breaks even at an acceptance of about {even:.2f} with these costs."
    return table(["forward", "#milliseconds (median)", "#plain steps"], rows) + note


def run_pages(runs: list[Run], anchors: list[reported_figures.Figure] = ()) -> str:
    """Every evidence run's page, each after a marker line (slug, title as JSON) that
    `split_run_pages` reads back."""
    numbered = evidence_runs(runs)
    anchored = anchor_text(runs, list(anchors)).splitlines()
    baselines = _baseline_ids([r for _, r in numbered])
    out = []
    for n, run in numbered:
        parts = [_stamp(run, n, baselines)]
        if run.record.provenance is not None and run.record.provenance.project_made:
            parts.append(provenance_note(run.record.provenance))
            parts.append(head_recipe_text(run))
        parts.append(GATE_RULE)
        for bid, summary in _summary(run, baselines):
            parts.append(f"*R{n}{escape(label(run))}, speed-ups over baseline {bid}*\n\n{summary}")
        parts.append("### Every draft length k\n\n" + _detail(run, baselines))
        parts.append("### Pass costs\n\n" + pass_costs_table(run))
        charts = _charts(run, n)
        if charts:
            parts.append("### Charts\n\n" + "\n\n".join(charts))
        mine = [a for a in anchored if a.startswith(f"- R{n}{escape(label(run))},")]
        if mine:
            parts.append("**Acceptance beside a reported anchor**\n\n" + "\n".join(mine))
        legend = "\n".join(f"- **{bid}**: {escape(text)}" for text, bid in baselines.items())
        parts.append(_COLUMNS + "\n\n**Baselines**:\n\n" + legend)
        title = json.dumps({"title": _run_title(n, run)}, ensure_ascii=True).replace("-->", "--\\u003e")
        out.append(f"<!-- atlas-run-page: {run_slug(run)} {title} -->\n" + "\n\n".join(parts))
    return "\n\n".join(out) + "\n"


def split_run_pages(text: str) -> list[tuple[str, str, str]]:
    """The run pages of the evidence's `runs` section: (slug, title, Markdown body)."""
    marks = list(_PAGE_MARK.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [(m.group(1), json.loads(m.group(2))["title"], text[m.end():end].strip() + "\n")
            for m, end in zip(marks, ends)]


def runs_index(runs: list[Run], link: str) -> str:
    """The Runs page's list: every evidence run, linked, its one dated line; then the comparison
    across engines and the smoke runs (which are never evidence)."""
    numbered = evidence_runs(runs)
    lines = run_lines(runs)
    parts = ["\n".join(f"- [R{n}]({link}{run_slug(run)}.md) — {line.split(': ', 1)[1]}"
                       for (n, run), line in zip(numbered, lines)) or NO_MEASUREMENT]
    parts.extend(across_engines(runs))
    smoke = [r for r in runs if r.record.settings.quick]
    if smoke:
        parts.append('!!! note "Smoke runs — not evidence"\n' + _indent(
            "These records come from `--quick` runs (few tokens, one prompt): they show the loop "
            "runs, not how fast. Their figures are in no table and set no gate.\n\n" + "\n".join(
                f"- {code(r.record.model_id)}, run {r.record.run_date:%Y-%m-%d %H:%M} UTC, record "
                f"{code(r.record_id[:12])} ({code(shown_source(r.source_path))})" for r in smoke)))
    return "\n\n".join(parts) + "\n"
