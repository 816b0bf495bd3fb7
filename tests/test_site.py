"""Render + `mkdocs build --strict`: escaping in the built HTML, provenance of every figure,
no external asset, offline build, and clear errors for broken templates."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

import pytest
from site_helpers import (
    EVIDENCE_ONLY_MODULE,
    HOSTILE_BASELINE,
    HOSTILE_HARDWARE,
    HOSTILE_ID,
    HOSTILE_MODELS,
    HUB_MODELS,
    PLANTED_SPEED,
    REPO,
    hostile_store,
    parse_html,
    plant_measurement,
    site_copy,
)

from atlas import AtlasError
from atlas.site.pages import write_evidence as evidence
from atlas.site.pages import render


def shown(value: str) -> str:
    return " ".join(value.replace("\r", "\n").split("\n")).strip()


RECORD_ID: dict[str, str] = {}


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory: pytest.TempPathFactory) -> render.Layout:
    """Hostile store + one planted measurement of the hostile model, through the real writers."""
    root = tmp_path_factory.mktemp("hostile-site")
    layout = site_copy(root, EVIDENCE_ONLY_MODULE)
    db = root / "atlas.duckdb"
    hostile_store(db)
    RECORD_ID["planted"] = plant_measurement(db, layout.evidence / "measurements", HOSTILE_ID)
    evidence.generate(db, layout.evidence / "module-08.evidence.md", layout.evidence / "servable.toml")
    render.build(layout)
    return layout


def module_08_html(layout: render.Layout) -> str:
    return (layout.build / "modules" / "module-08" / "index.html").read_text(encoding="utf-8")


def test_hostile_values_neither_break_tables_nor_inject_markup(hostile_site: render.Layout) -> None:
    page = parse_html(module_08_html(hostile_site))
    baseline = parse_html((hostile_site.build / "index.html").read_text(encoding="utf-8"))
    # Same scripts as a page without untrusted data; no event-handler attribute anywhere.
    scripts = [a for tag, a in page.elements if tag == "script"]
    assert len(scripts) == len([a for tag, a in baseline.elements if tag == "script"])
    assert not [(t, n) for t, attrs in page.elements for n, _ in attrs if n.lower().startswith("on")]
    assert not [a for tag, a in page.elements if tag in ("img", "iframe", "object", "embed")]
    for table in page.tables:
        assert table.header, "every evidence table has a header row"
        assert all(len(row) == len(table.header) for row in table.rows), table
    hub, ours = [t for t in page.tables if t.section == "declared"]  # Hub models, then our own
    assert shown(HOSTILE_ID) in [row[0] for row in hub.rows]
    assert [row[0] for row in ours.rows] == ["mtp-atlas/byte-mtp-8l"]
    # The prose got the hostile exemplar through `facts`, escaped as well: it reads as text.
    exemplars = ", ".join(sorted(m.repo_id for m in HUB_MODELS if m.exemplar))
    assert " ".join(("Exemplars: " + exemplars).split()) in " ".join(page.text.split())


def test_every_present_claim_row_carries_crawl_date_and_revision(hostile_site: render.Layout) -> None:
    page = parse_html(module_08_html(hostile_site))
    by_id = {shown(m.repo_id): m for m in HOSTILE_MODELS}
    present = [t for t in page.tables if t.section in ("declared", "shipped", "mismatches")]
    assert {t.section for t in present} == {"declared", "shipped", "mismatches"}
    for table in present:
        # a live crawl (the fixture's endpoint is an http hub): the revision is a Hub commit,
        # under the one name the whole site uses for it
        assert "revision" in table.header and "crawled" in table.header
        model_col = table.header.index("model")
        rev_col, date_col = table.header.index("revision"), table.header.index("crawled")
        assert not any("speed" in h or "accept" in h for h in table.header)
        for row in table.rows:
            model = by_id[row[model_col]]
            assert row[rev_col] == model.sha[:12], (table.section, row)
            assert row[date_col] == "2026-11-29", (table.section, row)
    # the servable matrix is per family: each family row lists the models it covers
    matrix = next(t for t in page.tables if t.section == "servable")
    covered = " ".join(r[1] for r in matrix.rows)
    declaring = [m for m in HUB_MODELS if (m.declared or 0) > 0 or (m.shipped or 0) > 0]
    assert sum(int(r[1].split(":")[0]) for r in matrix.rows) == len(declaring)
    assert all(shown(m.repo_id) in covered for m in declaring[:4])


def test_measured_summary_has_one_row_per_engine_workload_temperature(hostile_site: render.Layout) -> None:
    page = parse_html(module_08_html(hostile_site))
    record = RECORD_ID["planted"][:12]
    speed = f"{PLANTED_SPEED:.2f}"
    # module 8's compact table: one row for the one run, over its one baseline, linked to its page
    (compact,) = [t for t in page.tables if t.section == "measured"]
    assert [(r[0], r[1], r[5]) for r in compact.rows] == [("R1", shown(HOSTILE_ID), "B1")]
    assert compact.rows[0][6].startswith(f"{PLANTED_SPEED:.2f}×") and compact.rows[0][8] == "on 2 of 2"
    assert f'href="../../runs/{record}/"' in module_08_html(hostile_site)
    # the run's own page (here under its evidence heading) holds the per-baseline summary and every k
    summary, *details = [t for t in page.tables if t.section == "runs"]
    assert summary.header == ["workload", "T", "engine", "gate (k shown)", "gate's lower bound",
                              "acceptance", "accepted length", "speed-up (range)", "ideal",
                              "efficiency", "greedy identical"]
    # the planted record: templated T=0 k=1 and a hostile workload at T=0.7 k=2, 3 equal repeats
    assert [(r[0], r[1]) for r in summary.rows] == [("templated", "0"), (shown("prose|<i>x</i>"), "0.7")]
    t0, t07 = summary.rows
    assert t0[2] == "atlas"
    assert t0[3] == "on, k=1" and t07[3] == "on, k=2"  # the gate: every repeat 1.37x faster
    # three identical repeats: the paired bounds collapse onto the speed-up itself
    assert t0[4] == f"{speed} (upper {speed})"
    assert t0[5] == f"{30 / 40:.3f}" and t07[5] == f"{50 / 80:.3f}"  # accepted / drafted
    assert t0[6] == f"{(30 + 40) / 40:.2f}" and t07[6] == f"{(50 + 40) / 40:.2f}"  # 1 + accepted/passes
    assert t0[7] == f"{speed} ({speed}–{speed})"
    ideal = (30 + 40) / 40 * 0.01 / (0.012 + 0.002)
    assert t0[8] == f"{ideal:.2f}" and t0[9] == f"{PLANTED_SPEED / ideal:.2f}"
    assert t0[10] == "yes" and t07[10] == "n/a (T > 0)"
    detail = details[0]
    assert [r[4] for r in detail.rows] == ["0.75", "0.75 / 0.50"]  # acceptance by draft position
    text = " ".join(page.text.split())
    assert f"B1: {shown(HOSTILE_BASELINE)}" in text  # one legend, not a sentence per row
    assert shown(HOSTILE_HARDWARE) in text and record in text and "2026-11-28 12:00 UTC" in text
    # one legend per page: the run's page, and module 8's compact table
    run_page = (hostile_site.build / "runs" / record / "index.html").read_text(encoding="utf-8")
    assert " ".join(parse_html(run_page).text.split()).count(shown(HOSTILE_BASELINE)) == 1
    assert text.count(shown(HOSTILE_BASELINE)) == 2
    # The planted measurement appears in no present-claim table, not even for the model it measured.
    for table in page.tables:
        if table.section in ("measured", "runs"):
            continue
        flat = " ".join(" ".join(r) for r in [table.header, *table.rows])
        assert record not in flat and speed not in flat and "2026-11-28" not in flat, table.section
        assert not any(h.startswith(("speed", "acceptance", "accepted")) for h in table.header)


def test_a_record_changed_after_import_is_refused(hostile_site: render.Layout, tmp_path: Path) -> None:
    import shutil

    db = tmp_path / "atlas.duckdb"
    shutil.copy(hostile_site.root / "atlas.duckdb", db)
    (record,) = (hostile_site.evidence / "measurements").glob("*.json")
    original = record.read_bytes()
    try:
        record.write_bytes(original.replace(b'"seed": 0', b'"seed": 1'))
        with pytest.raises(AtlasError, match="changed since it was imported"):
            evidence.generate(db, tmp_path / "ev.md", hostile_site.evidence / "servable.toml")
    finally:
        record.write_bytes(original)


def test_nav_lists_modules_in_order_with_glossary_and_how_made(hostile_site: render.Layout) -> None:
    html = (hostile_site.build / "index.html").read_text(encoding="utf-8")
    links = [a.get("href") or "" for tag, attrs in parse_html(html).elements if tag == "a"
             for a in [dict(attrs)]]
    modules = list(dict.fromkeys(h for h in links if h.startswith("modules/module-")))
    assert modules == sorted(modules) and modules
    assert "glossary/" in links and "how-made/" in links


class _Assets(HTMLParser):
    """Every URL the browser would fetch by itself: scripts, styles, images, frames, media, fonts."""

    FETCHING = {
        ("script", "src"), ("link", "href"), ("img", "src"), ("img", "srcset"), ("iframe", "src"),
        ("source", "src"), ("source", "srcset"), ("video", "src"), ("video", "poster"),
        ("audio", "src"), ("embed", "src"), ("object", "data"), ("image", "href"),
        ("use", "href"), ("input", "src"), ("track", "src"),
    }

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and (tag, name) in self.FETCHING:
                self.urls.append(value)
            if value and name == "style" and "url(" in value:
                self.urls.append(value)


def _external(url: str) -> bool:
    u = url.strip()
    return u.startswith("//") or urlparse(u).scheme in ("http", "https") or "url(http" in u \
        or "url('http" in u or 'url("http' in u or "url(//" in u


def test_built_html_references_no_external_asset(hostile_site: render.Layout) -> None:
    pages = sorted(hostile_site.build.rglob("*.html"))
    assert len(pages) >= 6
    for page in pages:
        text = page.read_text(encoding="utf-8")
        parser = _Assets()
        parser.feed(text)
        external = [u for u in parser.urls if _external(u)]
        assert not external, f"{page}: {external}"
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text
    for css in (hostile_site.build / "stylesheets").glob("*.css"):
        body = css.read_text(encoding="utf-8")
        assert "@import" not in body and "url(http" not in body and "url('http" not in body


def test_mkdocs_build_strict_passes_with_network_disabled(hostile_site: render.Layout, tmp_path: Path) -> None:
    # The same command `atlas site build` runs, in a process whose sockets cannot connect.
    code = (
        "import socket, sys, runpy\n"
        "def refuse(*a, **k):\n"
        "    raise OSError('network disabled by the test')\n"
        "socket.socket.connect = refuse\n"
        "socket.socket.connect_ex = refuse\n"
        "socket.create_connection = refuse\n"
        "socket.getaddrinfo = refuse\n"
        "sys.argv = ['mkdocs', 'build', '--strict', '--config-file', sys.argv[1], '--site-dir', sys.argv[2]]\n"
        "runpy.run_module('mkdocs', run_name='__main__')\n"
    )
    out = tmp_path / "offline-build"
    done = subprocess.run(
        [sys.executable, "-c", code, str(hostile_site.site / "mkdocs.yml"), str(out)],
        capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "modules" / "module-08" / "index.html").exists()


def test_render_errors_are_clear(tmp_path: Path) -> None:
    layout = site_copy(tmp_path / "a", "no front matter here\n")
    with pytest.raises(AtlasError, match="front matter"):
        render.render_site(layout)
    layout = site_copy(tmp_path / "b", "---\nnumber: 9\ntitle: x\n---\nbody\n")
    with pytest.raises(AtlasError, match="does not match the file name"):
        render.render_site(layout)
    layout = site_copy(tmp_path / "c", "---\nnumber: 8\ntitle: x\n---\n{{ evidence('declared') }}\n")
    with pytest.raises(AtlasError, match="no evidence file"):
        render.render_site(layout)
    layout = site_copy(tmp_path / "d", "---\nnumber: 8\ntitle: x\n---\n{{ facts.n_models }}\n")
    with pytest.raises(AtlasError, match="n_models"):
        render.render_site(layout)
    layout = site_copy(tmp_path / "e", "---\nnumber: 8\ntitle: x\n---\n{% if %}\n")
    with pytest.raises(AtlasError, match="syntax"):
        render.render_site(layout)


def test_unknown_evidence_section_names_the_known_ones(hostile_site: render.Layout, tmp_path: Path) -> None:
    layout = site_copy(tmp_path / "f", "---\nnumber: 8\ntitle: x\n---\n{{ evidence('speedups') }}\n")
    (layout.evidence / "module-08.evidence.md").write_text(
        (hostile_site.evidence / "module-08.evidence.md").read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(AtlasError, match="unknown evidence section 'speedups'.*declared"):
        render.render_site(layout)


def test_repository_site_sources_exist() -> None:
    # The checked-in, offline-only configuration the build relies on.
    config = (REPO / "site" / "mkdocs.yml").read_text(encoding="utf-8")
    assert "font: false" in config and "http" not in config
