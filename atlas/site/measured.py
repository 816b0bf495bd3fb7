"""The measured level in module 8: imported measurement records (atlas.evidence.runs) -> one row per
run (compact_summary), the generated answer (answer_text), the cells slower than plain decoding
(backfires_text) and the dated line of what the atlas itself measured (measured_line).

Which records count is decided by the store (`measurement_cells`: what `atlas measure import`
accepted); their content is read back from the record files it names, because the per-position
counts and the per-(workload, temperature) gate live only there. A file whose record no longer
has the imported record id (records.record_id) is refused: the page would otherwise show figures
nobody imported.

Each run's own page, with every figure, is atlas.site.runpages; what the two share (run numbers,
engine names, baseline ids, the run lines) is here.
"""

from __future__ import annotations

from pathlib import Path

from atlas.evidence.runs import Run
from atlas.records import gating, record as records
from atlas.site.mdsafe import Markdown, code, escape, table

NO_MEASUREMENT = "No measurement yet."
ENGINE_NAMES = {"atlas": "atlas", "transformers-use_mtp": "transformers use_mtp"}


def engine_name(engine: str) -> Markdown:
    """A cell's engine as the pages name it, escaped here: the name is the record's own text."""
    return escape(ENGINE_NAMES.get(engine, engine))


def num_text(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def temp_text(t: float) -> str:
    return f"{t:g}"


def baseline_ids(runs: list[Run]) -> dict[str, str]:
    """Each distinct baseline text -> a short id B1, B2, … in order of first appearance."""
    ids: dict[str, str] = {}
    for run in runs:
        for c in run.record.cells:
            ids.setdefault(c.baseline, f"B{len(ids) + 1}")
    return ids


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


def shown_source(source_path: str) -> str:
    """Where a record file is, as the site may show it: relative to the checkout as stored; a record
    imported from outside the checkout by its file name only (its absolute path would publish the
    importer's folders, and means nothing to a reader)."""
    path = Path(source_path)
    return f"{path.name}, imported from outside the checkout" if path.is_absolute() else source_path


def short_rev(revision: str) -> str:
    scheme, _, digest = revision.rpartition(":")
    return f"{scheme}:{digest[:12]}" if scheme else digest[:12]


def evidence_runs(runs: list[Run]) -> list[tuple[int, Run]]:
    """The runs that are evidence (not --quick), numbered R1, R2, … as the section shows them."""
    return list(enumerate((r for r in runs if not r.record.settings.quick), start=1))


def engine_text(run: Run, cell: records.Cell) -> str:
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
                           f"{escape(worst.workload)} at T = {temp_text(worst.temperature)}, k = {worst.draft_tokens}: "
                           f"{worst.derived.speedup:.2f}× ({escape(engine_text(run, worst))})")
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
        temps = " and ".join(temp_text(t) for t in sorted({c.temperature for c in cells}))
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
        engines = ", ".join(dict.fromkeys(engine_text(run, c) for c in r.cells))
        line = (f"R{n}{escape(label(run))}: {code(r.model_id)} at {code(short_rev(r.revision))}, through {escape(engines)}, "
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


# ---- module 8's Measured table and its answer ---------------------------------------------------


def run_slug(run: Run) -> str:
    """A run page's file name: its record id's first 12 hex digits (stable, and id-safe)."""
    return run.record_id[:12]


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
                    f"T = {temp_text(cell.temperature)}, k = {cell.draft_tokens}{bounds})</span>")


def _k1_acceptance(run: Run) -> str:
    by_workload = workload_acceptance(_gated_cells(run))
    return "; ".join(f"{w} {a:.2f}" for w, a in by_workload.items()) or "—"


def compact_summary(runs: list[Run], link: str) -> str:
    """Module 8's Measured table: one row per evidence run, each linked to its page under `link`
    (a relative URL prefix); the backfire line and the Runs page follow it in the module."""
    numbered = evidence_runs(runs)
    if not numbered:
        return NO_MEASUREMENT + "\n"
    baselines = baseline_ids([r for _, r in numbered])
    rows = []
    for n, run in numbered:
        r = run.record
        best = max(_gated_cells(run), key=lambda c: c.derived.speedup)
        rows.append([
            Markdown(f"[R{n}]({link}{run_slug(run)}.md)"),
            code(r.model_id),
            escape(r.provenance.kind) if r.provenance is not None else "—",
            escape(", ".join(dict.fromkeys(engine_text(run, c) for c in r.cells))),
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
        through = ""
        if r.engine_run is not None:  # an external engine: the one a user would run, with its weights and threads
            er = r.engine_run
            threads = er.engine_args.get("threads")
            through = escape(f" through {er.package} {er.version} ({er.dtype}"
                             + (f", {threads} thread(s)" if isinstance(threads, int) else "") + ")")
        first = (f"**Measured on a real model:** on {r.run_date:%Y-%m-%d} the atlas ran "
                 f"{code(r.model_id)} ({escape(r.provenance.kind)}){through} on {escape(r.hardware.text)} "
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
                    f"{where}, {escape(c.workload)} at T = {temp_text(c.temperature)}, k = {c.draft_tokens}: "
                    f"{d.speedup:.2f}×, with {num_text(d.acceptance_rate, 2)} of its drafts accepted "
                    f"({num_text(d.mean_accepted_length, 2)} tokens per verify pass)")
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
