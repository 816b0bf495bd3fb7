"""The conformance records as the site shows them: the verdict table with its record legend, the
short ids (C1, …) that cite a record, and the known causes (K1, …) behind failures.

Markdown is the site's business, so it is rendered here from atlas.conformance.record's verdicts;
the measurement side never imports the site.
"""

from __future__ import annotations

from collections.abc import Iterable

from atlas.conformance.record import Verdict
from atlas.site.parts.mdsafe import Markdown, code, escape, link, table


def record_ids(rows: Iterable[Verdict]) -> dict[str, str]:
    """Short ids C1, C2, … for the records behind these verdicts, newest first: the same ids in the
    conformance table and wherever a verdict is cited (the servable matrix)."""
    newest = sorted(rows, key=lambda v: (v.date, v.source), reverse=True)
    return {src: f"C{i}" for i, src in enumerate(dict.fromkeys(v.source for v in newest), 1)}


VERDICT_WORDS = {"lossless": "checked lossless", "fails": "fails", "inconclusive": "inconclusive"}


def evidence_table(shown: list[Verdict]) -> str:
    """Markdown: the verdicts the site shows (`shown`, current_verdicts: per build, release or
    patched, hardware, layout, temperature class and draft sampling, the verdict of the newest
    record that ran it with power), newest first; each row names its record. What is the same for a whole record (file, build, hardware, date,
    command) is said once, under the table, by its short id, and so is each known cause. A row
    that fails with a known cause present shows the cause instead of figures: those figures are
    what the defect left in memory, not a property of the engine."""
    rows = list(shown)
    if not rows:
        return "_No engine conformance record yet (`atlas conformance run`)._\n"
    rows.sort(key=lambda v: (v.date, v.build, v.layout, v.temperature, v.draft_sampling), reverse=True)
    ids = record_ids(rows)
    cause_ids = _cause_ids(rows)

    def why(v: Verdict) -> str:
        present = [k for k in v.causes if k.status == "present"]
        if v.result == "fails" and present:
            return (f"{v.reason}; cause: " + ", ".join(f"{cause_ids[k.id]} ({k.upstream_issue.rsplit('/', 1)[-1]})" for k in present)
                    + " (the failure figures are uninitialised memory, not characteristic: see the record)")
        patched = [k for k in v.causes if k.status == "patched"]
        tail = "".join(f"; {cause_ids[k.id]} patched out" for k in patched)
        return f"{v.reason}{tail}; {v.detail}"

    body = [
        [v.build, v.layout, v.temperature, v.draft_sampling, Markdown(f"**{VERDICT_WORDS[v.result]}**"), why(v), ids[v.source]]
        for v in rows
    ]
    first = {v.source: v for v in reversed(rows)}
    legend = "\n".join(
        f"- **{cid}**: {code(src)} — {escape(first[src].build)}{' (a patched build, not the release)' if first[src].patched else ''}, "
        f"{escape(first[src].hardware)} ({escape(first[src].device)}), {first[src].date}, made by {code(first[src].command)}"
        for src, cid in ids.items()
    )
    return table(["Build", "Layout", "T", "Drafts", "Verdict", "Why", "Record"], body) + "\n\n" + legend + "\n"


def _cause_ids(rows: Iterable[Verdict]) -> dict[str, str]:
    return {cid: f"K{i}" for i, cid in enumerate(dict.fromkeys(k.id for v in rows for k in v.causes), 1)}


def causes_text(rows: list[Verdict]) -> str:
    """Markdown: each known cause behind these verdicts, by its short id (K1, …, as the table cites
    them): the mechanism, which builds and checks it breaks, the upstream issue and fix, what
    reading says of the other builds, and the run-time patch that takes it out."""
    ids = _cause_ids(rows)
    causes = {k.id: k for v in rows for k in v.causes}
    return "\n".join(
        f"- **{ids[k.id]}** ({escape(k.id)}): {escape(k.mechanism)}. Applies to {escape(k.applies_to)}. Upstream: "
        f"{link('issue', k.upstream_issue)}, {link('fix', k.upstream_fix)}. Other builds: {escape(k.other_paths)}. "
        f"Run-time patch: {code(k.patch or '—')} ({code(f'atlas conformance run --patch {k.patch}')}), recorded as a patched build."
        for k in causes.values()
    )
