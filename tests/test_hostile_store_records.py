"""A store recovers when an imported record's file is gone (issue 25 F11): `atlas evidence` and
`atlas export` name the record and the command that forgets it, and after `atlas measure forget`
both work again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from site_helpers import crawl_mirror

from atlas.store import db as store
from atlas.cli import cli
from atlas.records import record as records


def _one_line(result) -> str:
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("Error: ") and "Traceback" not in line
    return line


def test_a_record_whose_folder_was_deleted_is_named_and_can_be_forgotten(tmp_path: Path) -> None:
    from test_records import make_record

    db = tmp_path / "atlas.duckdb"
    crawl_mirror(db)
    scratch = tmp_path / "scratch"
    path = records.write_record(make_record(model_id="scratch/model"), scratch)
    rid = records.record_id(records.read_record(path))
    runner = CliRunner()
    assert runner.invoke(cli, ["measure", "import", "--db", str(db), "--dir", str(scratch)]).exit_code == 0
    shutil.rmtree(scratch)

    evidence = ["evidence", "--db", str(db), "--out", str(tmp_path / "ev" / "module-08.evidence.md")]
    export = ["export", "--db", str(db), "--out", str(tmp_path / "export")]
    for args in (evidence, export):
        line = _one_line(runner.invoke(cli, args))
        assert f"{path.name} (imported as {rid[:12]}) is gone" in line, line
        assert f"`atlas measure forget {rid[:12]}`" in line, line

    too_short = runner.invoke(cli, ["measure", "forget", "--db", str(db), rid[:6]])
    assert "12 characters at least" in _one_line(too_short)
    assert "no imported measurement record" in _one_line(runner.invoke(cli, ["measure", "forget", "--db", str(db), "f" * 64]))
    forgot = runner.invoke(cli, ["measure", "forget", "--db", str(db), rid[:12]])
    assert forgot.exit_code == 0 and f"forgot measurement record {rid[:12]}" in forgot.output, forgot.output
    with store.connect(db) as con:
        assert con.execute("SELECT count(*) FROM measurement_cells WHERE record_id = ?", [rid]).fetchone() == (0,)
    for args in (evidence, export):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output


def test_a_record_is_forgotten_by_its_source_path_and_only_that_one(tmp_path: Path) -> None:
    from test_records import make_record

    folder = tmp_path / "records"
    kept = records.write_record(make_record(model_id="keep/model"), folder)
    gone = records.write_record(make_record(model_id="gone/model"), folder)
    with store.connect(tmp_path / "s.duckdb") as con:
        assert records.import_records(con, folder)[0] == 2
        [(rid, source)] = records.forget_record(con, str(gone))
        assert source == gone.as_posix() and rid == records.record_id(records.read_record(gone))
        left = con.execute("SELECT DISTINCT model_id FROM measurement_cells").fetchall()
        assert left == [("keep/model",)] and kept.is_file()
        with pytest.raises(Exception, match="no imported measurement record"):
            records.forget_record(con, str(gone))
