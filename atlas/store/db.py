"""The atlas store: one DuckDB file holding crawl snapshots, hub metadata, raw configs, tensor
names and fingerprints, plus the views other parts of the atlas (and users, with the duckdb CLI)
query.

Rules this module keeps:
- One process owns the file read-write (DuckDB's lock); a second one gets StoreLockedError.
- A snapshot is written in one transaction, so it is whole or absent.
- Raw files and tensor names are keyed by (repo_id, sha) and written once; fingerprints are a
  pure function of them, keyed by (repo_id, sha) and stamped with the rule version.
- Bulk writes go through registered numpy columns, never row-by-row inserts.
- Whatever goes wrong underneath (a damaged file, a full or read-only disk) is one line naming the
  file and what to do (`store_error`; `reading` for a command that only reads), never a traceback;
  a failed write leaves the snapshots already there intact.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from atlas import AtlasError
from atlas.store.schema import SCHEMA

# Hub orgs whose models this project made (team model, oracle checkpoints): never counted as Hub
# adoption (the site leaves them out, the export marks them made_by_atlas; both read it here).
# Lower-case; the org is the part of the repo id before the first "/".
PROJECT_ORGS = ("mtp-atlas",)


def is_ours(repo_id: str) -> bool:
    return repo_id.split("/", 1)[0].lower() in PROJECT_ORGS


def ours(column: str = "repo_id") -> str:
    """is_ours in SQL, over the repo ids in `column` (the orgs are constants, no data)."""
    return f"lower(split_part({column}, '/', 1)) IN (" + ", ".join(f"'{o}'" for o in PROJECT_ORGS) + ")"

class StoreLockedError(AtlasError):
    """Another process holds the DuckDB file."""


_DISK_FULL = ("no space left on device", "disk is full", "not enough space")
_READ_ONLY = ("read-only file system",)


def _disk_error(path: Path | str, exc: BaseException) -> AtlasError | None:
    """A full or read-only disk under the store, by name (the file is whole: DuckDB commits whole or
    not at all); None for anything else."""
    text = _first_line(exc)
    low = text.lower()
    code = getattr(exc, "errno", None)
    if code == errno.ENOSPC or any(k in low for k in _DISK_FULL):
        return AtlasError(f"the disk holding the atlas store {path} is full ({text}): nothing of this run was "
                          "written and the snapshots already in the store are intact; free some space and run again")
    if code == errno.EROFS or any(k in low for k in _READ_ONLY):
        return AtlasError(f"the atlas store {path} is on a read-only file system ({text}): nothing was written; "
                          "use --db (or $ATLAS_DB) for a store on a writable disk")
    return None


def store_error(path: Path | str, exc: BaseException) -> AtlasError:
    """One line for a DuckDB failure under a store that opened: the disk by name, else a damaged file."""
    return _disk_error(path, exc) or AtlasError(
        f"the atlas store {path} is damaged or not an atlas store ({_first_line(exc)}); keep it for "
        "inspection and crawl into a new one with --db (or $ATLAS_DB)")


@contextmanager
def reading(path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """The store opened read-only for a command that only reads it, closed after. A DuckDB failure
    under it (a corrupt block, a file truncated by a full disk) is one line: DuckDB's first, and what
    to do; nothing of the command was written yet, so the advice is the store's alone."""
    con = connect(path, read_only=True)
    try:
        yield con
    except duckdb.Error as exc:
        raise AtlasError(f"the atlas store {path} cannot be read, it is damaged or not an atlas store ({_first_line(exc)}); "
                         "nothing was written: restore the file or rebuild it with `atlas crawl`") from None
    finally:
        con.close()


