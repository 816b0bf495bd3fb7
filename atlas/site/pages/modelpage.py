"""One tracked model's page (docs/models/<slug>.md), written at site build time from models.json
without the store: its claim levels side by side, each with its provenance, base model and
derivatives linked, a speculative drafter and its target linked to each other, its history across
snapshots; and `render`, which writes the whole docs/models/ folder (the finder and every page).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

from atlas.evidence import reported as reported_figures
from atlas.evidence import servable as servable_matrix
from atlas.site.pages import datapage
from atlas.site.parts import measured as measured_section
from atlas.site.parts import mtp_forms
from atlas.site.parts import reported as reported_section
from atlas.site.pages.modelfinder import FINDER_PARTS, SERVING_ENGINES, conformance_words, finder, finder_parts, measured_engines
from atlas.site.parts.mdsafe import Markdown, code, escape, table
from atlas.site.parts.models_json import Measured, Model, Models, Snapshot, not_crawled_words, snapshot_words
from atlas.site.parts.numbers import fixed

_MODULE = "../modules/module-08.md"


def _rev(revision: str | None) -> Markdown:
    if not revision:
        return Markdown("—")
    scheme, _, digest = revision.rpartition(":")
    return code(f"{scheme}:{digest[:12]}" if scheme else digest[:12])


def _link(m: Model | None, repo_id: str, here: str = "") -> Markdown:
    if m is not None and m.has_page:
        return Markdown(f"[{escape(repo_id)}]({here}{m.slug}.md)")
    return escape(repo_id)


def _levels(m: Model, figures: list[reported_figures.Figure], mirror_date: str | None,
            servable_date: str) -> Markdown:
    c = m.current
    where = (snapshot_words(c.snapshot_id, c.snapshot_date, mirror_date) + ", revision " if c else "")
    if c is None:
        declared: list[Any] = [not_crawled_words(m), "—"]
        shipped: list[Any] = [not_crawled_words(m), "—"]
    else:
        declared = [
            f"{c.declared} MTP layer(s)" if c.declared is not None else "no MTP key (not declared)",
            Markdown(escape(where) + _rev(c.revision)
                     + (Markdown(", key ") + code(c.declared_key) if c.declared_key else Markdown(""))),
        ]
        shipped = [
            "unknown (weight names not read)" if c.shipped is None
            else f"{c.shipped} MTP layer(s) in the weight index" if c.shipped else "no MTP tensors",
            Markdown(escape(where) + _rev(c.revision)
                     + (Markdown(", ") + code(c.shipped_evidence) if c.shipped_evidence else Markdown(""))),
        ]
    precision = _precision_row(c, where)
    if m.servable:
        servable: list[Any] = [
            Markdown("; ".join(f"{escape(e.engine)} {escape(e.version)} ({conformance_words(e)})" for e in m.servable)),
            f"support matrix of {servable_date}; conformance records under evidence/conformance/ (below)",
        ]
    else:
        servable = ["no engine in the support matrix", f"support matrix of {servable_date}"]
    ran = [e for e in measured_engines(m) if SERVING_ENGINES.get(e.split(" ", 1)[0])]
    if ran:
        servable = [Markdown(f"{servable[0]}; ran its MTP in a measured run: "
                             + "; ".join(str(escape(e)) for e in ran)),
                    Markdown(f"{servable[1]}; dated records (measured, below)")]
    rep: list[Any] = (
        [f"{len(figures)} published figure(s)", "evidence/reported.toml (sources below)"]
        if figures else ["none on record", "evidence/reported.toml"]
    )
    meas: list[Any] = (
        [f"{len(m.measured)} measured cell(s) from {len({x.record_id for x in m.measured})} record(s), "
         f"engines: {', '.join(measured_engines(m))}",
         "dated records under evidence/measurements/ (below)"]
        if m.measured else ["not measured by the atlas", "—"]
    )
    # a drafter link is a present claim: it sits with declared and shipped, never summed into either count
    drafter = ([["speculative drafter (own repo, not MTP)", Markdown("; ".join(_drafter_words(m))),
                 Markdown(escape(where) + _rev(c.revision if c else None))]] if m.drafter is not None or m.drafters else [])
    # the form is a present claim too: what the config, the weight names and GGUF headers say together
    form = mtp_forms.page_rows(m.form, Markdown(escape(where) + _rev(c.revision if c else None)))
    rows = [["declared", *declared], ["shipped", *shipped], *form, ["MTP precision (shipped)", *precision], *drafter,
            ["servable", *servable], ["reported", *rep], ["measured", *meas]]
    return table(["claim level", "what it says", "provenance"], rows)


DRAFTER_EVIDENCE = {"base_model": "from its card's base_model", "config": "from its config",
                    "name": "from its repo name, the drafter suffix stripped"}


def _slug_link(text: str, slug: str | None) -> Markdown:
    return Markdown(f"[{escape(text)}]({slug}.md)") if slug else escape(text)


_NO_CLAIM = "its card names no single base_model and no repo of this snapshot has its name without the drafter suffix"


def _drafter_words(m: Model) -> list[Markdown]:
    """The drafter link in words, each side linking to the other's page: what this drafter repo
    drafts for (and by which evidence, or that the target is unknown), and the drafter repos
    published for this model."""
    out = []
    d = m.drafter
    if d is not None:
        kind = f"{escape(d.method or 'drafter')}, not MTP ({code(d.kind)}, config key {code(d.kind_key)})"
        if d.target is not None:
            pinned = f"; trained against the target at {code(d.target_revision)}" if d.target_revision else ""
            out.append(Markdown(f"{kind} for {_slug_link(d.target, d.target_slug)} "
                                f"(target {escape(DRAFTER_EVIDENCE.get(d.evidence or '', d.evidence or ''))}){pinned}"))
        else:
            out.append(Markdown(f"{kind}; target unknown: {escape(d.problem or _NO_CLAIM)}"))
    if m.drafters:
        out.append(Markdown("speculative drafter published (not MTP): " + ", ".join(
            f"{_slug_link(p.repo_id, p.slug)} ({escape(DRAFTER_EVIDENCE.get(p.evidence, p.evidence))})"
            for p in m.drafters)))
    return out


PRECISION_WORDS = {"no": "not quantized", "partly": "partly quantized", "yes": "quantized", "unknown": "unknown"}


def _precision_row(c: Snapshot | None, where: str) -> list[Any]:
    """The MTP layer's precision as the checkpoint ships it (atlas.fingerprints.precision): whether it is
    quantized, in what dtype, and from which file and key; "unknown" whenever the rules cannot say."""
    if c is not None and c.mtp_quantized is None and not (c.declared or 0) > 0 and not (c.shipped or 0) > 0:
        # a page without an MTP layer of its own: an MTP drafter repo's target (or, by its config, the drafter)
        return ["no MTP layer declared or shipped in this repo: no precision to read", "—"]
    if c is None or c.mtp_quantized is None:
        return ["unknown (not read for this snapshot: its fingerprints predate the precision rule)", "—"]
    what = PRECISION_WORDS.get(c.mtp_quantized, "unknown")
    dtype = c.mtp_dtype or "unknown"
    return [f"{what}; dtype: {dtype}" if what != "unknown" or dtype != "unknown" else "unknown",
            Markdown(escape(where) + _rev(c.revision) + Markdown(", ") + code(c.mtp_quantized_evidence or "—")
                     + Markdown("; dtype from ") + code(c.mtp_dtype_evidence or "—"))]


def page(m: Model, by_id: dict[str, Model], figures: list[reported_figures.Figure],
         data: Models, downloads: set[str] = frozenset()) -> str:
    """`downloads`: the record files the Data page ships (docs/data/records/measurements/), which
    a record's line links."""
    lines = [f"# {escape(m.repo_id)}", ""]
    facts = [f"organisation {code(m.org or '—')}", f"family {code(m.family) if m.family else '—'}"]
    if m.architectures:
        facts.append(f"architectures {code(m.architectures)}")
    lines += [Markdown(" · ".join(facts)) + ".", ""]
    if m.provenance is not None and m.provenance.project_made:
        lines += ["## Provenance", "", measured_section.provenance_note(m.provenance), ""]
    if m.base_models:
        lines += ["Derivative of " + ", ".join(_link(by_id.get(b), b) for b in m.base_models) + ".", ""]
    if m.derivatives:
        lines += ["Derivatives tracked by the atlas: "
                  + ", ".join(_link(by_id.get(d), d) for d in m.derivatives) + ".", ""]
    if m.drafter is not None or m.drafters:
        lines += ["; ".join(_drafter_words(m)) + ".", ""]
    lines += [
        "## Claim levels", "",
        "Five separate claims, each with where it comes from. Only the measured level shows a "
        "speed-up of the atlas's own; a reported figure is someone else's, with their conditions. "
        f"What each level means: [module 8]({_MODULE}).", "",
        _levels(m, figures, data.mirror_date, data.servable_date), "",
    ]
    if m.servable:
        lines += _servable_lines(m, data.servable_date)
    if figures:
        lines += ["## Reported", "", reported_section.section(figures), ""]
    lines += ["## Measured", "", *_measured_lines(m, downloads)]
    lines += ["## The atlas's own runner", "", runner_line(m.family, len(m.measured)), ""]
    if len(m.history) > 1:
        lines += ["## History across snapshots", "",
                  table(["snapshot", "date", "revision", "#declared", "key", "#shipped", "status"],
                        [[f"#{h.snapshot_id}", h.snapshot_date, _rev(h.revision), h.declared,
                          code(h.declared_key) if h.declared_key else Markdown("—"), h.shipped,
                          h.fetch_status] for h in m.history]), ""]
    lines += ["---", "", f"[All tracked models](index.md) · [Module 8]({_MODULE})", ""]
    return "\n".join(lines)


