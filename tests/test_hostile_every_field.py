"""Issue 25 F2, as a class: every string field of every record kind the site renders (measurement,
conformance, servable, reported) and the record files' names, made hostile, must reach the pages as
text. The records are the committed ones with each string leaf replaced in turn by a hostile text,
kept wherever the record's own validation accepts it, so a field added later is swept as well.
"""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote

import pytest
from site_helpers import REPO, assert_inert, crawl_mirror, import_folder, parse_html, site_copy

from atlas import AtlasError
from atlas.export import tables as export
from atlas.conformance import record as conformance
from atlas.records import record as records
from atlas.site.pages import write_evidence as evidence
from atlas.site.parts import models_json as modelpages
from atlas.site.parts import mdsafe
from atlas.site.pages import render
from atlas.evidence import reported as reported_figures
from atlas.evidence import servable as servable_matrix

# An event handler, a link out of a Markdown link's parentheses (as a file name can hold), a
# backtick that ends a code span, a javascript: link in Markdown.
ATTACK = "`<img src=x onerror=alert(1)> a.json) <img src=y onerror=alert(2)> [x](javascript:alert(3))"
FILE_NAME = "a.json) <img src=z onerror=alert(4)>.json"


def _leaves(data: Any, path: tuple = ()) -> list[tuple]:
    """The path of every string in nested dicts and lists."""
    if isinstance(data, str):
        return [path]
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    return [p for k, v in items for p in _leaves(v, path + (k,))]


def _set(data: Any, path: tuple, value: str) -> str:
    *head, last = path
    for k in head:
        data = data[k]
    old, data[last] = data[last], value
    return old


def make_hostile(data: Any, valid: Callable[[Any], bool], tag: str, keep: tuple[str, ...] = ()) -> int:
    """Each string leaf of `data` made hostile in place, one at a time, kept where `valid` accepts
    the whole; returns how many were kept. The original value leads the hostile one, so what the
    pages pick by a word in it (a chat workload) is still picked; leaves named in `keep` stay."""
    kept = 0
    for n, path in enumerate(_leaves(data)):
        if path[-1] in keep:
            continue
        old = _set(data, path, "")
        _set(data, path, f"{old} {tag}{n} {ATTACK}")
        if valid(data):
            kept += 1
        else:
            _set(data, path, old)
    return kept


def _accepts(check: Callable[[], object]) -> bool:
    try:
        check()
    except (AtlasError, ValueError):
        return False
    return True


def _toml_value(v: Any) -> str:
    """TOML for the values tomllib reads (inline tables and arrays; JSON's string escapes are TOML's)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def _toml(data: dict) -> str:
    return "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in data.items())


def _hostile_toml(source: Path, target: Path, load: Callable[[Path], object], tag: str,
                  keep: tuple[str, ...] = ()) -> int:
    data = tomllib.loads(source.read_text(encoding="utf-8"))

    def valid(d: dict) -> bool:
        target.write_text(_toml(d), encoding="utf-8")
        return _accepts(lambda: load(target))

    kept = make_hostile(data, valid, tag, keep)
    target.write_text(_toml(data), encoding="utf-8")
    return kept


@pytest.fixture(scope="module")
def every_field_site(tmp_path_factory: pytest.TempPathFactory) -> render.Layout:
    """The real pages over the committed records, support matrix and reported figures with every
    string they accept hostile, each record file under a hostile name, exported and built."""
    root = tmp_path_factory.mktemp("every-field")
    layout = site_copy(root)
    ev = layout.evidence
    kept = {
        "servable": _hostile_toml(REPO / "evidence" / "servable.toml", ev / "servable.toml", servable_matrix.load, "srv"),
        # a figure's id stays: module 8 finds its anchor figure by id
        "reported": _hostile_toml(REPO / "evidence" / "reported.toml", ev / "reported.toml", reported_figures.load,
                                  "rep", keep=("id",)),
    }
    for kind, check in (("measurements", lambda b: records.parse_record(b, Path("x.json"))),
                        ("conformance", conformance.ConformanceRecord.model_validate_json)):
        (ev / kind).mkdir()
        kept[kind] = 0
        for i, source in enumerate(sorted((REPO / "evidence" / kind).glob("*.json"))):
            data = json.loads(source.read_text(encoding="utf-8"))
            kept[kind] += make_hostile(data, lambda d: _accepts(lambda: check(json.dumps(d).encode())), f"{kind[:4]}{i}-")
            name = source.name if i else FILE_NAME  # one file of each kind under a hostile name
            (ev / kind / name).write_text(json.dumps(data, indent=1), encoding="utf-8")
    assert all(kept.values()), kept
    db = root / "atlas.duckdb"
    crawl_mirror(db)
    assert import_folder(db, ev / "measurements")
    layout = layout.model_copy(update={"data_dir": root / "data"})
    export.export(db, layout.data, ev, root)
    evidence.generate(db, ev / "module-08.evidence.md", ev / "servable.toml")
    modelpages.generate(db, ev / modelpages.FILE_NAME, ev / "servable.toml", root)
    render.build(layout)
    return layout


def test_no_hostile_string_is_live_in_any_generated_markdown(every_field_site: render.Layout) -> None:
    """In the Markdown mkdocs reads: no tag and no link the records made, and the backtick never ends
    a code span early (it would leave the rest of the string as live Markdown)."""
    pages = sorted(every_field_site.docs.rglob("*.md"))
    assert {p.name for p in pages} >= {"module-08.md", "index.md", "changelog.md"}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for live in ("<img", "](javascript:", ".json) <"):
            assert live not in text, (page.name, live, text[max(0, text.find(live) - 200):text.find(live) + 100])


def test_no_hostile_string_is_an_element_or_a_link_on_any_built_page(every_field_site: render.Layout) -> None:
    built = every_field_site.build
    reference = (built / "index.html").read_text(encoding="utf-8")
    pages = {p.relative_to(built).as_posix(): p for p in built.rglob("index.html")}
    for name in ("modules/module-08/index.html", "data/index.html", "changelog/index.html"):
        assert name in pages, sorted(pages)
    for name, page in pages.items():
        assert_inert(page.read_text(encoding="utf-8"), reference, name)
    # and the hostile texts are there to be read, as text
    text = " ".join(parse_html(pages["changelog/index.html"].read_text(encoding="utf-8")).text.split())
    assert FILE_NAME in text


def test_a_link_from_record_parts_ends_where_it_should_and_runs_no_script() -> None:
    """The two link helpers every record-made link goes through: a URL of another scheme is no
    link, and a file name with a link's own syntax in it is one link, to exactly that file."""
    assert mdsafe.link("fix", "javascript:alert(1)") == "fix"
    assert mdsafe.link("fix", " JaVaScript:alert(1)") == "fix"  # no scheme a browser would run, no link
    assert mdsafe.link("issue", "https://127.0.0.1/a b)<i>") == "[issue](https://127.0.0.1/a%20b%29%3Ci%3E)"
    name = "a.json) <img src=x onerror=alert(1)> ?#%.json"
    got = mdsafe.file_link(name, f"records/{name}")
    target = got[got.index("](") + 2:-1]
    assert unquote(target) == f"records/{name}" and not set(target) & set(" ()<>?#")
