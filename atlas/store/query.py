"""`atlas query`: a user's SQL against the store, read-only in fact, not only in name.

The store is opened read-only, and DuckDB's own settings close everything else before the first
statement runs: no file outside the store (read_text, read_csv, glob, COPY TO, EXPORT DATABASE,
ATTACH, an https:// file), no extension installed or loaded, and the configuration locked so the
SQL cannot turn any of it back on. A keyword filter would miss spellings; the engine's switch does
not. Rows are fetched as a stream and cut at a cap that the output names, so a huge result never
sits in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from atlas import AtlasError
from atlas.store.db import connect

DEFAULT_MAX_ROWS = 1000

# Applied when the database opens: external access off (the store's own file, opened at connect,
# stays readable), and no extension autoinstalled or autoloaded behind a function name.
_SANDBOX = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}

_REFUSED = ("query refused: atlas query reads the store and nothing else (no other files, "
            "no writes, no extensions, no settings)")


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    more: bool  # rows past the cap exist and were not fetched


def statements(sql: str) -> int:
    """How many statements the SQL holds (0 for blanks, semicolons and comments); bad SQL is one line."""
    try:
        return len(duckdb.extract_statements(sql))
    except duckdb.Error as exc:
        raise AtlasError(f"query failed: {_one_line(exc)}") from None


def query(path: Path | str, sql: str, max_rows: int = DEFAULT_MAX_ROWS) -> QueryResult:
    """Run the SQL on the sandboxed store: the last statement's columns and its first `max_rows`
    rows. A refusal (a file, a write, an extension, a setting) or any DuckDB error is one line."""
    if statements(sql) == 0:
        raise AtlasError("query is empty (only blanks, semicolons or comments): give one SQL "
                         "statement, e.g. atlas query \"SELECT * FROM fingerprints LIMIT 5\"")
    con = connect(path, read_only=True, config=_SANDBOX)
    try:
        # Locked last: from here on no statement can change a setting, these three included.
        con.execute("SET lock_configuration = true")
        cursor = con.execute(sql)
        if cursor is None or cursor.description is None:
            return QueryResult([], [], False)
        rows = cursor.fetchmany(max_rows + 1)
        return QueryResult([d[0] for d in cursor.description], rows[:max_rows], len(rows) > max_rows)
    except duckdb.PermissionException as exc:
        raise AtlasError(f"{_REFUSED}: {_one_line(exc)}") from None
    except duckdb.Error as exc:
        if "configuration has been locked" in str(exc):
            raise AtlasError(f"{_REFUSED}: {_one_line(exc)}") from None
        raise AtlasError(f"query failed: {_one_line(exc)}") from None
    finally:
        con.close()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]


def plain_table(columns: Sequence[str], rows: Sequence[tuple]) -> str:
    """Columns left-aligned and padded to their widest cell, NULL shown as NULL, one row a line."""
    cells = [[("NULL" if v is None else str(v)).replace("\n", " ") for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = [list(columns), ["-" * w for w in widths], *cells]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in lines)
