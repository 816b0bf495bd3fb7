"""Imports follow the data flow (the layer order itself: tests/test_layering.py): the site reads an
export only through its formats, and the commands that only read evidence (`atlas site build`,
`atlas measure import`) run in a process where torch cannot be imported at all."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from site_helpers import REPO, build_demo_site

def test_the_site_does_not_import_the_exporter() -> None:
    """The Data page reads an export through atlas.export.formats, so export and site form no cycle."""
    site = sorted((REPO / "atlas" / "site").rglob("*.py"))
    assert [str(p.relative_to(REPO)) for p in site if _imports_export(p)] == []


def _imports_export(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name == "atlas.export.tables" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module == "atlas.export.tables"
                                                 or node.module == "atlas" and any(a.name == "export" for a in node.names)):
            return True
    return False


# The command line in a process where torch cannot be imported: every attempt is refused and
# listed on stderr at exit, so that an attempt some caller swallowed still shows.
NO_TORCH = """
import atexit, json, sys
attempts = []
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            attempts.append(name)
            raise ImportError(f"torch is not importable in this test ({name})")
        return None
sys.meta_path.insert(0, NoTorch())
atexit.register(lambda: print("TORCH-ATTEMPTS " + json.dumps(attempts), file=sys.stderr))
from atlas.cli import cli
cli(sys.argv[1:], prog_name="atlas")
"""


def _atlas_without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-c", NO_TORCH, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    attempts = json.loads(result.stderr.rsplit("TORCH-ATTEMPTS ", 1)[1])
    assert attempts == [], result.stderr
    return result


def test_site_build_never_imports_torch(tmp_path: Path) -> None:
    demo = build_demo_site(tmp_path, conformance=True, export_data=True)
    result = _atlas_without_torch("site", "build", "--root", str(demo.root))
    assert "Rendered" in result.stdout and (demo.layout.build / "index.html").is_file()


def test_measure_import_never_imports_torch(tmp_path: Path) -> None:
    db = tmp_path / "atlas.duckdb"
    result = _atlas_without_torch("measure", "import", "--db", str(db), "--dir", str(REPO / "evidence" / "measurements"))
    assert "record(s) loaded" in result.stdout and ", 0 rejected" in result.stdout
