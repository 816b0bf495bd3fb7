"""The servable sections of the evidence file: the support matrix by model family, each cell with the
conformance results of the engine builds checked on that layout, and the grid of conformance
verdicts with the statistics behind them."""

from __future__ import annotations

from typing import Any

from atlas.evidence import head_engines as head_engine_rows
from atlas.evidence import servable as servable_matrix
from atlas.conformance import record as conformance
from atlas.site.parts import conformance_table
from atlas.site.parts.evidence_format import guardrail, indent
from atlas.site.parts.mdsafe import Markdown, code, escape, link, table


VERDICT_CSS = {"lossless": "verified", "fails": "fails", "inconclusive": "inconclusive"}  # the marks' colours (atlas.css)


def _checked_text(checked: list[servable_matrix.Checked], sources: dict[str, str]) -> str:
    """The conformance half of a cell: per build checked, its results, record and date, and the
    layout checked (named where it is not this family's own)."""
    parts = []
    for c in checked:
        results = [f'<span class="atlas-{VERDICT_CSS[result]}">{escape(key)}: {result}</span>' for key, result in c.results.items()]
        causes = "".join(f" (cause: {escape(k.id)}, {escape(k.upstream_issue.rsplit('/', 1)[-1])})"
                         for k in c.causes if k.status == "present")
        parts.append(" · ".join(results) + causes + f"<br>{escape(c.build)} on {escape(c.device)} "
                     f'<span class="atlas-nowrap">[{sources[c.record]}] {c.date}</span>')
    note = checked[0].layout_note
    return (f"<b>Conformance</b> (layout {escape(checked[0].layout)}"
            + (f": {escape(note)}" if not note.startswith("this family's own") else "") + "):<br>" + "<br>".join(parts))


