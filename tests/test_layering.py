"""The package tree is the data flow (issue 41): each package of atlas/ is one stage, and no module
imports a package above its own, at module level or inside a function. Cycles between modules of
one package are allowed; they are listed here so that a new one is a visible change."""

from __future__ import annotations

import ast
from pathlib import Path

from site_helpers import REPO

# Bottom to top. A module's stage is the first component under atlas/ (atlas/hub/local/ is the hub's).
LAYERS = ["", "fingerprints", "store", "hub", "families", "records", "conformance", "decode",
          "checkpoints", "engines", "evidence", "export", "site", "cli"]
TOP = {"cli", "cli_checkpoints", "__main__"}  # the command line: the top stage

# Import cycles inside one package, as (package, sorted module names): allowed, but listed.
KNOWN_CYCLES: set[tuple[str, tuple[str, ...]]] = set()


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


def imports(path: Path) -> set[str]:
    """Every atlas module or attribute `path` imports, anywhere in the file; `from atlas.x import y`
    gives atlas.x.y (a module or a name in atlas.x: both live in atlas.x's stage)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
    """Strongly connected groups (more than one module) in the module-level import graph, by package."""
    graph: dict[str, set[str]] = {}
    paths = sorted((root / "atlas").rglob("*.py"))
    names = {module_name(p, root) for p in paths}
    for path in paths:
        me = module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        deps = set()
        for node in tree.body:  # module level only: a function-level import is how a cycle is broken
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                deps |= {c for c in (f"{node.module}.{a.name}" for a in node.names) if c in names} or ({node.module} & names)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names} & names
        graph[me] = deps - {me}
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


def test_no_module_imports_a_higher_stage() -> None:
    assert upward_imports(REPO) == []


def test_cycles_stay_inside_one_package_and_are_listed() -> None:
    cycles = package_cycles(REPO)
    assert all(len({stage_of(m) for m in group}) == 1 for _, group in cycles), cycles
    assert cycles == KNOWN_CYCLES


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
    })
    assert package_cycles(root) == {("decode", ("atlas.decode.a", "atlas.decode.b"))}