def connect(path: Path | str, read_only: bool = False,
            config: dict[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
    """Open the store (creating file and schema when needed). Everyone opens the DB through this;
    `config` is DuckDB's own settings, applied as the database opens (atlas query's sandbox)."""
    path = Path(path)
    if read_only and not path.exists():
        raise AtlasError(f"no atlas store at {path}: run `atlas crawl` first")
    if not read_only:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only or full file system, a file where the folder goes
            raise AtlasError(f"cannot create the folder {path.parent} for the atlas store: "
                             f"{exc.strerror or exc}") from None
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=config or {})
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise StoreLockedError(
                f"the atlas store {path} is in use by another process (DuckDB allows one writer, "
                "or readers only while no one writes). Wait for that process to finish "
                "(e.g. a running `atlas crawl`) and try again."
            ) from None
        raise _open_error(path, exc) from None
    except duckdb.Error as exc:
        raise _open_error(path, exc) from None
    if not read_only:
        try:
            con.execute(SCHEMA)
        except duckdb.Error as exc:
            with suppress(duckdb.Error):
                con.close()
            raise store_error(path, exc) from None
    return con


def _open_error(path: Path, exc: BaseException) -> AtlasError:
    return _disk_error(path, exc) or AtlasError(f"cannot open the atlas store {path}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# ---- rows the crawler hands over ----------------------------------------------------------------


@dataclass
class SnapshotRow:
    started_at: datetime
    finished_at: datetime
    endpoint: str
    watchlist_digest: str
    status: str
    n_listed: int
    n_fetched: int
    n_unchanged: int
    n_gated: int
    n_missing: int
    n_failed: int
    rule_version: str
    n_requests: int
    n_rate_limited: int
    problems: str | None
    n_seen: int | None = None
    coverage: str | None = None


@dataclass
class ModelRow:
    repo_id: str
    sha: str | None
    last_modified: datetime | None
    created_at: datetime | None
    downloads: int | None
    likes: int | None
    gated: str | None
    private: bool | None
    pipeline_tag: str | None
    library_name: str | None
    tags: list[str]
    base_models: list[str]
    base_relation: str | None
    is_derivative: bool
    is_exemplar: bool
    param_total: int | None
    fetch_status: str
    error: str | None  # about the config (or the repo); side files report in side_file_error
    side_file_error: str | None = None
    base_revision: str | None = None  # the base's commit the card says this repo matches (base_model_revision)


@dataclass
class BaseLookup:
    """A base model some repo of the snapshot names that the snapshot does not hold, asked of the
    hub on demand (atlas.hub.bases): whether it exists, and its MTP form at its current commit."""

    repo_id: str
    sha: str | None
    status: str  # 'ok', 'missing' (no such repo on the hub), 'gated' (exists; files not readable), 'error'
    error: str | None
    mtp_form: str | None
    mtp_form_evidence: str | None


@dataclass
class RawFile:
    repo_id: str
    sha: str
    filename: str
    content: str


@dataclass
class WeightNames:
    repo_id: str
    sha: str
    source: str
    names: list[str]


# where stored tensor names came from -> the file they were read from
WEIGHT_SOURCE_FILES = {"index": "model.safetensors.index.json", "header": "model.safetensors"}

FingerprintRows = list[tuple[str, str, str, str, str, str | None]]  # repo, sha, version, name, value, path


Scrub = Callable[[str], str]


def _keep(text: str) -> str:
    return text


def _column(values: Iterable[Any], scrub: Scrub = _keep) -> np.ndarray:
    """Every column goes in as text (or NULL) and is cast in SQL: no type guessing by the driver.
    Every text, list items included, goes through `scrub` (the crawl's hides its token)."""
    out = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, list):
            out.append(json.dumps([scrub(x) if isinstance(x, str) else x for x in v]))
        elif isinstance(v, bool):
            out.append("true" if v else "false")
        elif isinstance(v, datetime):
            out.append(v.isoformat())
        else:
            out.append(scrub(str(v)))
    return np.array(out, dtype=object)


def _bulk_insert(
    con: duckdb.DuckDBPyConnection,
    table: str,
    columns: dict[str, tuple[str, list[Any]]],
    unique_on: tuple[str, ...] = (),
    scrub: Scrub = _keep,
) -> None:
    """INSERT INTO table SELECT casts FROM registered numpy columns (one statement, any size);
    with `unique_on`, rows whose key is already in the table are skipped (an anti-join in SQL)."""
    lengths = {len(vals) for _, vals in columns.values()}
    if lengths == {0}:
        return
    data = {name: _column(vals, scrub) for name, (_, vals) in columns.items()}
    view = f"_bulk_{table}"
    con.register(view, data)
    try:
        casts = ", ".join(
            f"from_json(v.{n}, '[\"VARCHAR\"]')" if t == "VARCHAR[]" else f"v.{n}::{t}"
            for n, (t, _) in columns.items()
        )
        where = ""
        if unique_on:
            match = " AND ".join(f"t.{k} = v.{k}::{columns[k][0]}" for k in unique_on)
            where = f" WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE {match})"
        con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {casts} FROM {view} v{where}")
    finally:
        _unregister(con, view)


def _unregister(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Drop a registered relation; after a failed statement DuckDB refuses even that, and the
    failure that matters is the one already on its way."""
    with suppress(duckdb.Error):
        con.unregister(name)


@contextmanager
def _pairs_view(con: duckdb.DuckDBPyConnection, pairs: Iterable[tuple[str, str]]) -> Iterator[str]:
    """The given (repo_id, sha) pairs as a registered relation, so reads join in SQL."""
    unique = sorted(set(pairs))
    name = "_wanted_pairs"
    con.register(name, {"repo_id": _column(p[0] for p in unique), "sha": _column(p[1] for p in unique)})
    try:
        yield name
    finally:
        _unregister(con, name)


# ---- reads --------------------------------------------------------------------------------------


def _rows_for(
    con: duckdb.DuckDBPyConnection,
    pairs: Iterable[tuple[str, str]] | None,
    select: str,
    table: str,
    where: str = "",
    group: bool = False,
) -> list[tuple[Any, ...]]:
    """`SELECT {select} FROM {table} t [WHERE] [GROUP BY ALL]` limited to `pairs` (every row when
    None) by a join in SQL, so only the rows asked for leave the database."""
    tail = (f" WHERE {where}" if where else "") + (" GROUP BY ALL" if group else "")
    if pairs is None:
        return con.execute(f"SELECT {select} FROM {table} t{tail}").fetchall()
    pairs = set(pairs)
    if not pairs:
        return []
    with _pairs_view(con, pairs) as view:
        return con.execute(
            f"SELECT {select} FROM {table} t JOIN {view} p ON t.repo_id = p.repo_id AND t.sha = p.sha{tail}"
        ).fetchall()


def require_complete_snapshot(db: Path) -> int:
    """The newest complete snapshot's id; AtlasError when the store has none (evidence drawn from
    no snapshot would only count zeros)."""
    con = connect(db, read_only=True)
    try:
        rows = con.execute("SELECT max(snapshot_id) FROM snapshots WHERE status = 'complete'").fetchall()
        partial = con.execute("SELECT count(*) FROM snapshots WHERE status <> 'complete'").fetchall()[0][0]
    except duckdb.Error as exc:
        raise store_error(db, exc) from None
    finally:
        con.close()
    if not rows or rows[0][0] is None:
        extra = f" ({partial} partial snapshot(s) only: their crawls missed whole orgs)" if partial else ""
        raise AtlasError(f"the atlas store {db} has no complete snapshot{extra}: run `atlas crawl` "
                         "(or `make crawl-mirror` for the bundled mirror) first")
    return int(rows[0][0])


def stored_pairs(con: duckdb.DuckDBPyConnection, pairs: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """Those of `pairs` whose config.json (or, for a GGUF repo, a GGUF header record) is stored:
    these cost no config request in a new crawl."""
    rows = _rows_for(con, pairs, "DISTINCT t.repo_id, t.sha", "raw_files",
                     "t.filename = 'config.json' OR starts_with(t.filename, 'gguf-header:')")
    return {(r, s) for r, s in rows}


def load_inputs(
    con: duckdb.DuckDBPyConnection, pairs: Iterable[tuple[str, str]] | None = None
) -> dict[tuple[str, str], dict[str, Any]]:
    """Raw files and tensor names per (repo_id, sha) of `pairs` (every stored one when None):
    {'files': {name: text}, 'weights': (source, names)}."""
    pairs = None if pairs is None else set(pairs)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for repo, sha, filename, content in _rows_for(con, pairs, "t.repo_id, t.sha, t.filename, t.content", "raw_files"):
        out.setdefault((repo, sha), {"files": {}, "weights": None})["files"][filename] = content
    for repo, sha, source, names in _rows_for(con, pairs, "t.repo_id, t.sha, t.source, t.names", "weight_names"):
        if (repo, sha) in out:
            out[(repo, sha)]["weights"] = (source, names)
    return out


def fingerprint_versions(con: duckdb.DuckDBPyConnection, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    rows = _rows_for(con, pairs, "t.repo_id, t.sha, any_value(t.rule_version)", "fingerprints", group=True)
    return {(r, s): v for r, s, v in rows}


def fingerprint_values(con: duckdb.DuckDBPyConnection, pairs: Iterable[tuple[str, str]],
                       names: Sequence[str]) -> dict[tuple[str, str], dict[str, str]]:
    """The stored fingerprints `names` (name -> value) per (repo_id, sha) of `pairs`."""
    wanted = ", ".join("'" + n.replace("'", "''") + "'" for n in names)
    out: dict[tuple[str, str], dict[str, str]] = {}
    for repo, sha, name, value in _rows_for(con, pairs, "t.repo_id, t.sha, t.name, t.value", "fingerprints",
                                            f"t.name IN ({wanted})"):
        out.setdefault((repo, sha), {})[name] = value
    return out


def recent_base_lookups(con: duckdb.DuckDBPyConnection, repo_ids: Sequence[str], since: datetime) -> dict[str, BaseLookup]:
    """The newest settled lookup (ok, missing, gated) of each of `repo_ids` (by lower-cased id) in a
    snapshot finished at or after `since`: a crawl reuses it instead of asking again."""
    if not repo_ids:
        return {}
    con.register("_wanted_bases", {"repo_id": _column(sorted({r.lower() for r in repo_ids}))})
    try:
        rows = con.execute(
            "SELECT l.repo_id, l.sha, l.status, l.error, l.mtp_form, l.mtp_form_evidence FROM base_lookups l "
            "JOIN snapshots s USING (snapshot_id) JOIN _wanted_bases w ON w.repo_id = lower(l.repo_id) "
            "WHERE s.finished_at >= ? AND l.status IN ('ok', 'missing', 'gated') "
            "QUALIFY row_number() OVER (PARTITION BY lower(l.repo_id) ORDER BY l.snapshot_id DESC) = 1", [since]).fetchall()
    finally:
        _unregister(con, "_wanted_bases")
    return {r[0].lower(): BaseLookup(*r) for r in rows}


def side_file_state(
    con: duckdb.DuckDBPyConnection, pairs: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], tuple[set[str], dict[str, str]]]:
    """Per (repo_id, sha) of `pairs`: the side files settled in the store (stored, or tensor names
    from them: the index or the single-file header) and the permanent errors stored for them."""
    pairs = set(pairs)
    out: dict[tuple[str, str], tuple[set[str], dict[str, str]]] = {p: (set(), {}) for p in pairs}
    for repo, sha, filename in _rows_for(con, pairs, "t.repo_id, t.sha, t.filename", "raw_files"):
        out[(repo, sha)][0].add(filename)
    for repo, sha, source in _rows_for(con, pairs, "t.repo_id, t.sha, t.source", "weight_names"):
        out[(repo, sha)][0].add(WEIGHT_SOURCE_FILES[source])
    for repo, sha, filename, error in _rows_for(con, pairs, "t.repo_id, t.sha, t.filename, t.error", "file_errors"):
        out[(repo, sha)][1][filename] = error
    return out


# ---- writes -------------------------------------------------------------------------------------


def utc_now() -> datetime:
    """Store times are naive UTC (DuckDB TIMESTAMP), whatever the machine's time zone."""
    return datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)


