"""`atlas query SQL`: read-only SQL against the store, a plain table, one line for bad SQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from atlas.store import db as store
from atlas.cli import cli


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "atlas.duckdb"
    store.connect(path).close()  # the store's schema, empty
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["query", *args])
    return result.exit_code, result.output


def test_prints_a_plain_table(db: Path) -> None:
    code, out = run("SELECT 1 AS n, NULL AS missing, 'a b' AS text UNION ALL SELECT 22, 'x', 'c'", "--db", str(db))
    assert code == 0, out
    assert out.splitlines() == ["n   missing  text", "--  -------  ----", "1   NULL     a b", "22  x        c", "(2 rows)"]


def test_bad_sql_is_one_line(db: Path) -> None:
    code, out = run("SELEC nothing FROM nowhere", "--db", str(db))
    assert code == 1
    assert out.startswith("Error: query failed:") and len(out.strip().splitlines()) == 1


def test_the_store_is_opened_read_only(db: Path) -> None:
    code, out = run("CREATE TABLE planted (x INTEGER)", "--db", str(db))
    assert code == 1 and "read-only" in out.lower(), out
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'planted'").fetchone() == (0,)


def test_no_store_is_one_line(tmp_path: Path) -> None:
    code, out = run("SELECT 1", "--db", str(tmp_path / "none.duckdb"))
    assert code == 1 and "no atlas store" in out and not (tmp_path / "none.duckdb").exists()
