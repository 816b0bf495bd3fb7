"""Benchmark of the site pipeline at the Hub's scale: 10 000 and 100 000 tracked models, one run.

For each size, on a synthetic store, every stage runs in its own process, timed and with its peak
resident memory (the process's and its children's: the mkdocs build is one):
  store     five complete snapshots written through atlas.store.db.write_snapshot (set-up, not a goal)
  evidence  the module evidence file                        (atlas evidence, first half)
  models    models.json, the model pages' and finder's data  (atlas evidence, second half)
  render    Jinja modules + model pages + finder parts -> site/docs/   (atlas site build, first half)
  build     mkdocs build --strict -> site/build/                       (atlas site build, second half)
  finder    the finder page in headless Chromium over http://127.0.0.1: time to its first screen
            (load event) and the bytes that needs; then a search over every model (which loads
            the finder's parts) — or, without Chromium, the bytes of the first screen only
Then the ratios of the largest size to the smallest. The goal: time and memory at most linear in
the models (100 000 at most 10x 10 000), the finder's first screen the same at every size.

The synthetic mix is the Hub's, not the test corpus's: --mtp-share of the models (default 2 %)
declare MTP (DeepSeek-V3, Qwen3.5, GLM-4.5, MiniMax layouts), 1 % carry the key set to 0 (Kimi),
the rest none; a fifth are derivatives. Per-model pages exist for the MTP share only, so the build
grows with the MTP models, the finder's data with all. Each of --modules module pages shows every
evidence section (the heaviest module page the site can have).

Usage: python benchmarks/site.py [--models 10000,100000] [--modules 10] [--mtp-share 0.02]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from atlas.store import db as store
from atlas.site.pages import write_evidence as evidence
from atlas.site.parts import models_json as modelpages
from atlas.site.pages import modelfinder, render

REPO = Path(__file__).resolve().parents[1]

MTP_FAMILIES = [  # (model_type, architecture, key, declared value, weight-name pattern)
    ("deepseek_v3", "DeepseekV3ForCausalLM", "num_nextn_predict_layers", 1, "model.layers.61.*"),
    ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "text_config.mtp_num_hidden_layers", 1, "mtp.*"),
    ("glm4_moe", "Glm4MoeForCausalLM", "num_nextn_predict_layers", 1, "model.layers.92.*"),
    ("minimax_m2", "MiniMaxM2ForCausalLM", "num_mtp_modules", 3, None),
]
ZERO_FAMILY = ("kimi_k2", "DeepseekV3ForCausalLM", "num_nextn_predict_layers", 0, None)
PLAIN_FAMILIES = [("llama", "LlamaForCausalLM", None, None, None), ("qwen3", "Qwen3ForCausalLM", None, None, None)]

MODULE = """---
number: {n}
title: Synthetic module {n}
---
# Module {{{{ page.number }}}} — {{{{ page.title }}}}

{{% if facts.n_models %}}Snapshot of {{{{ facts.snapshot_date }}}}: {{{{ facts.n_declaring }}}} of
{{{{ facts.n_models }}}} models declare MTP.{{% endif %}}

{{% for name in ["declared", "aggregate", "shipped", "mismatches", "servable", "measured",
                "adoption_chart", "layers_chart", "provenance"] %}}
## Section {{{{ loop.index }}}}

{{{{ evidence(name) }}}}

