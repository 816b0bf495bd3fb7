"""Module 8's widgets and the model finder in headless Chromium, checked against the Python
formulas of atlas.records.theory. Four browser launches in all: one page holding many widget
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
from browser_helpers import ARTIFACTS, CHROMIUM, run_chromium
from site_helpers import build_demo_site, parse_html

from atlas.records import theory
from atlas.site.parts import models_json as modelpages
from atlas.site.pages import render
from atlas.site.parts import widgets

pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary on PATH")]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[render.Layout, modelpages.Models]:
    """The real module 8 over the bundled mirror and the committed measurement record(s)."""
    built = build_demo_site(tmp_path_factory.mktemp("course-browser"))
    return built.layout, built.models


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


_WIDGET = re.compile(r'<div class="atlas-widget [^"]*" data-atlas-widget="[^"]+"[^>]*>.*?</div>(?=\s*(?:<|$))', re.S)
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
                              verify_costs={}, measured_tokens_per_pass=None, measured_speedup=1.0,
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
    dom = run_chromium("--virtual-time-budget=3000", "--dump-dom", page.as_uri())
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
    dom = run_chromium("--virtual-time-budget=3000", "--dump-dom", finder.as_uri() + f"?{parameter}=kimi")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = parse_html(dom.stdout)
    table = next(t for t in page.tables if t.header[:1] == ["model"])
    # the finder lists the matching rows of every model (its data loaded in parts, see
    # tests/test_hostile_records.py for 10^3 models), and counts them against all
    assert [r[0] for r in table.rows] == ["moonshotai/Kimi-K2-Instruct"]
    assert f"1 of {len(models.models)} models shown" in dom.stdout
    assert 'data-atlas-sortable="1"' in dom.stdout  # sort-tables.js wired the finder's table


def test_a_search_that_matches_nothing_says_which_family_it_names(site) -> None:
    """"mimo" matched nothing with no hint, though module 8 uses MiMo three times: the crawl tracks
    no MiMo checkpoint. The finder now says that MiMo is a family the runner's table knows; other
    words get what the finder searches; a family name with models finds them (its alias)."""
    layout, models = site
    finder = layout.build / "models" / "index.html"

    def shown(words: str) -> tuple[list[str], str]:
        dom = run_chromium("--virtual-time-budget=3000", "--dump-dom", finder.as_uri() + "?find=" + words)
        assert dom.returncode == 0, dom.stderr[-2000:]
        table = next(t for t in parse_html(dom.stdout).tables if t.header[:1] == ["model"])
        hint = re.search(r"<p data-atlas-finder-hint( hidden)?[^>]*>(.*?)</p>", dom.stdout, re.S)
        assert hint is not None
        return [r[0] for r in table.rows], "" if hint.group(1) else hint.group(2)

    assert not any(m.family == "mimo" for m in models.models)
    rows, hint = shown("mimo")
    assert rows == [] and "MiMo (model_type qwen2, mimo) is a family in the runner&#39;s table: our loop runs its layout" \
        in hint.replace("'", "&#39;")
    rows, hint = shown("zzqx")
    assert rows == [] and "try part of a model id" in hint
    rows, hint = shown("nemotron-h")
    assert rows and hint == ""
    assert set(rows) >= {m.repo_id for m in models.models if m.family == "nemotron_h" and m.runner}


def test_screenshot_of_diagrams_and_widgets(site) -> None:
    layout, _ = site
    built = (layout.build / "modules" / "module-08" / "index.html").read_text(encoding="utf-8")
    parts = _DIAGRAM.findall(built) + _WIDGET.findall(built)
    assert len(parts) == 5
    page = _page(layout, "gallery.html", "".join(f"<section>{p}</section>" for p in parts))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "module-08-diagrams-and-widgets.png"
    shot.unlink(missing_ok=True)
    done = run_chromium("--window-size=1000,3600", "--hide-scrollbars", "--virtual-time-budget=3000",
                     f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.stat().st_size > 100_000, "a rendered page, not a blank one"
    phone = ARTIFACTS / "module-08-diagrams-and-widgets-390px.png"
    phone.unlink(missing_ok=True)
    done = run_chromium("--window-size=390,5200", "--hide-scrollbars", "--virtual-time-budget=3000",
                     f"--screenshot={phone}", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert phone.stat().st_size > 50_000


def test_widgets_follow_k_show_one_mode_and_clear_stale_results(site) -> None:
    """As a reader: shorten the prefilled list to two values (the verify cost must become the
    record's k = 2 cost, not stay at k = 3's), list more values than the record timed (no result,
    a message), type something invalid (the old result disappears), switch to one α (only its
    inputs show); in the accept/resample widget, an invalid p clears the law and the draws."""
    layout, models = site
    pre = models.prefill
    assert pre is not None and len(pre.verify_costs) >= 2
    built = (layout.build / "modules" / "module-08" / "index.html").read_text(encoding="utf-8")
    real = _WIDGET.findall(built)
    calc = next(w for w in real if 'data-atlas-widget="calculator"' in w)
    accept = next(w for w in real if 'data-atlas-widget="accept-resample"' in w)
    ks = sorted(pre.verify_costs)
    short = pre.conditional[:ks[-2]]
    too_long = ", ".join(["0.5"] * (ks[-1] + 1))
    # four copies of the calculator, each driven into one state; two of the accept widget
    act = """<script>window.addEventListener("load", function () { setTimeout(function () {
      function type(el, name, value) { var box = el.querySelector('[data-in="' + name + '"]');
        box.value = value; box.dispatchEvent(new Event("input", {bubbles: true})); }
      var c = document.querySelectorAll(".atlas-calculator");
      type(c[0], "conditional", "%s");
      type(c[1], "conditional", "%s");
      type(c[2], "conditional", "0.5, x");
      var mode = c[3].querySelector('[data-in="mode"]'); mode.value = "alpha";
      mode.dispatchEvent(new Event("change", {bubbles: true}));
      var a = document.querySelectorAll(".atlas-accept");
      a[0].querySelector('[data-action="many"]').click();
      var p = a[0].querySelector('[data-in="p"]'); p.value = "-1";
      p.dispatchEvent(new Event("input", {bubbles: true}));
    }, 200); });</script>""" % (", ".join(f"{a:.3f}" for a in short), too_long)
    diagram = _DIAGRAM.findall(built)[1]  # the round diagram: tapped once, it shows at its drawn width
    act = act.replace("}, 200); });</script>", "document.querySelector('.atlas-diagram').click(); }, 200); });</script>")
    page = _page(layout, "widget-states.html", calc * 4 + accept * 2 + diagram + act)
    dom = run_chromium("--virtual-time-budget=3000", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    found = _instances(html, "calculator")
    assert len(found) == 4
    # 1. two values: k = 2, and the verify cost the record timed at k = 2
    k = len(short)
    verify = float(re.search(r'data-in="verify"[^>]*value="([^"]+)"', found[0]).group(1)) \
        if 'data-in="verify"' in found[0] else None
    tokens = theory.tokens_per_pass([round(a, 3) for a in short])
    speed = _value(html, found[0], "speedup")
    assert speed == pytest.approx(theory.ideal_speedup(tokens, k, round(pre.draft_cost, 3),
                                                       round(pre.verify_costs[k], 3)), rel=1e-9)
    assert speed != pytest.approx(theory.ideal_speedup(tokens, k, round(pre.draft_cost, 3),
                                                       round(pre.verify_costs[ks[-1]], 3)), rel=1e-6)
    assert f"at k = {k} from the record" in found[0]
    assert verify is not None
    # 2. a k the record never timed: no number is shown, and the reader is told why
    assert 'data-out="speedup" data-value' not in found[1] and "only at k =" in found[1]
    # 3. invalid input: the stale result is gone
    assert 'data-out="tokens" data-value' not in found[2] and 'data-out="speedup" data-value' not in found[2]
    assert "List acceptance probabilities" in found[2]
    # 4. one α: its inputs shown, the list hidden
    assert re.search(r'<label data-mode="positions" hidden', found[3])
    assert re.search(r'<label data-mode="alpha">', found[3])
    acc = _instances(html, "accept-resample")
    assert 'data-out="output" data-value' not in acc[0] and 'data-out="empirical" data-value' not in acc[0]
    assert 'data-out="acceptance" data-value' not in acc[0]
    assert 'data-out="output" data-value' in acc[1]  # the untouched copy still computes
    tapped = re.search(r'<div class="atlas-diagram"[^>]*>\s*<svg[^>]*>', html).group(0)
    drawn = re.search(r'viewBox="0 0 (\d+) ', tapped).group(1)
    assert "data-zoomed" in tapped and f"width: {drawn}px" in tapped.split("max-width", 1)[1]
