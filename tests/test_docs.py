"""Docs that cannot drift (sqlite-utils' test_docs.py): the generated CLI reference equals the
commands' --help, every module is named on the layout page, and the README stays a front door
whose every link, image and quoted output has its source."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

from site_helpers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
LAYOUT = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", REPO / "docs" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_generated_from_help() -> None:
    committed = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == _cli_reference().render(), "docs/cli.md is stale: run `make cli-docs`"


def test_the_cli_reference_names_every_command() -> None:
    from atlas.cli import cli

    page = _cli_reference().render()
    assert "## atlas measure run\n" in page and "Usage: atlas measure run [OPTIONS]" in page
    assert all(f"## atlas {name}\n" in page for name in cli.commands)


def layout_rows(text: str) -> dict[str, str]:
    """The layout table's rows: folder (e.g. 'atlas/hub/local/') -> the row's text."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`atlas/"):
            rows.setdefault(cells[1].strip("`"), "")
            rows[cells[1].strip("`")] += " " + cells[2]
    return rows


def unnamed_modules(root: Path, text: str) -> list[str]:
    """Modules under root/atlas that the row of their folder (the longest listed prefix) does not
    name by file name (`name.py`); a package's __init__ counts only where it holds code."""
    rows = layout_rows(text)
    missing = []
    for path in sorted((root / "atlas").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if path.name == "__init__.py" and len(path.read_text(encoding="utf-8").splitlines()) <= 5:
            continue
        folder = max((f for f in rows if rel.startswith(f)), key=len, default=None)
        if folder is None or f"`{path.name}`" not in rows[folder] and f"{path.name}" not in rows[folder]:
            missing.append(rel)
    return missing


def test_every_module_is_named_on_the_layout_page() -> None:
    assert unnamed_modules(REPO, LAYOUT) == []


def test_the_layout_check_catches_an_unnamed_module(tmp_path: Path) -> None:
    (tmp_path / "atlas" / "decode").mkdir(parents=True)
    (tmp_path / "atlas" / "decode" / "model.py").write_text("x = 1\n")
    (tmp_path / "atlas" / "decode" / "newthing.py").write_text("x = 1\n")
    page = "| decode | `atlas/decode/` | `model.py` (the fused model) |\n"
    assert unnamed_modules(tmp_path, page) == ["atlas/decode/newthing.py"]


def test_the_readme_is_a_front_door() -> None:
    assert len(README.encode("utf-8")) <= 10 * 1024
    assert "make demo" in README and "make test" in README


def test_every_readme_link_and_image_exists() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert targets and "docs/images/module-8.png" in targets
    assert [t for t in targets if not t.startswith("http") and not (REPO / t).exists()] == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert pages - set(re.findall(r"\]\((docs/[^)#]+)", README)) == set()


def test_the_quoted_demo_ending_is_what_make_demo_prints() -> None:
    quoted = re.search(r"It ends with:\n\n```\n(.*?)\n```", README, flags=re.S).group(1)
    printed = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    echo = next(line for line in printed.splitlines() if "Site built in" in line)
    assert quoted == re.sub(r"^echo ['\"]?|['\"]?$", "", echo.strip()).replace(".venv/bin/atlas", ".venv/bin/atlas")
