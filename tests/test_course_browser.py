"""Module 8's widgets and the model finder in headless Chromium, checked against the Python
formulas of atlas.measure.theory. Four browser launches in all: one page holding many widget
instances (their computed numbers read back from the DOM), the finder with a filter in its URL,
and screenshots (1000 px and 390 px wide) of the diagrams and widgets as the built module 8
shows them (kept under
build/test-artifacts/, or $ATLAS_TEST_ARTIFACTS). Skips only when no Chromium binary exists."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
from site_helpers import REPO, crawl_mirror, parse_html, site_copy
from test_browser import ARTIFACTS, CHROMIUM, _chromium

from atlas import store
from atlas.measure import records, theory
from atlas.site import evidence, modelpages, render, widgets

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary on PATH")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[render.Layout, modelpages.Models]:
    """The real module 8 over the bundled mirror and the committed measurement record(s)."""
    root = tmp_path_factory.mktemp("course-browser")
    layout = site_copy(root)
    db = root / "atlas.duckdb"
    crawl_mirror(db)
    con = store.connect(db)
    try:
        loaded, _, errors = records.import_records(con, REPO / "evidence" / "measurements")
    finally:
        con.close()
    assert loaded and not errors
    evidence.generate(db, layout.evidence / "module-08.evidence.md", layout.evidence / "servable.toml")
    models = modelpages.generate(db, layout.evidence / modelpages.FILE_NAME,
                                 layout.evidence / "servable.toml", REPO)
    render.build(layout)
    return layout, models


def _head(layout: render.Layout) -> str:
    """The built module 8's <head> (its CSS and scripts), so a test page renders like the site."""
    html = (layout.build / "modules" / "module-08" / "index.html").read_text(encoding="utf-8")
    return html[html.index("<head>"):html.index("</head>") + len("</head>")]


def _page(layout: render.Layout, name: str, body: str) -> Path:
    """A page in the built modules/module-08/ folder, so the head's relative URLs resolve."""
    html = _head(layout)
    scripts = re.findall(r'<script src="[^"]*"></script>', (layout.build / "modules" / "module-08"
                                                            / "index.html").read_text(encoding="utf-8"))
    path = layout.build / "modules" / "module-08" / name
    path.write_text(
        f'<!doctype html><html lang="en">{html}<body dir="ltr" data-md-color-scheme="default" '
        f'data-md-color-primary="indigo" data-md-color-accent="indigo"><div class="md-container">'
        f'<main class="md-main"><div class="md-main__inner md-grid"><div class="md-content">'
        f'<article class="md-content__inner md-typeset">{body}</article></div></div></main></div>'
        + "".join(scripts) + "</body></html>",
        encoding="utf-8",
    )
    return path


_WIDGET = re.compile(r'<div class="atlas-widget [^"]*" data-atlas-widget="[^"]+">.*?</div>(?=\s*(?:<|$))', re.S)
_DIAGRAM = re.compile(r'<div class="atlas-diagram" data-atlas-diagram="[^"]+">.*?</svg></div>', re.S)


def _value(html: str, scope: str, out: str) -> float:
    m = re.search(r'data-out="' + out + r'"[^>]*data-value="([^"]+)"', scope)
    assert m, (out, scope[:300])
    return float(m.group(1))


def _instances(html: str, kind: str) -> list[str]:
    starts = [m.start() for m in re.finditer(f'data-atlas-widget="{kind}"', html)]
    ends = starts[1:] + [len(html)]
    return [html[s:e] for s, e in zip(starts, ends)]


