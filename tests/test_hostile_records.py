"""Hostile measurement records and site faults, beside tests/test_hostile_corpus.py (which attacks the
crawl). Records are how a GPU box hands results back and they are committed, so one record reaches
the public site: every string in it must be shown as text wherever it is rendered, and no record
may break the import, the evidence or the site for the records around it.

Classes, each with its own test that sweeps the class rather than one reviewer's case:
1. injection: every string field of a record hostile, the site built, the built pages' DOM (and
   Chromium's, after the pages' scripts ran) checked for links, scripts and handlers;
2. one record breaks import or evidence: every number of a good record pushed to an extreme, every
   string and list past its bound, duplicated cells, each rejected by name while the good records
   around it are stored; records from outside the checkout never publish their absolute path;
3. anchored validators: none accepts a trailing newline (and no `$`-anchored regex is left);
4. faults: a corrupt data block in the store, a read-only file system: one line, exit 1;
5. scale: the finder's page holds its first screen only, its rows come from part files, and in
   Chromium it still filters, sorts and takes ?find= over every model (figures: benchmarks/site.py).
"""

from __future__ import annotations

import ast
import errno
import io
import json
import math
import os
import re
from datetime import datetime
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, run_chromium
from chromium_cdp import Chromium
from click.testing import CliRunner
from site_helpers import REPO, assert_inert, hostile_store, parse_html, site_copy

from atlas import AtlasError
from atlas.store import db as store
from atlas.cli import cli
from atlas.records import gating, fields as recordfields, record as records, runcontext
from atlas.site.pages import write_evidence as evidence
from atlas.site.parts import models_json as modelpages
from atlas.site.pages import modelfinder, render

# ---- 1. injection -------------------------------------------------------------------------------


def hostile(field: str) -> str:
    """One hostile text per field (named, so each can be found on the page): a javascript: link in
    Markdown and in HTML, a script, an event handler, an attribute list, Jinja, a table pipe, a
    code span, emphasis, a line break and an entity."""
    return (f"{field} [x](javascript:alert(1)) <script>alert(2)</script> <img src=x onerror=alert(3)> "
            f"{{{{ 7*7 }}}} | pipe | `tick` *em*\nnext {{: onclick=alert(4)}} "
            f"<a href='javascript:alert(5)'>a</a> &amp; -->")


def shown(text: str) -> str:
    """What a reader sees: line breaks as spaces, runs of white space as one."""
    return " ".join(text.split())


WORKLOADS = [hostile("workload-a"), hostile("workload-b")]
PEER = "vllm " + hostile("engine")  # a serving engine's name: the model page names it as one


def hostile_record() -> records.Record:
    """A schema-1 record (its gate texts are kept as recorded, so they can be hostile too) whose every
    free string is hostile: our loop's cells (the charts draw them) and a peer engine's."""
    costs = records.PassCosts(plain=0.01, verify={1: 0.012, 2: 0.013}, draft=0.002)
    cells = []
    for engine in ("atlas", PEER):
        for workload in WORKLOADS:
            for t in (0.0, 1.0):
                for k in (1, 2):
                    repeats = [records.Repeat(
                        tokens=100, seconds=1.0 + 0.01 * i, baseline_seconds=1.3 + 0.02 * i,
                        drafted_per_position=[40] * k, accepted_per_position=[30, 20][:k], verify_passes=40,
                        identical_to_baseline=True if t == 0 else None) for i in range(3)]
                    derived = gating.derive(repeats, t, k, costs if engine == "atlas" else None)
                    cells.append(records.Cell(
                        engine=engine, engine_version=hostile("version"), baseline=hostile("baseline"),
                        workload=workload, temperature=t, draft_tokens=k, repeats=repeats, derived=derived,
                        gate_enabled=False, gate_reason=hostile("gate")))
    return records.Record(
        schema_version=1, run_date=datetime(2026, 11, 28, 12, 0), model_id=hostile("model"), revision="c" * 40,
        hardware=runcontext.Hardware(text=hostile("hardware"), cpu=hostile("cpu"), cpu_cores=2, memory_gib=8.0,
                                  gpu=hostile("gpu"), torch_threads=1),
        software=runcontext.Software(python=hostile("py"), torch=hostile("torch"), transformers=hostile("tf"),
                                  atlas=hostile("atlas"), atlas_commit=hostile("commit"), blas=hostile("blas"),
                                  os=hostile("os")),
        command=hostile("command"), seed=0, prompt_set=hostile("prompts"), prompt_set_digest="0" * 64,
        settings=runcontext.Settings(device=hostile("device"), dtype=hostile("dtype"), workloads=WORKLOADS,
                                  temperatures=[0.0, 1.0], draft_tokens=[1, 2], max_new_tokens=100, repeats=3,
                                  prompts_per_workload=1),
        pass_costs=costs, cells=cells)


