"""Benchmark of the site pipeline on a synthetic store: 1 000 models, 10 modules.

Stages, each timed separately (median of --repeat runs):
  evidence  named queries against the store -> module evidence file   (atlas evidence)
  render    Jinja: 10 module templates + evidence -> site/docs/        (first half of atlas site build)
  build     mkdocs build --strict -> site/build/                      (second half of atlas site build)

The store is written through the store's own writer (atlas.store.write_snapshot): five complete
snapshots, the last with all 1 000 models, so the adoption chart has a history. Every module page
shows all evidence sections (a 1 000-row declared table each), the heaviest page the site can have.

Usage: python benchmarks/site.py [--models 1000] [--modules 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from atlas import store
from atlas.site import evidence, render

REPO = Path(__file__).resolve().parents[1]

FAMILIES = [  # (model_type, architecture, key, declared values, weight-name pattern)
    ("deepseek_v3", "DeepseekV3ForCausalLM", "num_nextn_predict_layers", [1], "model.layers.61.*"),
    ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "text_config.mtp_num_hidden_layers", [1], "mtp.*"),
    ("glm4_moe", "Glm4MoeForCausalLM", "num_nextn_predict_layers", [1], "model.layers.92.*"),
    ("minimax_m2", "MiniMaxM2ForCausalLM", "num_mtp_modules", [3], None),
    ("kimi_k2", "DeepseekV3ForCausalLM", "num_nextn_predict_layers", [0], None),
    ("llama", "LlamaForCausalLM", None, [], None),
    ("qwen3", "Qwen3ForCausalLM", None, [], None),
]

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


def synthetic_store(db: Path, n_models: int, n_snapshots: int = 5) -> None:
    rng = random.Random(8)
    con = store.connect(db)
    try:
        for s in range(n_snapshots):
            n = n_models * (s + 1) // n_snapshots
            models, fps = [], []
            for i in range(n):
                mt, arch, key, values, weights = FAMILIES[i % len(FAMILIES)]
                repo, sha = f"org{i % 37}/model-{i:04d}", f"{i:08x}{s:032x}"
                derivative = i % 5 == 0
                models.append(store.ModelRow(
                    repo_id=repo, sha=sha, last_modified=None, created_at=None,
                    downloads=rng.randint(0, 10**6), likes=rng.randint(0, 1000), gated=None,
                    private=False, pipeline_tag="text-generation", library_name="transformers",
                    tags=[], base_models=[f"org0/model-{i - 1:04d}"] if derivative else [],
                    base_relation="quantized" if derivative else None, is_derivative=derivative,
                    is_exemplar=i < 3, param_total=None, fetch_status="ok", error=None,
                ))
                if key is not None:
                    fps.append((repo, sha, "bench", "declared_num_mtp_layers", str(values[0]), key))
                if i % 3 == 0:  # weight names known for a third of the models
                    shipped = 0 if (derivative or weights is None) else values[0] if values else 0
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
                    ignore=shutil.ignore_patterns("build", "modules", "glossary.md", "how-made.md"))
    (root / "modules").mkdir()
    (root / "evidence").mkdir()
    shutil.copy(REPO / "evidence" / "servable.toml", root / "evidence" / "servable.toml")
    for n in range(1, n_modules + 1):
        (root / "modules" / f"module-{n:02d}.md").write_text(MODULE.format(n=n), encoding="utf-8")
    return render.Layout(root=root)


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--modules", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db = root / "atlas.duckdb"
        t0 = time.perf_counter()
        synthetic_store(db, args.models)
        t_store = time.perf_counter() - t0
        layout = project(root, args.modules)
        ev_path = layout.evidence / "module-08.evidence.md"
        matrix = layout.evidence / "servable.toml"

        def evidence_stage() -> None:
            evidence.generate(db, ev_path, matrix)
            for n in range(1, args.modules + 1):  # every module shows the same evidence
                if n != 8:
                    shutil.copy(ev_path, layout.evidence / f"module-{n:02d}.evidence.md")

        ev_med, ev_min = timed(evidence_stage, args.repeat)
        r_med, r_min = timed(lambda: render.render_site(layout), args.repeat)
        b_med, b_min = timed(lambda: render.mkdocs_build(layout), args.repeat)
        facts = evidence.read(ev_path).facts
        page = layout.build / "modules" / "module-08" / "index.html"
        html_bytes = sum(p.stat().st_size for p in layout.build.rglob("*.html"))
        total = ev_med + r_med + b_med
        print(f"synthetic store: {args.models} models, 5 snapshots, written in {t_store:.2f} s "
              f"({facts.n_declaring} declare MTP, {facts.n_mismatches} mismatches)")
        print(f"site: {args.modules} modules; module page {page.stat().st_size / 1e6:.2f} MB, "
              f"all HTML {html_bytes / 1e6:.1f} MB; python {sys.version.split()[0]}")
        print(f"{'stage':<10} {'median s':>9} {'min s':>8} {'share':>7}")
        for name, med, mn in (("evidence", ev_med, ev_min), ("render", r_med, r_min),
                              ("build", b_med, b_min)):
            print(f"{name:<10} {med:>9.3f} {mn:>8.3f} {med / total:>7.0%}")
        print(f"{'total':<10} {total:>9.3f}")


if __name__ == "__main__":
    main()