def _replace_fingerprints(con: duckdb.DuckDBPyConnection, rows: FingerprintRows, scrub: Scrub = _keep) -> None:
    if not rows:
        return
    pairs = sorted({(r[0], r[1]) for r in rows})
    con.register("_fp_pairs", {"repo_id": _column(p[0] for p in pairs), "sha": _column(p[1] for p in pairs)})
    try:
        con.execute(
            "DELETE FROM fingerprints f USING _fp_pairs p WHERE f.repo_id = p.repo_id AND f.sha = p.sha"
        )
    finally:
        _unregister(con, "_fp_pairs")
    cols = ("repo_id", "sha", "rule_version", "name", "value", "path")
    _bulk_insert(con, "fingerprints", {c: ("VARCHAR", [r[i] for r in rows]) for i, c in enumerate(cols)}, scrub=scrub)


def _insert_snapshot_rows(con: duckdb.DuckDBPyConnection, snapshot_id: int, models: Sequence[ModelRow],
                          base_lookups: Sequence[BaseLookup], scrub: Scrub) -> None:
    """The rows that belong to one snapshot: its hub models and its base lookups."""
    types = {
        "last_modified": "TIMESTAMP", "created_at": "TIMESTAMP", "downloads": "BIGINT",
        "likes": "BIGINT", "private": "BOOLEAN", "tags": "VARCHAR[]", "base_models": "VARCHAR[]",
        "is_derivative": "BOOLEAN", "is_exemplar": "BOOLEAN", "param_total": "BIGINT",
    }
    fields = list(ModelRow.__dataclass_fields__)
    columns: dict[str, tuple[str, list[Any]]] = {"snapshot_id": ("INTEGER", [snapshot_id] * len(models))}
    for name in fields:
        columns[name] = (types.get(name, "VARCHAR"), [getattr(m, name) for m in models])
    _bulk_insert(con, "hub_models", columns, scrub=scrub)
    lookup_fields = list(BaseLookup.__dataclass_fields__)
    lookups: dict[str, tuple[str, list[Any]]] = {"snapshot_id": ("INTEGER", [snapshot_id] * len(base_lookups))}
    lookups |= {name: ("VARCHAR", [getattr(b, name) for b in base_lookups]) for name in lookup_fields}
    _bulk_insert(con, "base_lookups", lookups, scrub=scrub)


