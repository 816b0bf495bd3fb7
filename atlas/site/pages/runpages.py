"""The Runs pages: one page per evidence run (docs/runs/<slug>.md) and the Runs index.

Module 8 keeps one row per run and the generated answer (atlas.site.parts.measured); each run's tables,
charts, pass costs, gate and provenance are on a page of its own, so the course page stays readable
while no figure is cut. A run (one record: one model revision on one machine, one date) has a stamp
line, its provenance and head recipe, the gate's rule as gating.gate computes it, one summary table
per baseline (speed-ups over different baselines never share a table) with one row per (engine,
workload, temperature) at the draft length the gate chose (or, where the gate is not on, the best
median speed-up, labelled so) and the paired bound the gate decided on, then every cell, the pass
costs and the charts.
"""

from __future__ import annotations

import json
import re

from atlas.evidence import reported as reported_figures
from atlas.evidence.runs import Run
from atlas.records import gating, record as records
from atlas.site.parts.charts import Point, Series, line_chart
from atlas.site.parts.measured_charts import row_cell
from atlas.site.parts.mdsafe import Markdown, code, escape, table
from atlas.site.parts.measured import (GATE_CONFIDENCE_TEXT, NO_MEASUREMENT, baseline_ids, break_even_acceptance,
                                 engine_name, engine_text, evidence_runs, label, num_text, provenance_note, record_setup,
                                 run_lines, run_slug, short_rev, shown_source, temp_text)


def _speed(d: records.Derived) -> Markdown:
    # the range on its own line (atlas.css), still "1.23 (1.10–1.35)" as text for sorting
    return Markdown(f'{d.speedup:.2f}<span class="atlas-range"> ({d.speedup_slowest_repeat:.2f}–{d.speedup_fastest_repeat:.2f})</span>')


def _greedy(d: records.Derived) -> str:
    return {True: "yes", False: "NO"}.get(d.greedy_lossless, "n/a (T > 0)")


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


