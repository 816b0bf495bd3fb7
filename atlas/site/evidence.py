"""Evidence: named SQL queries against the store -> one Markdown file of named, escaped sections.

`atlas evidence` writes evidence/module-08.evidence.md. The file is committed, so the effect of a
crawl or an imported measurement is a reviewable diff; it is deterministic for a given store (no
generation timestamp). `atlas site build` reads it back (sections + facts) without the store.

Claim levels stay apart: declared, shipped and servable are *present* claims and never show a
speed-up; measured rows come only from imported measurement records (atlas/site/measured.py), in
their own tables, each run with its date and record id. Every row of a present-claim table carries
its revision and crawl date, and the revision says what it is: a Hub commit (linked) after a live
crawl, a content hash of the bundled mirror folder after a mirror crawl, whose files' real origin
(SOURCES.tsv) is listed beside it.

Models this project made itself (atlas.store.PROJECT_ORGS: the team model, oracle checkpoints) are not the
Hub: they are left out of every count, chart and exemplar list and shown in their own row group.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
from pydantic import BaseModel, ValidationError

from atlas import AtlasError, store
from atlas.hub.mirror import MIRROR_FILE, MIRROR_PREFIX, load_mirror_date
from atlas.paths import replace_text
from atlas.evidence import reported as reported_figures
from atlas.evidence import runs as evidence_runs
from atlas.evidence import servable as servable_matrix
from atlas.measure import conformance, records
from atlas.site import conformance_table
from atlas.site import measured as measured_section
from atlas.site.charts import Bar, Stack, bar_chart, stacked_bar_chart
from atlas.site.mdsafe import Markdown, code, escape, table

SECTIONS = (
    "summary",
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
    "backfires",
    "verdict_measured",
    "answer",
    "runs",
    "runs_index",
)

_OURS = store.ours()
# Repos created before the Hub recorded creation dates all carry this createdAt (Hub API docs).
HUB_PLACEHOLDER_CREATED = dt.datetime(2022, 3, 2, 23, 29, 4)

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
    "measurement_sources": """
        SELECT record_id, any_value(source_path) AS source_path
        FROM measurement_cells GROUP BY record_id ORDER BY record_id""",
}

NO_MEASUREMENT = measured_section.NO_MEASUREMENT


class Facts(BaseModel):
    """Numbers the course prose may use. Prose takes every number from here, never types one.
    Every count is of Hub models: models this project made are only in n_project_models."""

    snapshot_date: str | None  # when the crawl finished
    # the date of the data itself: the mirror's own date after a mirror crawl (MIRROR.toml), the
    # crawl's date after a live one
    data_date: str | None
    snapshot_id: int | None
    mirror_build: bool
    n_models: int
    n_project_models: int
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
    n_created_known: int
    n_measurements: int
    n_measurement_records: int
    n_servable: int
    servable_date: str
    exemplars: list[str]


class Evidence(BaseModel):
    facts: Facts
    sections: dict[str, str]


class MirrorSource(BaseModel):
    """One row of the mirror's SOURCES.tsv: where a bundled file was copied from."""

    repo_id: str
    file: str
    source_repo: str
    source_path: str
    source_commit: str
    notes: str = ""


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