SHOWN_ON_RUN_PAGE = ["model", "hardware", "device", "dtype", "command", "baseline", "version", "engine"]


@pytest.fixture(scope="module")
def hostile_record_site(tmp_path_factory: pytest.TempPathFactory) -> render.Layout:
    """The real course pages over a store holding the hostile record, through the real import,
    `atlas evidence`'s two writers and the real build."""
    root = tmp_path_factory.mktemp("hostile-records-site")
    layout = site_copy(root)
    db = root / "atlas.duckdb"
    hostile_store(db)
    records.write_record(hostile_record(), layout.evidence / "measurements")
    with store.connect(db) as con:
        assert records.import_records(con, layout.evidence / "measurements")[::2] == (1, [])
    evidence.generate(db, layout.evidence / "module-08.evidence.md", layout.evidence / "servable.toml")
    modelpages.generate(db, layout.evidence / modelpages.FILE_NAME, layout.evidence / "servable.toml", root)
    render.build(layout)
    return layout


def _pages(layout: render.Layout) -> dict[str, str]:
    """Every built page that can show a record string: module 8, the finder, the Runs page, each
    run's page ("run:<slug>"), the model pages."""
    built = layout.build
    pages = {"module-08": built / "modules" / "module-08" / "index.html",
             "finder": built / "models" / "index.html", "runs": built / "runs" / "index.html"}
    pages |= {f"run:{p.parent.name}": p for p in (built / "runs").glob("*/index.html")}
    pages |= {p.parent.name: p for p in (built / "models").glob("*/index.html")}
    return {name: p.read_text(encoding="utf-8") for name, p in pages.items()}


def test_every_record_string_is_inert_text_on_every_page(hostile_record_site: render.Layout) -> None:
    pages = _pages(hostile_record_site)
    reference = (hostile_record_site.build / "index.html").read_text(encoding="utf-8")
    model_pages = [n for n in pages if n not in ("module-08", "finder", "runs") and not n.startswith("run:")]
    assert model_pages, "the measured hostile model has its own page"
    for name, html in pages.items():
        assert_inert(html, reference, name)
    (run_page,) = [html for name, html in pages.items() if name.startswith("run:")]
    text = " ".join(parse_html(run_page).text.split())
    for field in SHOWN_ON_RUN_PAGE + ["workload-a", "workload-b"]:
        assert shown(hostile(field)) in text, field  # shown, character for character
    assert text.count("{{ 7*7 }}") >= len(SHOWN_ON_RUN_PAGE)  # Jinja in a record is never evaluated
    module = " ".join(parse_html(pages["module-08"]).text.split())
    for field in ("model", "hardware"):  # module 8's one row for the run (its device is the run page's: the hardware names it)
        assert shown(hostile(field)) in module, field
    # the model page shows the record's model id, hardware and workloads as text too
    page_text = " ".join(parse_html(pages[modelpages.slug(hostile("model"))]).text.split())
    for field in ("model", "hardware", "workload-a"):
        assert shown(hostile(field)) in page_text, field
    assert f"ran its MTP in a measured run: {shown(PEER)}" in page_text  # the servable level names it


_CHART = re.compile(r'<div class="atlas-chart">.*?</div>', re.S)


def test_chart_titles_and_legends_show_the_workload_as_text(hostile_record_site: render.Layout) -> None:
    """The reviewer's case, as a class: every chart drawn from the record (legend, SVG titles,
    tick labels, inside the collapsible box) holds no element the record made, and its text."""
    (html,) = [h for n, h in _pages(hostile_record_site).items() if n.startswith("run:")]
    charts = [c for c in _CHART.findall(html) if "workload-a" in c]
    assert len(charts) >= 3, "the record's charts are on its run's page"
    for chart in charts:
        part = parse_html(chart)
        tags = {t for t, _ in part.elements}
        assert tags <= {"div", "p", "span", "svg", "title", "line", "text", "rect", "circle", "polyline"}, tags
        assert shown(hostile("workload-a")) in " ".join(part.text.split())
    legend = re.findall(r'<p class="atlas-chart-legend">(.*?)</p>', "".join(charts), re.S)
    assert any("workload-a" in item for item in legend)


