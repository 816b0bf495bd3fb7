"""`atlas query SQL`: read-only SQL against the store, a plain table, one line for bad SQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from atlas.store import db as store
from atlas.cli import cli

ROOT = Path(__file__).resolve().parents[1]


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


# ---- hostile queries (issue 40): DuckDB's own switches, not a keyword filter --------------------


@pytest.fixture()
def secret(tmp_path: Path) -> Path:
    """Another user's file the query must not read, list or overwrite."""
    home = tmp_path / "other-home"
    home.mkdir()
    path = home / "secret.txt"
    path.write_text("root:x:0:0:precious\n")
    return path


def refused(code: int, out: str) -> bool:
    return code == 1 and out.startswith("Error: query refused:") and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize("sql", [
    "SELECT content FROM read_text('{secret}')",
    "SELECT * FROM read_csv('{secret}', sep=':')",
    "SELECT * FROM glob('{home}/*')",
    "ATTACH '{home}/other.duckdb' AS other",
])
def test_no_file_outside_the_store_is_read(db: Path, secret: Path, sql: str) -> None:
    code, out = run(sql.format(secret=secret, home=secret.parent), "--db", str(db))
    assert refused(code, out), out
    assert "precious" not in out and "secret.txt" not in out.split("disabled")[-1]
    assert sorted(p.name for p in secret.parent.iterdir()) == ["secret.txt"]


def test_copy_to_cannot_overwrite_a_users_file(db: Path, secret: Path) -> None:
    code, out = run(f"COPY (SELECT 'x') TO '{secret}'", "--db", str(db))
    assert refused(code, out), out
    assert secret.read_text() == "root:x:0:0:precious\n"


def test_export_database_writes_no_folder(db: Path, tmp_path: Path) -> None:
    code, out = run(f"EXPORT DATABASE '{tmp_path / 'dump'}'", "--db", str(db))
    assert refused(code, out), out
    assert not (tmp_path / "dump").exists()


@pytest.mark.parametrize("sql", ["INSTALL httpfs", "LOAD httpfs", "SELECT * FROM 'https://127.0.0.1:9/x.parquet'",
                                 "SET enable_external_access = true", "SET autoload_known_extensions = true",
                                 "RESET lock_configuration"])
def test_no_extension_and_no_setting_can_be_changed(db: Path, sql: str) -> None:
    code, out = run(sql, "--db", str(db))
    assert refused(code, out), out


def test_the_sandbox_is_duckdbs_own_settings(db: Path) -> None:
    code, out = run("SELECT current_setting('enable_external_access') AS ext, "
                    "current_setting('autoinstall_known_extensions') AS ai, "
                    "current_setting('autoload_known_extensions') AS al, "
                    "current_setting('lock_configuration') AS locked", "--db", str(db))
    assert code == 0, out
    assert out.splitlines()[2].split() == ["False", "False", "False", "True"]


def test_the_store_itself_still_reads(db: Path) -> None:
    with store.connect(db) as con:
        con.execute("INSERT INTO raw_files VALUES ('org/m', 'abc', 'config.json', '{}', NULL)")
    code, out = run("SELECT repo_id, filename FROM raw_files", "--db", str(db))
    assert code == 0, out
    assert out.splitlines()[2:] == ["org/m    config.json", "(1 row)"]


@pytest.mark.parametrize("sql", ["", " ; ", "-- only a comment", "/* a comment */ ;"])
def test_empty_sql_is_a_clear_error(db: Path, sql: str) -> None:
    code, out = run("--db", str(db), "--", sql)
    assert code == 1 and out.startswith("Error: query is empty") and len(out.strip().splitlines()) == 1, out


def test_rows_are_capped_and_the_cap_is_said(db: Path) -> None:
    code, out = run("SELECT * FROM range(5000000)", "--db", str(db))
    assert code == 0, out
    lines = out.splitlines()
    assert len(lines) == 2 + 1000 + 1 and lines[-2] == "999"
    assert lines[-1] == "(first 1,000 rows shown, more left out: add a LIMIT or raise --max-rows)"
    code, out = run("SELECT * FROM range(3)", "--db", str(db), "--max-rows", "3")
    assert out.splitlines()[-1] == "(3 rows)"
    code, out = run("SELECT * FROM range(4)", "--db", str(db), "--max-rows", "3")
    assert out.splitlines()[-2:] == ["2", "(first 3 rows shown, more left out: add a LIMIT or raise --max-rows)"]