{{% endfor %}}
"""


def family(rng: random.Random, mtp_share: float) -> tuple:
    draw = rng.random()
    if draw < mtp_share:
        return rng.choice(MTP_FAMILIES)
    if draw < mtp_share + 0.01:
        return ZERO_FAMILY
    return rng.choice(PLAIN_FAMILIES)


def synthetic_store(db: Path, n_models: int, mtp_share: float, n_snapshots: int = 5) -> None:
    """Five complete snapshots growing to n_models (so the adoption chart and the model pages have
    a history); each model keeps its family across snapshots."""
    rng = random.Random(8)
    families = [family(rng, mtp_share) for _ in range(n_models)]
    con = store.connect(db)
    try:
        for s in range(n_snapshots):
            n = n_models * (s + 1) // n_snapshots
            models, fps = [], []
            for i in range(n):
                mt, arch, key, value, weights = families[i]
                repo, sha = f"org{i % 37}/model-{i:06d}", f"{i:08x}{s:032x}"
                derivative = i % 5 == 0 and i > 0
                models.append(store.ModelRow(
                    repo_id=repo, sha=sha, last_modified=None, created_at=datetime(2025, 1 + i % 12, 1 + i % 28),
                    downloads=rng.randint(0, 10**6), likes=rng.randint(0, 1000), gated=None,
                    private=False, pipeline_tag="text-generation", library_name="transformers",
                    tags=[], base_models=[f"org{(i - 1) % 37}/model-{i - 1:06d}"] if derivative else [],
                    base_relation="quantized" if derivative else None, is_derivative=derivative,
                    is_exemplar=i < 3, param_total=None, fetch_status="ok", error=None,
                ))
                if key is not None:
                    fps.append((repo, sha, "bench", "declared_num_mtp_layers", str(value), key))
                if i % 3 == 0:  # weight names known for a third of the models
                    shipped = 0 if (derivative or weights is None) else value or 0
                    fps.append((repo, sha, "bench", "shipped_mtp_layers", str(shipped), weights))
                fps.append((repo, sha, "bench", "model_type", mt, None))
                fps.append((repo, sha, "bench", "architectures", arch, None))
            store.write_snapshot(con, store.SnapshotRow(
                started_at=datetime(2026, 7 + s, 1, 8), finished_at=datetime(2026, 7 + s, 1, 9),
                endpoint="synthetic", watchlist_digest="0" * 64, status="complete", n_listed=n,
                n_fetched=n, n_unchanged=0, n_gated=0, n_missing=0, n_failed=0,
                rule_version="bench", n_requests=0, n_rate_limited=0, problems=None,
            ), models, [], [], fps)
    finally:
        con.close()


def project(root: Path, n_modules: int) -> render.Layout:
    shutil.copytree(REPO / "site", root / "site",
                    ignore=shutil.ignore_patterns("build", "modules", "models", "glossary.md", "how-made.md"))
    (root / "modules").mkdir()
    (root / "evidence").mkdir()
    shutil.copy(REPO / "evidence" / "servable.toml", root / "evidence" / "servable.toml")
    for n in range(1, n_modules + 1):
        (root / "modules" / f"module-{n:02d}.md").write_text(MODULE.format(n=n), encoding="utf-8")
    return render.Layout(root=root)


# ---- one stage, in its own process ---------------------------------------------------------------


def stage(name: str, root: Path, n_models: int, n_modules: int, mtp_share: float) -> dict[str, object]:
    layout = render.Layout(root=root)
    db = root / "atlas.duckdb"
    matrix = layout.evidence / "servable.toml"
    ev_path = layout.evidence / "module-08.evidence.md"
    t0 = time.perf_counter()
    out: dict[str, object] = {}
    if name == "store":
        project(root, n_modules)
        synthetic_store(db, n_models, mtp_share)
    elif name == "evidence":
        facts = evidence.generate(db, ev_path, matrix).facts
        for n in range(1, n_modules + 1):  # every module shows the same evidence
            if n != 8:
                shutil.copy(ev_path, layout.evidence / f"module-{n:02d}.evidence.md")
        out = {"bytes": ev_path.stat().st_size, "declaring": facts.n_declaring}
    elif name == "models":
        data = modelpages.generate(db, layout.evidence / modelpages.FILE_NAME, matrix, root)
        out = {"bytes": (layout.evidence / modelpages.FILE_NAME).stat().st_size,
               "pages": sum(m.has_page for m in data.models)}
    elif name == "render":
        out = {"pages": len(render.render_site(layout))}
    elif name == "build":
        render.mkdocs_build(layout)
        out = {"bytes": sum(p.stat().st_size for p in layout.build.rglob("*") if p.is_file())}
    elif name == "finder":
        out = finder_load(layout)
    out["seconds"] = time.perf_counter() - t0
    return out


def finder_load(layout: render.Layout) -> dict[str, object]:
    """The finder over http://127.0.0.1 in headless Chromium: load-event time and bytes of its
    first screen (page, styles, scripts; no part file), then a search that loads every part."""
    page_bytes = (layout.build / "models" / "index.html").stat().st_size
    parts = list((layout.build / "models" / modelfinder.FINDER_PARTS).glob("part-*.js"))
    out: dict[str, object] = {"page_bytes": page_bytes, "parts": len(parts),
                              "parts_bytes": sum(p.stat().st_size for p in parts)}
    chromium = next((found for name in ("chromium", "chromium-browser", "google-chrome")
                     if (found := shutil.which(name))), None)
    if chromium is None:
        return out
    sys.path.insert(0, str(REPO / "tests"))
    from chromium_cdp import Chromium

    handler = functools.partial(_QuietHandler, directory=str(layout.build))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/models/"
    try:
        with Chromium(chromium) as browser:
            browser.open(url, 1400).close()  # warm: the theme's assets cached, as for a reader
            t0 = time.perf_counter()
            page = browser.open(url, 1400)  # returns at the load event
            out["first_screen_s"] = time.perf_counter() - t0
            # the page and the styles and scripts it links (cached or not; not the search index,
            # which the theme's worker fetches in the background)
            out["first_screen_bytes"] = page.evaluate(
                "performance.getEntriesByType('navigation')[0].encodedBodySize + "
                "performance.getEntriesByType('resource').filter(function (r) {"
                " return r.initiatorType === 'link' || r.initiatorType === 'script'; })"
                ".reduce(function (s, r) { return s + r.encodedBodySize; }, 0)")
            out["parts_loaded_first"] = page.evaluate(
                "document.querySelectorAll('script[src*=\"finder/part-\"]').length")
            t0 = time.perf_counter()
            out["search_count"] = page.evaluate(
                "new Promise(function (done) { var i = document.querySelector('input[data-atlas-finder]');"
                " i.value = 'deepseek'; i.dispatchEvent(new Event('input'));"
                " (function poll() { var c = document.querySelector('[data-atlas-finder-count]').textContent;"
                " if (/^\\d+ of /.test(c)) done(c); else setTimeout(poll, 10); })(); })")
            out["search_all_s"] = time.perf_counter() - t0
            page.close()
    finally:
        server.shutdown()
    return out


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


# ---- the run: every size, every stage --------------------------------------------------------------

STAGES = ("store", "evidence", "models", "render", "build", "finder")


def run_stage(name: str, root: Path, n: int, args: argparse.Namespace) -> dict[str, object]:
    cmd = [sys.executable, __file__, "--stage", name, "--root", str(root), "--models", str(n),
           "--modules", str(args.modules), "--mtp-share", str(args.mtp_share)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    stdout = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"stage {name} at {n} models failed (exit {proc.returncode})")
    result = json.loads(stdout.strip().splitlines()[-1])
    result["peak_mib"] = usage.ru_maxrss / 1024  # kB on Linux; the stage's process and its children
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="10000,100000", help="comma-separated sizes (one for --stage)")
    ap.add_argument("--modules", type=int, default=10)
    ap.add_argument("--mtp-share", type=float, default=0.02)
    ap.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.modules < 8:
        ap.error("--modules must be at least 8: model pages link to module 8")
    if args.stage:
        print(json.dumps(stage(args.stage, args.root, int(args.models), args.modules, args.mtp_share)))
        return
    sizes = [int(s) for s in args.models.split(",")]
    results: dict[int, dict[str, dict[str, object]]] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            results[n] = {}
            for name in STAGES:
                results[n][name] = run_stage(name, Path(tmp), n, args)
                r = results[n][name]
                print(f"  {n:>7} models  {name:<9} {r['seconds']:8.2f} s  {r['peak_mib']:7.0f} MiB", flush=True)
    report(results, args)


def _fmt_bytes(v: object) -> str:
    return "—" if v is None else f"{float(v) / 1e6:.2f} MB"  # type: ignore[arg-type]


def report(results: dict[int, dict[str, dict[str, object]]], args: argparse.Namespace) -> None:
    sizes = sorted(results)
    lo, hi = sizes[0], sizes[-1]
    print(f"\nsite pipeline, {args.modules} modules, MTP share {args.mtp_share:.0%}; python {sys.version.split()[0]}")
    head = f"{'stage':<10}" + "".join(f"{f'{n} s':>12}{f'{n} MiB':>12}" for n in sizes)
    print(head + (f"{'time ×':>9}{'mem ×':>8}" if len(sizes) > 1 else ""))
    for name in STAGES:
        line = f"{name:<10}" + "".join(f"{results[n][name]['seconds']:>12.2f}{results[n][name]['peak_mib']:>12.0f}"
                                       for n in sizes)
        if len(sizes) > 1:
            t = results[hi][name]["seconds"] / results[lo][name]["seconds"]  # type: ignore[operator]
            m = results[hi][name]["peak_mib"] / results[lo][name]["peak_mib"]  # type: ignore[operator]
            line += f"{t:>9.1f}{m:>8.1f}"
        print(line)
    rows = [
        ("models declaring MTP", lambda r: r["evidence"]["declaring"]),
        ("model pages", lambda r: r["models"]["pages"]),
        ("evidence file", lambda r: _fmt_bytes(r["evidence"]["bytes"])),
        ("models.json", lambda r: _fmt_bytes(r["models"]["bytes"])),
        ("built site", lambda r: _fmt_bytes(r["build"]["bytes"])),
        ("finder page (HTML)", lambda r: _fmt_bytes(r["finder"]["page_bytes"])),
        ("finder parts", lambda r: f"{r['finder']['parts']} files, {_fmt_bytes(r['finder']['parts_bytes'])}"),
        ("finder first screen", lambda r: (f"{r['finder']['first_screen_s']:.2f} s, "
                                           f"{_fmt_bytes(r['finder']['first_screen_bytes'])}, "
                                           f"{r['finder']['parts_loaded_first']} parts")
         if "first_screen_s" in r["finder"] else "no Chromium: see the page bytes"),
        ("finder search all", lambda r: (f"{r['finder']['search_all_s']:.2f} s, "
                                         f"{r['finder']['search_count'].split(' models')[0]} match")
         if "search_all_s" in r["finder"] else "—"),
    ]
    print()
    for label, get in rows:
        print(f"{label:<22}" + "".join(f"{str(get(results[n])):>34}" for n in sizes))


if __name__ == "__main__":
    main()
