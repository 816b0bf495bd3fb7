"""The Changelog page: the changelog's data (atlas.evidence.changelog, written by `atlas export` as
changelog.json beside the exported tables) rendered without the store."""

from __future__ import annotations

from pathlib import Path

from atlas.evidence.changelog import Changelog, RecordChange, SnapshotChanges
from atlas.site.parts.mdsafe import Markdown, code, escape, file_link, table


def _ids(ids: list[str]) -> Markdown:
    return Markdown(", ".join(str(code(i)) for i in ids))


def _snapshot_section(s: SnapshotChanges, servable_date: str) -> list[str]:
    lines = [f"### Snapshot #{s.snapshot_id} — {s.date} UTC", ""]
    if s.previous is None:
        lines += [escape(f"The first snapshot in the store: {s.n_models} Hub models, "
                         f"{len(s.new_mtp)} of them declare or ship MTP."), ""]
        if s.new_mtp:
            lines += [Markdown("Declare or ship MTP: ") + _ids(s.new_mtp) + ".", ""]
        if s.newly_servable:
            lines += [Markdown("Families with a servable model: ") + _ids(s.newly_servable) + ".", ""]
        return lines
    lines += [escape(f"Against snapshot #{s.previous}: {s.n_models} Hub models, {len(s.added)} added, "
                     f"{len(s.removed)} gone."), ""]
    if s.new_mtp:
        lines += [Markdown("**Newly declare or ship MTP:** ") + _ids(s.new_mtp) + ".", ""]
    if s.newly_servable:
        lines += [Markdown(f"**Newly servable families** (support matrix of {servable_date}): ")
                  + _ids(s.newly_servable) + ".", ""]
    if s.changed:
        lines += ["**Changed values**", "", table(
            ["model", "value", "before", "now", "revision now"],
            [[escape(c.repo_id), code(c.field), escape(c.old if c.old is not None else "—"),
              escape(c.new if c.new is not None else "—"),
              code((c.revision or "—")[:12])] for c in s.changed]), ""]
    if s.added:
        lines += [Markdown("Added to the crawl: ") + _ids(s.added) + ".", ""]
    if s.removed:
        lines += [Markdown("Gone from the crawl: ") + _ids(s.removed) + ".", ""]
    if not (s.new_mtp or s.newly_servable or s.changed or s.added or s.removed):
        lines += ["No model changed a compared value.", ""]
    return lines


def _record_row(r: RecordChange, links: dict[str, str]) -> list[object]:
    source = _record_link(r.source, links)
    again = "; ".join(f"{n} of {Path(src).name}" for src, n in r.remeasured.items()) or "—"
    return [Markdown(f'<span class="atlas-nowrap">{escape(r.date)}</span>'), r.kind, escape(r.subject), source,
            r.n_rows, r.added, escape(again)]


def _record_link(source: str, links: dict[str, str]) -> Markdown:
    name = Path(source).name
    return file_link(name, links[source]) if source in links else code(name)


def _moved_rows(log: Changelog, links: dict[str, str]) -> list[list[object]]:
    return [[m.kind, escape(m.condition), escape(m.field),
             Markdown(" → ".join(f"<strong>{escape(st.value)}</strong> ({_record_link(st.source, links)}, "
                                 f'<span class="atlas-nowrap">{escape(st.date)}</span>)' for st in m.steps))]
            for m in log.moved]


def page(log: Changelog | None, links: dict[str, str]) -> str:
    """The Changelog page (Markdown). `links`: record source path -> its link on the site."""
    lines = ["# Changelog", ""]
    if log is None:
        return "\n".join(lines + ["No changelog in this build: `atlas export` writes it from the store "
                                  "(`make demo` does), then `atlas site build --data` renders it.", ""])
    lines += [
        "What each crawl and each record changed, newest first, generated from the store and the "
        "record files. Snapshots compare each model's declared and shipped MTP layers, declared key "
        "and model type with the snapshot before; a record's rows are its measured cells (model, "
        "engine, workload, temperature, draft length) or its conformance verdicts (engine build, "
        "hardware, layout, temperature class, draft sampling). Models this project made are not "
        "listed under snapshots.", "",
        "## What moved", "",
        "Conditions whose verdict changed from one record to a later one (a conformance result, or "
        "the gate's verdict of a measured cell), with every value in run order and the record that "
        "gave it.", "",
    ]
    lines += [table(["kind", "condition", "what", "values, oldest first"], _moved_rows(log, links)) if log.moved
              else "No verdict changed between records.", ""]
    lines += ["## Records", ""]
    if log.records:
        lines += [table(["run (UTC)", "kind", "subject", "record file", "#rows", "#new conditions",
                         "measured again (rows of earlier records)"],
                        [_record_row(r, links) for r in reversed(log.records)]), ""]
    else:
        lines += ["No record yet.", ""]
    lines += ["## Snapshots", ""]
    for s in reversed(log.snapshots):
        lines += _snapshot_section(s, log.servable_date)
    if not log.snapshots:
        lines += ["No complete snapshot yet.", ""]
    return "\n".join(lines)