def _measurement_sources(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    if not _has_table(con, "measurement_cells"):
        return []
    found = con.execute(
        "SELECT count(*) FROM information_schema.columns "
        "WHERE table_name = 'measurement_cells' AND column_name = ?", [records.NEWEST]
    ).fetchone()
    if not (found and found[0]):
        # the store is open read-only here; the import brings the table up to date
        raise AtlasError("the store's measurements predate its current columns: run "
                         "`atlas measure import` first")
    return _rows(con, "measurement_sources")


def load_mirror_sources(path: Path | None) -> list[MirrorSource]:
    """SOURCES.tsv of the bundled mirror (tab-separated, header row); [] when there is none."""
    if path is None or not path.exists():
        return []
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t")
        try:
            return [MirrorSource.model_validate(row) for row in reader]
        except ValidationError as exc:
            raise AtlasError(f"{path}: a row does not have the SOURCES.tsv columns: {exc}") from None


def _date(value: dt.datetime | dt.date | None) -> str:
    return value.strftime("%Y-%m-%d") if value is not None else "—"


def _day(value: dt.datetime | dt.date | None) -> Markdown:
    """A date in a table cell, never broken across lines."""
    return Markdown(f'<span class="atlas-nowrap">{_date(value)}</span>')


def _key(value: str | None) -> Markdown:
    """A config key or weight-name pattern in a cell: breakable after its dots and underscores
    only, so a narrow column wraps it between words instead of letter by letter."""
    if not value:
        return Markdown("—")
    text = str(escape(value))
    for sep in (".", "&#95;", "/"):
        text = text.replace(sep, sep + "<wbr>")
    return Markdown(f"<code>{text}</code>")


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _num(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


class _Revisions:
    """How a revision and its date are shown. The revision (one name for it everywhere): after a
    live crawl a Hub commit, linked to the Hub; after a mirror crawl the mirror folder's content
    hash, which is no Hub commit and links nowhere. The date: after a live crawl the day it was
    crawled; after a mirror crawl the mirror's own date (the day its files were fixed), since
    crawling the same files again on a later day does not make them newer."""

    header = "revision"

    def __init__(self, snap: dict[str, Any] | None, mirror_date: dt.date | None = None) -> None:
        endpoint = (snap or {}).get("endpoint") or ""
        self.mirror = endpoint.startswith(MIRROR_PREFIX)
        self.endpoint = endpoint.rstrip("/") if endpoint.startswith(("http://", "https://")) else None
        self.mirror_date = mirror_date if self.mirror else None
        self.date_header = "data of" if self.mirror_date else "crawled"

    def day(self, crawled: dt.datetime | dt.date | None) -> Markdown:
        return _day(self.mirror_date or crawled)

    def stamp(self, facts: "Facts") -> str:
        """The snapshot as prose: "snapshot #1, crawled D", or for a mirror "mirror crawl #1 of
        D1 (data of D2)"."""
        if not self.mirror:
            return f"snapshot #{facts.snapshot_id}, crawled {facts.snapshot_date}"
        data = f" (data of {facts.data_date})" if self.mirror_date else ""
        return f"mirror crawl #{facts.snapshot_id} of {facts.snapshot_date}{data}"

    def cell(self, repo_id: str, revision: str | None) -> Markdown:
        # 12 hex digits identify a commit unambiguously in practice and keep the tables readable.
        if not revision:
            return Markdown("—")
        short = Markdown(f'<code class="atlas-rev">{escape(revision[:12])}</code>')
        if self.mirror or self.endpoint is None:
            return short
        href = f"{self.endpoint}/{quote(repo_id, safe='/')}/tree/{quote(revision, safe='')}"
        return Markdown(f'<a href="{escape(href)}" title="{escape(revision)}">{short}</a>')


# the reported figure a real model's chat acceptance is shown beside (never compared as equal)
_ANCHOR = "deepseek-v3-second-token-acceptance"


def _anchors(path: Path) -> list[reported_figures.Figure]:
    """The anchor figure from evidence/reported.toml beside the matrix, if that file holds it."""
    if not path.is_file():
        return []
    return [f for f in reported_figures.load(path).figure if f.id == _ANCHOR]


def collect(con: duckdb.DuckDBPyConnection, matrix_path: Path,
            mirror_sources: Path | None = None) -> Evidence:
    """Run every named query and build the sections and facts."""
    matrix = servable_matrix.load(matrix_path)
    snaps = _rows(con, "snapshot")
    snap = snaps[0] if snaps else None
    revs = _Revisions(snap, load_mirror_date(mirror_sources.parent if mirror_sources else None))
    agg = _rows(con, "aggregate")[0]
    n_ours = _rows(con, "project_models")[0]["n"]
    layers = {int(r["value"]): int(r["n"]) for r in _rows(con, "layers")}
    sources = _measurement_sources(con)
    runs = evidence_runs.load_runs([(s["record_id"], s["source_path"]) for s in sources])
    mismatch_rows = _rows(con, "mismatches")
    servable_rows = [r for r in _rows(con, "servable") if not r["is_ours"]]
    for r in servable_rows:
        r["engines"] = matrix.serving(r["model_type"], _archs(r["architectures"]),
                                      r["declared_num_mtp_layers"], r["shipped_mtp_layers"])
    created = _rows(con, "created")
    facts = Facts(
        snapshot_date=_date(snap["finished_at"]) if snap else None,
        data_date=_date(revs.mirror_date or snap["finished_at"]) if snap else None,
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
        n_created_known=sum(1 for r in created if _known_created(r["created_at"])),
        # smoke runs (--quick) are never evidence, so never counted
        n_measurements=sum(len(r.record.cells) for r in runs if not r.record.settings.quick),
        n_measurement_records=sum(1 for r in runs if not r.record.settings.quick),
        n_servable=sum(1 for r in servable_rows if r["engines"]),
        servable_date=matrix.date.isoformat(),
        exemplars=[r["repo_id"] for r in _rows(con, "exemplars")],
    )
    mirror = load_mirror_sources(mirror_sources) if revs.mirror else []
    verdicts = _verdicts(matrix_path.parent / "conformance")
    sections = {
        "summary": _summary(facts, revs, verdicts, runs),
        "declared": _declared(_rows(con, "declared"), revs, mirror),
        "aggregate": _aggregate(facts, snap, revs),
        "shipped": _shipped(_rows(con, "shipped"), facts, revs),
        "mismatches": _mismatches(mismatch_rows, revs),
        "servable": _servable(servable_rows, matrix, verdicts),
        "conformance": _conformance(matrix_path.parent / "conformance", verdicts),
        # module 8 keeps one row per run; the runs' own pages (docs/runs/) hold every figure
        "measured": measured_section.compact_summary(runs, "../runs/"),
        "adoption_chart": _adoption(_rows(con, "adoption"), created),
        "layers_chart": _layers_chart(layers, facts, revs),
        "provenance": _provenance(snap, _rows(con, "rule_versions"), runs, matrix, matrix_path,
                                  facts, revs),
        "backfires": measured_section.backfires_text(runs) + "\n",
        "verdict_measured": measured_section.measured_line(runs),
        "answer": measured_section.answer_text(runs, "../runs/"),
        "runs": measured_section.run_pages(runs, _anchors(matrix_path.parent / "reported.toml")),
        "runs_index": _MEASURED_HEAD + "\n" + measured_section.runs_index(runs, "runs/"),
    }
    return Evidence(facts=facts, sections=sections)


def _archs(joined: str | None) -> list[str]:
    return [a.strip() for a in (joined or "").split(",") if a.strip()]


def _known_created(value: dt.datetime | None) -> bool:
    return value is not None and value != HUB_PLACEHOLDER_CREATED


# ---- sections --------------------------------------------------------------------------------


def _guardrail(kind: str, title: str, text: str) -> str:
    # Custom admonition types (declared/shipped/servable/measured) are styled in atlas.css.
    return f'!!! {kind} "{title}"\n    {text}\n'


def _indent(text: str) -> str:
    return "\n".join(("    " + line) if line else "" for line in text.splitlines())


_MEASURED_HEAD = _guardrail(
    "measured",
    "Measured: one dated run per table",
    "A measurement holds for its run only: that model revision, hardware, engine, workload, "
    "temperature and draft length. It is never generalised.",
)

_OURS_NOTE = (
    "Made by this project (not Hub models): never counted in the totals, charts or exemplars above."
)


def _summary(facts: Facts, revs: _Revisions, verdicts: list[conformance.Verdict],
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
        hardware = sorted({r.record.hardware.text for _, r in numbered})
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


def _declared(rows: list[dict[str, Any]], revs: _Revisions, mirror: list[MirrorSource]) -> str:
    head = _guardrail(
        "declared",
        "Declared: what the config says",
        "A key and its value in config.json at the revision shown. It says nothing about whether "
        "the weights ship, whether an engine serves them, or how fast anything runs.",
    )
    if not rows:
        return head + "\nNo model in this snapshot declares an MTP key.\n"

    def body(group: list[dict[str, Any]]) -> list[list[object]]:
        out = []
        for r in group:
            notes: list[str] = []
            if r["is_exemplar"]:
                notes.append("exemplar")
            if r["declared_num_mtp_layers"] == 0:
                notes.append("0 declares no MTP")
            if r["is_derivative"]:
                notes.append("derivative" + (f" of {escape(r['base_model'])}" if r["base_model"] else ""))
            out.append([
                escape(r["repo_id"]),
                r["declared_num_mtp_layers"],
                _key(r["declared_key"]),
                revs.cell(r["repo_id"], r["revision"]),
                revs.day(r["snapshot_date"]),
                Markdown("; ".join(notes)) if notes else Markdown(""),
            ])
        return out

    headers = ["model", "#MTP layers", "key", revs.header, revs.date_header, "note"]
    hub = [r for r in rows if not r["is_ours"]]
    ours = [r for r in rows if r["is_ours"]]
    text = head + "\n" + (table(headers, body(hub)) if hub else "No Hub model declares an MTP key.")
    if ours:
        text += "\n\n" + escape(_OURS_NOTE) + "\n\n" + table(headers, body(ours))
    if mirror:
        text += "\n\n" + _mirror_sources([r["repo_id"] for r in rows], mirror)
    return text + "\n"


def _github_link(src: MirrorSource) -> Markdown:
    if not re.fullmatch(r"[0-9a-f]{40}", src.source_commit) or src.source_repo.count("/") != 1:
        # not copied from a public repository (e.g. made by this project)
        return Markdown(f"{escape(src.source_repo)}: {escape(src.source_path)}")
    href = (f"https://github.com/{quote(src.source_repo)}/blob/{src.source_commit}/"
            f"{quote(src.source_path)}")
    return Markdown(
        f'<a href="{escape(href)}">{escape(src.source_repo)}</a> @'
        f'<code class="atlas-rev">{src.source_commit[:12]}</code>: {_key(src.source_path)}'
    )


def _mirror_sources(repo_ids: list[str], mirror: list[MirrorSource]) -> str:
    wanted = set(repo_ids)
    rows = [[escape(s.repo_id), code(s.file), _github_link(s)]
            for s in mirror if s.repo_id in wanted
            and s.file in ("config.json", "model.safetensors.index.json", "model.safetensors")]
    if not rows:
        return ""
    return (
        '??? declared "Where the mirror\'s files come from (SOURCES.tsv)"\n'
        + _indent(
            "This site was built from a crawl of the bundled offline mirror, so the revisions above "
            "are content hashes of the mirror's folders, not Hub commits. Each file was copied "
            "verbatim from the public repository and commit below.\n\n"
            + table(["model", "file", "copied from"], rows)
        )
    )


def _aggregate(facts: Facts, snap: dict[str, Any] | None, revs: _Revisions) -> str:
    if snap is None:
        return "No complete snapshot in the store yet: nothing to count.\n"
    by_value = ", ".join(
        f"{n} with {v}" for v, n in sorted(facts.n_layers.items()) if v > 0
    )
    line = (
        f"{_capital(revs.stamp(facts))}: of {facts.n_models} "
        f"current Hub models, {facts.n_declaring} declare MTP (num_mtp_layers > 0)"
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
    if facts.n_project_models:
        line += (f" Not counted: {facts.n_project_models} model(s) this project made itself "
                 f"(listed separately).")
    return escape(line) + "\n"


def _shipped(rows: list[dict[str, Any]], facts: Facts, revs: _Revisions) -> str:
    head = _guardrail(
        "shipped",
        "Shipped: what the weight index holds",
        "MTP tensors counted from weight names at the revision shown. Weights present do not "
        "mean MTP is enabled when the model is served.",
    )
    known = escape(
        f"Weight names are known for {facts.n_shipped_known} of {facts.n_models} Hub models in "
        f"{revs.stamp(facts)}; elsewhere shipped is "
        f"unknown, not no."
    )
    if not rows:
        return head + "\n" + known + "\n\nNo model with known weight names declares or ships MTP.\n"

    def body(group: list[dict[str, Any]]) -> list[list[object]]:
        out = []
        for r in group:
            d, s = r["declared_num_mtp_layers"], r["shipped_mtp_layers"]
            if (d or 0) > 0 and s == 0:
                verdict = "declared, not shipped"
            elif (d or 0) == 0 and s > 0:
                verdict = "shipped, not declared"
            elif d != s:
                verdict = "counts differ"
            else:
                verdict = "agrees"
            out.append([
                escape(r["repo_id"]),
                d,
                s,
                _key(r["shipped_evidence"]),
                revs.cell(r["repo_id"], r["revision"]),
                revs.day(r["snapshot_date"]),
                verdict,
            ])
        return out

    headers = ["model", "#declared", "#shipped", "weight names", revs.header, revs.date_header,
               "config vs weights"]
    hub = [r for r in rows if not r["is_ours"]]
    ours = [r for r in rows if r["is_ours"]]
    text = head + "\n" + known + "\n\n"
    text += table(headers, body(hub)) if hub else "No Hub model with known weight names declares or ships MTP."
    if ours:
        text += "\n\n" + escape(_OURS_NOTE) + "\n\n" + table(headers, body(ours))
    return text + "\n"


def _mismatches(rows: list[dict[str, Any]], revs: _Revisions) -> str:
    if not rows:
        return "No mismatch between declared and shipped among models with known weight names.\n"
    body = [
        [
            r["kind"],
            escape(r["repo_id"]),
            r["declared_num_mtp_layers"],
            _key(r["declared_key"]),
            r["shipped_mtp_layers"],
            _key(r["shipped_evidence"]),
            revs.cell(r["repo_id"], r["revision"]),
            revs.day(r["snapshot_date"]),
        ]
        for r in rows
    ]
    return table(
        ["mismatch", "model", "#declared", "key", "#shipped", "weight names", revs.header,
         revs.date_header],
        body,
    ) + "\n"


def _conformance(folder: Path, verdicts: list[conformance.Verdict]) -> str:
    """Engine conformance verdicts (evidence/conformance/, beside the support matrix) as a grid:
    one row per engine version and layout, one column per temperature class and draft method,
    each cell one word; the statistics behind them one click away."""
    head = _guardrail(
        "servable",
        "Checked lossless: engine conformance records",
        "Each row is a dated run of the conformance suite against one engine version on one MTP "
        "layout: oracle checkpoints whose right answers are exact, and random ones. It checks the "
        "engine's MTP, not a given checkpoint.",
    )
    if not verdicts:
        return head + "\n" + conformance_table.evidence_table(folder, folder.parent.parent)
    columns = list(dict.fromkeys(
        (v.temperature, v.draft_sampling)
        for v in sorted(verdicts, key=lambda v: (v.temperature != "0", v.draft_sampling))))
    ids = conformance_table.record_ids(verdicts)
    causes = conformance_table.causes_text(verdicts)
    grid: dict[tuple[str, str, str], dict[tuple[str, str], conformance.Verdict]] = {}
    for v in verdicts:
        grid.setdefault((v.build, v.layout, v.source), {})[(v.temperature, v.draft_sampling)] = v
    body = []
    for (engine, layout, source), cells in sorted(grid.items()):
        row: list[object] = [escape(engine), code(layout)]
        for col in columns:
            v = cells.get(col)
            word = conformance.outcome(v) if v else None
            row.append(Markdown(f'<span class="atlas-{VERDICT_CSS[word]}">{word}</span>') if word else "—")
        row.append(ids[source])
        body.append(row)
    headers = ["engine", "layout", *(
        "T = 0" if t == "0" else f"T {t}, {sampling} drafts" for t, sampling in columns), "record"]
    return (head + "\n" + table(headers, body)
            + "\n\nA cell: whether the engine's MTP kept the model's output at that temperature "
            "with that draft method — *lossless* (every check with drafts passed, each on a sample with 95 % power "
            "to detect its deviation), *fails* (one failed beyond what the plain engine's own control explains), "
            "*inconclusive* (the only failures sit where the plain engine already failed its control, or a pass "
            "came from too small a sample); each cell comes from the newest record that ran it with that power; "
            "a build with a run-time patch is its own row, never the release. At T = 0 the draft method does not matter: "
            "output must equal plain decoding token for token.\n\n"
            + (f"**Known causes** of the failures (K1, …: the statistics below cite them):\n\n{causes}\n\n" if causes else "")
            + '??? servable "The statistics behind each verdict"\n'
            + _indent(conformance_table.evidence_table(folder, folder.parent.parent)) + "\n")


def _verdicts(folder: Path) -> list[conformance.Verdict]:
    return conformance.current_verdicts(conformance.load_records(folder), folder.parent.parent)


VERDICT_CSS = {"lossless": "verified", "fails": "fails", "inconclusive": "inconclusive"}  # the marks' colours (atlas.css)


def _checked_text(checked: list[servable_matrix.Checked], sources: dict[str, str]) -> str:
    """The conformance half of a cell: per build checked, its results, record and date, and the
    layout checked (named where it is not this family's own)."""
    parts = []
    for c in checked:
        results = [f'<span class="atlas-{VERDICT_CSS[result]}">{escape(key)}: {result}</span>' for key, result in c.results.items()]
        causes = "".join(f" (cause: {escape(k.id)}, {escape(k.upstream_issue.rsplit('/', 1)[-1])})"
                         for k in c.causes if k.status == "present")
        parts.append(" · ".join(results) + causes + f"<br>{escape(c.build)} on {escape(c.device)} "
                     f'<span class="atlas-nowrap">[{sources[c.record]}] {c.date}</span>')
    note = checked[0].layout_note
    return (f"<b>Conformance</b> (layout {escape(checked[0].layout)}"
            + (f": {escape(note)}" if not note.startswith("this family's own") else "") + "):<br>" + "<br>".join(parts))


def _servable(rows: list[dict[str, Any]], matrix: servable_matrix.Matrix,
              verdicts: list[conformance.Verdict]) -> str:
    head = _guardrail(
        "servable",
        f"Servable: support matrix of {matrix.date.isoformat()}",
        "An engine has code to draft with this architecture's MTP layers, at the version shown. "
        "This is not a measurement, and it does not check that a checkpoint ships the MTP weights.",
    )
    if not rows:
        return head + "\nNo current Hub model declares or ships MTP, so nothing to match.\n"
    engines = list(dict.fromkeys(e.engine for e in matrix.entry))
    methods = {m: f"M{i}" for i, m in enumerate(dict.fromkeys(e.method for e in matrix.entry), 1)}
    cites = {id(e): f"S{i}" for i, e in enumerate(matrix.entry, 1)}
    checks = conformance_table.record_ids(verdicts)
    used: set[str] = set()
    families: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        families.setdefault(r["model_type"] or "(no model_type)", []).append(r)
    body = []
    for family, members in sorted(families.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ids = sorted(m["repo_id"] for m in members)
        shown = ", ".join(escape(i) for i in ids[:4])
        if len(ids) > 4:
            shown += f", … ({len(ids) - 4} more)"
        cells = []
        archs = {a for m in members for a in _archs(m["architectures"])}
        for engine in engines:
            entries = list({id(e): e for m in members for e in m["engines"] if e.engine == engine}.values())
            if not entries:
                cells.append(Markdown("—"))
                continue
            n_served = sum(1 for m in members if any(e.engine == engine for e in m["engines"]))
            text = "<b>Support claim</b>: " + "<br>".join(
                f"yes · {methods[e.method]} · {escape(e.version)}<br>"
                f'<span class="atlas-nowrap">[{cites[id(e)]}] {(e.checked or matrix.date).isoformat()}</span>'
                for e in entries
            )
            if n_served < len(members):
                text += f" ({n_served} of {len(members)} models)"
            checked = servable_matrix.checked_for(None if family.startswith("(") else family, sorted(archs), engine, verdicts)
            if checked:
                text += "<br>" + _checked_text(checked, checks)
                used.update(c.record for c in checked)
            else:
                text += "<br><b>Conformance</b>: not checked"
            cells.append(Markdown(f'<span class="atlas-servable">{text}</span>'))
        body.append([code(family), Markdown(f"{len(ids)}: {shown}"), *cells])
    legend_m = "\n".join(f"- **{mid}** — {code(method)}" for method, mid in methods.items())
    legend_s = "\n".join(
        f"- **{cites[id(e)]}** — {escape(e.engine)} {escape(e.version)}, checked "
        f"{(e.checked or matrix.date).isoformat()}: {escape(e.source)}"
        + (f" ({escape(e.note)})" if e.note else "")
        for e in matrix.entry
    )
    legend_c = "\n".join(f"- **{cid}** — {code(src)} (all its verdicts: the conformance table below)"
                          for src, cid in checks.items() if src in used)
    return (
        head
        + "\n"
        + table(["family (model_type)", "models", *engines], body)
        + "\n\nA cell holds two named things. The **support claim**: served · method · engine version "
        "· [source] date checked (the engine has code for it; nothing was run). The **conformance** "
        "result: for each engine build the suite ran on this family's MTP layout, whether its MTP kept "
        "the model's output at T = 0 and T > 0 (lossless, fails, or inconclusive where the plain "
        "engine failed its own control), with the build, device, [record] and date; the layout "
        "checked is named where it is another family's with the same MTP tensors. The build checked "
        "is not the version the support claim cites. \"Not checked\": no conformance run covers "
        "that engine on this layout. A dash: that engine has no MTP drafting for the family in the "
        "matrix (not: it cannot run the model without MTP).\n\n"
        "**Methods**\n\n" + legend_m + "\n\n**Sources**\n\n" + legend_s + "\n"
        + ("\n**Conformance records**\n\n" + legend_c + "\n" if legend_c else "")
    )


def _adoption(rows: list[dict[str, Any]], created: list[dict[str, Any]]) -> str:
    """Adoption over time: creation months of the MTP-declaring Hub models of the latest snapshot
    (cumulative, by lab) when most of their creation dates are known, and per-snapshot counts when
    the store holds several snapshots. A chart placing a few of the models would read as "adoption
    is flat", so without either a sentence says why there is none."""
    if not rows:
        return "No complete snapshot yet: no adoption chart.\n"
    known = sum(1 for r in created if _known_created(r["created_at"]))
    if created and known * 2 > len(created):
        parts = [_by_month(created)]
    else:
        parts = [escape(
            f"No chart by creation month: a creation date is known for only {known} of the "
            f"{len(created)} MTP-declaring Hub models of this snapshot, too few to show when MTP "
            f"spread (a chart of those alone would look like no adoption at all)."
        )]
    dates = [_date(r["snapshot_date"]) for r in rows]
    if len(rows) > 1:
        bars = [
            Bar(
                label=d if dates.count(d) == 1 else f"{d} #{r['snapshot_id']}",
                value=100.0 * r["n_declaring"] / r["n_models"] if r["n_models"] else 0.0,
                annotation=f"{r['n_declaring']}/{r['n_models']}",
            )
            for d, r in zip(dates, rows)
        ]
        parts.append(bar_chart(
            "Hub models declaring MTP, per snapshot", bars, "% of models", y_max=100.0,
            note=f"Share of the crawled Hub models whose config declares num_mtp_layers > 0, in each "
                 f"of the {len(rows)} complete snapshots from {dates[0]} to {dates[-1]}. The watch "
                 f"list can change between snapshots, so read the share, not the count.",
        ))
    else:
        parts.append(escape(
            f"The store holds one complete snapshot ({dates[0]}), so there is no per-snapshot "
            f"trend yet; each further crawl adds a point."
        ))
    return "\n\n".join(parts) + "\n"


def _by_month(created: list[dict[str, Any]]) -> str:
    known = [r for r in created if _known_created(r["created_at"])]
    unknown = len(created) - len(known)
    months = _month_range(min(r["created_at"] for r in known), max(r["created_at"] for r in known))
    labs = sorted({r["repo_id"].split("/", 1)[0] for r in known},
                  key=lambda lab: (min(r["created_at"] for r in known if r["repo_id"].startswith(lab + "/")), lab))
    stacks = []
    for lab in labs:
        running, values = 0, []
        for m in months:
            running += sum(1 for r in known if r["repo_id"].startswith(lab + "/")
                           and r["created_at"].strftime("%Y-%m") == m)
            values.append(float(running))
        stacks.append(Stack(name=lab, values=values))
    note = ("Cumulative count of the Hub models in this snapshot that declare MTP, by the month "
            "their repository was created on the Hub (listing field createdAt), coloured by lab "
            "(org). A repository created in a month may have declared MTP only later.")
    if unknown:
        note += f" {unknown} model(s) with an unknown creation date are not placed."
    chart = stacked_bar_chart("MTP-declaring Hub models by creation month, cumulative", months,
                              stacks, "models", note=note)
    running = 0
    rows = []
    for m in months:
        new = [r["repo_id"] for r in known if r["created_at"].strftime("%Y-%m") == m]
        running += len(new)
        if new:
            rows.append([m, len(new), running, Markdown(", ".join(escape(i) for i in new))])
    lab_rows = []
    for lab in labs:
        mine = [r for r in known if r["repo_id"].startswith(lab + "/")]
        lab_rows.append([escape(lab), len(mine), min(r["created_at"] for r in mine).strftime("%Y-%m"),
                         max(r["created_at"] for r in mine).strftime("%Y-%m")])
    tables = (
        table(["month created", "#new", "#cumulative", "models"], rows)
        + "\n\n"
        + table(["lab (org)", "#models", "first", "latest"], lab_rows)
    )
    return chart + "\n\n" + '??? declared "The table behind the chart"\n' + _indent(tables)


def _month_range(start: dt.datetime, end: dt.datetime) -> list[str]:
    months, y, m = [], start.year, start.month
    while (y, m) <= (end.year, end.month):
        months.append(f"{y:04d}-{m:02d}")
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return months


def _layers_chart(layers: dict[int, int], facts: Facts, revs: _Revisions) -> str:
    if not layers:
        return "No Hub model declares an MTP key in this snapshot: no distribution to chart.\n"
    bars = [Bar(label=f"{v} layer" + ("" if v == 1 else "s"), value=n) for v, n in layers.items()]
    chart = bar_chart(
        "Declared num_mtp_layers, current Hub models", bars, "models",
        note=f"{_capital(revs.stamp(facts))}: the "
             f"{sum(layers.values())} Hub models that carry an MTP key, by declared value. Models "
             f"without the key, and models this project made, are not counted.",
    )
    return chart + "\n"


def _provenance(
    snap: dict[str, Any] | None,
    rules: list[dict[str, Any]],
    runs: list[evidence_runs.Run],
    matrix: servable_matrix.Matrix,
    matrix_path: Path,
    facts: Facts,
    revs: _Revisions,
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


# ---- the evidence file -------------------------------------------------------------------------

_FACTS_RE = re.compile(r"^<!-- atlas-facts: (\{.*\}) -->$", re.M)
_SECTION_RE = re.compile(
    r"^<!-- atlas-section: (\w+) -->\n(.*?)^<!-- /atlas-section: \1 -->$", re.M | re.S
)


def _json_for_comment(data: dict[str, Any]) -> str:
    # Escaping <, > and & keeps `-->` (from a hostile id among the exemplars) out of the comment.
    try:
        text = json.dumps(data, ensure_ascii=True, sort_keys=True, allow_nan=False)
    except ValueError as exc:
        raise AtlasError(f"the evidence facts hold a value JSON cannot hold ({exc}); not written") from None
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
    return replace_text(path, dumps(evidence), "the evidence file")


def generate(db: Path, out: Path, matrix_path: Path, mirror_sources: Path | None = None) -> Evidence:
    """`atlas evidence`: open the store read-only, collect, write the file. `mirror_sources` is
    the mirror's SOURCES.tsv, shown when the latest snapshot is a mirror crawl."""
    from atlas import store

    with store.reading(db) as con:
        evidence = collect(con, matrix_path, mirror_sources)
    write(evidence, out)
    return evidence
