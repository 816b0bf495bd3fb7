"""The model finder and per-model pages say what the evidence says, by rule: an engine is listed as
serving a model's MTP only when the model declares or ships MTP layers and the support matrix
matches it; engines that ran a model's MTP in a measured record are named from the records; the
finder's table stays out of the search index (per-model pages are the models' entries)."""

from __future__ import annotations

import json
import re

import pytest
from site_helpers import REPO, build_demo_site, engines_in, parse_html

from atlas.evidence import servable
from atlas.site.pages import render

TEAM = "mtp-atlas/byte-mtp-8l"
MATRIX = REPO / "evidence" / "servable.toml"


@pytest.fixture(scope="module")
def finder_site(tmp_path_factory: pytest.TempPathFactory):
    site = build_demo_site(tmp_path_factory.mktemp("finder"))
    return site.layout, site.models, site.evidence


def finder_rows(layout: render.Layout) -> dict[str, dict[str, str]]:
    page = parse_html((layout.build / "models" / "index.html").read_text(encoding="utf-8"))
    table = next(t for t in page.tables if t.header[0] == "model")
    return {r[0]: dict(zip(table.header, r)) for r in table.rows}


def test_a_model_declaring_zero_mtp_layers_is_served_by_no_engine(finder_site) -> None:
    layout, models, _ = finder_site
    kimi = next(m for m in models.models if m.repo_id == "moonshotai/Kimi-K2-Instruct")
    assert kimi.current is not None and kimi.current.declared == 0
    # its architecture is one SGLang's entry names: the architecture alone must not make it servable
    matrix = servable.load(MATRIX)
    assert [e.engine for e in matrix.engines_for(kimi.family, ["DeepseekV3ForCausalLM"])] == ["SGLang"]
    assert kimi.servable == []
    assert finder_rows(layout)[kimi.repo_id]["servable"] == "—"


def test_servable_only_where_the_model_declares_or_ships_and_the_matrix_matches(finder_site) -> None:
    layout, models, ev = finder_site
    matrix = servable.load(MATRIX)
    rows = finder_rows(layout)
    nemotron_without_key = [m for m in models.models if m.family == "nemotron_h" and m.current
                            and m.current.declared is None]
    assert len(nemotron_without_key) == 2
    for m in models.models:
        archs = [a.strip() for a in (m.architectures or "").split(",") if a.strip()]
        has_mtp = m.current is not None and ((m.current.declared or 0) > 0 or (m.current.shipped or 0) > 0)
        want = [e.engine for e in matrix.engines_for(m.family, archs)] if has_mtp else []
        assert [e.engine for e in m.servable] == want, m.repo_id
        assert engines_in(rows[m.repo_id]["servable"], matrix) == want, m.repo_id
        if not want:
            assert rows[m.repo_id]["servable"] == "—" or m.measured, m.repo_id
    for m in nemotron_without_key:
        assert m.servable == [] and "vLLM" not in rows[m.repo_id]["servable"]
    # the same rule as the module's servable matrix: as many servable Hub models in both
    hub = [m for m in models.models if not m.repo_id.startswith("mtp-atlas/")]
    assert sum(1 for m in hub if m.servable) == ev.facts.n_servable


def test_engines_that_measured_a_model_are_named_from_its_records(finder_site) -> None:
    layout, models, _ = finder_site
    team = next(m for m in models.models if m.repo_id == TEAM)
    engines = {x.engine for x in team.measured}
    assert any(e.startswith("vllm ") for e in engines)  # the committed vLLM record
    row = finder_rows(layout)[TEAM]
    assert "vLLM (measured run)" in row["servable"]
    assert row["measured"].startswith(f"{len(team.measured)} cells: ")
    assert all(e in row["measured"] for e in engines)
    page = parse_html((layout.build / "models" / team.slug / "index.html").read_text(encoding="utf-8"))
    levels = next(t for t in page.tables if t.header == ["claim level", "what it says", "provenance"])
    said = {r[0]: r[1] for r in levels.rows}
    vllm = next(e for e in engines if e.startswith("vllm "))
    assert vllm in said["servable"].split("ran its MTP in a measured run: ", 1)[1]
    assert all(e in said["measured"] for e in engines)


