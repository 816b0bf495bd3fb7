"""`atlas query`: a user's SQL against the store, read-only in fact, not only in name, and bounded.

The store is opened read-only, and DuckDB's own settings close everything else before the first
statement runs: no file outside the store (read_text, read_csv, glob, COPY TO, EXPORT DATABASE,
ATTACH, an https:// file), no extension installed or loaded, and the configuration locked so the
SQL cannot turn any of it back on. A keyword filter would miss spellings; the engine's switch does
not.

A query is bounded as well as sandboxed (`Limits`): it runs in a worker thread while the main thread
waits, so Ctrl-C, SIGTERM and the timeout reach it (DuckDB's `interrupt()`; a Python signal handler
never runs while the main thread is inside DuckDB); DuckDB's `memory_limit` holds its memory, with
no spilling to disk (nothing written, and no temp_directory naming the store's folder); at most
`max_rows` rows are fetched, and a cell of a result is cut inside DuckDB to a little over what may
be printed, so that neither rows nor one huge value ever sit in memory.
"""

from __future__ import annotations

import re
import resource
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from atlas import AtlasError
from atlas.store.db import connect

DEFAULT_MAX_ROWS = 1000
DEFAULT_TIMEOUT_S = 60.0  # the store's own queries take well under a second
DEFAULT_MAX_MEMORY = "1GB"  # DuckDB's default is 80 % of the machine's memory
DEFAULT_MAX_CELL_BYTES = 4096  # a config's long string still reads; a 1 GB one is cut
# A memory_limit as DuckDB reads it: a number and a unit (DuckDB's error for another spelling
# would come from the open, and read as a damaged store).
MEMORY = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)\s*")
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
# Address space a query may add to the process beyond twice --max-memory: its threads' stacks, the
# rows fetched (bounded by the row and cell caps), the result's table.
_HEADROOM = 512 << 20
_JOIN_S = 10.0  # how long a statement may take to stop once interrupted before it is left behind

# Applied when the database opens: external access off (the store's own file, opened at connect,
# stays readable), no extension autoinstalled or autoloaded behind a function name, and no
# temporary directory: nothing spills to disk (a read-only store writes nothing), and
# current_setting('temp_directory') names no folder of this machine.
_SANDBOX = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "temp_directory": "",
}

_REFUSED = ("query refused: atlas query reads the store and nothing else (no other files, "
            "no writes, no extensions, no settings)")

# Column types whose values are bounded in size: fetched as they are. Every other type (text,
# blobs, lists, structs, maps, bit strings, big numbers) is cast to text and cut inside DuckDB.
_BOUNDED = frozenset({
    "boolean", "tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint", "uinteger", "ubigint",
    "uhugeint", "float", "double", "decimal", "date", "time", "time with time zone", "timestamp", "timestamp_s",
    "timestamp_ms", "timestamp_ns", "timestamp with time zone", "interval", "uuid",
})


@dataclass(frozen=True)
class Limits:
    """What one query may take: rows printed, seconds, DuckDB's memory, bytes of one printed cell."""

    max_rows: int = DEFAULT_MAX_ROWS
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_memory: str = DEFAULT_MAX_MEMORY
    max_cell_bytes: int = DEFAULT_MAX_CELL_BYTES


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    more: bool  # rows past the cap exist and were not fetched


def statements(sql: str) -> int:
    """How many statements the SQL holds (0 for blanks, semicolons and comments); bad SQL is one line."""
    return len(_statements(sql))


def _statements(sql: str) -> list[Any]:
    try:
        return duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise AtlasError(f"query failed: {_one_line(exc)}") from None


def memory_bytes(text: str) -> int:
    """A --max-memory in bytes, as DuckDB reads it (KB 1000, KiB 1024)."""
    found = MEMORY.fullmatch(check_memory(text))
    assert found is not None  # check_memory refused anything else
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


@contextmanager
def _address_space(extra: int) -> Iterator[None]:
    """Inside the block the process may map at most `extra` bytes more than it holds now (the soft
    RLIMIT_AS, given back after; never raised). DuckDB's memory_limit holds its buffers, but not a
    string a function builds: repeat('x', 10**9) is one allocation outside them, refused here
    instead (DuckDB turns it into its out-of-memory error). Where /proc says nothing, no bound."""
    try:
        found = re.search(r"VmSize:\s*(\d+) kB", Path("/proc/self/status").read_text())
    except OSError:
        found = None
    if found is None:
        yield
        return
    held = int(found.group(1)) << 10
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    bound = held + extra if hard == resource.RLIM_INFINITY else min(hard, held + extra)
    if soft != resource.RLIM_INFINITY and soft <= bound:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def check_memory(text: str) -> str:
    """A --max-memory DuckDB takes (a number and a unit, e.g. 512MB, 2GB); AtlasError otherwise."""
    if not MEMORY.fullmatch(text):
        raise AtlasError(f"--max-memory expects a size such as 512MB or 2GB, got {text!r}")
    return text.strip()