def _stamp(run: Run, n: int, baselines: dict[str, str]) -> str:
    r = run.record
    s = r.settings
    used = sorted({baselines[c.baseline] for c in r.cells}, key=lambda b: int(b[1:]))
    return (
        f"**Run R{n}**{escape(label(run))} — {code(r.model_id)} at {code(short_rev(r.revision))} · "
        f"{escape(r.hardware.label())} · {escape(record_setup(r))} · {escape(s.device)} {escape(s.dtype)} · run "
        f"{r.run_date:%Y-%m-%d %H:%M} UTC · {s.repeats} repeats × {s.prompts_per_workload} prompts × "
        f"{s.max_new_tokens} tokens per workload · prompt set {code(r.prompt_set)} (sha256 "
        f"{code(r.prompt_set_digest[:12])}) · baselines {', '.join(used)} · record "
        f"{code(run.record_id[:12])} ({code(shown_source(run.source_path))}, made by {code(r.command)})"
    )


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
        cell, gate_text = row_cell(group, gate)
        d = cell.derived
        by_baseline.setdefault(baselines[cell.baseline], []).append([
            escape(workload),
            temp_text(t),
            engine_name(engine),
            gate_text,
            _bound(d) if gate is not None else "—",
            num_text(d.acceptance_rate, 3),
            num_text(d.mean_accepted_length, 2),
            _speed(d),
            num_text(d.ideal_speedup, 2),
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
            by_pos = " / ".join(num_text(p, 2) for p in _by_position(d)[0]) or "—"
            by_engine.setdefault(engine, []).append([
                escape(workload),
                temp_text(t),
                c.draft_tokens,
                num_text(d.acceptance_rate, 3),
                by_pos,
                num_text(d.mean_accepted_length, 2),
                _speed(d),
                num_text(d.ideal_speedup, 2),
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
                f"R{n}{label(run)}: acceptance by draft position, T = {temp_text(t)}, k = {k_max}",
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
            f"R{n}{label(run)}: speed-up vs draft length k, T = {temp_text(t)}", series, "draft length k",
            "speed-up ×", [(k, str(k)) for k in ks], reference=1.0,
            note="Median over repeats, whiskers from the slowest to the fastest repeat; the "
                 "dashed line is 1 (as fast as plain decoding).",
        ))
    k_low = ks[0]
    series = [
        Series(name=f"T = {temp_text(t)}", points=[
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
                    columns.setdefault(f"R{n} {engine_text(run, c)}", {})[(c.workload, c.temperature)] = c
        if len(columns) < 2:
            continue
        keys = list(dict.fromkeys(key for cells in columns.values() for key in cells))
        rows = []
        for workload, t in keys:
            row: list[object] = [workload, temp_text(t)]
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
def gate_rule_text(record: records.Record) -> str:
    """The rule the record's gates were set by, as its page states it."""
    return GATE_RULE if record.rule == 1 else GATE_RULE_2


# Rule 2 (gating.GATE_RULES), for records that name it: prompts as the unit, Holm over the k.
GATE_RULE_2 = (
    f"**The gate (rule 2).** Each prompt of a workload gives one paired speed-up per repeat (plain "
    f"time ÷ speculative time of that prompt, run back to back); a prompt's speed-up is the geometric "
    f"mean over its repeats, so the bound covers the spread between prompts, not only timing noise. "
    f"For each draft length k the run takes one-sided {GATE_CONFIDENCE_TEXT} bounds on the geometric "
    f"mean over prompts (Student's t over their logarithms). A draft length is *off* when greedy "
    f"output differed from plain decoding; otherwise *undecided* with fewer than "
    f"{gating.MIN_GATE_REPEATS} prompts; otherwise *on* when the lower bound is above 1, *off* when "
    f"the upper bound is below 1, and *undecided* in between. Per workload and temperature the k "
    f"share one plain run, so the gate is on only for the k a Holm step-down over every k tried "
    f"finds faster at family level {1 - gating.GATE_CONFIDENCE:.0%} (its reason lists each k's p-value): "
    f"a false *on* has at most that chance per decision, whichever k it names. It is on with the k "
    f"of the best median speed-up among those, off when every k is off, undecided otherwise."
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


RUNS_DIR = "runs"  # under docs/: one page per evidence run; the index is docs/runs.md
_PAGE_MARK = re.compile(r"^<!-- atlas-run-page: ([0-9a-f]{12}) (\{.*\}) -->$", re.M)


def _run_title(n: int, run: Run) -> str:
    # the title reaches the theme's <title> unescaped: only id-safe characters (the body escapes)
    return re.sub(r"[^A-Za-z0-9._/ -]", "?", f"R{n} {run.record.model_id} {run.record.run_date:%Y-%m-%d}")


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
    """The run's pass costs, timed in isolation: seconds and plain steps per forward, and how an
    engine's were timed (llama.cpp's record says it)."""
    costs = run.record.pass_costs
    if costs is None:
        return "This run timed no passes of its own (an engine's run): no pass costs."
    er = run.record.engine_run
    how = er.engine_args.get("pass_costs") if er is not None else None
    method = f"How they were timed: {escape(how['method'])}.\n\n" if isinstance(how, dict) and isinstance(how.get("method"), str) else ""
    rows = [["plain step (1 row)", f"{costs.plain * 1000:.2f}", "1.00"],
            ["draft step (MTP layer, 1 row)", f"{costs.draft * 1000:.2f}", f"{costs.draft / costs.plain:.2f}"]]
    rows += [[f"verify pass, k = {k} ({k + 1} rows)", f"{v * 1000:.2f}", f"{v / costs.plain:.2f}"]
             for k, v in sorted(costs.verify.items())]
    even = break_even_acceptance(costs)
    note = "" if even is None else (f"\n\nAt k = 1 drafting breaks even at an acceptance of about {even:.2f} with these costs"
                                    + (": more than every draft, so no head pays at k = 1 here." if even >= 1 else "."))
    return method + table(["forward", "#milliseconds (median)", "#plain steps"], rows) + note


def run_pages(runs: list[Run], anchors: list[reported_figures.Figure] = ()) -> str:
    """Every evidence run's page, each after a marker line (slug, title as JSON) that
    `split_run_pages` reads back."""
    numbered = evidence_runs(runs)
    anchored = anchor_text(runs, list(anchors)).splitlines()
    baselines = baseline_ids([r for _, r in numbered])
    out = []
    for n, run in numbered:
        parts = [_stamp(run, n, baselines)]
        if run.record.provenance is not None and run.record.provenance.project_made:
            parts.append(provenance_note(run.record.provenance))
            parts.append(head_recipe_text(run))
        parts.append(gate_rule_text(run.record))
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
