"""Issue 40 §3: the dataset card an `atlas export` writes is rendered as Markdown (the Hub renders
cards so, raw HTML allowed), and nothing from a hostile record, record or conformance file name or
snapshot source may become live HTML there: no element, no event handler, no javascript: link. The
hostile texts are still there, as text. Everything goes through the public commands: `atlas crawl`
of a mirror under a hostile folder name, `atlas measure import`, `atlas export --evidence`."""

from __future__ import annotations

import html
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import markdown
import pytest
from click.testing import CliRunner
from hub_fixtures import copy_mirror
from site_helpers import REPO

from atlas.export import formats as exportformat
from atlas.cli import cli

# a code span closed early, an event handler, raw HTML, a Markdown link to javascript:, a table pipe
ATTACK = "`<img src=x onerror=alert(1)>` <b>raw</b> [x](javascript:alert(2)) | *em* <script>alert(3)</script>"
HARDWARE = f"CPU: AMD EPYC (2 cores) {ATTACK}"
# a file name may hold all of it but '/'
FILE_ATTACK = ATTACK.replace("/", "")
RECORD_NAME = f"rec {FILE_ATTACK}.json"
CONFORMANCE_NAME = f"conf {FILE_ATTACK}.json"
MIRROR_NAME = f"mirror {FILE_ATTACK}"


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-card")
    # the bundled mirror, copied under a hostile folder name (the snapshot's source names it)
    mirror = copy_mirror(root / MIRROR_NAME)
    shutil.copy(REPO / "data" / "hub-mirror" / "watchlist.toml", mirror)
    db = root / "atlas.duckdb"
    _cli("crawl", "--db", str(db), "--mirror", str(mirror), "--no-progress")
    evidence = root / "evidence"
    (evidence / "measurements").mkdir(parents=True)
    (evidence / "conformance").mkdir()
    for name in ("servable.toml", "reported.toml"):
        shutil.copy(REPO / "evidence" / name, evidence / name)
    source = sorted((REPO / "evidence" / "measurements").glob("*.json"))[0]
    data = json.loads(source.read_text(encoding="utf-8"))
    data["hardware"]["text"] = HARDWARE
    (evidence / "measurements" / RECORD_NAME).write_text(json.dumps(data, indent=1), encoding="utf-8")
    _cli("measure", "import", "--db", str(db), "--dir", str(evidence / "measurements"))
    shutil.copy(sorted((REPO / "evidence" / "conformance").glob("*.json"))[0], evidence / "conformance" / CONFORMANCE_NAME)
    out = root / "export"
    _cli("export", "--db", str(db), "--out", str(out), "--evidence", str(evidence))
    return out


@pytest.fixture(scope="module")
def card(exported: Path) -> str:
    return (exported / exportformat.CARD).read_text(encoding="utf-8")


class _Elements(HTMLParser):
    """Every element and attribute the rendered card holds, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _renderers() -> dict[str, object]:
    found: dict[str, object] = {"python-markdown": lambda text: markdown.markdown(text, extensions=["tables"])}
    try:  # markdown-it-py (CommonMark, raw HTML on, as the Hub's renderer): when installed
        from markdown_it import MarkdownIt
    except ImportError:
        return found
    found["markdown-it"] = MarkdownIt("commonmark", {"html": True}).enable("table").render
    return found


def _body(card: str) -> str:
    return card.split("\n---\n", 1)[1]  # past the YAML front matter


@pytest.mark.parametrize("renderer", sorted(_renderers()))
def test_no_hostile_string_is_live_html_in_the_rendered_card(card: str, renderer: str) -> None:
    rendered = _renderers()[renderer](_body(card))
    elements = _Elements()
    elements.feed(rendered)
    tags = {tag for tag, _ in elements.tags}
    assert not tags & {"img", "script", "b", "em", "a", "iframe", "svg"}, (renderer, tags)
    for tag, attrs in elements.tags:
        for name, value in attrs:
            assert not name.startswith("on") and "javascript" not in (value or "").lower(), (renderer, tag, name)
    # and every hostile text reads as itself
    shown = " ".join("".join(elements.text).split())
    for planted in (HARDWARE, RECORD_NAME, CONFORMANCE_NAME, f"mirror:{MIRROR_NAME}"):
        assert " ".join(planted.split()) in shown, (renderer, planted)


def test_the_hostile_texts_sit_in_code_elements_whole(card: str) -> None:
    """Each planted text is one <code> element of the Markdown source, its characters references."""
    for planted in (HARDWARE, RECORD_NAME, CONFORMANCE_NAME):
        escaped = html.escape(planted)
        assert escaped not in card and "<img" not in card and "](javascript" not in card
        assert any(html.unescape(c.split("</code>")[0]) == planted for c in card.split("<code>")[1:]), planted


def _strict(text: str) -> object:
    def refuse(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("name", ["changelog.json", exportformat.MANIFEST])
def test_the_json_files_hold_the_hostile_names_exactly_and_no_raw_markup(exported: Path, name: str) -> None:
    """Strict JSON (no NaN) holding each hostile file name as one whole string, with '<', '>' and '&'
    as \\u escapes: the same data, inert wherever a reader pastes the text."""
    raw = (exported / name).read_text(encoding="utf-8")
    assert not {"<", ">", "&"} & set(raw)
    data = json.dumps(_strict(raw))
    for planted in (RECORD_NAME, CONFORMANCE_NAME) if name == "changelog.json" else (RECORD_NAME,):
        assert json.dumps(planted) in data, planted
