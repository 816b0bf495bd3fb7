"""Evidence: named SQL queries against the store -> one Markdown file of named, escaped sections.

`atlas evidence` writes evidence/module-08.evidence.md. The file is committed, so the effect of a
crawl or an imported measurement is a reviewable diff; it is deterministic for a given store (no
generation timestamp). `atlas site build` reads it back (sections + facts) without the store.

Claim levels stay apart: declared, shipped and servable are *present* claims and never show a
speed-up; measured rows come only from measurement_cells, in their own table, each with its date
and record id. Every row of a present-claim table carries its snapshot date and revision.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel, ValidationError

from atlas import AtlasError
from atlas.site import servable as servable_matrix
from atlas.site.charts import Bar, bar_chart
from atlas.site.mdsafe import Markdown, code, escape, table

SECTIONS = (
    "declared",
    "aggregate",
    "shipped",
    "mismatches",
    "servable",
    "conformance",
    "measured",
    "adoption_chart",
    "layers_chart",
    "provenance",
)

QUERIES: dict[str, str] = {
    "snapshot": """
        SELECT snapshot_id, started_at, finished_at, endpoint, watchlist_digest,
               n_listed, n_fetched, n_unchanged, n_gated, n_missing, n_failed
        FROM snapshots WHERE status = 'complete'
        ORDER BY finished_at DESC, snapshot_id DESC LIMIT 1""",
    "declared": """
        SELECT repo_id, declared_num_mtp_layers, declared_key, revision, snapshot_date,
               coalesce(is_exemplar, false) AS is_exemplar,
               coalesce(is_derivative, false) AS is_derivative, base_model
        FROM mtp_fingerprints WHERE declared_num_mtp_layers IS NOT NULL
        ORDER BY is_exemplar DESC, declared_num_mtp_layers DESC, repo_id""",
    "aggregate": """
        SELECT count(*) AS n_models,
               count(*) FILTER (WHERE declared_num_mtp_layers > 0) AS n_declaring,
               count(*) FILTER (WHERE declared_num_mtp_layers = 0) AS n_declaring_zero,
               count(*) FILTER (WHERE declared_num_mtp_layers > 0
                                AND NOT coalesce(is_derivative, false)) AS n_originals,
               count(*) FILTER (WHERE declared_num_mtp_layers > 0
                                AND coalesce(is_derivative, false)) AS n_derivatives,
               count(*) FILTER (WHERE shipped_mtp_layers IS NOT NULL) AS n_shipped_known,
               count(*) FILTER (WHERE shipped_mtp_layers > 0) AS n_shipping,
               count(*) FILTER (WHERE fetch_status <> 'ok') AS n_not_fetched,
               count(*) FILTER (WHERE declared_num_mtp_layers IS NULL
                                AND fetch_status = 'ok') AS n_undeclared
        FROM mtp_fingerprints""",
    "layers": """
        SELECT declared_num_mtp_layers AS value, count(*) AS n
        FROM mtp_fingerprints WHERE declared_num_mtp_layers IS NOT NULL
        GROUP BY value ORDER BY value""",
    "exemplars": """
        SELECT repo_id FROM mtp_fingerprints WHERE is_exemplar ORDER BY repo_id""",
    "shipped": """
        SELECT repo_id, declared_num_mtp_layers, shipped_mtp_layers, shipped_evidence,
               revision, snapshot_date
        FROM mtp_fingerprints
        WHERE shipped_mtp_layers IS NOT NULL
          AND (coalesce(declared_num_mtp_layers, 0) > 0 OR shipped_mtp_layers > 0)
        ORDER BY coalesce(is_exemplar, false) DESC, repo_id""",
    "mismatches": """
        SELECT repo_id, declared_num_mtp_layers, declared_key, shipped_mtp_layers,
               shipped_evidence, revision, snapshot_date,
               CASE WHEN coalesce(declared_num_mtp_layers, 0) > 0 AND shipped_mtp_layers = 0
                        THEN 'declared, not shipped'
                    WHEN coalesce(declared_num_mtp_layers, 0) = 0 AND shipped_mtp_layers > 0
                        THEN 'shipped, not declared'
                    ELSE 'counts differ' END AS kind
        FROM mtp_fingerprints
        WHERE shipped_mtp_layers IS NOT NULL
          AND coalesce(declared_num_mtp_layers, 0) <> shipped_mtp_layers
        ORDER BY kind, repo_id""",
    "servable": """
        SELECT repo_id, model_type, architectures, declared_num_mtp_layers, shipped_mtp_layers,
               revision, snapshot_date
        FROM mtp_fingerprints
        WHERE coalesce(declared_num_mtp_layers, 0) > 0 OR coalesce(shipped_mtp_layers, 0) > 0
        ORDER BY coalesce(is_exemplar, false) DESC, repo_id""",
    "adoption": """
        SELECT snapshot_id, snapshot_date, count(*) AS n_models,
               count(*) FILTER (WHERE declared_num_mtp_layers > 0) AS n_declaring
        FROM mtp_fingerprints_history
        GROUP BY snapshot_id, snapshot_date ORDER BY snapshot_date, snapshot_id""",
    "rule_versions": """
        SELECT DISTINCT rule_version FROM mtp_fingerprints
        WHERE rule_version IS NOT NULL ORDER BY rule_version""",
    "measured": """
        SELECT run_date, model_id, revision, hardware, engine, engine_version, workload,
               temperature, draft_tokens, acceptance_rate, mean_accepted_length,
               speedup, speedup_lo, speedup_hi, baseline, gate_enabled, record_id
        FROM measurement_cells
        ORDER BY run_date, model_id, engine, workload, temperature, draft_tokens, record_id""",
    "measurement_sources": """
        SELECT record_id, any_value(source_path) AS source_path, any_value(command) AS command,
               min(run_date) AS run_date, count(*) AS n_cells
        FROM measurement_cells GROUP BY record_id ORDER BY run_date, record_id""",
}

NO_MEASUREMENT = "No measurement yet."


class Facts(BaseModel):
    """Numbers the course prose may use. Prose takes every number from here, never types one."""

    snapshot_date: str | None
    snapshot_id: int | None
    n_models: int
    n_declaring: int
    n_declaring_zero: int
    n_layers: dict[int, int]
    n_shipped_known: int
    n_shipping: int
    n_mismatches: int
    n_originals_declaring: int
    n_derivatives_declaring: int
    n_not_fetched: int
    n_undeclared: int
    n_measurements: int
    n_measurement_records: int
    n_servable: int
    servable_date: str
    exemplars: list[str]


class Evidence(BaseModel):
    facts: Facts
    sections: dict[str, str]


# ---- running the queries -----------------------------------------------------------------------


def _rows(con: duckdb.DuckDBPyConnection, name: str) -> list[dict[str, Any]]:
    cur = con.execute(QUERIES[name])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    found = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
    ).fetchone()
    return bool(found and found[0])


def _measured_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    if not _has_table(con, "measurement_cells"):
        return []
    found = con.execute(
        "SELECT count(*) FROM information_schema.columns "
        "WHERE table_name = 'measurement_cells' AND column_name = 'baseline'"
    ).fetchone()
    if not (found and found[0]):
        # the store is open read-only here; the import brings the table up to date
        raise AtlasError("the store's measurements predate the baseline column: run "
                         "`atlas measure import` first")
    return _rows(con, "measured")


def _date(value: dt.datetime | dt.date | None) -> str:
    return value.strftime("%Y-%m-%d") if value is not None else "—"


def _rev(revision: str | None) -> Markdown:
    # 12 hex digits identify a commit unambiguously in practice and keep the tables readable;
    # the provenance section says so. A checkpoint digest keeps its scheme ("sha256:") in front.
    if not revision:
        return Markdown("—")
    scheme, _, digest = revision.rpartition(":")
    short = f"{scheme}:{digest[:12]}" if scheme else digest[:12]
    return Markdown(f'<code class="atlas-rev">{escape(short)}</code>')


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def collect(con: duckdb.DuckDBPyConnection, matrix_path: Path) -> Evidence:
    """Run every named query and build the sections and facts."""
    matrix = servable_matrix.load(matrix_path)
    snaps = _rows(con, "snapshot")
    snap = snaps[0] if snaps else None
    agg = _rows(con, "aggregate")[0]
    layers = {int(r["value"]): int(r["n"]) for r in _rows(con, "layers")}
    measured = _measured_rows(con)
    sources = _rows(con, "measurement_sources") if measured else []
    mismatch_rows = _rows(con, "mismatches")
    servable_rows = _rows(con, "servable")
    for r in servable_rows:
        r["engines"] = matrix.engines_for(r["model_type"], _archs(r["architectures"]))
    n_servable = sum(1 for r in servable_rows if r["engines"])
    facts = Facts(
        snapshot_date=_date(snap["finished_at"]) if snap else None,
        snapshot_id=snap["snapshot_id"] if snap else None,
        n_models=agg["n_models"],
        n_declaring=agg["n_declaring"],
        n_declaring_zero=agg["n_declaring_zero"],
        n_layers=layers,
        n_shipped_known=agg["n_shipped_known"],
        n_shipping=agg["n_shipping"],
        n_mismatches=len(mismatch_rows),
        n_originals_declaring=agg["n_originals"],
        n_derivatives_declaring=agg["n_derivatives"],
        n_not_fetched=agg["n_not_fetched"],
        n_undeclared=agg["n_undeclared"],
        n_measurements=len(measured),
        n_measurement_records=len(sources),
        n_servable=n_servable,
        servable_date=matrix.date.isoformat(),
        exemplars=[r["repo_id"] for r in _rows(con, "exemplars")],
    )
    sections = {
        "declared": _declared(_rows(con, "declared")),
        "aggregate": _aggregate(facts, snap),
        "shipped": _shipped(_rows(con, "shipped"), facts),
        "mismatches": _mismatches(mismatch_rows),
        "servable": _servable(servable_rows, matrix),
        "conformance": _conformance(matrix_path.parent / "conformance"),
        "measured": _measured(measured, sources),
        "adoption_chart": _adoption_chart(_rows(con, "adoption")),
        "layers_chart": _layers_chart(layers, facts),
        "provenance": _provenance(
            snap, _rows(con, "rule_versions"), sources, matrix, matrix_path, facts
        ),
    }
    return Evidence(facts=facts, sections=sections)


def _archs(joined: str | None) -> list[str]:
    return [a.strip() for a in (joined or "").split(",") if a.strip()]


# ---- sections --------------------------------------------------------------------------------


def _guardrail(kind: str, title: str, text: str) -> str:
    # Custom admonition types (declared/shipped/servable/measured) are styled in atlas.css.
    return f'!!! {kind} "{title}"\n    {text}\n'


def _declared(rows: list[dict[str, Any]]) -> str:
    head = _guardrail(
        "declared",
        "Declared: what the config says",
        "A key and its value in config.json at the revision shown. It says nothing about whether "
        "the weights ship, whether an engine serves them, or how fast anything runs.",
    )
    if not rows:
        return head + "\nNo model in this snapshot declares an MTP key.\n"
    body = []
    for r in rows:
        notes: list[str] = []
        if r["is_exemplar"]:
            notes.append("exemplar")
        if r["declared_num_mtp_layers"] == 0:
            notes.append("0 declares no MTP")
        if r["is_derivative"]:
            notes.append("derivative" + (f" of {escape(r['base_model'])}" if r["base_model"] else ""))
        body.append(
            [
                escape(r["repo_id"]),
                r["declared_num_mtp_layers"],
                code(r["declared_key"]) if r["declared_key"] else Markdown("—"),
                _rev(r["revision"]),
                _date(r["snapshot_date"]),
                Markdown("; ".join(notes)) if notes else Markdown(""),
            ]
        )
    return head + "\n" + table(
        ["model", "#num_mtp_layers", "key", "revision", "snapshot", "note"], body
    ) + "\n"


def _aggregate(facts: Facts, snap: dict[str, Any] | None) -> str:
    if snap is None:
        return "No complete snapshot in the store yet: nothing to count.\n"
    by_value = ", ".join(
        f"{n} with {v}" for v, n in sorted(facts.n_layers.items()) if v > 0
    )
    line = (
        f"Snapshot #{facts.snapshot_id} of {facts.snapshot_date}: of {facts.n_models} current "
        f"models, {facts.n_declaring} declare MTP (num_mtp_layers > 0)"
    )
    line += f": {by_value}." if by_value else "."
    if facts.n_declaring:
        line += (
            f" Of those, {facts.n_originals_declaring} are originals and "
            f"{facts.n_derivatives_declaring} derivatives (quantizations, fine-tunes, conversions)."
        )
    if facts.n_declaring_zero:
        line += f" {facts.n_declaring_zero} set the key to 0, which declares no MTP."
    line += (
        f" {facts.n_undeclared} have no MTP key (not declared, which is not the same as no MTP)."
    )
    if facts.n_not_fetched:
        line += f" {facts.n_not_fetched} could not be read (gated, missing or failed)."
    return escape(line) + "\n"


def _shipped(rows: list[dict[str, Any]], facts: Facts) -> str:
    head = _guardrail(
        "shipped",
        "Shipped: what the weight index holds",
        "MTP tensors counted from weight names at the revision shown. Weights present do not "
        "mean MTP is enabled when the model is served.",
    )
    known = escape(
        f"Weight names are known for {facts.n_shipped_known} of {facts.n_models} models in "
        f"snapshot #{facts.snapshot_id} ({facts.snapshot_date}); elsewhere shipped is unknown, "
        f"not no."
    )
    if not rows:
        return head + "\n" + known + "\n\nNo model with known weight names declares or ships MTP.\n"
    body = []
    for r in rows:
        d, s = r["declared_num_mtp_layers"], r["shipped_mtp_layers"]
        if (d or 0) > 0 and s == 0:
            verdict = "declared, not shipped"
        elif (d or 0) == 0 and s > 0:
            verdict = "shipped, not declared"
        elif d != s:
            verdict = "counts differ"
        else:
            verdict = "agrees"
        body.append(
            [
                escape(r["repo_id"]),
                d,
                s,
                code(r["shipped_evidence"]) if r["shipped_evidence"] else Markdown("—"),
                _rev(r["revision"]),
                _date(r["snapshot_date"]),
                verdict,
            ]
        )
    return (
        head
        + "\n"
        + known
        + "\n\n"
        + table(
            ["model", "#declared", "#shipped MTP layers", "weight names", "revision", "snapshot",
             "config vs weights"],
            body,
        )
        + "\n"
    )


def _mismatches(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No mismatch between declared and shipped among models with known weight names.\n"
    body = [
        [
            r["kind"],
            escape(r["repo_id"]),
            r["declared_num_mtp_layers"],
            code(r["declared_key"]) if r["declared_key"] else Markdown("—"),
            r["shipped_mtp_layers"],
            code(r["shipped_evidence"]) if r["shipped_evidence"] else Markdown("—"),
            _rev(r["revision"]),
            _date(r["snapshot_date"]),
        ]
        for r in rows
    ]
    return table(
        ["mismatch", "model", "#declared", "key", "#shipped", "weight names", "revision",
         "snapshot"],
        body,
    ) + "\n"


def _servable(rows: list[dict[str, Any]], matrix: servable_matrix.Matrix) -> str:
    head = _guardrail(
        "servable",
        f"Servable: support matrix of {matrix.date.isoformat()}",
        "An engine implements MTP drafting for the architecture, at the version shown. This is "
        "not a measurement, and it does not check that this checkpoint ships the MTP weights.",
    )
    if not rows:
        return head + "\nNo current model declares or ships MTP, so nothing to match.\n"
    body = []
    for r in rows:
        engines = r["engines"]
        common = [
            escape(r["repo_id"]),
            code(r["model_type"]) if r["model_type"] else Markdown("—"),
        ]
        stamp = [_rev(r["revision"]), _date(r["snapshot_date"])]
        if not engines:
            body.append(common + ["no engine in the matrix", "—", "—"] + stamp)
        for e in engines:
            body.append(common + [e.engine, e.version, code(e.method)] + stamp)
    sources = "\n".join(
        f"- {escape(e.engine)} {escape(e.version)}: {escape(e.source)}"
        + (f" ({escape(e.note)})" if e.note else "")
        for e in matrix.entry
    )
    return (
        head
        + "\n"
        + table(["model", "model_type", "engine", "engine version", "method", "revision",
                 "snapshot"], body)
        + f"\n\nSources of the support matrix (dated {matrix.date.isoformat()}):\n\n"
        + sources
        + "\n"
    )


def _conformance(folder: Path) -> str:
    """Engine conformance verdicts (evidence/conformance/, beside the support matrix)."""
    from atlas.measure.conformance import evidence_table

    head = _guardrail(
        "servable",
        "Checked lossless: engine conformance records",
        "Each row is a dated run of the conformance suite against one engine version on one MTP "
        "layout: oracle checkpoints whose right answers are exact, and random ones. It checks the "
        "engine's MTP, not a given checkpoint.",
    )
    return head + "\n" + evidence_table(folder, folder.parent.parent)


def _measured(rows: list[dict[str, Any]], sources: list[dict[str, Any]]) -> str:
    head = _guardrail(
        "measured",
        "Measured: one dated run per row",
        "A measurement holds for its row only: that model revision, hardware, engine, workload, "
        "temperature and draft length. It is never generalised.",
    )
    if not rows:
        return head + "\n" + NO_MEASUREMENT + "\n"
    body = []
    for r in rows:
        speed = _num(r["speedup"], 2)
        if r["speedup"] is not None and r["speedup_lo"] is not None and r["speedup_hi"] is not None:
            speed += f" ({r['speedup_lo']:.2f}–{r['speedup_hi']:.2f})"
        engine = r["engine"] + (f" {r['engine_version']}" if r["engine_version"] else "")
        body.append(
            [
                _date(r["run_date"]),
                escape(r["model_id"]),
                _rev(r["revision"]),
                escape(r["hardware"]),
                escape(engine),
                escape(r["workload"]),
                _num(r["temperature"], 2),
                r["draft_tokens"],
                _num(r["acceptance_rate"], 3),
                _num(r["mean_accepted_length"], 2),
                speed,
                escape(r["baseline"]) if r["baseline"] else Markdown("—"),
                {True: "on", False: "off"}.get(r["gate_enabled"], "—"),
                _rev(r["record_id"]),
            ]
        )
    src = table(
        ["record", "file", "command", "date", "#cells"],
        [
            [code(s["record_id"][:12]), code(s["source_path"]), code(s["command"]),
             _date(s["run_date"]), s["n_cells"]]
            for s in sources
        ],
    )
    return (
        head
        + "\n"
        + table(
            ["date", "model", "revision", "hardware", "engine", "workload", "#temperature",
             "#draft tokens", "#acceptance", "#accepted length", "#speedup (range)", "baseline",
             "gate", "source record"],
            body,
        )
        + "\n\nSpeed-up: plain time over speculative time for the same tokens, median over repeats "
        "(range in brackets); the plain time is the row's baseline, so speed-ups of rows with "
        "different baselines do not compare. Gate: on only where the slowest repeat was still faster than plain "
        "decoding. Sources: each record is a file under evidence/measurements/, made by the "
        "command shown.\n\n"
        + src
        + "\n"
    )


def _adoption_chart(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No complete snapshot yet: no adoption chart.\n"
    dates = [_date(r["snapshot_date"]) for r in rows]
    bars = [
        Bar(
            label=d if dates.count(d) == 1 else f"{d} #{r['snapshot_id']}",
            value=100.0 * r["n_declaring"] / r["n_models"] if r["n_models"] else 0.0,
            annotation=f"{r['n_declaring']} of {r['n_models']}",
        )
        for d, r in zip(dates, rows)
    ]
    chart = bar_chart("Models declaring MTP, per snapshot", bars, "% of models", y_max=100.0)
    caption = escape(
        f"Share of the crawled models whose config declares num_mtp_layers > 0, in each of the "
        f"{len(rows)} complete snapshots from {dates[0]} to {dates[-1]} (store view "
        f"mtp_fingerprints_history). The watch list can change between snapshots, so read the "
        f"share, not the count."
    )
    return chart + "\n\n" + caption + "\n"


def _layers_chart(layers: dict[int, int], facts: Facts) -> str:
    if not layers:
        return "No model declares an MTP key in this snapshot: no distribution to chart.\n"
    bars = [Bar(label=f"{v} layer" + ("" if v == 1 else "s"), value=n) for v, n in layers.items()]
    chart = bar_chart("Declared num_mtp_layers, current models", bars, "models")
    caption = escape(
        f"Snapshot #{facts.snapshot_id} of {facts.snapshot_date}: the {sum(layers.values())} "
        f"models that carry an MTP key, by declared value. Models without the key are not counted."
    )
    return chart + "\n\n" + caption + "\n"


def _provenance(
    snap: dict[str, Any] | None,
    rules: list[dict[str, Any]],
    sources: list[dict[str, Any]],
    matrix: servable_matrix.Matrix,
    matrix_path: Path,
    facts: Facts,
) -> str:
    lines = ["**Provenance of this evidence**", ""]
    if snap is None:
        lines.append("- Store: no complete snapshot yet.")
    else:
        lines.append(
            f"- Store snapshot #{snap['snapshot_id']}: crawl started "
            f"{escape(_stamp(snap['started_at']))}, finished {escape(_stamp(snap['finished_at']))} "
            f"UTC, endpoint {code(snap['endpoint'])}, watch list digest "
            f"{code((snap['watchlist_digest'] or '')[:12])}."
        )
        lines.append(
            f"- Repositories: {snap['n_listed']} listed, {snap['n_fetched']} fetched, "
            f"{snap['n_unchanged']} unchanged since the previous snapshot, {snap['n_gated']} "
            f"gated, {snap['n_missing']} missing, {snap['n_failed']} failed."
        )
    if rules:
        lines.append(
            "- Fingerprint rules: " + ", ".join(code(r["rule_version"]) for r in rules) + "."
        )
    lines.append(
        "- Revisions are shown as the first 12 hex digits of the Hub commit the files were read at."
    )
    lines.append(
        f"- Servable: {escape(matrix_path.name)}, dated {matrix.date.isoformat()}, "
        f"{len(matrix.entry)} engines; sources listed under the servable table."
    )
    if sources:
        lines.append(
            f"- Measured: {facts.n_measurements} cells from {len(sources)} record files; each "
            f"row names its record (sha256 of the file, first 12 hex digits)."
        )
    else:
        lines.append("- Measured: no measurement record imported.")
    lines.append(
        "- Regenerate: `atlas crawl`, `atlas measure import`, then `atlas evidence` "
        "(all three: `make evidence`)."
    )
    return "\n".join(lines) + "\n"


def _stamp(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else "—"


# ---- the evidence file -------------------------------------------------------------------------

_FACTS_RE = re.compile(r"^<!-- atlas-facts: (\{.*\}) -->$", re.M)
_SECTION_RE = re.compile(
    r"^<!-- atlas-section: (\w+) -->\n(.*?)^<!-- /atlas-section: \1 -->$", re.M | re.S
)


def _json_for_comment(data: dict[str, Any]) -> str:
    # Escaping <, > and & keeps `-->` (from a hostile id among the exemplars) out of the comment.
    text = json.dumps(data, ensure_ascii=True, sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def dumps(evidence: Evidence) -> str:
    parts = [
        "<!-- Generated by `atlas evidence` from the atlas store; do not edit by hand. -->",
        f"<!-- atlas-facts: {_json_for_comment(evidence.facts.model_dump(mode='json'))} -->",
        "",
    ]
    for name in SECTIONS:
        parts += [
            f"## {name}",
            "",
            f"<!-- atlas-section: {name} -->",
            evidence.sections[name].rstrip("\n"),
            f"<!-- /atlas-section: {name} -->",
            "",
        ]
    return "\n".join(parts)


def loads(text: str, origin: str) -> Evidence:
    found = _FACTS_RE.search(text)
    if not found:
        raise AtlasError(f"{origin}: no facts line; regenerate it with `atlas evidence`")
    sections = {m.group(1): m.group(2).rstrip("\n") + "\n" for m in _SECTION_RE.finditer(text)}
    missing = [s for s in SECTIONS if s not in sections]
    if missing:
        raise AtlasError(f"{origin}: missing sections {', '.join(missing)}; run `atlas evidence`")
    try:
        facts = Facts.model_validate_json(found.group(1))
    except ValidationError as exc:
        raise AtlasError(f"{origin}: facts do not match this version: {exc}") from None
    return Evidence(facts=facts, sections=sections)


def read(path: Path) -> Evidence:
    try:
        return loads(path.read_text(encoding="utf-8"), str(path))
    except FileNotFoundError:
        raise AtlasError(f"no evidence file {path}: run `atlas evidence` first") from None


def write(evidence: Evidence, path: Path) -> bool:
    """Write the evidence file; returns whether its content changed."""
    text = dumps(evidence)
    old = path.read_text(encoding="utf-8") if path.exists() else None
    if old != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        # written aside and renamed: a full disk or a kill mid-write never leaves a torn file
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, path)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise AtlasError(f"cannot write the evidence file {path}: {exc.strerror or exc}; the old one is intact") from None
    return old != text


def generate(db: Path, out: Path, matrix_path: Path) -> Evidence:
    """`atlas evidence`: open the store read-only, collect, write the file."""
    from atlas import store

    con = store.connect(db, read_only=True)
    try:
        evidence = collect(con, matrix_path)
    finally:
        con.close()
    write(evidence, out)
    return evidence
