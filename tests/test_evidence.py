"""Evidence: named queries -> escaped, named sections + facts, written to a deterministic file."""

from __future__ import annotations

import re
from pathlib import Path

import markdown
import pytest
import yaml
from click.testing import CliRunner
from site_helpers import (
    HOSTILE_ID,
    HOSTILE_KEY,
    HOSTILE_MODELS,
    HOSTILE_TYPE,
    REPO,
    hostile_store,
    parse_html,
    snapshot_row,
)

from atlas import AtlasError, store
from atlas.site import evidence, mdsafe
from atlas.cli import cli

MATRIX = REPO / "evidence" / "servable.toml"


def site_markdown(text: str) -> str:
    """Markdown -> HTML with the extensions the site's mkdocs.yml enables."""
    config = yaml.safe_load((REPO / "site" / "mkdocs.yml").read_text(encoding="utf-8"))
    names, configs = [], {}
    for ext in config["markdown_extensions"]:
        if isinstance(ext, dict):
            (name, options), = ext.items()
            names.append(name)
            configs[name] = options
        else:
            names.append(ext)
    return markdown.markdown(text, extensions=names, extension_configs=configs)


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
    declaring = [m for m in HOSTILE_MODELS if (m.declared or 0) > 0]
    assert (f.snapshot_id, f.snapshot_date) == (2, "2026-11-29")
    assert f.n_models == len(HOSTILE_MODELS)
    assert f.n_declaring == len(declaring)
    assert f.n_declaring_zero == sum(1 for m in HOSTILE_MODELS if m.declared == 0)
    layers: dict[int, int] = {}
    for m in HOSTILE_MODELS:
        if m.declared is not None:
            layers[m.declared] = layers.get(m.declared, 0) + 1
    assert f.n_layers == layers
    assert f.n_derivatives_declaring == sum(1 for m in declaring if m.derivative)
    assert f.n_shipped_known == sum(1 for m in HOSTILE_MODELS if m.shipped is not None)
    assert f.n_mismatches == sum(
        1 for m in HOSTILE_MODELS if m.shipped is not None and (m.declared or 0) != m.shipped
    )
    assert f.exemplars == sorted(m.repo_id for m in HOSTILE_MODELS if m.exemplar)
    assert f.n_measurements == 0
    assert f.servable_date == "2026-11-29"


def test_evidence_file_round_trips_and_is_deterministic(hostile_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "module-08.evidence.md"
    ev = evidence.generate(hostile_db, out, MATRIX)
    first = out.read_bytes()
    assert evidence.read(out) == ev
    assert evidence.write(evidence.collect(store.connect(hostile_db, read_only=True), MATRIX), out) is False
    assert out.read_bytes() == first
    text = first.decode()
    # The hostile id is never raw in the file: no tag, no comment terminator outside our markers.
    assert "<script" not in text and "<img" not in text
    assert text.count("-->") == text.count("<!--")
    assert list(ev.sections) == list(evidence.SECTIONS)


def test_sections_hold_each_claim_level_apart(hostile_db: Path, tmp_path: Path) -> None:
    ev = evidence.generate(hostile_db, tmp_path / "ev.md", MATRIX)
    s = ev.sections
    for present in ("declared", "shipped", "mismatches", "servable", "aggregate"):
        assert "speedup" not in s[present].lower() and "acceptance" not in s[present].lower()
    assert evidence.NO_MEASUREMENT in s["measured"]
    assert "declared, not shipped" in s["mismatches"] and "shipped, not declared" in s["mismatches"]
    assert "<svg" in s["adoption_chart"] and "<svg" in s["layers_chart"]
    assert "2026-11-20" in s["adoption_chart"] and "2026-11-29" in s["adoption_chart"]
    # Exemplars first in the declared table, then by declared value.
    rows = [line for line in s["declared"].splitlines() if line.startswith("| ") and "<code" in line]
    exemplars = [m for m in HOSTILE_MODELS if m.exemplar]
    assert all(line.endswith("| exemplar |") for line in rows[: len(exemplars)])
    assert rows[0].startswith(f"| {mdsafe.escape(HOSTILE_ID)} | 3 |")
    assert rows[1].startswith("| deepseek-ai/DeepSeek-V3 | 1 |")


def test_empty_store_gives_empty_but_complete_evidence(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    store.connect(db).close()
    ev = evidence.generate(db, tmp_path / "ev.md", MATRIX)
    assert ev.facts.n_models == 0 and ev.facts.snapshot_date is None
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
    assert evidence.read(out).facts.n_models == len(HOSTILE_MODELS)


def test_malformed_support_matrix_is_a_clear_error(hostile_db: Path, tmp_path: Path) -> None:
    bad = tmp_path / "servable.toml"
    bad.write_text('date = "2026-11-29"\n[[entry]]\nengine = "vLLM"\n', encoding="utf-8")
    with pytest.raises(AtlasError, match="malformed"):
        evidence.generate(hostile_db, tmp_path / "ev.md", bad)


def test_tampered_evidence_file_is_rejected(tmp_path: Path) -> None:
    out = tmp_path / "ev.md"
    out.write_text("<!-- atlas-facts: {} -->\n", encoding="utf-8")
    with pytest.raises(AtlasError, match="missing sections"):
        evidence.read(out)
    with pytest.raises(AtlasError, match="atlas evidence"):
        evidence.read(tmp_path / "absent.md")


def test_unreadable_models_are_not_counted_as_undeclared(tmp_path: Path) -> None:
    db = tmp_path / "gated.duckdb"
    con = store.connect(db)
    try:
        rows = [
            store.ModelRow(repo_id=rid, sha=sha, last_modified=None, created_at=None, downloads=1,
                           likes=0, gated=gated, private=False, pipeline_tag=None, library_name=None,
                           tags=[], base_models=[], base_relation=None, is_derivative=False,
                           is_exemplar=False, param_total=None, fetch_status=status, error=None)
            for rid, sha, gated, status in (("org/open", "1" * 40, None, "ok"),
                                            ("org/gated", "2" * 40, "manual", "gated"))
        ]
        store.write_snapshot(con, snapshot_row(29, 2), rows, [], [], [])
    finally:
        con.close()
    facts = evidence.generate(db, tmp_path / "ev.md", MATRIX).facts
    assert (facts.n_models, facts.n_undeclared, facts.n_not_fetched) == (2, 1, 1)