def write_snapshot(
    con: duckdb.DuckDBPyConnection,
    snapshot: SnapshotRow,
    models: Sequence[ModelRow],
    files: Sequence[RawFile],
    weights: Sequence[WeightNames],
    fingerprint_rows: FingerprintRows,
    file_errors: Sequence[tuple[str, str, str, str]] = (),
    scrub: Scrub = _keep,
    base_lookups: Sequence[BaseLookup] = (),
) -> int:
    """Write one whole snapshot in a single transaction and return its id. `file_errors` are
    (repo_id, sha, filename, error) for side files that can never be read at that sha (parse
    errors, over the size limit, a listed file that is absent); passing errors are not stored.
    Every text written goes through `scrub`."""
    con.execute("BEGIN TRANSACTION")
    try:
        (snapshot_id,) = con.execute("SELECT coalesce(max(snapshot_id), 0) + 1 FROM snapshots").fetchall()[0]
        now = utc_now()
        # raw files and tensor names are immutable per (repo_id, sha): insert only what is new
        _bulk_insert(
            con,
            "raw_files",
            {
                "repo_id": ("VARCHAR", [f.repo_id for f in files]),
                "sha": ("VARCHAR", [f.sha for f in files]),
                "filename": ("VARCHAR", [f.filename for f in files]),
                "content": ("VARCHAR", [f.content for f in files]),
                "fetched_at": ("TIMESTAMP", [now] * len(files)),
            },
            unique_on=("repo_id", "sha", "filename"),
            scrub=scrub,
        )
        _bulk_insert(
            con,
            "weight_names",
            {
                "repo_id": ("VARCHAR", [w.repo_id for w in weights]),
                "sha": ("VARCHAR", [w.sha for w in weights]),
                "source": ("VARCHAR", [w.source for w in weights]),
                "names": ("VARCHAR[]", [w.names for w in weights]),
            },
            unique_on=("repo_id", "sha"),
            scrub=scrub,
        )
        _bulk_insert(
            con,
            "file_errors",
            {c: ("VARCHAR", [e[i] for e in file_errors]) for i, c in enumerate(("repo_id", "sha", "filename", "error"))},
            unique_on=("repo_id", "sha", "filename"),
            scrub=scrub,
        )
        _replace_fingerprints(con, fingerprint_rows, scrub)
        s = snapshot
        con.execute(
            "INSERT INTO snapshots (snapshot_id, started_at, finished_at, endpoint, watchlist_digest, status, "
            "n_listed, n_fetched, n_unchanged, n_gated, n_missing, n_failed, rule_version, n_requests, "
            "n_rate_limited, problems, n_seen, coverage) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                snapshot_id, s.started_at, s.finished_at, scrub(s.endpoint), s.watchlist_digest, s.status,
                s.n_listed, s.n_fetched, s.n_unchanged, s.n_gated, s.n_missing, s.n_failed,
                s.rule_version, s.n_requests, s.n_rate_limited, s.problems and scrub(s.problems), s.n_seen,
                s.coverage and scrub(s.coverage),
            ],
        )
        _insert_snapshot_rows(con, snapshot_id, models, base_lookups, scrub)
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise
    return int(snapshot_id)


def write_fingerprints(con: duckdb.DuckDBPyConnection, rows: FingerprintRows) -> None:
    """Replace the fingerprints of the (repo_id, sha) pairs in `rows`, in one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        _replace_fingerprints(con, rows)
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Undo a failed write. A COMMIT that failed (a full disk) has already ended the transaction,
    and DuckDB then refuses the ROLLBACK: the error worth reporting is the first one."""
    with suppress(duckdb.Error):
        con.execute("ROLLBACK")
