"""The README and the manual (docs/) tell a newcomer the truth: no verdict they state contradicts the
latest conformance records, every `atlas` command and `make` target they name exists, and the query
example runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from atlas.cli import cli
from atlas.conformance import record as conformance
from tests.site_helpers import REPO, crawl_mirror

PAGES = {p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8")
         for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))] if p.name != "cli.md"}  # cli.md: generated from the commands
MANUAL = "\n".join(PAGES.values())
# how the README names each layout the conformance records check
LAYOUT_NAMES = {"mimo": "MiMo", "deepseek_v3": "DeepSeek-V3", "qwen3_next": "Qwen3-Next"}
VERDICT_WORDS = re.compile(r"\b(lossless|fails|inconclusive)\b")


def code_spans(text: str) -> list[str]:
    """Fenced blocks and inline `code`: where the README names commands."""
    # a shell comment in a block is prose ("the atlas as data"), not a command
    fenced = [re.sub(r"(^|\s)#.*$", "", block, flags=re.M)
              for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)]
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return fenced + re.findall(r"`([^`\n]+)`", prose)


def sentences(text: str) -> list[str]:
    """Prose split into sentences, headings and code left out (a heading asks, it states nothing)."""
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith("#"))
    return [s for s in re.split(r"(?<=[.;:])\s+|\n\s*\n|\n- ", prose) if s.strip()]


def latest_verdicts(folder: Path) -> dict[str, set[str]]:
    """Per layout, the results the latest record of each build gives it (any temperature)."""
    out: dict[str, set[str]] = {}
    for v in conformance.verdicts(conformance.latest_records(folder)):
        out.setdefault(v.layout, set()).add(v.result)
    return out


def contradicted(text: str, latest: dict[str, set[str]]) -> list[str]:
    """Sentences that name a layout beside a verdict no latest record gives that layout."""
    wrong = []
    for sentence in sentences(text):
        words = set(VERDICT_WORDS.findall(sentence))
        for layout, name in LAYOUT_NAMES.items():
            if name in sentence and words - latest.get(layout, set()):
                wrong.append(f"{name}: {' '.join(sentence.split())}")
    return wrong


def missing_commands(text: str) -> list[str]:
    """`atlas X [Y]` naming no command or subcommand of the CLI."""
    missing = []
    ctx = click.Context(cli)
    for span in code_spans(text):
        for first, second in re.findall(r"(?:^|[\s/(])atlas ([a-z][\w-]*)(?: ([a-z][\w-]*))?", span, flags=re.M):
            command = cli.get_command(ctx, first)
            if command is None:
                missing.append(f"atlas {first}")
            elif isinstance(command, click.Group) and command.get_command(ctx, second) is None:
                missing.append(f"atlas {first} {second}")
    return missing


def missing_targets(text: str, makefile: str) -> list[str]:
    targets = set()
    for line in re.findall(r"^([\w./ -]+):(?!=)", makefile, flags=re.M):
        targets.update(line.split())
    return [f"make {t}" for span in code_spans(text) for t in re.findall(r"\bmake ([a-z][\w-]*)", span)
            if t not in targets]


def test_no_stated_verdict_contradicts_the_latest_records() -> None:
    latest = latest_verdicts(REPO / conformance.DEFAULT_DIR)
    assert latest, "no conformance records to check the README against"
    assert contradicted(MANUAL, latest) == []


def test_the_verdict_check_catches_a_stale_claim() -> None:
    # the claim issue 27 found: the latest release record says lossless at T = 0 for DeepSeek-V3
    stale = "At T = 0 MTP is lossless on MiMo; on DeepSeek-V3 the verdict is *inconclusive*, by the rule."
    latest = latest_verdicts(REPO / conformance.DEFAULT_DIR)
    # (inconclusive stands in the latest records now only for sampled drafts, whose oracle never
    # rejected one: the check is run on the greedy rows the claim is about)
    greedy = {layout: {v.result for v in conformance.verdicts(conformance.latest_records(REPO / conformance.DEFAULT_DIR))
                       if v.layout == layout and v.draft_sampling != "probabilistic"} for layout in latest}
    assert "inconclusive" not in greedy["deepseek_v3"]
    assert contradicted(stale, greedy) != []


def test_every_named_command_exists() -> None:
    assert missing_commands(MANUAL) == []
    assert missing_commands("run `atlas conformance replay` or `atlas frobnicate`") == [
        "atlas conformance replay", "atlas frobnicate"]


def test_every_named_make_target_exists() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert missing_targets(MANUAL, makefile) == []
    assert missing_targets("`make real-model` and `make deploy`", makefile) == ["make deploy"]


@pytest.fixture(scope="module")
def mirror_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("readme") / "atlas.duckdb"
    crawl_mirror(db)
    return db


def test_the_query_example_runs(mirror_store: Path) -> None:
    examples = [line for block in re.findall(r"^```bash\n(.*?)^```", MANUAL, flags=re.S | re.M)
                for line in block.splitlines() if line.startswith("atlas query ")]
    assert len(examples) == 1, examples
    args = shlex.split(examples[0])[1:]
    result = CliRunner().invoke(cli, [*args, "--db", str(mirror_store)])
    assert result.exit_code == 0, result.output
    header, rule, *rows, count = result.output.splitlines()
    assert header.split() == ["repo_id", "declared_num_mtp_layers", "declared_key", "shipped_mtp_layers"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert rows and count == f"({len(rows)} rows)"