def test_widget_numbers_match_the_python_formulas(site) -> None:
    layout, models = site
    rng = random.Random(11)
    calcs: list[tuple[str, list[float], float, int, float, float]] = []
    blocks: list[str] = []
    for i in range(10):
        k = rng.randint(1, 6)
        conditional = [round(rng.uniform(0.05, 1.0), 3) for _ in range(k)]
        alpha = round(rng.choice([rng.uniform(0, 1), 1.0, 0.0]), 3)
        draft, verify = round(rng.uniform(0, 0.5), 3), round(rng.uniform(0.8, 3), 3)
        mode = "alpha" if i % 2 else "positions"
        pre = widgets.Prefill(record_id="0" * 64, run_date="2026-01-01", model_id="m", hardware="h",
                              engine="atlas", workload="w", temperature=1.0,
                              conditional=conditional, draft_cost=draft, verify_cost=verify,
                              measured_tokens_per_pass=None, measured_speedup=1.0,
                              ideal_speedup=None)
        html = str(widgets.calculator(pre))
        html = html.replace(f'data-in="alpha" min="0" max="1" step="0.01" value="{conditional[0]:.3f}"',
                            f'data-in="alpha" min="0" max="1" step="0.01" value="{alpha:.3f}"')
        if mode == "alpha":
            html = html.replace('<option value="positions" selected>', '<option value="positions">')
            html = html.replace('<option value="alpha">', '<option value="alpha" selected>')
        calcs.append((mode, conditional, alpha, k, draft, verify))
        blocks.append(html)
    accepts: list[tuple[np.ndarray, np.ndarray]] = []
    for i in range(8):
        n = rng.randint(2, 6)
        p = np.array([round(rng.uniform(0, 1), 2) for _ in range(n)]) + 0.01
        q = np.array([round(rng.uniform(0, 1), 2) for _ in range(n)]) + (0.01 if i % 2 else 0.0)
        if i == 0:
            q = np.array([0.0] * (n - 1) + [1.0])  # a one-hot (greedy) draft
        accepts.append((p / p.sum(), q / q.sum()))
        blocks.append(str(widgets.accept_resample([f"t{j}" for j in range(n)], list(p), list(q))))
    # the real module 8 widgets, as built
    built = (layout.build / "modules" / "module-08" / "index.html").read_text(encoding="utf-8")
    real = _WIDGET.findall(built)
    # after load, act as a reader: retype the first calculator's acceptances, and draw 10 000
    # rounds in the second accept/resample widget (its first one is the one-hot draft)
    act = """<div id="atlas-test-act"></div><script>window.addEventListener("load", function () {
      setTimeout(function () {
        var c = document.querySelectorAll(".atlas-calculator")[0];
        var box = c.querySelector('[data-in="conditional"]'); box.value = "0.5, 0.25";
        box.dispatchEvent(new Event("input", {bubbles: true}));
        var a = document.querySelectorAll(".atlas-accept")[1];
        a.querySelector('[data-action="many"]').click();
      }, 200);
    });</script>"""
    page = _page(layout, "widget-check.html", "".join(blocks) + "".join(real) + act)
    dom = _chromium("--virtual-time-budget=3000", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout

    found = _instances(html, "calculator")
    assert len(found) == len(calcs) + 1
    calcs[0] = (calcs[0][0], [0.5, 0.25], *calcs[0][2:3], 2, *calcs[0][4:])  # retyped above
    for scope, (mode, conditional, alpha, k, draft, verify) in zip(found, calcs):
        tokens = theory.tokens_per_pass_iid(alpha, k) if mode == "alpha" else theory.tokens_per_pass(conditional)
        assert _value(html, scope, "tokens") == pytest.approx(tokens, rel=1e-9)
        assert _value(html, scope, "speedup") == pytest.approx(
            theory.ideal_speedup(tokens, k, draft, verify), rel=1e-9)
    # the prefilled calculator of module 8 shows the measured cell's figures through the formula
    pre = models.prefill
    assert pre is not None
    tokens = theory.tokens_per_pass(pre.conditional)
    last = found[-1]
    assert _value(html, last, "tokens") == pytest.approx(tokens, rel=1e-3)  # inputs shown to 3 digits
    assert _value(html, last, "speedup") == pytest.approx(
        theory.ideal_speedup(tokens, len(pre.conditional), pre.draft_cost, pre.verify_cost), rel=2e-3)
    assert "measured" in last and pre.record_id[:12] in last

    found = _instances(html, "accept-resample")
    assert len(found) == len(accepts) + 1
    for scope, (p, q) in zip(found, accepts):
        law = theory.accept_resample_distribution(p, q)
        shown = [float(v) for v in re.findall(r'data-out="output"[^>]*data-value="([^"]+)"', scope)]
        assert np.allclose(shown, law, atol=1e-12) and np.allclose(shown, p, atol=1e-12)
        assert _value(html, scope, "acceptance") == pytest.approx(theory.acceptance_probability(p, q))
        assert _value(html, scope, "maxdiff") < 1e-12
    # the 10 000 drawn rounds follow p (seeded draws: a fixed, reproducible sample)
    drawn = [float(v) for v in re.findall(r'data-out="empirical"[^>]*data-value="([^"]+)"', found[1])]
    assert "10000 rounds drawn" in found[1]
    assert np.allclose(drawn, accepts[1][0], atol=0.02)
    # the real widget's defaults: position 2 of the worked round, acceptance 0.7
    assert _value(html, found[-1], "acceptance") == pytest.approx(0.7)


@pytest.mark.parametrize("parameter", ["find", "h"])  # h: what a site-search hit's link carries
def test_finder_filters_from_its_url_and_lists_every_model(site, parameter: str) -> None:
    layout, models = site
    finder = layout.build / "models" / "index.html"
    dom = _chromium("--virtual-time-budget=3000", "--dump-dom", finder.as_uri() + f"?{parameter}=kimi")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = parse_html(dom.stdout)
    table = next(t for t in page.tables if t.header[:1] == ["model"])
    assert len(table.rows) == len(models.models)
    visible = re.findall(r"<tr(?![^>]*hidden)[^>]*><td[^>]*>(.*?)</td>", dom.stdout.split("<tbody>", 1)[1])
    assert [re.sub("<[^>]+>", "", v) for v in visible] == ["moonshotai/Kimi-K2-Instruct"]
    assert f"1 of {len(models.models)} models shown" in dom.stdout
    assert 'data-atlas-sortable="1"' in dom.stdout  # sort-tables.js wired the finder's table


def test_screenshot_of_diagrams_and_widgets(site) -> None:
    layout, _ = site
    built = (layout.build / "modules" / "module-08" / "index.html").read_text(encoding="utf-8")
    parts = _DIAGRAM.findall(built) + _WIDGET.findall(built)
    assert len(parts) == 5
    page = _page(layout, "gallery.html", "".join(f"<section>{p}</section>" for p in parts))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "module-08-diagrams-and-widgets.png"
    shot.unlink(missing_ok=True)
    done = _chromium("--window-size=1000,3600", "--hide-scrollbars", "--virtual-time-budget=3000",
                     f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.stat().st_size > 100_000, "a rendered page, not a blank one"
    phone = ARTIFACTS / "module-08-diagrams-and-widgets-390px.png"
    phone.unlink(missing_ok=True)
    done = _chromium("--window-size=390,5200", "--hide-scrollbars", "--virtual-time-budget=3000",
                     f"--screenshot={phone}", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert phone.stat().st_size > 50_000