# ---- bounded queries and safe output (issue 62) ----------------------------------------------------

NEVER_ENDS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT count(*) FROM r"


def one_line(code: int, out: str, start: str) -> bool:
    return code == 1 and out.startswith(start) and len(out.strip().splitlines()) == 1 and "Traceback" not in out


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, "Interrupted (Ctrl-C)."),
                                                (signal.SIGTERM, 143, "Terminated (SIGTERM).")])
def test_a_query_that_never_ends_stops_on_ctrl_c_and_sigterm(db: Path, signum: int, code: int, line: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "atlas", "query", "--db", str(db), NEVER_ENDS], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # the interpreter started and the statement runs inside DuckDB
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=10)  # generous: the statement is interrupted at once
    finally:
        proc.kill()
    assert (proc.returncode, out, err.strip().splitlines()) == (code, "", [line])


def test_the_timeout_stops_a_query_that_never_ends(db: Path) -> None:
    code, out = run(NEVER_ENDS, "--db", str(db), "--timeout", "0.5")
    assert one_line(code, out, "Error: query stopped: it ran past --timeout 0.5 s"), out


@pytest.mark.parametrize("sql", ["SELECT repeat('x', 1000000000)",
                                 "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r WHERE length(s) < 1e12) "
                                 "SELECT max(length(s)) FROM r"])
def test_the_memory_limit_stops_a_query_that_grows(db: Path, sql: str) -> None:
    code, out = run(sql, "--db", str(db), "--max-memory", "200MB")
    assert one_line(code, out, "Error: query stopped: it needs more memory than --max-memory 200MB"), out


def test_a_bad_memory_limit_is_one_line(db: Path) -> None:
    code, out = run("SELECT 1", "--db", str(db), "--max-memory", "lots")
    assert one_line(code, out, "Error: --max-memory expects a size such as 512MB or 2GB, got 'lots'"), out


def test_a_long_cell_is_cut_and_the_cut_is_said(db: Path) -> None:
    code, out = run("SELECT repeat('x', 10) AS a, [1, 2, 3] AS l, 7 AS n UNION ALL SELECT 'é', NULL, 8", "--db", str(db),
                    "--max-cell-bytes", "5")
    assert code == 0, out
    assert out.splitlines()[2:] == ["xxxxx…  [1, 2…  7", "é       NULL    8", "(2 rows)",
                                    "(2 cells cut at 5 bytes: raise --max-cell-bytes to see more)"]


def test_no_setting_names_the_stores_folder(db: Path) -> None:
    code, out = run("SELECT current_setting('temp_directory') AS t, current_setting('memory_limit') AS m", "--db", str(db))
    assert code == 0 and str(db.parent) not in out, out


def test_control_characters_and_bidi_overrides_reach_no_terminal(db: Path) -> None:
    code, out = run("SELECT chr(27) || '[2J' AS clear, chr(27) || ']0;title' || chr(7) AS title, chr(8238) AS rlo, "
                    "chr(0) AS nul, chr(155) AS csi, chr(8294) AS isolate", "--db", str(db))
    assert code == 0, out
    assert out.splitlines()[2].split() == ["\\x1b[2J", "\\x1b]0;title\\x07", "\\u202e", "\\x00", "\\x9b", "\\u2066"]
    assert not any(ch in out for ch in "\x1b\x07\x00\x9b\u202e\u2066")


def test_an_error_quoting_untrusted_text_is_safe(db: Path) -> None:
    code, out = run('SELECT * FROM "\x1b]0;pwned\x07"', "--db", str(db))
    assert one_line(code, out, "Error: query failed:") and "\\x1b]0;pwned\\x07" in out and "\x1b" not in out, out


def test_a_rejected_records_name_reaches_no_terminal_raw(db: Path, tmp_path: Path) -> None:
    """Another command that quotes untrusted text (a record file's name) prints it escaped too."""
    folder = tmp_path / "records"
    folder.mkdir()
    (folder / "\x1b]0;pwned\x07\u202e.json").write_text("{}")
    result = CliRunner().invoke(cli, ["measure", "import", "--db", str(db), "--dir", str(folder)])
    assert result.exit_code == 1 and "\\x1b]0;pwned\\x07\\u202e.json" in result.output, result.output
    assert not any(ch in result.output for ch in "\x1b\x07\u202e")
