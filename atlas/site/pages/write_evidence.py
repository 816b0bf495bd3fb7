"""Evidence: named SQL queries against the store -> the facts and the named, escaped sections of
the evidence file, and `atlas evidence`, which writes them.

`atlas evidence` writes evidence/module-08.evidence.md (its format: atlas.site.parts.evidence_file). The
present-claim sections come from atlas.site.parts.present_claims, the servable and conformance ones from
atlas.site.parts.servable_tables, the measured ones from atlas.site.parts.measured; the summary and the
provenance are written here.

Claim levels stay apart: declared, shipped and servable are *present* claims and never show a
speed-up; measured rows come only from imported measurement records (atlas/site/parts/measured.py), in
their own tables, each run with its date and record id. Every row of a present-claim table carries
its revision and crawl date, and the revision says what it is: a Hub commit (linked) after a live
crawl, a content hash of the bundled mirror folder after a mirror crawl, whose files' real origin
(SOURCES.tsv) is listed beside it.

Models this project made itself (atlas.store.db.PROJECT_ORGS: the team model, oracle checkpoints) are not the
Hub: they are left out of every count, chart and exemplar list and shown in their own row group.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import duckdb

from atlas.store import db as store
from atlas.hub.local.mirror import MIRROR_FILE, MIRROR_PREFIX, load_mirror_date
from atlas.evidence import catalog, head_engines
from atlas.evidence import runs as evidence_runs
from atlas.evidence import servable as servable_matrix
from atlas.conformance import record as conformance
from atlas.site.parts import fold, measured_charts, present_claims, servable_tables
from atlas.site.pages import runpages
from atlas.site.parts import measured as measured_section
from atlas.site.parts.evidence_file import Evidence, Facts, write
from atlas.site.parts.evidence_format import Revisions, date_text, guardrail
from atlas.site.parts.mdsafe import code, escape

_OURS = store.ours()

QUERIES: dict[str, str] = {
    "snapshot": """
        SELECT snapshot_id, started_at, finished_at, endpoint, watchlist_digest,
               n_listed, n_fetched, n_unchanged, n_gated, n_missing, n_failed
        FROM snapshots WHERE status = 'complete'
        ORDER BY finished_at DESC, snapshot_id DESC LIMIT 1""",
    "declared": f"""
        SELECT repo_id, declared_num_mtp_layers, declared_key, revision, snapshot_date,
               coalesce(is_exemplar, false) AND NOT {_OURS} AS is_exemplar,
               coalesce(is_derivative, false) AS is_derivative, base_model, {_OURS} AS is_ours
        FROM mtp_fingerprints WHERE declared_num_mtp_layers IS NOT NULL
        ORDER BY is_ours, is_exemplar DESC, declared_num_mtp_layers DESC, repo_id""",
    "aggregate": f"""
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
        FROM mtp_fingerprints WHERE NOT {_OURS}""",
    "project_models": f"""
        SELECT count(*) AS n FROM mtp_fingerprints WHERE {_OURS}""",
    "layers": f"""
        SELECT declared_num_mtp_layers AS value, count(*) AS n
        FROM mtp_fingerprints WHERE declared_num_mtp_layers IS NOT NULL AND NOT {_OURS}
        GROUP BY value ORDER BY value""",
    "exemplars": f"""
        SELECT repo_id FROM mtp_fingerprints WHERE is_exemplar AND NOT {_OURS} ORDER BY repo_id""",
    "shipped": f"""
        SELECT repo_id, declared_num_mtp_layers, shipped_mtp_layers, shipped_evidence,
               revision, snapshot_date, {_OURS} AS is_ours
        FROM mtp_fingerprints
        WHERE shipped_mtp_layers IS NOT NULL
          AND (coalesce(declared_num_mtp_layers, 0) > 0 OR shipped_mtp_layers > 0)
        ORDER BY is_ours, coalesce(is_exemplar, false) DESC, repo_id""",
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
    "servable": f"""
        SELECT repo_id, model_type, architectures, declared_num_mtp_layers, shipped_mtp_layers,
               revision, snapshot_date, {_OURS} AS is_ours
        FROM mtp_fingerprints
        WHERE coalesce(declared_num_mtp_layers, 0) > 0 OR coalesce(shipped_mtp_layers, 0) > 0
        ORDER BY coalesce(is_exemplar, false) DESC, repo_id""",
    "adoption": f"""
        SELECT snapshot_id, snapshot_date, count(*) AS n_models,
               count(*) FILTER (WHERE declared_num_mtp_layers > 0) AS n_declaring
        FROM mtp_fingerprints_history WHERE NOT {_OURS}
        GROUP BY snapshot_id, snapshot_date ORDER BY snapshot_date, snapshot_id""",
    # Creation dates come from the Hub listing (createdAt) of the latest snapshot.
    "created": f"""
        SELECT f.repo_id, h.created_at
        FROM mtp_fingerprints f
        JOIN hub_models h ON h.snapshot_id = f.snapshot_id AND h.repo_id = f.repo_id
        WHERE f.declared_num_mtp_layers > 0 AND NOT {_OURS.replace('repo_id', 'f.repo_id')}
        ORDER BY h.created_at NULLS LAST, f.repo_id""",
    "rule_versions": """
        SELECT DISTINCT rule_version FROM mtp_fingerprints
        WHERE rule_version IS NOT NULL ORDER BY rule_version""",
}


NO_MEASUREMENT = measured_section.NO_MEASUREMENT


# ---- running the queries -----------------------------------------------------------------------


def _rows(con: duckdb.DuckDBPyConnection, name: str) -> list[dict[str, Any]]:
    cur = con.execute(QUERIES[name])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


# the reported figure a real model's chat acceptance is shown beside (never compared as equal)
_ANCHOR = "deepseek-v3-second-token-acceptance"


def collect(con: duckdb.DuckDBPyConnection, cat: catalog.Catalog, mirror_sources: Path | None = None) -> Evidence:
    """Run every named query and build the sections and facts, with the evidence catalog loaded on
    `con` (atlas.evidence.catalog)."""
    matrix = cat.matrix
    snaps = _rows(con, "snapshot")
    snap = snaps[0] if snaps else None
    revs = Revisions(snap, load_mirror_date(mirror_sources.parent if mirror_sources else None))
    agg = _rows(con, "aggregate")[0]
    n_ours = _rows(con, "project_models")[0]["n"]
    layers = {int(r["value"]): int(r["n"]) for r in _rows(con, "layers")}
    runs = cat.runs
    mismatch_rows = _rows(con, "mismatches")
    servable_rows = [r for r in _rows(con, "servable") if not r["is_ours"]]
    for r in servable_rows:
        r["engines"] = cat.serving[r["repo_id"]]
    created = _rows(con, "created")
    facts = Facts(
        snapshot_date=date_text(snap["finished_at"]) if snap else None,
        data_date=date_text(revs.mirror_date or snap["finished_at"]) if snap else None,
        snapshot_id=snap["snapshot_id"] if snap else None,
        mirror_build=revs.mirror,
        n_models=agg["n_models"],
        n_project_models=n_ours,
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
        n_created_known=sum(1 for r in created if present_claims.known_created(r["created_at"])),
        # smoke runs (--quick) are never evidence, so never counted
        n_measurements=sum(len(r.record.cells) for r in runs if not r.record.settings.quick),
        n_measurement_records=sum(1 for r in runs if not r.record.settings.quick),
        n_servable=sum(1 for r in servable_rows if r["engines"]),
        servable_date=matrix.date.isoformat(),
        exemplars=[r["repo_id"] for r in _rows(con, "exemplars")],
    )
    mirror = present_claims.load_mirror_sources(mirror_sources) if revs.mirror else []
    verdicts = cat.verdicts
    sections = {
        "summary": _summary(facts, revs, verdicts, runs),
        "declared": present_claims.declared(_rows(con, "declared"), revs, mirror),
        "aggregate": present_claims.aggregate(facts, snap, revs),
        "shipped": present_claims.shipped(_rows(con, "shipped"), facts, revs),
        "mismatches": present_claims.mismatches(mismatch_rows, revs),
        "servable": servable_tables.servable(servable_rows, matrix, verdicts),
        "conformance": servable_tables.conformance_grid(verdicts),
        # reported, not servable: which engines use the head, per PR (evidence/head_engines.toml)
        "head_engines": servable_tables.head_engines(head_engines.beside(cat.servable_path)) or "No head-engines table.\n",
        # module 8 keeps one row per run; the runs' own pages (docs/runs/) hold every figure
        "measured": measured_section.compact_summary(runs, "../runs/"),
        "adoption_chart": present_claims.adoption(_rows(con, "adoption"), created),
        "layers_chart": present_claims.layers_chart(layers, facts, revs),
        "provenance": _provenance(snap, _rows(con, "rule_versions"), runs, matrix, cat.servable_path,
                                  facts, revs),
        "backfires": measured_section.backfires_text(runs) + "\n",
        "verdict_measured": measured_section.measured_line(runs),
        "answer": measured_section.answer_text(runs, "../runs/"),
        "runs": runpages.run_pages(runs, [f for f in cat.figures if f.id == _ANCHOR]),
        "runs_index": _MEASURED_HEAD + "\n" + runpages.runs_index(runs, "runs/"),
        "plain_answer": measured_section.plain_answer(runs),
        # folded: the answer above names the run and its figures; the page's budget (15 screens at 1400 x 900)
        "measured_charts": fold.more("charts of the featured run: acceptance by draft position, speed-up by workload",
                                     lambda: measured_charts.featured_charts(runs)) + "\n",
        "break_even": fold.more("the break-even chart: every run with pass costs against its k = 1 acceptance",
                                lambda: measured_charts.break_even_chart(runs)) + "\n",
    }
    return Evidence(facts=facts, sections=sections)


# ---- module 8's summary and provenance ----------------------------------------------------------


_MEASURED_HEAD = guardrail(
    "measured",
    "Measured: one dated run per table",
    "A measurement holds for its run only: that model revision, hardware, engine, workload, "
    "temperature and draft length. It is never generalised.",
)


def _summary(facts: Facts, revs: Revisions, verdicts: list[conformance.Verdict],
             runs: list[evidence_runs.Run]) -> str:
    """"What the evidence says": five lines, one per claim level, each generated from the facts,
    the conformance verdicts or the measurement records (never typed)."""
    if facts.snapshot_id is None:
        present = ["**Declared, shipped, servable:** no complete snapshot in the store yet."]
    else:
        one = facts.n_layers.get(1, 0)
        present = [
            f"**Declared:** {facts.n_declaring} of the {facts.n_models} Hub models in "
            f"{revs.stamp(facts)} declare MTP, {one} of them exactly one MTP layer.",
            f"**Shipped:** weight names are known for {facts.n_shipped_known} of the "
            f"{facts.n_models}; {facts.n_shipping} of those ship MTP tensors; config and weights "
            f"disagree for {facts.n_mismatches}.",
            f"**Servable:** {facts.n_servable} of the models that declare or ship MTP belong to a "
            f"family an engine can draft for (support matrix of {facts.servable_date}).",
        ]
    if verdicts:
        per_build = []
        for build in dict.fromkeys(v.build for v in verdicts):  # the release and a patched build apart
            mine = [v for v in verdicts if v.build == build]
            words = [conformance.outcome(v) for v in mine]
            counts = ", ".join(f"{word} in {words.count(word)}"
                               for word in ("lossless", "inconclusive", "fails") if word in words)
            per_build.append(f"{escape(build)}{' (a patched build, not the release)' if mine[0].patched else ''}, run of "
                             f"{max(v.date for v in mine)}: {counts} of its {len(mine)} layout × temperature × draft-method cells")
        checked = "**Checked lossless:** " + "; ".join(per_build) + "."
    else:
        checked = "**Checked lossless:** no engine conformance record yet."
    numbered = measured_section.evidence_runs(runs)
    if numbered:
        cells = [c for _, r in numbered for c in r.record.cells]
        models = sorted({r.record.model_id for _, r in numbered})
        hardware = sorted({r.record.hardware.label() for _, r in numbered})
        days = sorted({f"{r.record.run_date:%Y-%m-%d}" for _, r in numbered})
        greedy = [c.derived.greedy_lossless for c in cells if c.derived.greedy_lossless is not None]
        kinds = {r.record.model_id: measured_section.label(r) for _, r in numbered}
        measured = (f"**Measured:** {len(cells)} cells in {len(numbered)} dated runs of "
                    + ", ".join(code(m) + escape(kinds[m]) for m in models) + f" only, on {escape('; '.join(hardware))}, "
                    + f"{' to '.join(dict.fromkeys([days[0], days[-1]]))}: "
                    f"{len(measured_section.below_one(runs))} cells slower than plain decoding; "
                    f"greedy output identical in {sum(greedy)} of {len(greedy)} T = 0 cells.")
    else:
        measured = "**Measured:** nothing yet; no speed-up on this page is the atlas's own."
    lines = [*present, checked, measured]
    return ('!!! abstract "What the evidence says"\n'
            + "\n".join(f"    - {line}" for line in lines) + "\n")


def _provenance(
    snap: dict[str, Any] | None,
    rules: list[dict[str, Any]],
    runs: list[evidence_runs.Run],
    matrix: servable_matrix.Matrix,
    matrix_path: Path,
    facts: Facts,
    revs: Revisions,
) -> str:
    lines = ["**Provenance of this evidence**", ""]
    if snap is None:
        lines.append("- Store: no complete snapshot yet.")
    else:
        source = (f"the bundled offline mirror {code(snap['endpoint'].removeprefix(MIRROR_PREFIX))} "
                  f"served on 127.0.0.1" if revs.mirror else f"the Hub at {code(snap['endpoint'])}")
        dates = (f"Dates in the tables (\"data of\") are the mirror's own date, "
                 f"{revs.mirror_date.isoformat()} ({MIRROR_FILE}), the day its files were last "
                 f"changed: a later crawl of the same files does not make them newer."
                 if revs.mirror_date else
                 "\"Crawled\" dates in the tables are this crawl's date, not a date a file was "
                 "published.")
        lines.append(
            f"- Store snapshot #{snap['snapshot_id']}: a {'mirror crawl' if revs.mirror else 'crawl'} "
            f"of {source}, started "
            f"{escape(_stamp(snap['started_at']))} and finished {escape(_stamp(snap['finished_at']))} "
            f"UTC; watch list digest {code((snap['watchlist_digest'] or '')[:12])}. " + dates
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
    if revs.mirror:
        lines.append(
            "- Revisions are the first 12 hex digits of a hash of each mirror folder's file "
            "contents, made by the local hub server: they identify the bundled files, not a Hub "
            "commit. Where each file was copied from is listed under the "
            "declared table (data/hub-mirror/SOURCES.tsv)."
        )
    else:
        lines.append(
            "- Revisions are the first 12 hex digits of the Hub commit the files "
            "were read at, linked to that commit on the Hub."
        )
    lines.append(
        f"- Servable: {escape(matrix_path.name)}, dated {matrix.date.isoformat()}, "
        f"{len(matrix.entry)} engines; sources listed under the servable matrix."
    )
    if runs:
        lines.append(
            f"- Measured: {facts.n_measurements} cells from {facts.n_measurement_records} record files "
            f"(smoke runs not counted); run dates are "
            f"when each measurement ran (UTC); each run names its record (sha256 of its canonical "
            f"serialisation, first 12 hex digits)."
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


def generate(db: Path, out: Path, matrix_path: Path, mirror_sources: Path | None = None) -> Evidence:
    """`atlas evidence`: open the store read-only, collect, write the file. `mirror_sources` is
    the mirror's SOURCES.tsv, shown when the latest snapshot is a mirror crawl."""
    from atlas.store import db as store

    with store.reading(db) as con:
        # the records' and verdicts' paths are published relative to the evidence folder's project
        cat = catalog.load(con, matrix_path.parent, matrix_path.parent.parent, servable=matrix_path)
        evidence = collect(con, cat, mirror_sources)
    write(evidence, out)
    return evidence
