"""The built site in a real browser: crawl the bundled mirror, import the committed measurement
records, build the site, serve it with `atlas site serve` on 127.0.0.1 and drive headless Chromium
through the DevTools protocol (tests/chromium_cdp.py) at 1400 px and 390 px.

Measured in the DOM, after the pages' own scripts ran, on every page of the site: no table and no
chart wider than the content column at 1400 px, no horizontal scrolling of the page at 390 px with
every table shown as cards, chart labels at least 9 px tall at both widths. Also: the measured
summary shows its fields, a header click sorts, the site search finds a model by part of its id.
Screenshots of module 8 at both widths go to build/test-artifacts/ (or $ATLAS_TEST_ARTIFACTS).
Skips only when no Chromium binary exists."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_helpers import ARTIFACTS, CHROMIUM
from chromium_cdp import Chromium
from site_helpers import REPO, build_demo_site, declared_repo_ids

from atlas.records import record as records
from atlas.site.pages import render

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary (chromium, chromium-browser or google-chrome) on PATH, so the "
    "browser test cannot run here; .ci/run installs Debian's chromium",
)]
PROBE = (Path(__file__).parent / "layout_probe.js").read_text(encoding="utf-8")
WIDE, PHONE = 1400, 390
MIN_LABEL_PX = 9.0
MODULE_8 = "modules/module-08/"
SUMMARY_HEADER = ["workload", "T", "engine", "gate (k shown)", "gate's lower bound", "acceptance",
                  "accepted length", "speed-up (range)", "ideal", "efficiency", "greedy identical"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, render.Layout]]:
    # the course's real pages, the verdicts in the servable matrix, every model page and the Data
    # and Changelog pages with an export: the whole site, as `make demo` builds it
    site = build_demo_site(tmp_path_factory.mktemp("browser-site"), conformance=True, sources=True, export_data=True)
    root, db, layout = site.root, site.db, site.layout
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "atlas", "site", "serve", "--root", str(root), "--port", str(port)],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    assert r.status == 200
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError(f"`atlas site serve` did not answer on {url}")
                time.sleep(0.2)
        yield url, db, layout
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    with Chromium(CHROMIUM or "chromium") as b:
        yield b


def _pages(layout: render.Layout) -> list[str]:
    """Every page of the built site, as a path under its root ("" for the home page)."""
    pages = []
    for html in sorted(layout.build.rglob("index.html")):
        rel = html.parent.relative_to(layout.build).as_posix()
        if rel.startswith(("assets", "search")) or rel == "404":
            continue
        pages.append("" if rel == "." else rel + "/")
    return pages


def _in_page(browser: Chromium, url: str, width: int, script: str):
    """Open the page at that width, load the probe, run one expression; its value."""
    page = browser.open(url, width)
    try:
        page.evaluate(PROBE)
        return page.evaluate(script)
    finally:
        page.close()


@pytest.fixture(scope="module")
def layouts(served: tuple[str, Path, render.Layout], browser: Chromium) -> dict[tuple[str, int], dict]:
    url, _, layout = served
    return {(p, w): _in_page(browser, url + p, w, "atlasProbe.measure()")
            for p in _pages(layout) for w in (WIDE, PHONE)}


def test_no_table_or_chart_overflows_the_column_at_1400px(layouts: dict[tuple[str, int], dict]) -> None:
    checked = 0
    for (page, width), m in layouts.items():
        if width != WIDE:
            continue
        right = m["column"]["innerRight"] + 1  # sub-pixel rounding
        assert m["docScrollWidth"] <= m["width"], (page, "the page scrolls sideways")
        for t in m["tables"]:
            assert t["box"]["right"] <= right and t["maxCellRight"] <= right, (page, t["header"], t["box"], right)
            assert t["hiddenScroll"] <= 1, (page, t["header"], "the table scrolls inside its box")
            checked += 1
        for c in m["charts"]:
            assert c["box"]["right"] <= right, (page, c["title"])
            assert c["minSvgFont"] >= MIN_LABEL_PX and c["minHtmlFont"] >= MIN_LABEL_PX, (page, c)
            checked += 1
        _blocks_fit(page, m, right)
    assert checked >= 10, "module 8 alone has more tables and charts than that"
    assert sum(1 for page, _ in layouts if page.startswith("models/")) > 10, "the model pages were measured"
    assert any(t["header"] == SUMMARY_HEADER for t in layouts[(_first_run_page(), WIDE)]["tables"])


# a table's median phone card under the old line-per-column card's 250 px, whatever its text; a
# table of figures (seven to ten short cells a row) in a few lines
CARD_PX, FIGURES_CARD_PX = 250, 120


def test_every_page_is_usable_at_390px(layouts: dict[tuple[str, int], dict]) -> None:
    for (page, width), m in layouts.items():
        if width != PHONE:
            continue
        assert m["width"] == PHONE
        assert m["docScrollWidth"] <= PHONE, (page, "the page scrolls sideways on a phone")
        right = m["column"]["innerRight"] + 1
        for t in m["tables"]:
            # each row of an evidence table a card of "column: value" lines (a widget's table of
            # inputs stays a table, and must fit as one); nothing cut off at the right edge
            assert t["cards"] or t["widget"], (page, t["header"], "not shown as cards on a phone")
            assert t["maxCellRight"] <= right and t["hiddenScroll"] <= 1, (page, t["header"])
            assert t["minFont"] >= 11, (page, t["header"])
            assert not t["brokenWords"], (page, t["header"], "words broken inside", t["brokenWords"])
            if t["cards"] and len(t["rowHeights"]) >= 3:
                # compact cards: a row's cells run on as "name value" pairs, a few lines per row
                # (the line-per-column cards were about 250 px a row)
                heights = sorted(t["rowHeights"])
                median = heights[len(heights) // 2]
                assert median < CARD_PX, (page, t["header"], heights)
                if "speed-up (range)" in t["header"] or "acceptance" in t["header"]:
                    assert median <= FIGURES_CARD_PX, (page, t["header"], heights)
        for c in m["charts"]:
            assert c["box"]["right"] <= right, (page, c["title"])
            assert c["minSvgFont"] >= MIN_LABEL_PX, (page, c["title"], c["minSvgFont"])
        _blocks_fit(page, m, right)


def _blocks_fit(page: str, m: dict, right: float) -> None:
    """Every diagram and widget within the column, nothing in it scrolling sideways; a diagram's
    drawing scales down to the column instead of keeping its drawn width."""
    for b in m["blocks"]:
        assert b["box"]["right"] <= right and b["maxChildRight"] <= right, (page, m["width"], b)
        assert b["hiddenScroll"] <= 1, (page, m["width"], b["kind"], "scrolls sideways")
        if b["inner"] is not None:
            assert b["inner"]["right"] <= right and b["inner"]["width"] <= b["box"]["width"] + 1, (page, b)
    if page == MODULE_8:
        kinds = sorted(b["kind"] for b in m["blocks"])
        assert kinds == ["accept-resample", "calculator", "layouts", "round", "wiring"], kinds


def _first_run() -> records.Record:
    """R1: the run the pages lead with, a record with provenance (the real main model with a
    project-made head), then the earliest run."""
    committed = [records.read_record(p) for p in sorted((REPO / "evidence" / "measurements").glob("*.json"))]
    return min((r for r in committed if not r.settings.quick),
               key=lambda r: (r.provenance is None, r.run_date, r.model_id, records.record_id(r)))


def _first_run_page() -> str:
    """R1's own page, as a path under the site's root."""
    return f"runs/{records.record_id(_first_run())[:12]}/"


def test_module_8_fits_its_budget_with_the_verdict_in_its_first_half(
        served: tuple[str, Path, render.Layout], browser: Chromium) -> None:
    """As a reader opens it (folded blocks closed): at most 15 screens at 1400 px and 35 at 390 px,
    a screen being the viewport's height; the verdict starts in the first half; the generated
    plain answer (what the atlas found on a real model) is within the first two screens; the
    measured charts and the break-even chart are drawn."""
    url, _, _ = served
    probe = ("(() => { const y = e => e.getBoundingClientRect().top + scrollY;"
             " const v = Array.from(document.querySelectorAll('article h2'))"
             ".find(e => e.textContent.startsWith('The honest trade-off'));"
             " const a = Array.from(document.querySelectorAll('article p'))"
             ".find(p => p.textContent.startsWith('What the atlas found'));"
             " return {height: document.documentElement.scrollHeight, screen: innerHeight,"
             " verdict: v ? y(v) : null, answer: a ? y(a) : null,"
             " charts: document.querySelectorAll('article .atlas-chart-pair .atlas-chart svg').length,"
             " breakEven: document.querySelectorAll('article .atlas-chart-narrow svg').length}; })()")
    for width, screens in ((WIDE, 15), (PHONE, 35)):
        page = browser.open(url + MODULE_8, width)
        try:
            m = page.evaluate(probe)
        finally:
            page.close()
        assert m["height"] <= screens * m["screen"], (width, m)
        assert m["verdict"] is not None and m["verdict"] <= m["height"] / 2, (width, m)
        assert m["answer"] is not None and m["answer"] < 2 * m["screen"], (width, m)
        assert m["charts"] == 2 and m["breakEven"] == 1, (width, m)
        print(f"module 8 at {width} px: {m['height'] / m['screen']:.2f} screens, verdict at "
              f"{100 * m['verdict'] / m['height']:.0f} %")


def test_measured_summary_shows_its_fields(served: tuple[str, Path, render.Layout], browser: Chromium) -> None:
    url, _, _ = served
    summary = _in_page(
        browser, url + _first_run_page(), WIDE,
        "Array.from(document.querySelectorAll('article table')).map(t => ["
        " Array.from(t.tHead.rows[0].cells).map(c => c.textContent.trim()),"
        " Array.from(t.tBodies[0].rows).map(r => Array.from(r.cells).map(c => c.textContent.trim())),"
        " ((t.closest('.md-typeset__scrollwrap') || t).previousElementSibling || {textContent: ''})"
        ".textContent.trim()])"
        ".filter(t => t[0][4] === \"gate's lower bound\")")
    assert summary, "no measured summary table on module 8"
    first = _first_run()
    # the first run's tables: one per baseline, each captioned with its one baseline id
    mine = [t for t in summary if t[2].startswith(("R1,", "R1 ("))]  # "R1 (its label), ..." when project-made
    baselines = list(dict.fromkeys(c.baseline for c in first.cells))
    assert len(mine) == len(baselines) and all(f"baseline B{i}" in t[2] for i, t in enumerate(mine, 1))
    for (header, rows, _), baseline in zip(mine, baselines):
        assert header == SUMMARY_HEADER
        engines = {c.engine for c in first.cells if c.baseline == baseline}
        groups = {(c.engine, c.workload, c.temperature) for c in first.cells if c.baseline == baseline}
        assert len(rows) == len(groups)  # one row per engine x workload x temperature, one baseline
        assert {r[2] for r in rows} == {"transformers use_mtp" if e == "transformers-use_mtp" else e for e in engines}
    for header, rows, _ in summary:
        for row in rows:
            assert row[3].startswith(("on, k=", "off (best k=", "undecided (best k=", "— (")), row
            if row[3].startswith("on, k="):  # the gate's rule: on only where its lower bound is above 1
                assert float(row[4].split()[0]) > 1, row
            if row[3].startswith("off"):
                assert float(row[4].split("upper ")[1].rstrip(")")) < 1, row
            assert float(row[5]) >= 0 and float(row[6]) >= 1  # acceptance, tokens per verify pass
            median, rng = row[7].split(" ", 1)
            lo, hi = rng.strip("()").split("–")
            assert float(lo) <= float(median) <= float(hi)
            assert row[10] in ("yes", "NO", "n/a (T > 0)")


def test_a_header_click_sorts_the_column(served: tuple[str, Path, render.Layout], browser: Chromium) -> None:
    url, _, _ = served
    summary = ("Array.from(document.querySelectorAll('.md-content__inner table'))"
               ".findIndex(t => t.tHead && t.tHead.rows[0].cells.length > 4 && "
               "t.tHead.rows[0].cells[4].textContent.trim() === \"gate's lower bound\")")
    result = _in_page(browser, url + _first_run_page(), WIDE,
                      f"atlasProbe.sort({summary}, {SUMMARY_HEADER.index('acceptance')})")
    numbers = [float(v) for v in result["before"]]
    assert [float(v) for v in result["first"]] == sorted(numbers)
    assert [float(v) for v in result["second"]] == sorted(numbers, reverse=True)
    assert (result["firstAria"], result["secondAria"]) == ("ascending", "descending")
    assert result["first"] != result["before"]  # the committed record's rows are not pre-sorted


def test_search_finds_a_model_by_part_of_its_id(served: tuple[str, Path, render.Layout], browser: Chromium) -> None:
    url, db, _ = served
    assert "moonshotai/Kimi-K2-Instruct" in declared_repo_ids(db)
    found = _in_page(browser, url + MODULE_8, WIDE, "atlasProbe.search('Kimi')")
    assert any("moonshotai/Kimi-K2-Instruct" in r for r in found["results"]), found


def test_module_8_screenshots_at_both_widths(served: tuple[str, Path, render.Layout], browser: Chromium) -> None:
    url, _, _ = served
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width in (WIDE, PHONE):
        shot = ARTIFACTS / f"module-08-{width}px.png"
        shot.unlink(missing_ok=True)
        page = browser.open(url + MODULE_8, width)
        try:
            page.evaluate(PROBE)
            page.evaluate("atlasProbe.measure()")  # opens the collapsible blocks, so they show
            page.screenshot(shot)
        finally:
            page.close()
        assert shot.stat().st_size > 100_000, "a rendered page, not a blank one"


def test_the_finder_puts_its_filter_before_any_prose_and_no_row_above_three_lines(
        served: tuple[str, Path, render.Layout], browser: Chromium) -> None:
    """At 1400 px: the filter is the first thing after the title (223 words of prose came first),
    and no row of the table is taller than three lines of its text (a servable cell made the first
    row 622 px tall), both as the page comes and after a filter rebuilt the rows in the script."""
    url, _, _ = served
    probe = """(async () => {
      const input = document.querySelector('article input[data-atlas-finder]');
      const walker = document.createTreeWalker(document.querySelector('article'), NodeFilter.SHOW_TEXT);
      let before = 0;
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        if (n.parentElement.closest('h1, label, details')) continue;
        if (input.compareDocumentPosition(n) & Node.DOCUMENT_POSITION_PRECEDING) before += n.data.split(/\\s+/).filter(Boolean).length;
      }
      const tallest = () => Math.max(...Array.from(document.querySelectorAll('table[data-atlas-finder-table] tbody tr'))
        .map(tr => { const line = parseFloat(getComputedStyle(tr.querySelector('td')).lineHeight);
                     const pad = Array.from(tr.cells).map(td => { const s = getComputedStyle(td);
                       return parseFloat(s.paddingTop) + parseFloat(s.paddingBottom); });
                     return (tr.getBoundingClientRect().height - Math.max(...pad)) / line; }));
      const first = tallest();
      input.value = 'deepseek'; input.dispatchEvent(new Event('input', {bubbles: true}));
      await new Promise(ok => setTimeout(ok, 500));
      return {before, first, filtered: tallest(),
              rows: document.querySelectorAll('table[data-atlas-finder-table] tbody tr').length};
    })()"""
    m = _in_page(browser, url + "models/", WIDE, probe)
    assert m["before"] == 0, m
    assert m["rows"] > 0 and m["first"] <= 3.2 and m["filtered"] <= 3.2, m


def test_the_home_pages_first_screen_says_what_the_atlas_found(
        served: tuple[str, Path, render.Layout], browser: Chromium) -> None:
    url, _, _ = served
    for width in (WIDE, PHONE):
        m = _in_page(browser, url, width, "(() => { const b = Array.from(document.querySelectorAll('article .admonition'))"
                     ".find(e => e.textContent.includes('What the atlas found'));"
                     " return b ? {top: b.getBoundingClientRect().top + scrollY, screen: innerHeight,"
                     " paid: b.textContent.includes('Did MTP pay, and where?')} : null; })()")
        assert m is not None and m["paid"] and m["top"] < m["screen"], (width, m)
