"""Every command is documented: it has help text, and the manual (README.md and docs/, beside the
generated reference) names it (sqlite-utils' habit)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from atlas.cli import cli

from site_helpers import REPO

MANUAL = "\n".join(p.read_text(encoding="utf-8") for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
                   if p.name != "cli.md")


def _commands(group: click.Group, prefix: str = "atlas") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        found.append((path, command))
        if isinstance(command, click.Group):
            found.extend(_commands(command, path))
    return found


@pytest.mark.parametrize("path,command", _commands(cli), ids=lambda v: v if isinstance(v, str) else "")
def test_command_has_help_and_is_in_the_manual(path: str, command: click.Command) -> None:
    assert (command.help or "").strip(), f"{path} has no help text"
    assert path in MANUAL, f"neither README.md nor docs/ mention `{path}`"
    result = CliRunner().invoke(cli, [*path.split()[1:], "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output


def test_store_error_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["measure", "import", "--db", str(tmp_path / "x.duckdb"), "--dir", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "Error: no measurement folder" in result.output and "Traceback" not in result.output