def test_the_finder_table_is_out_of_the_search_index_and_model_pages_are_in(finder_site) -> None:
    layout, models, _ = finder_site
    index = json.loads((layout.build / "search" / "search_index.json").read_text(encoding="utf-8"))
    docs = index["docs"]
    finder = [d for d in docs if d["location"].split("#")[0] == "models/"]
    assert finder, "the finder page itself is still found"
    no_page = [m.repo_id for m in models.models if not m.has_page]
    assert no_page
    for d in finder:
        assert not any(rid in d["text"] for rid in no_page), d["text"][:300]
    for m in models.models:
        if m.has_page:
            entries = [d for d in docs if d["location"].startswith(f"models/{m.slug}/")]
            assert entries, m.repo_id
            first = re.sub("<[^>]+>", "", entries[0]["text"])
            assert len(first) < 400, (m.repo_id, first)  # a preview, not a table


def test_a_model_page_puts_each_baseline_in_a_table_of_its_own(finder_site) -> None:
    """C2: the real team model's page held our loop's and transformers' speed-ups in one table,
    each over its own engine's plain decoding. One table per record and baseline, named above it."""
    from atlas.records import record as records

    layout, models, _ = finder_site
    real = next(m for m in models.models if m.repo_id.endswith("smollm2-135m-instruct-mtp"))
    html_text = (layout.build / "models" / real.slug / "index.html").read_text(encoding="utf-8")
    committed = [records.read_record(p) for p in sorted((REPO / "evidence" / "measurements").glob("*.json"))]
    baseline_of = {f"{c.engine} {c.engine_version}".strip(): c.baseline for r in committed
                   if r.model_id == real.repo_id and not r.settings.quick for c in r.cells}
    pairs = {(r.model_id, records.record_id(r), c.baseline) for r in committed
             if r.model_id == real.repo_id and not r.settings.quick for c in r.cells}
    assert len({b for _, _, b in pairs}) >= 2, "the real model was run over more than one baseline"
    page = parse_html(html_text)
    tables = [t for t in page.tables if "speed-up (range)" in t.header]
    assert len(tables) == len(pairs)
    for t in tables:
        engines = {r[t.header.index("engine")] for r in t.rows}
        assert len({baseline_of[e] for e in engines}) == 1, engines
    text = " ".join(page.text.split())
    for _, _, baseline in pairs:
        assert f"Speed-ups over {baseline}:" in text


def test_a_family_name_finds_its_models_and_only_mtp_models_carry_it(finder_site) -> None:
    """The finder's family cell carries the family-table name (module 8 says Nemotron-H, MiMo,
    GLM-5) beside the model_type, for models that declare or ship MTP only: MiMo's row also reads
    qwen2, which no Qwen2 model should answer to."""
    layout, models, _ = finder_site
    rows = finder_rows(layout)
    nemotron = [m for m in models.models if m.family == "nemotron_h" and m.runner]
    assert nemotron
    for m in nemotron:
        assert rows[m.repo_id]["family"] == "nemotron_h (Nemotron-H / Nemotron-3)"
    for m in models.models:
        if not m.runner:
            assert "(" not in rows[m.repo_id]["family"], m.repo_id
    qwen35 = next(m for m in models.models if m.family == "qwen3_5" and m.runner)
    assert rows[qwen35.repo_id]["family"] == "qwen3_5"  # "Qwen3.5" is its model_type spelled again
    hint = json.loads(__import__("html").unescape(
        re.search(r'data-atlas-finder-families="([^"]*)"', (layout.build / "models" / "index.html").read_text(encoding="utf-8")).group(1)))
    mimo = next(f for f in hint if f["name"] == "MiMo")
    assert mimo["types"] == ["qwen2", "mimo"] and mimo["says"] == "our loop runs its layout"