def _servable_lines(m: Model, servable_date: str) -> list[Any]:
    """The Servable section: each engine's support claim with the conformance results of every build checked."""
    lines: list[Any] = ["## Servable", "", f"From the support matrix of {escape(servable_date)}:", ""]
    for e in m.servable:
        lines += [f"- **{escape(e.engine)}** — support claim: {escape(e.version)}, {code(e.method)}. Source: "
                  f"{escape(e.source)}."]
        if not e.conformance:
            lines += ["    - Conformance: not checked (no conformance run covers this engine on this family's MTP layout)."]
        for c in e.conformance:
            causes = "".join(f" Cause: {escape(k.id)} ([issue]({k.upstream_issue}), [fix]({k.upstream_fix}))."
                             for k in c.causes if k.status == "present")
            lines += [f"    - Conformance of {escape(c.build)}{' (a patched build, not the release)' if c.patched else ''}: "
                      f"**{escape(servable_matrix.results_text(c))}**. Layout {code(c.layout)}: {escape(c.layout_note)}. "
                      f"Run {escape(c.date)} on {escape(c.hardware)}, record {code(c.record)}.{causes}"]
    lines += ["", "The support claim says the engine has code for this family (nothing was run); a conformance "
              f"result says what the atlas's suite found when it ran one engine build on checkpoints with exact "
              f"right answers ([module 8]({_MODULE})).", ""]
    return lines


