"""The measured level in module 8: imported measurement records (atlas.evidence.runs) -> one row per
run (compact_summary), the generated answer (answer_text), the cells slower than plain decoding
(backfires_text) and the dated line of what the atlas itself measured (measured_line).

Which records count is decided by the store (`measurement_cells`: what `atlas measure import`
accepted); their content is read back from the record files it names, because the per-position
counts and the per-(workload, temperature) gate live only there. A file whose record no longer
has the imported record id (records.record_id) is refused: the page would otherwise show figures
nobody imported.

Each run's own page, with every figure, is atlas.site.pages.runpages; what the two share (run numbers,
engine names, baseline ids, the run lines) is here.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from atlas.evidence.runs import Run
from atlas.records import gating, record as records
from atlas.records.experiment import engine_patches, engine_threads, engine_wait_policy
from atlas.site.parts import fold
from atlas.site.parts.mdsafe import Markdown, code, escape, table

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


def setup_text(run: Run, brief: bool = False) -> str:
    """What made a run's speed besides the hardware (record_setup)."""
    return record_setup(run.record, brief)


def record_setup(r: records.Record, brief: bool = False) -> str:
    """A record's engine (the one its gate decided for), threads, matmul kernels and draft
    vocabulary, as plain text. Records from before our loop recorded its kernels ran PyTorch's
    matmul ("mm"); an engine's own run uses that engine's kernels. `brief` is for a table cell
    that links to the run's page: there an engine run goes without "its own kernels" (no engine
    takes ours) and its patches without their names, which the run's page gives."""
    engine = gating.gated_engine(r.cells)
    cells = [c for c in r.cells if c.engine == engine] or list(r.cells)
    if r.engine_run is not None:  # an external engine: the one a user would run, with its weights' type
        # llama.cpp's dtype is its GGUF's file type (MOSTLY_Q4_0: most tensors Q4_0), the type a reader picks;
        # vLLM's is the torch dtype it loaded safetensors weights in
        e = r.engine_run
        weights = f"{e.dtype.removeprefix('MOSTLY_')} GGUF" if e.name == "llamacpp" else e.dtype
        output = (e.conversion or {}).get("output_layer")
        if isinstance(output, str) and output.startswith("output.weight"):  # an untied copy (llamacpp_gguf): its own output layer
            weights += f", output layer untied at {output.split(', ')[-1]}"
        name = f"{e.package} {e.version} ({weights})"
    else:
        name = ", ".join(dict.fromkeys(f"{ENGINE_NAMES.get(c.engine, c.engine)} {c.engine_version}" for c in cells))
    return f"{name}, {setup_details(r, brief)}"


def setup_details(r: records.Record, brief: bool = False) -> str:
    """A record's threads, matmul kernels and draft vocabulary (record_setup without the engine)."""
    kernels = "its own kernels" if r.engine_run is not None else f"kernels {r.settings.kernels or 'mm (PyTorch matmul)'}"
    # an engine that runs its own threads (llama.cpp's --threads) records them with its arguments
    threads = engine_threads(r)
    vocab = r.settings.draft_vocab
    drafts = (f"draft vocabulary cut to {vocab.size} tokens" if vocab is not None
              else "full draft vocabulary")
    if patches := [name for name, _ in engine_patches(r)]:  # a patched build: every line of it says so, the page names each patch
        label = "atlas patch" if len(patches) == 1 else "atlas patches"
        drafts += f" ({label})" if brief else f" ({label} {', '.join(patches)})"
    threads_text = f"{threads} thread{'s' if threads != 1 else ''}"
    if engine_wait_policy(r) == "PASSIVE":  # the engine's OpenMP workers slept at every barrier: a slowed setting, not its default
        threads_text += " (OpenMP wait PASSIVE)"
    if brief and r.engine_run is not None:
        return f"{threads_text}, {drafts}"
    return f"{threads_text}, {kernels}, {drafts}"


def head_text(r: records.Record) -> str:
    """", head <folder>" for a record of a project-made head with its recipe, "" else: each run's line
    names it, so two heads on one main model read apart."""
    head = r.provenance.mtp_head if r.provenance is not None and r.provenance.project_made else {}
    recipe = head.get("recipe")
    if not isinstance(recipe, str):
        return ""
    return f", head {PurePosixPath(recipe).parent.name or recipe}"