@pytest.mark.slow
def test_in_the_browser_no_record_string_became_a_link_or_a_script(hostile_record_site: render.Layout) -> None:
    """The same in Chromium's DOM, after the site's own scripts (sortable tables, widgets) ran."""
    if CHROMIUM is None:
        pytest.skip("no Chromium binary on PATH")
    dumped = {}
    for name, url in (("index", (hostile_record_site.build / "index.html").as_uri()),
                      ("module-08", (hostile_record_site.build / "modules" / "module-08" / "index.html").as_uri()),
                      # the finder's rows built by its script from the loaded parts
                      ("finder", (hostile_record_site.build / "models" / "index.html").as_uri() + "?find=alert(5)")):
        done = run_chromium("--virtual-time-budget=3000", "--dump-dom", url)
        assert done.returncode == 0, done.stderr[-2000:]
        dumped[name] = done.stdout
    for name in ("module-08", "finder"):
        assert_inert(dumped[name], dumped["index"], f"{name} in Chromium")
    assert shown(hostile("workload-a")) in " ".join(parse_html(dumped["module-08"]).text.split())
    finder = next(t for t in parse_html(dumped["finder"]).tables if t.header[:1] == ["model"])
    assert [r[0] for r in finder.rows] == [shown(hostile("model"))]


# ---- 2. one record breaks import or evidence -----------------------------------------------------


def good_record(model_id: str, engine: str = "atlas", speed: float = 1.3) -> records.Record:
    from test_records import make_record

    record = make_record(model_id=model_id, speed=speed)
    if engine != "atlas":  # an external engine's cells: no pass costs, so no ideal
        cells = []
        for c in record.cells:
            derived, g = gating.judge(c.repeats, c.temperature, c.draft_tokens, None)
            cells.append(c.model_copy(update=dict(engine=engine, derived=derived, gate_enabled=g.enabled,
                                                  gate_verdict=g.verdict, gate_reason=g.reason)))
        record = record.model_copy(update=dict(cells=cells, gates=[], pass_costs=None))
    return record


def _leaves(data: object, path: tuple = ()):
    """Every (path, value) of a JSON tree whose value is a number or a string."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _leaves(v, path + (i,))
    elif isinstance(data, (int, float, str)) and not isinstance(data, bool):
        yield path, data


def _set(data: dict, path: tuple, value: object) -> dict:
    data = json.loads(json.dumps(data))
    node = data
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return data


def _field(path: tuple) -> str:
    """The name an error must give: the innermost key of the path."""
    return next(str(p) for p in reversed(path) if isinstance(p, str))


GOOD = json.loads(records.canonical_bytes(good_record("hostile/model")))
NUMBERS = [(p, v) for p, v in _leaves(GOOD) if isinstance(v, (int, float)) and p != ("schema_version",)]
EXTREMES = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan, "1e308": 1e308, "-1e308": -1e308, "2^63": 2**63}


def import_around(folder: Path, bad: bytes | list[bytes], db: Path) -> tuple[int, int, list[str]]:
    """Two good records sorting before and after the bad file(s) (m-bad.json, or m-bad-N.json for
    several), imported together."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("a-before", "z-after"):
        (folder / f"{name}.json").write_bytes(records.canonical_bytes(good_record(f"good/{name}")))
    if isinstance(bad, bytes):
        (folder / "m-bad.json").write_bytes(bad)
    else:
        for i, data in enumerate(bad):
            (folder / f"m-bad-{i:04d}.json").write_bytes(data)
    with store.connect(db) as con:
        result = records.import_records(con, folder)
        stored = {r[0] for r in con.execute("SELECT DISTINCT model_id FROM measurement_cells").fetchall()}
    assert stored == {"good/a-before", "good/z-after"}, result
    return result


@pytest.mark.parametrize("extreme", list(EXTREMES), ids=list(EXTREMES))
def test_every_number_at_an_extreme_is_rejected_by_name_and_the_rest_imported(tmp_path: Path, extreme: str) -> None:
    """Every number of a good record, in turn, set to ±Infinity, NaN, ±1e308 or 2^63: the file is
    rejected, its error names the file and the field, and the good records around it are stored."""
    value = EXTREMES[extreme]
    bad = [json.dumps(_set(GOOD, path, value)).encode() for path, _ in NUMBERS]  # Infinity / NaN as Python writes them
    loaded, _, errors = import_around(tmp_path / "m", bad, tmp_path / "db.duckdb")
    assert loaded == 2 and len(errors) == len(NUMBERS), errors
    for i, ((path, _), error) in enumerate(zip(NUMBERS, sorted(errors))):
        assert f"m-bad-{i:04d}.json" in error and _field(path) in error, (path, error)