def _measured_lines(m: Model, downloads: set[str]) -> list[Any]:
    """The Measured section's body: per record its run, revision and hardware, then one table per baseline."""
    if not m.measured:
        return ["The atlas has no measurement of this model.", ""]
    lines: list[Any] = [
        '!!! measured "Measured: one dated run per row"',
        "    Each row holds for its own record's revision and hardware, and its own engine, "
        "workload, temperature and draft length only.", "",
    ]
    series = list(dict.fromkeys(x.experiment_key for x in m.measured))
    if len(series) > 1:
        lines += [f"{len(series)} series: a series is one experiment (revision, head, draft vocabulary, kernels, engine and "
                  "version, precision, threads, machine), and only rows of one series compare.", ""]
    for key in series:
        mine = [x for x in m.measured if x.experiment_key == key]
        if key is not None:
            lines += [f"### Series {code(key)}", "", f"{escape(mine[0].experiment or '')}.", ""]
        lines += _record_lines(mine, downloads)
    return lines


def _record_lines(measured: list[Measured], downloads: set[str]) -> list[Any]:
    """Per record of one series: its run, revision and hardware, then one table per baseline."""
    lines: list[Any] = []
    for record_id in dict.fromkeys(x.record_id for x in measured):
        cells = [x for x in measured if x.record_id == record_id]
        first = cells[0]
        name = Path(first.source_path).name if first.source_path else None
        link = (f" Record file: [{escape(name)}](../{datapage.RECORDS}/measurements/{quote(name)})."
                if name in downloads else "")
        lines += [
            f"Record {code(record_id[:12])}: run {escape(first.run_date)}, revision "
            f"{_rev(first.revision)}, hardware {escape(first.hardware)}.{link}", "",
        ]
        # speed-ups over different baselines never share a table (module 8's rule): one per baseline
        for baseline in dict.fromkeys(x.baseline for x in cells):
            mine = [x for x in cells if x.baseline == baseline]
            lines += [
                f"*Speed-ups over {escape(baseline) if baseline else 'a baseline this evidence file does not name (rerun atlas evidence)'}:*", "",
                table(["engine", "workload", "#T", "#k", "#acceptance", "#accepted length",
                       "#speed-up (range)"],
                      [[escape(x.engine), escape(x.workload), f"{x.temperature:g}", x.draft_tokens,
                        fixed(x.acceptance_rate, 3), fixed(x.mean_accepted_length, 2),
                        fixed(x.speedup, 2) + (f" ({x.speedup_slowest_repeat:.2f}–{x.speedup_fastest_repeat:.2f})"
                                              if x.speedup_slowest_repeat is not None and x.speedup_fastest_repeat is not None
                                              else "")] for x in mine]), "",
            ]
    return lines


