"""The package tree is the data flow (issue 41): each package of atlas/ is one stage, and no module
imports a package above its own, at module level or inside a function. No import circle anywhere
(issue 60): an import moved into a function hides a circle, it does not break it; only an import
under `if TYPE_CHECKING:` (never run) is left out. Each engine is a room of its own: no engine's
package imports another's. On the site, a part never imports a page."""

from __future__ import annotations

import ast
from pathlib import Path

from site_helpers import REPO

# Bottom to top. A module's stage is the first component under atlas/ (atlas/hub/local/ is the hub's).
LAYERS = ["", "fingerprints", "store", "hub", "families", "records", "conformance", "decode",
          "checkpoints", "engines", "evidence", "export", "site", "cli"]
TOP = {"cli", "cli_checkpoints", "__main__"}  # the command line: the top stage

ENGINE_PACKAGES = ("ours", "llamacpp", "vllm")  # atlas/engines/<name>/: one engine each


def stage_of(module: str) -> str:
    """The stage of a dotted atlas name: its package under atlas/, 'cli' for the command line, ''
    for the leaves (atlas/*.py and the names atlas/__init__.py defines). A package the list does not
    name is a failure of test_every_package_is_a_layer."""
    first = (module.split(".")[1:] or [""])[0]
    if first in TOP:
        return "cli"
    return first if first in LAYERS else ""


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def _run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` but those under `if TYPE_CHECKING:`, which never run."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if id(n) not in skipped]


def imports(path: Path) -> set[str]:
    """Every atlas module or attribute `path` imports where it runs, in the file or in a function;
    `from atlas.x import y` gives atlas.x.y (a module or a name in atlas.x: both live in atlas.x's stage)."""
    found: set[str] = set()
    for node in _run_time_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in found if n == "atlas" or n.startswith("atlas.")}


def upward_imports(root: Path) -> list[str]:
    """'importer -> imported' for each import from a lower stage into a higher one under root/atlas."""
    bad = []
    for path in sorted((root / "atlas").rglob("*.py")):
        me = module_name(path, root)
        mine = LAYERS.index(stage_of(me))
        for target in sorted(imports(path)):
            stage = stage_of(target)
            if LAYERS.index(stage) > mine:
                bad.append(f"{me} -> {target} ({stage_of(me) or 'leaf'} is below {stage})")
    return bad


def package_cycles(root: Path) -> set[tuple[str, tuple[str, ...]]]:
    """Strongly connected groups (more than one module) in the import graph, by stage: imports in
    functions count (one moved there still runs), imports under TYPE_CHECKING do not."""
    paths = sorted((root / "atlas").rglob("*.py"))
    names = {module_name(p, root) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path, root)
        # `from atlas.x import y` is atlas.x.y where that is a module, else atlas.x
        graph[me] = {n if n in names else n.rsplit(".", 1)[0] for n in imports(path)} & names - {me}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = set()

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.add((stage_of(v), tuple(sorted(group))))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def engine_crossings(root: Path) -> list[str]:
    """'importer -> imported' for each import from one engine's package into another's."""
    def engine_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "engines" and parts[2] in ENGINE_PACKAGES else None

    bad = []
    for path in sorted((root / "atlas" / "engines").rglob("*.py")):
        me = module_name(path, root)
        for target in sorted(imports(path)):
            if engine_of(me) and engine_of(target) and engine_of(target) != engine_of(me):
                bad.append(f"{me} -> {target}")
    return bad


def parts_importing_pages(root: Path) -> list[str]:
    site = root / "atlas" / "site"
    return [f"{module_name(p, root)} -> {n}" for p in sorted((site / "parts").rglob("*.py"))
            for n in sorted(imports(p)) if n.startswith("atlas.site.pages")]


def test_no_module_imports_a_higher_stage() -> None:
    assert upward_imports(REPO) == []


def test_no_import_circle() -> None:
    assert package_cycles(REPO) == set()


def test_no_engine_imports_another() -> None:
    assert engine_crossings(REPO) == []


def test_no_site_part_imports_a_page() -> None:
    assert parts_importing_pages(REPO) == []


def test_every_package_is_a_layer() -> None:
    packages = {p.name for p in (REPO / "atlas").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LAYERS) - {"", "cli"}


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "atlas" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "__init__.py": "",
        "records/__init__.py": "",
        "records/gating.py": "def f():\n    from atlas.site import charts  # inside a function still counts\n",
        "site/__init__.py": "",
        "site/charts.py": "from atlas.records import gating\n",
        "paths.py": "import atlas.store.db\n",
    })
    assert upward_imports(root) == [
        "atlas.paths -> atlas.store.db (leaf is below store)",
        "atlas.records.gating -> atlas.site.charts (records is below site)",
    ]


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "__init__.py": "",
        "decode/__init__.py": "",
        "decode/a.py": "from atlas.decode import b\n",
        "decode/b.py": "from atlas.decode.a import x\n",
        # a circle hidden in a function still counts; one under TYPE_CHECKING (never run) does not
        "records/__init__.py": "",
        "records/c.py": "def f():\n    from atlas.records import d\n",
        "records/d.py": "from atlas.records.c import f\n",
        "records/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from atlas.records.f import R\n",
        "records/f.py": "from atlas.records.e import x\n",
    })
    assert package_cycles(root) == {("decode", ("atlas.decode.a", "atlas.decode.b")),
                                    ("records", ("atlas.records.c", "atlas.records.d"))}


def test_a_planted_engine_crossing_and_a_part_importing_a_page_are_caught(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "__init__.py": "",
        "engines/__init__.py": "",
        "engines/cells.py": "",
        "engines/vllm/__init__.py": "",
        "engines/vllm/client.py": "from atlas.engines import cells\n",
        "engines/llamacpp/__init__.py": "",
        "engines/llamacpp/conformance.py": "def f():\n    from atlas.engines.vllm.client import Generated\n",
        "site/__init__.py": "",
        "site/pages/__init__.py": "",
        "site/pages/runpages.py": "from atlas.site.parts import charts\n",
        "site/parts/__init__.py": "",
        "site/parts/charts.py": "from atlas.site.pages.runpages import row\n",
    })
    assert engine_crossings(root) == ["atlas.engines.llamacpp.conformance -> atlas.engines.vllm.client.Generated"]
    assert parts_importing_pages(root) == ["atlas.site.parts.charts -> atlas.site.pages.runpages.row"]
