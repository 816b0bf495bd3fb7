"""mkdocs hook: the nav in reading order (home, modules by number, finder, fingerprints, runs,
conformance, data, changelog, glossary, how-made), computed from what `atlas site build` rendered into docs/, so adding a module needs no config edit."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def on_config(config: Any) -> Any:
    if config["nav"] is not None:
        return config
    docs = Path(config["docs_dir"])
    modules = sorted(p.name for p in (docs / "modules").glob("module-*.md"))
    nav: list[Any] = [{"Home": "index.md"}]
    if modules:
        nav.append({"Modules": [f"modules/{name}" for name in modules]})
    if (docs / "models" / "index.md").exists():
        # the finder links every per-model page; those pages stay out of the nav (not_in_nav)
        nav.append({"Model finder": "models/index.md"})
    # the Runs page lists the run pages (docs/runs/), which stay out of the nav like model pages
    for title, name in (("Fingerprints", "fingerprints.md"), ("Runs", "runs.md"),
                        ("Conformance", "conformance.md"), ("Data", "data/index.md"),
                        ("Changelog", "changelog.md"), ("Glossary", "glossary.md"),
                        ("How this atlas is made", "how-made.md")):
        if (docs / name).exists():
            nav.append({title: name})
    config["nav"] = nav
    return config