def runner_line(model_type: str | None, n_measured: int = 0) -> Markdown:
    """Whether `atlas measure run` can measure this model's family, and why (the family table's
    answer, atlas.families.table.measurability), as one escaped line; with what backs a "can
    measure" for a model the atlas has not run, and, for one it ran, that it did (`n_measured`
    cells), whether or not a crawl gave it a model_type."""
    from atlas.families.table import measurability

    ran = (f" The atlas's own runner measured this checkpoint: {n_measured} cells, under Measured above."
           if n_measured else "")
    if not model_type:
        if n_measured:
            # a project-made checkpoint is in no crawl, so no model_type of a crawl: it was still run
            return Markdown("No crawl holds it, so there is no crawled model_type to look its family up by." + ran)
        return Markdown("No model_type in its config: the atlas's own runner has no family to look up.")
    got = measurability(model_type)
    row = f" (family row {escape(got.family)})" if got.family else ""
    verdict = {"measurable": "can measure", "refused": "refuses", "no row": "has no family row for"}[got.status]
    backing = ""
    if got.status == "measurable" and not n_measured:
        backing = (" What backs this: the runner's tests of the layout on small checkpoints shrunk from a "
                   "config of the family; this model itself has not been measured.")
    return Markdown(f"The atlas's own runner {verdict} {code(model_type)}{row}: {escape(got.reason)}.{backing}{ran}")


def render(data: Models | None, reported: reported_figures.Reported | None, out_dir: Path) -> list[Path]:
    """Write models/index.md and one page per qualifying model into `out_dir` (rebuilt whole)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    written = [out_dir / "index.md"]
    written[0].write_text(_front("Model finder") + finder(data), encoding="utf-8")
    if data is None:
        return written
    finder_parts(data, out_dir / FINDER_PARTS)
    by_id = {m.repo_id: m for m in data.models}
    shipped = out_dir.parent / datapage.RECORDS / "measurements"
    downloads = {p.name for p in shipped.glob("*.json")} if shipped.is_dir() else set()
    for m in data.models:
        if not m.has_page:
            continue
        figures = reported.about(m.repo_id) if reported else []
        path = out_dir / f"{m.slug}.md"
        path.write_text(_front(m.repo_id) + page(m, by_id, figures, data, downloads), encoding="utf-8")
        written.append(path)
    return written


def _front(title: str) -> str:
    # The title reaches the theme's <title> and nav unescaped by us: keep only id-safe characters
    # (real Hub ids have no others); the page body shows the full id, escaped. No table of
    # contents sidebar: these pages are short and their tables get the width.
    safe = re.sub(r"[^A-Za-z0-9._/ -]", "?", title)
    return "---\n" + json.dumps({"title": safe, "hide": ["toc"]}, ensure_ascii=True) + "\n---\n\n"