def servable(rows: list[dict[str, Any]], matrix: servable_matrix.Matrix,
             verdicts: list[conformance.Verdict]) -> str:
    head = guardrail(
        "servable",
        f"Servable: support matrix of {matrix.date.isoformat()}",
        "An engine has code to draft with this architecture's MTP layers, at the version shown. "
        "This is not a measurement, and it does not check that a checkpoint ships the MTP weights.",
    )
    if not rows:
        return head + "\nNo current Hub model declares or ships MTP, so nothing to match.\n"
    engines = list(dict.fromkeys(e.engine for e in matrix.entry))
    methods = {m: f"M{i}" for i, m in enumerate(dict.fromkeys(e.method for e in matrix.entry), 1)}
    cites = {id(e): f"S{i}" for i, e in enumerate(matrix.entry, 1)}
    checks = conformance_table.record_ids(verdicts)
    used: set[str] = set()
    families: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        families.setdefault(r["model_type"] or "(no model_type)", []).append(r)
    body = []
    for family, members in sorted(families.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ids = sorted(m["repo_id"] for m in members)
        shown = ", ".join(escape(i) for i in ids[:4])
        if len(ids) > 4:
            shown += f", … ({len(ids) - 4} more)"
        cells = []
        archs = {a for m in members for a in servable_matrix.arch_list(m["architectures"])}
        for engine in engines:
            entries = list({id(e): e for m in members for e in m["engines"] if e.engine == engine}.values())
            if not entries:
                cells.append(Markdown("—"))
                continue
            n_served = sum(1 for m in members if any(e.engine == engine for e in m["engines"]))
            text = "<b>Support claim</b>: " + "<br>".join(
                f"yes · {methods[e.method]} · {escape(e.version)}<br>"
                f'<span class="atlas-nowrap">[{cites[id(e)]}] {(e.checked or matrix.date).isoformat()}</span>'
                for e in entries
            )
            if n_served < len(members):
                text += f" ({n_served} of {len(members)} models)"
            checked = servable_matrix.checked_for(None if family.startswith("(") else family, sorted(archs), engine, verdicts)
            if checked:
                text += "<br>" + _checked_text(checked, checks)
                used.update(c.record for c in checked)
            else:
                text += "<br><b>Conformance</b>: not checked"
            cells.append(Markdown(f'<span class="atlas-servable">{text}</span>'))
        body.append([code(family), Markdown(f"{len(ids)}: {shown}"), *cells])
    legend_m = "\n".join(f"- **{mid}** — {code(method)}" for method, mid in methods.items())
    legend_s = "\n".join(
        f"- **{cites[id(e)]}** — {escape(e.engine)} {escape(e.version)}, checked "
        f"{(e.checked or matrix.date).isoformat()}: {escape(e.source)}"
        + (f" ({escape(e.note)})" if e.note else "")
        for e in matrix.entry
    )
    legend_c = "\n".join(f"- **{cid}** — {code(src)} (all its verdicts: the conformance table below)"
                          for src, cid in checks.items() if src in used)
    return (
        head
        + "\n"
        + table(["family (model_type)", "models", *engines], body)
        + "\n\nA cell holds two named things. The **support claim**: served · method · engine version "
        "· [source] date checked (the engine has code for it; nothing was run). The **conformance** "
        "result: for each engine build the suite ran on this family's MTP layout, whether its MTP kept "
        "the model's output at T = 0 and T > 0 (lossless, fails, or inconclusive where the plain "
        "engine failed its own control), with the build, device, [record] and date; the layout "
        "checked is named where it is another family's with the same MTP tensors. The build checked "
        "is not the version the support claim cites. \"Not checked\": no conformance run covers "
        "that engine on this layout. A dash: that engine has no MTP drafting for the family in the "
        "matrix (not: it cannot run the model without MTP).\n\n"
        "**Methods**\n\n" + legend_m + "\n\n**Sources**\n\n" + legend_s + "\n"
        + ("\n**Conformance records**\n\n" + legend_c + "\n" if legend_c else "")
    )


def conformance_grid(verdicts: list[conformance.Verdict]) -> str:
    """Engine conformance verdicts (evidence/conformance/, beside the support matrix) as a grid:
    one row per engine version and layout, one column per temperature class and draft method,
    each cell one word; the statistics behind them one click away."""
    head = guardrail(
        "servable",
        "Checked lossless: engine conformance records",
        "Each row is a dated run of the conformance suite against one engine version on one MTP "
        "layout: oracle checkpoints whose right answers are exact, and random ones. It checks the "
        "engine's MTP, not a given checkpoint.",
    )
    if not verdicts:
        return head + "\n" + conformance_table.evidence_table(verdicts)
    columns = list(dict.fromkeys(
        (v.temperature, v.draft_sampling)
        for v in sorted(verdicts, key=lambda v: (v.temperature != "0", v.draft_sampling))))
    ids = conformance_table.record_ids(verdicts)
    causes = conformance_table.causes_text(verdicts)
    grid: dict[tuple[str, str, str], dict[tuple[str, str], conformance.Verdict]] = {}
    for v in verdicts:
        grid.setdefault((v.build, v.layout, v.source), {})[(v.temperature, v.draft_sampling)] = v
    body = []
    for (engine, layout, source), cells in sorted(grid.items()):
        row: list[object] = [escape(engine), code(layout)]
        for col in columns:
            v = cells.get(col)
            word = conformance.outcome(v) if v else None
            row.append(Markdown(f'<span class="atlas-{VERDICT_CSS[word]}">{word}</span>') if word else "—")
        row.append(ids[source])
        body.append(row)
    headers = ["engine", "layout", *(
        "T = 0" if t == "0" else f"T {t}, {sampling} drafts" for t, sampling in columns), "record"]
    return (head + "\n" + table(headers, body)
            + "\n\nA cell: whether the engine's MTP kept the model's output at that temperature "
            "with that draft method — *lossless* (every check with drafts passed, each on a sample with 95 % power "
            "to detect its deviation), *fails* (one failed beyond what the plain engine's own control explains), "
            "*inconclusive* (the only failures sit where the plain engine already failed its control, or a pass "
            "came from too small a sample); each cell comes from the newest record that ran it with that power; "
            "a build with a run-time patch is its own row, never the release. At T = 0 the draft method does not matter: "
            "output must equal plain decoding token for token.\n\n"
            + (f"**Known causes** of the failures (K1, …: the statistics below cite them):\n\n{causes}\n\n" if causes else "")
            + '??? servable "The statistics behind each verdict"\n'
            + indent(conformance_table.evidence_table(verdicts)) + "\n")


def head_engines(data: head_engine_rows.HeadEngines | None) -> str:
    """The reported-level table of which engines use the MTP head, per family: a section and box of
    its own after the support matrix, each row with its link and date, never a measured figure."""
    if data is None:
        return ""
    head = guardrail(
        "reported",
        f"Which engines use the MTP head (reported: public PRs and source files read {data.date.isoformat()})",
        "What each PR or source file states, per family and engine, with its state and the first version or build "
        "that has it where the sources say; \"not stated\" where they do not. Not a measurement of the atlas.",
    )
    # Five columns and a short link text: a repository path as link text is one unbreakable word
    # that widened the table past the content column.
    rows = [[escape(r.engine), escape(r.family), escape(r.what), link(_source_label(r.link), r.link),
             escape(_when(r))] for r in data.row]
    body = table(["engine", "family", "what it does with the head", "source", "state, date, first version"], rows)
    gaps = (f"\nNo public source on the head path was read for: {escape(', '.join(data.gaps))}.\n" if data.gaps else "")
    return f"{head}\n{body}\n{gaps}"


def _source_label(url: str) -> str:
    """A source link's text: `#N` for a pull request or issue, else the file or page name."""
    tail = url.rstrip("/").rsplit("/", 2)
    return f"#{tail[-1]}" if len(tail) == 3 and tail[-2] in ("pull", "issues") else tail[-1]


def _when(row: head_engine_rows.Row) -> str:
    """State, date and first version in one short cell: what the sources state, "not stated" only
    when they state none of the three (a card on a phone stays a few lines)."""
    stated = [v for v in (row.state, row.when, f"first: {row.first}") if not v.endswith("not stated")]
    return " · ".join(stated) or "not stated"
