"""Writes docs/cli.md, the command-line reference, from the commands' own --help (as datasette's
cog-generated cli-reference does); tests/test_docs.py fails when the committed page drifts.

    .venv/bin/python docs/cli_reference.py > docs/cli.md     (or: make cli-docs)
"""

from __future__ import annotations

import click

from atlas.cli import cli

WIDTH = 100  # fixed, so the page does not depend on the terminal that wrote it


def _commands(group: click.Group, path: list[str]) -> list[tuple[list[str], click.Command]]:
    found = []
    ctx = click.Context(group, info_name=" ".join(path))
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        found.append(([*path, name], command))
        if isinstance(command, click.Group):
            found += _commands(command, [*path, name])
    return found


def _help(path: list[str], command: click.Command) -> str:
    # the Usage line names the whole path ("atlas measure run") through the context's info_name
    ctx = click.Context(command, info_name=" ".join(path), terminal_width=WIDTH, max_content_width=WIDTH)
    return command.get_help(ctx)


def render() -> str:
    parts = ["# Command-line reference\n",
             "Generated from each command's `--help` by `docs/cli_reference.py` (`make cli-docs`); "
             "`tests/test_docs.py` fails when this page and the commands differ.\n"]
    for path, command in [(["atlas"], cli), *_commands(cli, ["atlas"])]:
        parts.append(f"## {' '.join(path)}\n\n```\n{_help(path, command)}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