def below_one(runs: list[Run]) -> list[tuple[int, Run, records.Cell]]:
    """Every measured cell whose median speed-up is below 1 (slower than plain decoding)."""
    return [(n, run, c) for n, run in evidence_runs(runs) for c in run.record.cells
            if c.derived.speedup < 1]


def backfires_text(runs: list[Run]) -> str:
    """For "When it backfires": the real-model runs the answer speaks of (featured, and our loop's
    reference), each against its own break-even, then how many measured cells ran slower than plain
    decoding in all."""
    numbered = evidence_runs(runs)
    if not numbered:
        return "This build has no measurement, so it cannot show a cell where MTP was slower."
    slow = below_one(runs)
    n_cells = sum(len(r.record.cells) for _, r in numbered)
    if not slow:
        return (f"None of the {n_cells} measured cells of this build ran slower than plain "
                f"decoding (median speed-up below 1×); that says nothing about other models, "
                f"workloads or hardware.")
    # the runs the answer speaks of (the featured one and our loop's reference); the others' pages hold theirs
    shown = [nr for nr in (featured(runs), reference(runs)) if nr is not None and nr[1].record.pass_costs]
    lead = "".join(_real_backfires(n, run) for n, run in shown)
    runs_slow = len({n for n, _, _ in slow})
    return (lead + f"In all, {len(slow)} of {n_cells} measured cells, in {runs_slow} of {len(numbered)} runs, "
            "ran slower than plain decoding (median speed-up below 1×); each run's page lists them.")


def _real_backfires(n: int, run: Run) -> str:
    """One real-model run against the break-even its own pass costs set, and its own rounds (which
    include what the engine does between passes): its setup, how many of the gated engine's cells
    ran below 1×, and its k = 1 acceptance by workload (the Measured table's figure)."""
    cells = gated_cells(run)
    below = sum(1 for c in cells if c.derived.speedup < 1)
    text = (f"**R{n}{escape(label(run))}, {escape(setup_text(run))}:** {below} of {len(cells)} cells "
            f"ran below 1× (median speed-ups {_speed_range(cells)})")
    by_workload = workload_acceptance(cells)
    even = break_even_acceptance(run.record.pass_costs)
    if by_workload and even is not None:
        low, high = min(by_workload, key=by_workload.get), max(by_workload, key=by_workload.get)
        text += (f"; its k = 1 acceptance ran from {by_workload[low]:.2f} ({escape(low)}) to "
                 f"{by_workload[high]:.2f} ({escape(high)}), where its pass costs need about {even:.2f} "
                 "to break even" + (" (more than every draft: at k = 1 it cannot pay)" if even >= 1 else ""))
        text += "" if (rounds := round_cost(cells)) is None else f" and its own rounds {rounds - 1:.2f}"
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
        line = (f"R{n}{escape(label(run))}: {code(r.model_id)} at {code(short_rev(r.revision))}, through {escape(engines)} "
                f"({escape(setup_details(r) + head_text(r))}), "
                f"on {escape(r.hardware.label())}, run {r.run_date:%Y-%m-%d} (record "
                f"{code(run.record_id[:12])}): median speed-ups {_speed_range(r.cells)} over "
                f"{len(r.cells)} cells")
        if greedy:
            line += f"; greedy output identical to plain decoding in {identical} of {len(greedy)} T = 0 cells"
        out.append(line + ".")
    return out


SHOWN_RUNS = 8  # runs listed in view under "What the atlas itself measured"; the rest fold