def query(path: Path | str, sql: str, limits: Limits = Limits()) -> QueryResult:
    """Run the SQL on the sandboxed store within `limits`: the last statement's columns and its
    first `max_rows` rows. A refusal (a file, a write, an extension, a setting), a limit reached
    or any DuckDB error is one line; Ctrl-C and SIGTERM interrupt the statement and propagate."""
    parsed = _statements(sql)
    if not parsed:
        raise AtlasError("query is empty (only blanks, semicolons or comments): give one SQL "
                         "statement, e.g. atlas query \"SELECT * FROM fingerprints LIMIT 5\"")
    con = connect(path, read_only=True, config={**_SANDBOX, "memory_limit": check_memory(limits.max_memory)})
    outcome: list[QueryResult | BaseException] = []
    # The worker's end is an Event, not Thread.join: a signal handler raising inside join() (Python
    # 3.11) marks the worker stopped while it still runs in DuckDB, and its connection still busy.
    done = threading.Event()

    def work() -> None:
        try:
            outcome.append(_run(con, parsed, limits))
        except BaseException as exc:  # handed to the main thread, which says what it was
            outcome.append(exc)
        finally:
            done.set()

    with _address_space(2 * memory_bytes(limits.max_memory) + _HEADROOM):
        try:
            threading.Thread(target=work, name="atlas-query", daemon=True).start()
            # Waiting here, not inside DuckDB, is what lets the signal handlers run (Ctrl-C, SIGTERM).
            if not done.wait(limits.timeout_s):
                raise AtlasError(f"query stopped: it ran past --timeout {limits.timeout_s:g} s; raise --timeout "
                                 "for a longer query, or add a LIMIT or a WHERE")
        finally:
            # The timeout, Ctrl-C or SIGTERM: the statement is interrupted; one that will not stop is
            # left behind in its daemon thread, its connection open.
            if _interrupted(con, done):
                con.close()
    return _result(outcome[0], limits)


def _interrupted(con: duckdb.DuckDBPyConnection, done: threading.Event) -> bool:
    """Interrupt the worker's statement, again until it ends (an interrupt that lands between two
    statements stops neither) or _JOIN_S pass; whether it ended."""
    deadline = time.monotonic() + _JOIN_S
    while not done.is_set() and time.monotonic() < deadline:
        con.interrupt()
        done.wait(0.05)
    return done.is_set()


def _run(con: duckdb.DuckDBPyConnection, parsed: list[Any], limits: Limits) -> QueryResult:
    # Locked first: from here on no statement can change a setting, the sandbox's and the limits included.
    con.execute("SET lock_configuration = true")
    for statement in parsed[:-1]:
        con.execute(statement.query)
    last = parsed[-1]
    if last.type != duckdb.StatementType.SELECT:  # PRAGMA, EXPLAIN, CALL, SET: run as written
        cursor = con.execute(last.query)
        if cursor is None or cursor.description is None:
            return QueryResult([], [], False)
        columns = [d[0] for d in cursor.description]
        rows = cursor.fetchmany(limits.max_rows + 1)
    else:
        text = last.query.rstrip().rstrip(";")
        relation = con.sql(text)  # bound, not run: the columns and their types
        # Each unbounded cell cut inside DuckDB just past what is printed (a character is at most
        # 4 bytes), and one row past the cap fetched: that row says more were left out.
        cells = ", ".join(f"#{i}" if t.id in _BOUNDED else f"left(CAST(#{i} AS VARCHAR), {limits.max_cell_bytes + 1})"
                          for i, t in enumerate(relation.types, start=1))
        columns = list(relation.columns)
        rows = con.execute(f"SELECT {cells} FROM (\n{text}\n) LIMIT {limits.max_rows + 1}").fetchall()
    return QueryResult(columns, rows[:limits.max_rows], len(rows) > limits.max_rows)


def _result(outcome: QueryResult | BaseException, limits: Limits) -> QueryResult:
    """The worker's result, or its failure as the one line that says what it was."""
    if isinstance(outcome, QueryResult):
        return outcome
    if isinstance(outcome, (duckdb.OutOfMemoryException, MemoryError)):
        raise AtlasError(f"query stopped: it needs more memory than --max-memory {limits.max_memory} "
                         "(DuckDB's memory_limit); raise --max-memory, or add a LIMIT or a WHERE") from None
    if isinstance(outcome, duckdb.PermissionException):
        raise AtlasError(f"{_REFUSED}: {_one_line(outcome)}") from None
    if isinstance(outcome, duckdb.Error):
        if "configuration has been locked" in str(outcome):
            raise AtlasError(f"{_REFUSED}: {_one_line(outcome)}") from None
        raise AtlasError(f"query failed: {_one_line(outcome)}") from None
    raise outcome


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]


def cell(value: object, max_bytes: int) -> tuple[str, bool]:
    """A value as printed (NULL for None, newlines as spaces), cut to `max_bytes` of UTF-8 at a
    character's edge; and whether it was cut."""
    text = ("NULL" if value is None else str(value)).replace("\n", " ")
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text, False
    return raw[:max_bytes].decode("utf-8", errors="ignore") + "…", True


def plain_table(columns: Sequence[str], rows: Sequence[tuple],
                max_cell_bytes: int = DEFAULT_MAX_CELL_BYTES) -> tuple[str, int]:
    """Columns left-aligned and padded to their widest cell, NULL shown as NULL, one row a line; and
    how many cells were cut at `max_cell_bytes` (each ends in …)."""
    shown = [[cell(v, max_cell_bytes) for v in row] for row in rows]
    cells = [[text for text, _ in row] for row in shown]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = [list(columns), ["-" * w for w in widths], *cells]
    table = "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in lines)
    return table, sum(cut for row in shown for _, cut in row)