def test_every_string_and_list_past_its_bound_is_rejected_by_name(tmp_path: Path) -> None:
    strings = [(p, v) for p, v in _leaves(GOOD) if isinstance(v, str) and p[-1] not in ("run_date",)]
    bad = [json.dumps(_set(GOOD, path, "x" * (recordfields.MAX_TEXT_CHARS + 1))).encode() for path, _ in strings]
    loaded, _, errors = import_around(tmp_path / "s", bad, tmp_path / "s.duckdb")
    assert loaded == 2 and len(errors) == len(strings)
    for (path, _), error in zip(strings, sorted(errors)):
        assert _field(path) in error, (path, error)
        assert "x" * 100 not in error  # the value is named by its length, not echoed
    lists = {("cells",): GOOD["cells"][0], ("cells", 0, "repeats"): GOOD["cells"][0]["repeats"][0],
             ("settings", "workloads"): "w", ("cells", 0, "repeats", 0, "drafted_per_position"): 1}
    bad = [json.dumps(_set(GOOD, path, [item] * (recordfields.MAX_CELLS + 1))).encode() for path, item in lists.items()]
    loaded, _, errors = import_around(tmp_path / "l", bad, tmp_path / "l.duckdb")
    assert loaded == 2 and len(errors) == len(lists)
    for path, error in zip(lists, sorted(errors)):
        assert _field(path) in error, (path, error)


def _impossible(data: dict) -> bytes:
    return json.dumps(data).encode()


def _consistent(record: records.Record) -> bytes:
    """A record whose derived figures and gates follow from its raw counts (so only the bounds can
    refuse it), written without write_record's check."""
    cells = []
    for c in record.cells:
        costs = record.pass_costs if c.engine == "atlas" else None
        d, g = gating.judge(c.repeats, c.temperature, c.draft_tokens, costs, rule=record.rule)
        cells.append(c.model_copy(update=dict(derived=d, gate_enabled=g.enabled, gate_verdict=g.verdict, gate_reason=g.reason)))
    return records.canonical_bytes(record.model_copy(update=dict(cells=cells, gates=gating.decide(cells, record.rule))))


def _scaled(record: records.Record, factor: float) -> records.Record:
    """Every repeat's baseline seconds times `factor`: a speed-up `factor` times the recorded one."""
    cells = [c.model_copy(update=dict(repeats=[r.model_copy(update=dict(baseline_seconds=r.baseline_seconds * factor * (1 + j / 10)))
                                               for j, r in enumerate(c.repeats)]))
             for c in record.cells]
    return record.model_copy(update=dict(cells=cells))


def _wider(data: dict) -> dict:
    """Cell 0 (k = 1) with counts for three draft positions."""
    for name, counts in (("drafted_per_position", [20, 20, 20]), ("reached_per_position", [20, 15, 9]),
                         ("accepted_per_position", [15, 9, 5])):
        data = _set(data, ("cells", 0, "repeats", 0, name), counts)
    return data


IMPOSSIBLE = {
    # speed-ups whose paired bounds overflowed math.exp (an OverflowError traceback, 0 of 3 stored)
    "speedup-overflow": (lambda: _consistent(_scaled(good_record("x/y"), 1e6)), "speed-up = "),
    # a vLLM cell 10^8 times faster than plain decoding, its gate on by the paired rule
    "vllm-1e8": (lambda: _consistent(_scaled(good_record("x/y", engine="vllm"), 1e8)), "speed-up = "),
    "slower-1e-6": (lambda: _consistent(_scaled(good_record("x/y"), 1e-6)), "speed-up = "),
    # 20 million draft tokens: became 20 million chart ticks and ran `atlas evidence` out of memory
    "draft-tokens-20M": (lambda: _impossible(_set(GOOD, ("cells", 0, "draft_tokens"), 20_000_000)), "draft_tokens"),
    "drafted-20M": (lambda: _impossible(_set(GOOD, ("cells", 0, "repeats", 0, "drafted_per_position"), [20_000_000])),
                    "first drafts but only"),
    "width-not-k": (lambda: _impossible(_wider(GOOD)), "draft_tokens = 1"),
    "tokens-over-settings": (lambda: _consistent(good_record("x/y").model_copy(update=dict(
        settings=good_record("x/y").settings.model_copy(update=dict(max_new_tokens=10))))), "max_new_tokens"),
    "temperature-20": (lambda: _impossible(_set(GOOD, ("cells", 0, "temperature"), 20.0)), "temperature"),
    "seed-2^40": (lambda: _impossible(_set(GOOD, ("seed",), 2**40)), "seed"),
    "duplicated-cell": (lambda: _impossible({**GOOD, "cells": GOOD["cells"] + GOOD["cells"][:1]}), "duplicated cell"),
    "duplicated-gate": (lambda: _impossible({**GOOD, "gates": GOOD["gates"] + GOOD["gates"][:1]}), "duplicated gate"),
    "revision-newline": (lambda: _impossible(_set(GOOD, ("revision",), "a" * 40 + "\n")), "revision"),
    # a number no JSON parser should hold: the parser names its place
    "5000-digit-number": (lambda: json.dumps(GOOD).replace('"seed": 0', '"seed": ' + "9" * 5000).encode(),
                          "number out of range at line 1"),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE), ids=list(IMPOSSIBLE))