def measured_line(runs: list[Run]) -> str:
    """The verdict's closing line: what the atlas itself measured, dated and cited, not generalised."""
    lines = run_lines(runs)
    if not lines:
        return ("**What the atlas itself measured:** nothing yet. No dated run record is imported, "
                "so this page makes no claim of its own about any speed-up.\n")
    models = sorted({r.record.model_id for _, r in evidence_runs(runs)})
    # the newest runs in view, the earlier ones in a closed box: each run adds a line, the page has a budget
    shown, earlier = lines[-SHOWN_RUNS:], lines[:-SHOWN_RUNS]
    box = ("\n\n" + fold.more(f"the {len(earlier)} earlier run{'s' if len(earlier) != 1 else ''}",
                               lambda: "\n".join(f"- {line}" for line in earlier))) if earlier else ""
    return ("**What the atlas itself measured** — " + ", ".join(code(m) for m in models)
            + ", and nothing else:\n\n" + "\n".join(f"- {line}" for line in shown) + box
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


def gated_cells(run: Run) -> list[records.Cell]:
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
    """Per workload up to five; beyond, the lowest and highest (the run's page has every one)."""
    by_workload = workload_acceptance(gated_cells(run))
    if len(by_workload) > 5:
        low, high = min(by_workload, key=by_workload.get), max(by_workload, key=by_workload.get)
        return f"{by_workload[low]:.2f} ({low}) to {by_workload[high]:.2f} ({high}) over {len(by_workload)} workloads"
    return "; ".join(f"{w} {a:.2f}" for w, a in by_workload.items()) or "—"


TEACHING_MODEL = ("The team model `mtp-atlas/byte-mtp-8l` is a byte-level teaching model the atlas trains itself "
                  "(`make team-model`); its greedy output falls into repetition, which is easy to draft, so its "
                  "T = 0 rows flatter acceptance and say nothing about a production model.")


def compact_summary(runs: list[Run], link: str) -> str:
    """Module 8's Measured table: one row per evidence run, each linked to its page under `link`
    (a relative URL prefix); the real model's runs the answer names (featured, and our loop's
    reference beside an engine's) open, its other runs and the teaching model's in closed boxes (the
    page's budget); the backfire line and the Runs page follow it in the module."""
    numbered = evidence_runs(runs)
    if not numbered:
        return NO_MEASUREMENT + "\n"
    baselines = baseline_ids([r for _, r in numbered])
    rows: dict[bool, list[list[Markdown]]] = {True: [], False: []}  # real model or not
    named = {chosen[0] for chosen in (featured(runs), reference(runs)) if chosen is not None}
    others: list[list[Markdown]] = []  # real-model runs the answer does not name: folded (the page's budget)
    for n, run in numbered:
        r = run.record
        best = max(gated_cells(run), key=lambda c: c.derived.speedup)
        into = others if is_real(run) and n not in named else rows[is_real(run)]
        into.append([
            Markdown(f"[R{n}]({link}{run_slug(run)}.md)"),
            code(r.model_id),
            escape(r.provenance.kind) if r.provenance is not None else "—",
            escape(setup_text(run, brief=True)),  # the row links to the run's page, which has it whole
            # one line on a phone's card: the column says machine, so a CPU goes without its "CPU: " prefix
            escape(f"{r.hardware.label().removeprefix('CPU: ')}, {r.run_date:%Y-%m-%d}"),
            baselines[best.baseline],
            _best_with_bounds(best),
            escape(_k1_acceptance(run)),
            _gate_counts(run),
        ])
    legend = "; ".join(f"**{bid}** {escape(text)}" for text, bid in baselines.items())
    header = ["run", "model", "label", "setup", "machine, date", "baseline", "best median speed-up (paired bounds)",
              "k = 1 acceptance by workload", "gate (workload × T)"]
    # The real model's runs lead; the teaching model's follow in a closed box (the page's budget)
    if not rows[True]:
        shown = TEACHING_MODEL + "\n\n" + table(header, rows[False])
    else:
        shown = table(header, rows[True])
        if others:
            shown += "\n\n" + fold.more(f"{len(others)} other real-model run(s): other engines, quantisations, kernels and days",
                                          lambda: table(header, others))
        if rows[False]:
            shown += "\n\n" + fold.more("runs of the teaching model", lambda: TEACHING_MODEL + "\n\n" + table(header, rows[False]))
    return (shown
            + f"\n\nBaselines (what a speed-up divides by): {legend}. A row's speed-up is over its own baseline, from "
            "the cells of the engine its *setup* names (with its threads, matmul kernels and draft vocabulary); "
            "*k = 1 acceptance* is accepted ÷ drafted at k = 1 per workload, temperatures pooled.\n")


def is_real(run: Run) -> bool:
    """A run of a real main model (its record's provenance names one), not the byte-level
    teaching model."""
    p = run.record.provenance
    return p is not None and bool(p.main_model.get("source"))


def featured(runs: list[Run]) -> tuple[int, Run] | None:
    """The one run module 8's answer, plain answer and charts speak of: a real-model run that timed
    its own passes (so its speed-ups, acceptance and break-even share one engine and one setup),
    through an engine people run (llama.cpp, vLLM) before our loop, the newest day first and, within
    a day, the setup with the fastest plain decoding (the one MTP has to beat) and, among that setup's
    runs (a stock and a cut draft over the same GGUF), the one whose MTP decoding was fastest; the
    newest real-model run when none timed them; None without a real model."""
    real = [(n, r) for n, r in evidence_runs(runs) if is_real(r)]

    speeds = {n: pooled_speed(gated_cells(run)) or (0, 0.0, 0.0) for n, run in real}  # (k, plain, MTP tokens/s)

    def setup(run: Run) -> tuple[object, ...]:
        """What fixes plain decoding: main model, engine, weights as run, threads, machine and day. Two
        project-made heads on one main model share it (plain decoding never runs the head), so their
        runs compare by MTP's speed, not by the noise between their plain timings."""
        r = run.record
        main = r.provenance.main_model.get("sha256") if r.provenance else None  # free-form in a record: a string or nothing
        return (r.model_id, main if isinstance(main, str) else r.revision, r.engine_run.name if r.engine_run else "atlas", r.settings.dtype,
                engine_threads(r), r.hardware.label(), r.run_date.date())

    setups = {n: setup(run) for n, run in real}
    plain_of_setup: dict[tuple[object, ...], float] = {}
    for n, _ in real:
        plain_of_setup[setups[n]] = max(plain_of_setup.get(setups[n], 0.0), speeds[n][1])
    # among one day's engine runs, the setup whose plain decoding was fastest: the one a user would pick
    return max(real, key=lambda nr: (nr[1].record.pass_costs is not None, nr[1].record.engine_run is not None,
                                     nr[1].record.run_date.date(), plain_of_setup[setups[nr[0]]], speeds[nr[0]][2],
                                     nr[1].record.run_date, nr[0]),
               default=None)


def reference(runs: list[Run]) -> tuple[int, Run] | None:
    """Where the featured run is an engine's: the newest real-model run of our own loop with its
    passes timed, the exactness reference the answer gives next to it; None otherwise."""
    chosen = featured(runs)
    if chosen is None or chosen[1].record.engine_run is None:
        return None
    ours = [(n, r) for n, r in evidence_runs(runs) if is_real(r) and r.record.engine_run is None and r.record.pass_costs]
    return max(ours, key=lambda nr: (nr[1].record.run_date, nr[0]), default=None)


def answer_text(runs: list[Run], link: str) -> str:
    """The measured answer, by rule from the records: one dated, linked sentence on the featured
    run (what it ran on and through, and whether it paid: the gate on for at least one workload
    and temperature), then where its gain came from, or why there was none, from the same run."""
    numbered = evidence_runs(runs)
    chosen = featured(runs)
    if chosen is None:
        return ("**Measured on a real model:** nothing in this build. "
                + (f"Its {len(numbered)} run(s) are of the atlas's own teaching model only, so this page "
                   "makes no measured claim about a real model." if numbered else
                   "It holds no measurement record at all.") + "\n")
    n, run = chosen
    r = run.record
    cells = gated_cells(run)
    faster = sum(1 for c in cells if c.derived.speedup > 1)
    on = sum(1 for g in r.gates if g.enabled)
    paid = "it paid" if on else "it did not pay"
    first = (f"**Measured on a real model:** on {r.run_date:%Y-%m-%d} the atlas ran "
             f"{code(r.model_id)} ({escape(r.provenance.kind)}) on {escape(r.hardware.label())} through "
             f"{escape(setup_text(run) + head_text(r))} ([R{n}]({link}{run_slug(run)}.md)), and **{paid}**: the gate switched "
             f"MTP on for {on} of {len(r.gates)} workload × temperature pairs, and {faster} of {len(cells)} "
             f"cells ran faster than plain decoding (median speed-ups {_speed_range(cells)}).")
    pooled = pooled_speed(cells)
    if pooled is not None:
        k, plain_tps, mtp_tps = pooled
        first += (f" At T = 0, all its workloads pooled, plain decoding ran at {plain_tps:.1f} tokens/s and MTP at its "
                  f"fastest draft length (k = {k}) at {mtp_tps:.1f} tokens/s ({mtp_tps / plain_tps:.2f}×).")
    n_real = sum(1 for _, x in numbered if is_real(x))
    if n_real > 1:
        first += (f" It is one of {n_real} real-model runs in the Measured table, each with its own engine "
                  "and setup; their figures are not pooled.")
    return first + " " + _gain_source(n, run, link) + _reference_text(runs, link) + "\n"


def pooled_speed(cells: list[records.Cell], temperature: float = 0.0) -> tuple[int, float, float] | None:
    """(k, plain tokens/s, MTP tokens/s) at `temperature`, every workload's runs pooled (tokens over
    seconds, each side over its own interleaved runs), at the k whose pooled ratio is highest; None
    without such cells."""
    sums: dict[int, tuple[int, float, float]] = {}  # k -> (tokens, MTP seconds, plain seconds)
    for c in cells:
        if c.temperature == temperature:
            n, spec, plain = sums.get(c.draft_tokens, (0, 0.0, 0.0))
            for r in c.repeats:
                n, spec, plain = n + r.tokens, spec + r.seconds, plain + r.baseline_seconds
            sums[c.draft_tokens] = (n, spec, plain)
    if not sums:
        return None
    k = max(sums, key=lambda k: sums[k][2] / sums[k][1])
    n, spec, plain = sums[k]
    return k, n / plain, n / spec


def round_cost(cells: list[records.Cell]) -> float | None:
    """A k = 1 round as the run timed it, in plain steps: seconds per verify pass over seconds per
    plain token, each pooled over the T = 0, k = 1 cells' repeats (the overhead outside the
    forward passes included, unlike the pass costs); None without such cells."""
    repeats = [r for c in cells if c.temperature == 0 and c.draft_tokens == 1 for r in c.repeats]
    passes = sum(r.verify_passes for r in repeats)
    if not passes:
        return None
    return (sum(r.seconds for r in repeats) / passes) / (sum(r.baseline_seconds for r in repeats) / sum(r.tokens for r in repeats))


def _reference_text(runs: list[Run], link: str) -> str:
    """Our loop's newest real-model run, after an engine's answer: what it showed, as the reference
    whose output is checked token for token (atlas.site.parts.measured.reference)."""
    found = reference(runs)
    if found is None:
        return ""
    n, run = found
    r = run.record
    cells = gated_cells(run)
    on = sum(1 for g in r.gates if g.enabled)
    same = [c.derived.greedy_lossless for c in cells if c.derived.greedy_lossless is not None]
    return (f" **Our own loop, the exactness reference:** [R{n}]({link}{run_slug(run)}.md), on {r.run_date:%Y-%m-%d}, "
            f"{escape(r.hardware.label())}, {escape(setup_text(run) + head_text(r))}: the gate switched MTP on for {on} of "
            f"{len(r.gates)} pairs "
            f"(median speed-ups {_speed_range(cells)}), and its greedy output equalled plain decoding in {sum(same)} of "
            f"{len(same)} cells. The two runs are separate experiments; their figures are not pooled.")


def _gain_source(n: int, run: Run, link: str) -> str:
    """Where the featured run's gain came from: its gated-on row with the best median, with its
    acceptance and the run's round cost; with no gain, its acceptance against its break-even."""
    found = []
    for g in run.record.gates:
        if g.enabled and g.draft_tokens is not None:
            c = next((c for c in gated_cells(run) if (c.workload, c.temperature, c.draft_tokens)
                      == (g.workload, g.temperature, g.draft_tokens)), None)
            if c is not None:
                found.append(c)
    costs = run.record.pass_costs
    if found:
        c = max(found, key=lambda c: c.derived.speedup)
        d = c.derived
        text = (f"**Where the gain came from:** the best gated-on row of [R{n}]({link}{run_slug(run)}.md) "
                f"is {escape(c.workload)} at T = {temp_text(c.temperature)}, k = {c.draft_tokens}: "
                f"{d.speedup:.2f}×, with {num_text(d.acceptance_rate, 2)} of its drafts accepted "
                f"({num_text(d.mean_accepted_length, 2)} tokens per verify pass)")
        verify = costs.verify.get(c.draft_tokens) if costs else None
        if costs and verify is not None:
            text += (f" against a round that cost {(verify + c.draft_tokens * costs.draft) / costs.plain:.2f} "
                     f"plain steps")
        return text + "."
    k1 = [c.derived.acceptance_rate for c in gated_cells(run)
          if c.draft_tokens == 1 and c.derived.acceptance_rate is not None]
    even = break_even_acceptance(costs)
    text = f"**Where a gain would come from:** no gate turned on in R{n}"
    measured_round = round_cost(gated_cells(run))
    if k1 and even is not None:
        text += f"; at k = 1 its head's drafts were accepted {min(k1):.2f}–{max(k1):.2f} of the time, and "
        text += (f"with that run's pass costs breaking even needs about {even:.2f}" if even < 1 else
                 f"with that run's pass costs a k = 1 round (verify and draft) costs {1 + even:.2f} plain steps, more than "
                 "the two tokens it can emit: no acceptance pays at k = 1 there, whatever the head")
    if measured_round is not None:
        text += (f"; in the run itself, with everything outside the passes, a k = 1 round took {measured_round:.2f} plain "
                 "steps, so " + (f"it would have paid only above an acceptance of {measured_round - 1:.2f}" if measured_round < 2
                                 else "no acceptance could have paid"))
    return text + "."


_NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _count_word(n: int) -> str:
    return _NUMBER_WORDS[n] if 0 <= n < len(_NUMBER_WORDS) else str(n)


def _plain_setup(run: Run) -> str:
    """The featured run's setup in words a newcomer reads: which engine, how many threads, and the
    kernels and draft vocabulary only where the run changed them."""
    r = run.record
    engine = ("the atlas's own decoding loop" if gating.gated_engine(r.cells) == "atlas"
              else f"the {r.engine_run.package if r.engine_run else 'named'} engine")
    threads = r.hardware.torch_threads
    text = f"through {engine}, on {_count_word(threads)} processor thread{'s' if threads != 1 else ''}"
    extras = []
    if r.engine_run is None and r.settings.kernels and r.settings.kernels != "mm":
        extras.append("matrix code picked for its checking pass")
    if r.settings.draft_vocab is not None:
        extras.append("guesses drawn only from the word pieces its head saw most in training"
                      + (" (a change the atlas made to the engine)" if engine_patches(r) else ""))
    return text + (", with " + " and ".join(extras) if extras else "")


def plain_answer(runs: list[Run]) -> str:
    """The 2-minute version's answer, and the home page's: the featured run in plain words (no
    symbols; the only numbers are the core and thread counts, as words), where it paid and where
    not, by the gate. Sentences of their own: the page puts its own label before them."""
    chosen = featured(runs)
    if chosen is None:
        return ("The atlas has not yet measured MTP on a real model, only on a tiny teaching model of "
                "its own, so it makes no measured claim about real ones.\n")
    _, run = chosen
    r = run.record
    on = list(dict.fromkeys(g.workload for g in r.gates if g.enabled))
    never = [w for w in dict.fromkeys(g.workload for g in r.gates) if w not in on]
    cores = r.hardware.cpu_cores if r.settings.device == "cpu" else None
    where = (f"an ordinary {_count_word(cores)}-core processor" if cores is not None
             else escape(r.hardware.label()))
    text = (f"The atlas measured a real but small model, with an MTP head the atlas "
            f"trained itself, on {where} {escape(_plain_setup(run))}. ")
    if on:
        text += (f"There MTP paid on some kinds of text and not on others: it was reliably faster (even "
                 f"allowing for the scatter of repeated timings) on {escape(_and(on))} prompts")
        text += f", and never reliably faster on {escape(_and(never))} prompts. " if never else ". "
    else:
        text += "There MTP did not pay: it was never reliably faster than plain generation. "
    if (beside := reference(runs)) is not None:  # the featured run is an engine's: our loop's verdict too
        ours = beside[1].record
        ours_on = list(dict.fromkeys(g.workload for g in ours.gates if g.enabled))
        place = ("the same processor" if ours.hardware.label() == r.hardware.label() else escape(ours.hardware.label())
                 if ours.settings.device != "cpu" else f"another {_count_word(ours.hardware.cpu_cores)}-core processor")
        text += (f"The atlas's own decoding loop, on {place}, was "
                 + (f"reliably faster on {escape(_and(ours_on))} prompts. " if ours_on else "never reliably faster. "))
    return text + "No large published model's own MTP head has been measured here.\n"


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
