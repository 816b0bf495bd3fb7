"""Evidence: named queries -> escaped, named sections + facts, written to a deterministic file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from site_helpers import (
    site_markdown,
    HOSTILE_ID,
    HOSTILE_KEY,
    HOSTILE_MODELS,
    HUB_MODELS,
    HOSTILE_TYPE,
    REPO,
    hostile_store,
    import_folder,
    parse_html,
    snapshot_row,
)

from atlas import AtlasError
from atlas.store import db as store
from atlas.site.pages import write_evidence as evidence
from atlas.site.parts import mdsafe
from atlas.site.parts import evidence_file, present_claims
from atlas.site.pages import runpages
from atlas.cli import cli
from atlas.evidence import catalog

if TYPE_CHECKING:  # the record helper below imports it when it runs
    from atlas.records import record as records

MATRIX = REPO / "evidence" / "servable.toml"


def shown(value: str) -> str:
    """What a reader should see for an untrusted value: the same text, line breaks as spaces."""
    return re.sub(r"[\r\n]+", " ", value).strip()


HOSTILE_VALUES = [
    HOSTILE_ID, HOSTILE_KEY, HOSTILE_TYPE, "a\\|b", "x\r\ny", "`code` ``more``", "***bold***",
    "{: .x onclick=alert(1)}", "<!-- comment -->", "&lt;already escaped&gt;", "# heading",
    "[link](javascript:alert(1))", "![img](x)", "_under_", "~~strike~~", "<https://example.com>",
]


def test_hostile_values_keep_table_shape_and_text() -> None:
    md = mdsafe.table(["value", "#n"], [[v, i] for i, v in enumerate(HOSTILE_VALUES)])
    page = parse_html(site_markdown(md))
    assert len(page.tables) == 1
    table = page.tables[0]
    assert table.header == ["value", "n"]
    assert [row for row in table.rows] == [[shown(v), str(i)] for i, v in enumerate(HOSTILE_VALUES)]
    # Only table structure came out: no script, img, link, code, emphasis or attribute injected.
    assert {tag for tag, _ in page.elements} == {"table", "thead", "tbody", "tr", "th", "td"}
    assert all(name == "style" for _, attrs in page.elements for name, _ in attrs)


def test_code_cells_cannot_be_closed_early() -> None:
    md = mdsafe.table(["key"], [[mdsafe.code("a`</code><script>x</script>`b")]])
    page = parse_html(site_markdown(md))
    assert page.tables[0].rows == [["a`</code><script>x</script>`b"]]
    assert [tag for tag, _ in page.elements if tag not in ("table", "thead", "tbody", "tr", "th", "td")] == ["code"]


@pytest.fixture()
def hostile_db(tmp_path: Path) -> Path:
    db = tmp_path / "atlas.duckdb"
    hostile_store(db)
    return db


def test_facts_are_computed_from_the_snapshot(hostile_db: Path, tmp_path: Path) -> None:
    ev = evidence.generate(hostile_db, tmp_path / "ev.md", MATRIX)
    f = ev.facts
    # counted independently from the fixture; the project's own model is never a Hub model
    declaring = [m for m in HUB_MODELS if (m.declared or 0) > 0]
    assert (f.snapshot_id, f.snapshot_date, f.mirror_build) == (2, "2026-11-29", False)
    assert f.n_models == len(HUB_MODELS) == len(HOSTILE_MODELS) - 1
    assert f.n_project_models == 1
    assert f.n_declaring == len(declaring)
    assert f.n_declaring_zero == sum(1 for m in HUB_MODELS if m.declared == 0)
    layers: dict[int, int] = {}
    for m in HUB_MODELS:
        if m.declared is not None:
            layers[m.declared] = layers.get(m.declared, 0) + 1
    assert f.n_layers == layers
    assert f.n_derivatives_declaring == sum(1 for m in declaring if m.derivative)
    assert f.n_originals_declaring == sum(1 for m in declaring if not m.derivative)
    assert f.n_shipped_known == sum(1 for m in HUB_MODELS if m.shipped is not None)
    assert f.n_mismatches == sum(
        1 for m in HOSTILE_MODELS if m.shipped is not None and (m.declared or 0) != m.shipped
    )
    assert f.exemplars == sorted(m.repo_id for m in HUB_MODELS if m.exemplar)
    assert "mtp-atlas/byte-mtp-8l" not in f.exemplars
    # creation dates: known for the declaring Hub models with a real createdAt (not the placeholder)
    assert f.n_created_known == sum(
        1 for m in declaring if m.created is not None and m.created.year != 2022)
    assert f.n_measurements == 0
    assert f.servable_date == "2026-11-29"


def test_project_models_get_their_own_row_group(hostile_db: Path, tmp_path: Path) -> None:
    s = evidence.generate(hostile_db, tmp_path / "ev.md", MATRIX).sections
    for name in ("declared", "shipped"):
        hub, ours = s[name].split(present_claims.OURS_NOTE.split(":")[0])
        assert "mtp-atlas/byte-mtp-8l" in ours and "mtp-atlas/byte-mtp-8l" not in hub, name
    assert "mtp-atlas" not in s["servable"] + s["layers_chart"] + s["adoption_chart"]
    assert "Not counted: 1 model(s) this project made itself" in s["aggregate"]


def test_adoption_by_creation_month_is_cumulative_by_lab(hostile_db: Path, tmp_path: Path) -> None:
    s = evidence.generate(hostile_db, tmp_path / "ev.md", MATRIX).sections["adoption_chart"]
    html = site_markdown(s)
    page = parse_html(html)
    months, labs = page.tables[0], page.tables[1]
    # DeepSeek-V3 (2024-12), the hostile model (2025-03, declares 3) and MiniMax (2025-03): the
    # derivative has only the Hub's placeholder date, the team model is ours.
    assert months.header == ["month created", "new", "cumulative", "models"]
    assert [r[:3] for r in months.rows] == [["2024-12", "1", "1"], ["2025-03", "2", "3"]]
    assert "1 model(s) with an unknown creation date are not placed" in " ".join(page.text.split())
    assert {r[0]: r[1] for r in labs.rows} == {"deepseek-ai": "1", "MiniMaxAI": "1",
                                                shown(HOSTILE_ID).split("/")[0]: "1"}
    # the chart: four months (2024-12 .. 2025-03), cumulative totals 1, 1, 1, 3 as value labels
    values = re.findall(r'class="atlas-chart-value"[^>]*>([^<]*)<', s)
    assert values[:4] == ["1", "1", "1", "3"]
    # two snapshots in the store: the per-snapshot chart is there too
    assert "per snapshot" in s and "2026-11-20" in s and "2026-11-29" in s


def test_servable_matrix_lists_families_engines_and_models(hostile_db: Path, tmp_path: Path) -> None:
    s = evidence.generate(hostile_db, tmp_path / "ev.md", MATRIX).sections["servable"]
    page = parse_html(site_markdown(s))
    matrix = page.tables[0]
    assert matrix.header == ["family (model_type)", "models", "vLLM", "SGLang", "transformers"]
    rows = {r[0]: r for r in matrix.rows}
    # deepseek_v3: V3 and its mlx derivative; served by all three engines in the matrix
    assert rows["deepseek_v3"][1] == "2: deepseek-ai/DeepSeek-V3, mlx-community/DeepSeek-V3-4bit"
    assert all(cell.startswith("Support claim: yes · M") and "[S" in cell for cell in rows["deepseek_v3"][2:])
    assert rows["minimax_m2"][2:] == ["—", "—", "—"]
    # every method and source is in the legend once, not on every row
    assert s.count("speculative&#95;config") == 1
    assert "S1" in s and "checked 2026-11-29" in s


def test_evidence_file_round_trips_and_is_deterministic(hostile_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "module-08.evidence.md"
    ev = evidence.generate(hostile_db, out, MATRIX)
    first = out.read_bytes()
    assert evidence_file.read(out) == ev
    with store.reading(hostile_db) as con:
        again = evidence.collect(con, catalog.load(con, MATRIX.parent, REPO))
    assert evidence_file.write(again, out) is False
    assert out.read_bytes() == first
    text = first.decode()
    # The hostile id is never raw in the file: no tag, no comment terminator outside our markers.
    assert "<script" not in text and "<img" not in text
    assert text.count("-->") == text.count("<!--")
    assert list(ev.sections) == list(evidence_file.SECTIONS)


def test_sections_hold_each_claim_level_apart(hostile_db: Path, tmp_path: Path) -> None:
    ev = evidence.generate(hostile_db, tmp_path / "ev.md", MATRIX)
    s = ev.sections
    for present in ("declared", "shipped", "mismatches", "servable", "aggregate"):
        assert "speedup" not in s[present].lower() and "acceptance" not in s[present].lower()
        assert "speed-up" not in s[present].lower()
    assert evidence.NO_MEASUREMENT in s["measured"]
    assert "declared, not shipped" in s["mismatches"] and "shipped, not declared" in s["mismatches"]
    assert "<svg" in s["adoption_chart"] and "<svg" in s["layers_chart"]
    # Exemplars first in the declared table, then by declared value.
    rows = [line for line in s["declared"].splitlines() if line.startswith("| ") and "<code" in line]
    exemplars = [m for m in HUB_MODELS if m.exemplar]
    assert all(line.endswith("| exemplar |") for line in rows[: len(exemplars)])
    assert rows[0].startswith(f"| {mdsafe.escape(HOSTILE_ID)} | 3 |")
    assert rows[1].startswith("| deepseek-ai/DeepSeek-V3 | 1 |")


def test_a_live_crawl_links_hub_commits_and_a_mirror_crawl_dates_rows_by_the_mirror(tmp_path: Path) -> None:
    live = tmp_path / "live.duckdb"
    hostile_store(live)
    s = evidence.generate(live, tmp_path / "a.md", MATRIX).sections
    assert "| revision | crawled |" in s["declared"]
    links = [dict(a)["href"] for tag, a in parse_html(site_markdown(s["declared"])).elements if tag == "a"]
    assert "http://127.0.0.1:9/deepseek-ai/DeepSeek-V3/tree/" + "1" * 40 in links
    assert "Where the mirror" not in s["declared"]

    from site_helpers import crawl_mirror

    mirror = tmp_path / "mirror.duckdb"
    crawl_mirror(mirror)
    sources = REPO / "data" / "hub-mirror" / "SOURCES.tsv"
    ev = evidence.generate(mirror, tmp_path / "b.md", MATRIX, sources)
    assert ev.facts.mirror_build
    fixed = evidence.load_mirror_date(sources.parent)
    assert fixed is not None and ev.facts.data_date == fixed.isoformat()
    declared = ev.sections["declared"]
    # one name for the 12-hex value, and the mirror's own date on every row, not the crawl's
    assert "| revision | data of |" in declared
    assert all(f">{fixed.isoformat()}<" in line for line in declared.splitlines()
               if line.startswith("| ") and "atlas-rev" in line and "github.com" not in line)
    stamp = f"mirror crawl &#35;{ev.facts.snapshot_id} of {ev.facts.snapshot_date} (data of {fixed.isoformat()})"
    assert stamp in ev.sections["aggregate"].lower() and stamp in ev.sections["summary"].replace("#", "&#35;")
    assert not any("mirror hash" in text or "Hub commit |" in text for text in ev.sections.values())
    assert "huggingface.co" not in declared  # a mirror content hash links nowhere
    # the config's real origin, from SOURCES.tsv, linked at its commit
    links = [dict(a)["href"] for tag, a in parse_html(site_markdown(declared)).elements if tag == "a"]
    assert ("https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/"
            "aic-core/src/aiconfigurator_core/model_configs/deepseek-ai--DeepSeek-V3_config.json") in links
    assert "not a Hub commit" in ev.sections["provenance"]
    assert f"mirror's own date, {fixed.isoformat()}" in ev.sections["provenance"]


def test_the_mirror_date_is_the_day_its_files_last_changed() -> None:
    """MIRROR.toml's `fixed` must follow the mirror: the author date of the last commit that changed
    a mirror data file (not MIRROR.toml itself, not the README), where the checkout has its git
    history."""
    import shutil
    import subprocess

    fixed = evidence.load_mirror_date(REPO / "data" / "hub-mirror")
    assert fixed is not None
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git history in this checkout to compare the mirror's date with")
    done = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%as", "--", "data/hub-mirror",
         ":(exclude)data/hub-mirror/MIRROR.toml", ":(exclude)data/hub-mirror/README.md"],
        capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        pytest.skip("git cannot tell when the mirror last changed here")
    assert done.stdout.strip() == fixed.isoformat(), (
        "a mirror file changed after data/hub-mirror/MIRROR.toml's `fixed` date: set it to that day")


def test_a_bad_mirror_date_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "MIRROR.toml").write_text('fixed = "yesterday"\n')
    with pytest.raises(AtlasError, match="MIRROR.toml: `fixed` must be a date"):
        evidence.load_mirror_date(tmp_path)


def test_empty_store_gives_empty_but_complete_evidence(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    store.connect(db).close()
    ev = evidence.generate(db, tmp_path / "ev.md", MATRIX)
    assert ev.facts.n_models == 0 and ev.facts.snapshot_date is None and not ev.facts.mirror_build
    assert evidence.NO_MEASUREMENT in ev.sections["measured"]
    assert "No complete snapshot" in ev.sections["aggregate"]


def test_measurements_from_before_the_baseline_column_ask_for_an_import(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    con = store.connect(db)
    con.execute("CREATE TABLE measurement_cells (record_id VARCHAR, speedup DOUBLE)")
    con.close()
    with pytest.raises(AtlasError, match="run `atlas measure import` first"):
        evidence.generate(db, tmp_path / "ev.md", MATRIX)


def test_cli_reports_a_missing_store(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["evidence", "--db", str(tmp_path / "none.duckdb"),
                                      "--out", str(tmp_path / "ev.md")])
    assert result.exit_code == 1
    assert "no atlas store" in result.output
    assert "Traceback" not in result.output


def test_cli_writes_the_evidence_file(hostile_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "ev.md"
    result = CliRunner().invoke(cli, ["evidence", "--db", str(hostile_db), "--out", str(out),
                                      "--servable", str(MATRIX)])
    assert result.exit_code == 0, result.output
    assert "snapshot 2 (2026-11-29)" in result.output
    assert evidence_file.read(out).facts.n_models == len(HUB_MODELS)


def test_malformed_support_matrix_is_a_clear_error(hostile_db: Path, tmp_path: Path) -> None:
    bad = tmp_path / "servable.toml"
    bad.write_text('date = "2026-11-29"\n[[entry]]\nengine = "vLLM"\n', encoding="utf-8")
    with pytest.raises(AtlasError, match="malformed"):
        evidence.generate(hostile_db, tmp_path / "ev.md", bad)


def test_tampered_evidence_file_is_rejected(tmp_path: Path) -> None:
    out = tmp_path / "ev.md"
    out.write_text("<!-- atlas-facts: {} -->\n", encoding="utf-8")
    with pytest.raises(AtlasError, match="missing sections"):
        evidence_file.read(out)
    with pytest.raises(AtlasError, match="atlas evidence"):
        evidence_file.read(tmp_path / "absent.md")


def test_unreadable_models_are_not_counted_as_undeclared(tmp_path: Path) -> None:
    db = tmp_path / "gated.duckdb"
    with store.connect(db) as con:
        rows = [
            store.ModelRow(repo_id=rid, sha=sha, last_modified=None, created_at=None, downloads=1,
                           likes=0, gated=gated, private=False, pipeline_tag=None, library_name=None,
                           tags=[], base_models=[], base_relation=None, is_derivative=False,
                           is_exemplar=False, param_total=None, fetch_status=status, error=None)
            for rid, sha, gated, status in (("org/open", "1" * 40, None, "ok"),
                                            ("org/gated", "2" * 40, "manual", "gated"))
        ]
        store.write_snapshot(con, snapshot_row(29, 2), rows, [], [], [])
    facts = evidence.generate(db, tmp_path / "ev.md", MATRIX).facts
    assert (facts.n_models, facts.n_undeclared, facts.n_not_fetched) == (2, 1, 1)


def test_charts_escape_labels_and_draw_what_they_are_given() -> None:
    from atlas.site.parts import charts

    hostile = "<script>x</script>&[l](javascript:y)"
    bar = charts.bar_chart(hostile, [charts.Bar(label=hostile, value=2)], hostile)
    stacked = charts.stacked_bar_chart(
        "t", ["2025-01", "2025-02"],
        [charts.Stack(name=hostile, values=[1, 2]), charts.Stack(name="b", values=[0, 1])], "models")
    line = charts.line_chart(
        "t", [charts.Series(name=hostile, points=[charts.Point(x=1, y=1.2, lo=1.0, hi=1.5),
                                                   charts.Point(x=2, y=0.9, lo=0.8, hi=1.1)])],
        "k", "speed-up", [(1, "1"), (2, "2")], reference=1.0)
    for svg in (bar, stacked, line):
        # escaped for HTML and for Markdown both (inside a collapsible box the block is Markdown)
        assert "<script>" not in svg and "&#60;script&#62;" in svg and "](javascript" not in svg
        assert "\n\n" not in svg  # one raw HTML block for Markdown
    # stacked: totals 1 and 3 labelled; an empty layer draws no rectangle
    assert re.findall(r'class="atlas-chart-value"[^>]*>([^<]*)<', stacked) == ["1", "3"]
    assert stacked.count("<rect") == 3
    # line: a whisker per point with a range, a dashed reference at 1
    assert line.count('class="atlas-chart-whisker') == 2 and "atlas-chart-reference" in line
    # a count axis of whole things has whole-number ticks
    assert re.findall(r'class="atlas-chart-tick"[^>]*>([^<]*)<', stacked) == ["0", "1", "2", "3"]
    with pytest.raises(ValueError):
        charts.bar_chart("t", [], "y")


def _schema2_record(quick: bool, model_id: str) -> records.Record:
    """A schema-2 record through the records module: conditional counts, per-repeat pass costs,
    speed-ups 0.7/1.0/1.3 (the paired bounds straddle 1: undecided)."""
    from datetime import datetime, timezone

    from atlas.records import gating, record as records, runcontext

    costs = records.PassCosts(plain=0.002, verify={1: 0.0024, 2: 0.0026}, draft=0.0004)
    cells = []
    for k in (1, 2):
        repeats = [
            records.Repeat(
                tokens=20 + [15, 9][:k][-1] + (15 if k == 2 else 0), seconds=0.1,
                baseline_seconds=0.1 * (0.7 + 0.3 * i), drafted_per_position=[20] * k,
                reached_per_position=[20, 15][:k], accepted_per_position=[15, 9][:k],
                verify_passes=20, identical_to_baseline=True,
                pass_costs=records.PassCosts(plain=0.002 * (1 + 0.01 * i), verify={1: 0.0024, 2: 0.0026},
                                             draft=0.0004))
            for i in range(3)
        ]
        derived = gating.derive(repeats, 0.0, k, costs, rule=1)
        g = gating.gate(derived, len(repeats), quick)
        cells.append(records.Cell(engine="atlas", engine_version="0.1.0", baseline="plain", workload="code",
                                  temperature=0.0, draft_tokens=k, repeats=repeats, derived=derived,
                                  gate_enabled=g.enabled, gate_reason=g.reason))
    return records.Record(
        schema_version=2, run_date=datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc), model_id=model_id,
        revision="sha256:" + "ab" * 32,
        hardware=runcontext.Hardware(text="CPU: test", cpu="test", cpu_cores=2, memory_gib=8.0, torch_threads=1),
        software=runcontext.Software(python="3.11", torch="2.13.0", transformers="5.24.0", atlas="0.1.0",
                                  atlas_commit=None, atlas_tree_dirty=False, numpy="2.3", blas="openblas", os="Linux"),
        command="atlas measure run" + (" --quick" if quick else ""), seed=0, prompt_set="p",
        prompt_set_digest="0" * 64,
        settings=runcontext.Settings(device="cpu", dtype="float32", workloads=["code"], temperatures=[0.0],
                                  draft_tokens=[1, 2], max_new_tokens=64, repeats=3, prompts_per_workload=1,
                                  quick=quick),
        pass_costs=costs, cells=cells, load_before=[0.5, 0.4, 0.3], load_after=[0.6, 0.4, 0.3],
    )


def test_schema_2_runs_show_conditional_acceptance_undecided_gates_and_keep_smoke_runs_apart(
    hostile_db: Path, tmp_path: Path,
) -> None:
    from atlas.records import record as records

    folder = tmp_path / "measurements"
    records.write_record(_schema2_record(False, "org/full-run"), folder)
    records.write_record(_schema2_record(True, "org/smoke-run"), folder)
    assert import_folder(hostile_db, folder) == 2
    ev = evidence.generate(hostile_db, tmp_path / "ev.md", MATRIX)
    assert (ev.facts.n_measurement_records, ev.facts.n_measurements) == (1, 2)  # the smoke run is not counted
    pages = runpages.split_run_pages(ev.sections["runs"])
    assert len(pages) == 1  # the full run only: the smoke run has no page
    page = parse_html(site_markdown(pages[0][2]))
    summary, detail = page.tables[:2]
    assert len(summary.rows) == 1 and summary.rows[0][3] == "undecided (best k=1)"  # equal medians: the first
    assert [r[4] for r in detail.rows] == ["0.75", "0.75 / 0.60"]  # accepted_i / reached_i
    assert [r[-1].split(" (lower ")[0] for r in detail.rows] == ["undecided", "undecided"]
    assert all(float(r[-1].split(" (lower ")[1].rstrip(")")) <= 1 for r in detail.rows)
    assert re.fullmatch(r"\d\.\d\d \(\d\.\d\d–\d\.\d\d\)", summary.rows[0][9])  # efficiency range
    # the bound the gate used stands next to its verdict: undecided, so the lower bound is not above 1
    low = summary.rows[0][4]
    assert re.fullmatch(r"\d\.\d\d \(upper \d\.\d\d\)", low) and float(low.split()[0]) <= 1
    text = " ".join(page.text.split())
    assert "org/smoke-run" not in text and text.count("Run R") == 1
    index = parse_html(site_markdown(ev.sections["runs_index"]))
    assert "Smoke runs — not evidence" in index.text and "org/smoke-run" in index.text
    # module 8's compact table: one row, the full run's, no smoke run
    compact = parse_html(site_markdown(ev.sections["measured"])).tables
    assert len(compact) == 1 and [r[1] for r in compact[0].rows] == ["org/full-run"]


def _acceptance_figures(t: float, passed: bool) -> dict:
    """An oracle acceptance check's statistics that say what `passed` says (a record whose
    statistics contradict its checks is refused), over enough drafts for a pass to count as
    lossless (conformance.derive_power)."""
    if t == 0:
        return {"drafted": 400, "accepted": 400 if passed else 399}
    return {"drafted": 1000, "accepted": 500 if passed else 0, "expected_accepted": 500.0, "expected_acceptance": 0.5,
            "z": 0.0 if passed else -31.6, "p_value": 1.0 if passed else 0.0}


def test_servable_cells_carry_conformance_verdicts_for_their_layout(hostile_db: Path, tmp_path: Path) -> None:
    import shutil
    from datetime import datetime, timezone

    from atlas.conformance import record as conformance

    matrix = tmp_path / "evidence" / "servable.toml"
    matrix.parent.mkdir()
    shutil.copy(MATRIX, matrix)

    def check(t: float, passed: bool, layout: str = "deepseek_v3") -> conformance.Check:
        return conformance.Check(layout=layout, checkpoint="oracle", temperature=t, draft_tokens=1,
                                 draft_sampling="greedy", name="acceptance", passed=passed,
                                 summary="planted", figures=_acceptance_figures(t, passed))

    conformance.write_record(conformance.ConformanceRecord(
        schema_version=conformance.SCHEMA_VERSION, run_date=datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc),
        engine="vllm", package="vllm-cpu", version="9.9.9", hardware="CPU: test", device="cpu",
        dtype="float32", command="atlas conformance run", seed=0, alpha=0.01, requests=4, max_new_tokens=8,
        checks=[check(0.0, True), check(1.0, False), check(0.0, False, "qwen3_next")],
    ), matrix.parent / "conformance")
    s = evidence.generate(hostile_db, tmp_path / "ev.md", matrix).sections["servable"]
    rows = {r[0]: r for r in parse_html(site_markdown(s)).tables[0].rows}
    vllm = rows["deepseek_v3"][2]
    assert "Support claim" in vllm and "Conformance" in vllm and "vllm-cpu 9.9.9 on cpu" in vllm
    assert "T 0: lossless" in vllm and "T > 0 greedy drafts: fails" in vllm
    # the Qwen3-Next model ships MTP: its family gets the qwen3_next layout's verdict (T = 0 only)
    assert "T 0: fails" in rows["qwen3_next"][2] and "T > 0" not in rows["qwen3_next"][2]
    # another engine, and a family with no checked layout, say not checked
    assert "Conformance: not checked" in rows["deepseek_v3"][3] and "fails" not in rows["deepseek_v3"][3]
    others = [c for r in rows.values() if r[0] not in ("deepseek_v3", "qwen3_next") for c in r[2:]]
    assert not [c for c in others if "fails" in c or "lossless" in c]
    assert all("Conformance: not checked" in c for c in others if "Support claim" in c)
    assert "C1" in s and "vllm-cpu-9.9.9.json" in s


def test_conformance_results_name_the_build_and_the_layout_checked(tmp_path: Path) -> None:
    """Qwen3.5 ships Qwen3-Next's mtp.* layout: its vLLM cell carries the qwen3_next verdicts, named
    as checked on that layout; a patched build is its own result beside the release's; a family
    with no checked layout and another engine get none."""
    from datetime import datetime, timezone

    from atlas.conformance import record as conformance
    from atlas.evidence import servable

    def check(t: float, passed: bool, sampling: str = "greedy", k: int = 1) -> conformance.Check:
        return conformance.Check(layout="qwen3_next", checkpoint="oracle", temperature=t, draft_tokens=k,
                                 draft_sampling=sampling, name="acceptance", passed=passed, summary="s",
                                 figures=_acceptance_figures(t, passed))

    def record(hour: int, passed_t1: bool, patched: bool) -> conformance.ConformanceRecord:
        return conformance.ConformanceRecord(
            schema_version=conformance.SCHEMA_VERSION, run_date=datetime(2026, 12, 1, hour, tzinfo=timezone.utc),
            engine="vllm", package="vllm-cpu", version="0.32.0", hardware="CPU: test", device="cpu", dtype="float32",
            command="atlas conformance run", seed=0, alpha=1e-4, requests=4, max_new_tokens=8, triton=False,
            patches=[conformance.AppliedPatch(name="expand-kernel-fix", sha256="a" * 64, replaces="x", file="y")] if patched else [],
            causes=conformance.known_causes("vllm-cpu", "0.32.0", False, [conformance.AppliedPatch(
                name="expand-kernel-fix", sha256="a" * 64, replaces="x", file="y")] if patched else []),
            checks=[check(0.0, True), check(1.0, passed_t1), check(1.0, passed_t1, "probabilistic")],
            oracle_draft_scale=0.5,  # an oracle that rejects sampled drafts, as the suite writes it
        )

    conformance.write_record(record(8, False, False), tmp_path)
    conformance.write_record(record(9, True, True), tmp_path)
    rows = conformance.verdicts(conformance.latest_records(tmp_path))
    [release, patched] = servable.checked_for("qwen3_5_moe", ["Qwen3_5MoeForConditionalGeneration"], "vLLM", rows)
    assert (release.build, release.patched, patched.patched) == ("vllm-cpu 0.32.0", False, True)
    assert "expand-kernel-fix (sha256 aaaaaaaaaaaa" in patched.build
    assert "checked as qwen3_next" in release.layout_note and "mtp.*" in release.layout_note
    assert servable.results_text(release) == "T 0 lossless · T > 0 fails"
    assert servable.results_text(patched) == "T 0 lossless · T > 0 lossless"
    assert [c.status for c in release.causes] == ["present"] and [c.status for c in patched.causes] == ["patched"]
    own = servable.checked_for("qwen3_next", [], "vLLM", rows)
    assert len(own) == 2 and all(c.layout_note.startswith("this family's own layout") for c in own)
    assert servable.checked_for("deepseek_v3", ["DeepseekV3ForCausalLM"], "vLLM", rows) == []
    assert servable.checked_for("qwen3_next", [], "SGLang", rows) == []


def test_slow_cells_and_the_measured_line_are_escaped_and_follow_the_record(hostile_db: Path, tmp_path: Path) -> None:
    """A run slower than plain decoding, of the hostile model, with a hostile workload: the verdict's
    "when it backfires" list and its measured line show them as text, with their own figures."""
    from site_helpers import HOSTILE_HARDWARE, HOSTILE_ID, plant_measurement

    record_id = plant_measurement(hostile_db, tmp_path / "records", HOSTILE_ID, speed=0.8)
    ev = evidence.generate(hostile_db, tmp_path / "ev.md", MATRIX)
    for name in ("backfires", "verdict_measured", "summary"):
        page = parse_html(site_markdown(ev.sections[name]))
        assert not [t for t, _ in page.elements if t in ("script", "i", "b", "img", "table")], name
    text = " ".join(parse_html(site_markdown(ev.sections["backfires"])).text.split())
    assert "In all, 2 of 2 measured cells, in 1 of 1 runs, ran slower" in text
    line = " ".join(parse_html(site_markdown(ev.sections["verdict_measured"])).text.split())
    assert record_id[:12] in line and " ".join(HOSTILE_HARDWARE.split()) in line
    assert "median speed-ups 0.80× over 2 cells" in line and "run 2026-11-28" in line