def test_impossible_records_are_rejected_by_name_and_the_good_ones_imported(tmp_path: Path, case: str) -> None:
    make, name = IMPOSSIBLE[case]
    loaded, present, errors = import_around(tmp_path / "m", make(), tmp_path / "db.duckdb")
    assert (loaded, present, len(errors)) == (2, 0, 1), errors
    assert "m-bad.json" in errors[0] and name in errors[0], errors[0]
    assert "\n" not in errors[0] and len(errors[0]) < 600


def test_import_command_names_the_bad_file_stores_the_rest_and_exits_1(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    import_around(folder, IMPOSSIBLE["speedup-overflow"][0](), tmp_path / "first.duckdb")
    db = tmp_path / "atlas.duckdb"
    result = CliRunner().invoke(cli, ["measure", "import", "--db", str(db), "--dir", str(folder)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "2 record(s) loaded, 0 already present, 1 rejected" in result.output
    assert "m-bad.json" in result.output and "speed-up = " in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_bounded_record_costs_the_import_a_bounded_size(tmp_path: Path) -> None:
    """What a record may hold is bounded before anything is copied per cell: the file, each string
    and each list (a 20 MB command was copied into every cell's row: 3.66 GB)."""
    assert records.MAX_RECORD_BYTES <= 8 * 1024 * 1024
    big = json.dumps(_set(GOOD, ("command",), "x" * (20 * 1024 * 1024))).encode()
    (tmp_path / "big.json").write_bytes(big)
    with pytest.raises(AtlasError, match="over the .*-byte limit"):
        records.read_record(tmp_path / "big.json")
    with pytest.raises(AtlasError, match=r"command \(20,971,520 characters\): String should have at most 4096"):
        records.parse_record(big, Path("big.json"))


def test_models_json_and_the_evidence_never_hold_non_finite_numbers(tmp_path: Path) -> None:
    """Strict JSON parsers reject Infinity and NaN: the writers refuse them by name (no record can
    carry one in any more, see above), so a bad value can never reach the finder."""
    empty = modelpages.Models(snapshot_id=None, snapshot_date=None, mirror_date=None, servable_date="2026-11-01",
                              models=[], prefill=None)
    assert json.loads(modelpages.dumps(empty))["models"] == []
    measured = modelpages.Measured(run_date="2026-11-28", revision="c" * 40, hardware="h", engine="atlas",
                                   workload="w", temperature=math.inf, draft_tokens=1, acceptance_rate=None,
                                   mean_accepted_length=None, speedup=math.nan, speedup_slowest_repeat=None, speedup_fastest_repeat=None,
                                   record_id="0" * 64)
    model = modelpages.Model(repo_id="a/b", slug="a--b", org="a", family=None, architectures=None, is_derivative=False,
                             base_models=[], derivatives=[], has_page=True, current=None, history=[], servable=[],
                             measured=[measured])
    with pytest.raises(AtlasError, match="JSON cannot hold"):
        modelpages.write(empty.model_copy(update=dict(models=[model])), tmp_path / "models.json")
    assert not (tmp_path / "models.json").exists()


def test_a_record_from_outside_the_checkout_never_publishes_its_path(tmp_path: Path) -> None:
    outside = tmp_path / "home" / "someone" / "private-folder"
    records.write_record(good_record("outside/model"), outside)
    db = tmp_path / "atlas.duckdb"
    hostile_store(db)
    with store.connect(db) as con:
        assert records.import_records(con, outside)[::2] == (1, [])
    out = tmp_path / "ev" / "module-08.evidence.md"
    evidence.generate(db, out, REPO / "evidence" / "servable.toml")
    text = out.read_text(encoding="utf-8")
    name = next(outside.glob("*.json")).name
    assert str(tmp_path) not in text and "private-folder" not in text and "someone" not in text
    assert name in text and "imported from outside the checkout" in text


# ---- 3. anchored validators ------------------------------------------------------------------------


def test_no_anchored_validator_accepts_a_trailing_newline(tmp_path: Path) -> None:
    """Each validator of atlas/measure and atlas/site that checks a whole value, given the valid
    value and the same with a final newline (Python's `$` matches before one)."""
    from atlas.checkpoints.oracles import BRANCH_OUT
    from atlas.evidence import reported

    good = json.loads(records.canonical_bytes(good_record("x/y")))
    for field, value in (("revision", "a" * 40), ("revision", "sha256:" + "b" * 64), ("prompt_set_digest", "0" * 64)):
        records.Record.model_validate({**good, field: value})
        with pytest.raises(ValueError, match=field):
            records.Record.model_validate({**good, field: value + "\n"})
    figure = reported.load(REPO / "evidence" / "reported.toml").figure[0].model_dump()
    for field, value in (("id", figure["id"]), ("url", figure["url"])):
        reported.Figure.model_validate({**figure, field: value})
        with pytest.raises(ValueError, match=field):
            reported.Figure.model_validate({**figure, field: value + "\n"})
    assert BRANCH_OUT.search("model.layers.0.self_attn.o_proj.weight")
    assert not BRANCH_OUT.search("model.layers.0.self_attn.o_proj.weight\n")
    assert render._MODULE_NAME.fullmatch("module-08.md") and not render._MODULE_NAME.fullmatch("module-08.md\n")


def _dollar_anchored(source: str) -> list[str]:
    """Regex literals passed to re.* that end in `$` without re.M: each would accept a final newline."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                and node.func.attr in ("compile", "match", "search", "fullmatch") and node.args):
            continue
        pattern = node.args[0]
        flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
        flags += " ".join(ast.unparse(k.value) for k in node.keywords if k.arg == "flags")
        if isinstance(pattern, ast.Constant) and isinstance(pattern.value, str) \
                and pattern.value.endswith("$") and not pattern.value.endswith("\\$") and "M" not in flags:
            found.append(f"line {node.lineno}: {pattern.value!r}")
    return found


def test_no_dollar_anchored_regex_is_left_in_measure_or_site() -> None:
    assert _dollar_anchored('import re\nX = re.compile(r"^a$")\n') == ["line 2: '^a$'"]  # the finder finds
    left = {}
    for path in sorted((REPO / "atlas" / "measure").rglob("*.py")) + sorted((REPO / "atlas" / "site").rglob("*.py")):
        found = _dollar_anchored(path.read_text(encoding="utf-8"))
        if found:
            left[path.relative_to(REPO).as_posix()] = found
    assert not left, left


# ---- 4. faults ---------------------------------------------------------------------------------------


def _one_line_error(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, (OSError, ArithmeticError))
    [line] = result.output.strip().splitlines()
    return line


def test_a_corrupt_data_block_is_one_line_from_atlas_evidence(tmp_path: Path) -> None:
    """A store that opens (its header is intact) with damaged blocks behind it: every block of the
    file in turn overwritten, `atlas evidence` either reads it or says so in one line."""
    good = tmp_path / "good.duckdb"
    hostile_store(good)
    records.write_record(good_record("x/y"), tmp_path / "m")
    with store.connect(good) as con:
        records.import_records(con, tmp_path / "m")
        con.execute("CHECKPOINT")
    data = good.read_bytes()
    block = 256 * 1024  # DuckDB's block size; the first blocks are the file and database headers
    errors = 0
    for offset in range(3 * 4096, len(data), block // 4):
        db = tmp_path / "corrupt.duckdb"
        db.write_bytes(data[:offset] + b"\xa5" * 4096 + data[offset + 4096:])
        result = CliRunner().invoke(cli, ["evidence", "--db", str(db), "--out", str(tmp_path / "e" / "ev.md")])
        assert "Traceback" not in result.output and not isinstance(result.exception, Exception) \
            or isinstance(result.exception, SystemExit), (offset, result.output, result.exception)
        if result.exit_code:
            errors += 1
            [line] = result.output.strip().splitlines()
            assert str(db) in line, line
    assert errors, "some damaged block was read and reported"


@pytest.fixture
def read_only(monkeypatch: pytest.MonkeyPatch):
    """A read-only file system under the folders given: every way the code creates a folder or opens
    a file for writing there fails with EROFS, as on a read-only mount (root ignores chmod)."""
    frozen: list[Path] = []

    def refused(path) -> bool:
        p = Path(os.fspath(path)).absolute()
        return any(p == f or p.is_relative_to(f) for f in frozen)

    def fail(path) -> None:
        raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))

    real_mkdir, real_open, real_replace = os.mkdir, io.open, os.replace

    def mkdir(path, *args, **kwargs):
        if refused(path):
            fail(path)
        return real_mkdir(path, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") and refused(file):
            fail(file)
        return real_open(file, mode, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        if refused(dst):
            fail(dst)
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(io, "open", open_)
    monkeypatch.setattr("builtins.open", open_)
    monkeypatch.setattr(os, "replace", replace)
    return frozen


def test_a_read_only_file_system_is_one_line_from_evidence_and_site_build(tmp_path: Path, read_only) -> None:
    db = tmp_path / "atlas.duckdb"
    hostile_store(db)
    layout = site_copy(tmp_path / "project")
    evidence.generate(db, layout.evidence / "module-08.evidence.md", layout.evidence / "servable.toml")
    read_only.append(tmp_path / "ro")
    read_only.append(layout.docs)
    for out in (tmp_path / "ro" / "evidence" / "module-08.evidence.md", tmp_path / "ro" / "module-08.evidence.md"):
        line = _one_line_error(["evidence", "--db", str(db), "--out", str(out)])
        assert "Read-only file system" in line and str(out) in line, line
    line = _one_line_error(["site", "build", "--root", str(layout.root)])
    assert "Read-only file system" in line and str(layout.docs) in line, line
    read_only.remove(layout.docs)  # the pages render; only the build folder is read-only
    read_only.append(layout.build)
    line = _one_line_error(["site", "build", "--root", str(layout.root)])
    assert "Read-only file system" in line and str(layout.build) in line, line


# ---- 5. scale: the finder pages its data ---------------------------------------------------------

N_FINDER = 2 * modelfinder.PART_ROWS + 345  # three parts, the last one short

FINDER_ONLY_MODULE = """---
number: 8
title: Finder only
prev: null
next: null
---
# Module {{ page.number }} — {{ page.title }}

[All tracked models](../models/index.md)
"""


def many_models(n: int) -> modelpages.Models:
    """n models as `atlas evidence` writes them; every 50th declares MTP (and has a page)."""
    snap = modelpages.Snapshot(snapshot_id=1, snapshot_date="2026-11-29", revision="d" * 40, declared=None,
                               declared_key=None, shipped=None, shipped_evidence=None, fetch_status="ok")
    models = []
    for i in range(n):
        rid = f"org{i % 7}/model-{i:05d}"
        declares = i % 50 == 0
        current = snap.model_copy(update=dict(declared=1 if declares else None,
                                              declared_key="num_nextn_predict_layers" if declares else None))
        models.append(modelpages.Model(
            repo_id=rid, slug=modelpages.slug(rid), org=f"org{i % 7}", family="deepseek_v3" if declares else "llama",
            architectures=None, is_derivative=False, base_models=[], derivatives=[], has_page=declares,
            current=current, history=[current] if declares else [], servable=[], measured=[]))
    models.sort(key=lambda m: m.repo_id)
    return modelpages.Models(snapshot_id=1, snapshot_date="2026-11-29", mirror_date=None, servable_date="2026-11-01",
                             models=models, prefill=None)


@pytest.fixture(scope="module")
def big_finder(tmp_path_factory: pytest.TempPathFactory) -> render.Layout:
    root = tmp_path_factory.mktemp("big-finder")
    layout = site_copy(root, FINDER_ONLY_MODULE)
    for other in layout.modules.glob("module-*.md"):
        if other.name != "module-08.md":
            other.unlink()
    for extra in layout.modules.glob("*.md"):
        if not extra.name.startswith("module-") and extra.name != "index.md":  # the home page stays: the nav has it
            extra.unlink()
    modelpages.write(many_models(N_FINDER), layout.evidence / modelpages.FILE_NAME)
    render.build(layout)
    return layout


def test_the_finder_page_holds_its_first_screen_and_every_row_is_in_a_part(big_finder: render.Layout) -> None:
    finder = big_finder.build / "models" / "index.html"
    page = parse_html(finder.read_text(encoding="utf-8"))
    table = next(t for t in page.tables if t.header[:1] == ["model"])
    assert len(table.rows) == modelfinder.FIRST_ROWS
    parts = sorted((big_finder.build / "models" / modelfinder.FINDER_PARTS).glob("part-*.js"))
    assert [p.name for p in parts] == ["part-0000.js", "part-0001.js", "part-0002.js"]
    rows = []
    for i, part in enumerate(parts):
        text = part.read_text(encoding="utf-8")
        prefix = f"atlasFinderPart({i}, "
        assert text.startswith(prefix) and text.endswith(");\n")
        rows += json.loads(text[len(prefix):-3])
    data = many_models(N_FINDER)
    assert [r[0] for r in rows] == [m.repo_id for m in data.models]
    assert [r[1] for r in rows] == [m.slug if m.has_page else None for m in data.models]
    assert table.rows == [[r[0], *r[2:]] for r in rows[:modelfinder.FIRST_ROWS]]  # the same text either way
    # pages only for models that declare, ship or measure MTP
    pages = {p.parent.name for p in (big_finder.build / "models").glob("*/index.html")}
    assert pages == {m.slug for m in data.models if m.has_page}


def _wait_for_count(expression: str) -> str:
    """JavaScript: run `expression`, then wait (up to 20 s) until the finder's count shows a result."""
    return ("new Promise(function (done) { " + expression + "; var t0 = Date.now(); (function poll() {"
            " var c = document.querySelector('[data-atlas-finder-count]').textContent;"
            " if (/^\\d+ of /.test(c) || Date.now() - t0 > 20000) done(c); else setTimeout(poll, 20); })(); })")


def _rows_js() -> str:
    return ("Array.prototype.map.call(document.querySelectorAll('[data-atlas-finder-table] tbody tr'),"
            " function (tr) { return tr.cells[0].textContent; })")


@pytest.mark.slow
def test_the_paged_finder_filters_and_sorts_every_model_in_the_browser(big_finder: render.Layout) -> None:
    if CHROMIUM is None:
        pytest.skip("no Chromium binary on PATH")
    finder = (big_finder.build / "models" / "index.html").as_uri()
    last = f"org{(N_FINDER - 1) % 7}/model-{N_FINDER - 1:05d}"
    with Chromium(CHROMIUM) as browser:
        page = browser.open(finder, 1400)
        try:
            # the first screen: its own rows, no part loaded yet
            assert page.evaluate("document.querySelectorAll('script[src*=\"finder/part-\"]').length") == 0
            assert page.evaluate(_rows_js())[:2] == ["org0/model-00000", "org0/model-00007"]
            assert page.evaluate("document.querySelector('[data-atlas-finder-count]').textContent") == \
                f"the first {modelfinder.FIRST_ROWS} of {N_FINDER} models listed: type to search them all"
            # typing searches all parts: the last model is in the last one
            count = page.evaluate(_wait_for_count(
                f"var i = document.querySelector('input[data-atlas-finder]'); i.value = '{last.split('/')[1]}';"
                " i.dispatchEvent(new Event('input'))"))
            assert count == f"1 of {N_FINDER} models shown" and page.evaluate(_rows_js()) == [last]
            # a page model's row links to its page; words match anywhere in the row
            count = page.evaluate(_wait_for_count(
                "var i = document.querySelector('input[data-atlas-finder]'); i.value = 'deepseek org3';"
                " i.dispatchEvent(new Event('input'))"))
            expected = sorted(m.repo_id for m in many_models(N_FINDER).models if m.has_page and m.org == "org3")
            assert count == f"{len(expected)} of {N_FINDER} models shown" and page.evaluate(_rows_js()) == expected
            assert page.evaluate("document.querySelector('[data-atlas-finder-table] tbody a').getAttribute('href')") \
                == modelpages.slug(expected[0]) + "/"
            # sorting sorts all rows, not the listed ones: model id descending puts the last first
            count = page.evaluate(_wait_for_count(
                "var i = document.querySelector('input[data-atlas-finder]'); i.value = '';"
                " i.dispatchEvent(new Event('input'));"
                " var th = document.querySelector('[data-atlas-finder-table] th'); th.click(); th.click()"))
            assert count.startswith(f"{N_FINDER} of {N_FINDER} models shown (the first 200 listed")
            assert page.evaluate(_rows_js())[0] == max(m.repo_id for m in many_models(N_FINDER).models)
            assert len(page.evaluate(_rows_js())) == 200
        finally:
            page.close()
        page = browser.open(finder + "?find=model-00049", 390)  # ?find= on a phone
        try:
            assert page.evaluate(_wait_for_count("0")) == f"1 of {N_FINDER} models shown"
            assert page.evaluate(_rows_js()) == ["org0/model-00049"]
        finally:
            page.close()


# ---- issue 25, leftover: non-finite numbers inside the free-form engine arguments -------------------


VLLM_RECORD = Path(__file__).resolve().parents[1] / "evidence" / "measurements" / "20261130T133215Z-mtp-atlas-byte-mtp-8l-87e840811ef0.json"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize(("field", "inner"), [("engine_args", '{"gpu_memory_utilization": %s}'),
                                               ("options", '{"deep": {"list": [1, %s]}}'),
                                               ("speculative_config", '{"method": "mtp", "x": %s}'),
                                               ("conversion", '{"scale": %s}')])
def test_non_finite_numbers_inside_the_engine_arguments_are_rejected_by_name(tmp_path: Path, field: str, inner: str,
                                                                            value: str) -> None:
    data = json.loads(VLLM_RECORD.read_text())
    data["engine_run"][field] = "PLACEHOLDER"
    path = tmp_path / "bad-engine-args.json"
    path.write_text(json.dumps(data).replace('"PLACEHOLDER"', inner % value))  # JSON's NaN / Infinity, as Python writes them
    with pytest.raises(AtlasError, match=rf"bad-engine-args\.json: not a valid measurement record .*engine_run\.{field}.*"
                                         rf"is {'nan' if value == 'NaN' else '-?inf'}: a JSON number must be finite"):
        records.read_record(path)
    records.read_record(VLLM_RECORD)  # the record as committed is good
