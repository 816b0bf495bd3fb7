"""The per-model pages' data: every tracked model's claim levels from the store, as evidence/models.json.

`atlas evidence` runs `collect` against the store and writes evidence/models.json (committed and
deterministic, like the evidence file, so a crawl's effect on every model is a reviewable diff).
`atlas site build` turns that file into site/docs/models/ without the store: one page per tracked
model that declares, ships or was measured with MTP (atlas.site.pages.modelpage) and the finder, a
table of every tracked model (atlas.site.pages.modelfinder).

At the Hub's scale (10^5 tracked models and more) nothing here may grow faster than the models:
only models with a page keep their history and links in models.json (one model per line, so a
crawl's effect stays a readable diff).

Claim levels stay apart here as everywhere: the present levels come from the fingerprints and the
support matrix, reported figures from evidence/reported.toml, and only the measured level shows an
acceptance or a speed-up, each row with its date and record.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

import duckdb
from pydantic import BaseModel

from atlas import AtlasError
from atlas.evidence import catalog
from atlas.evidence import servable as servable_matrix
from atlas.records import record as records
from atlas.paths import replace_text
from atlas.jsonfile import read_written
from atlas.site.parts.evidence_format import date_text
from atlas.site.parts.calculator_defaults import calculator_prefill
from atlas.site.parts.mtp_forms import MTPForm, linked, read_forms
from atlas.site.parts.widgets import Prefill

FILE_NAME = "models.json"


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
    # the MTP layer's precision as shipped (atlas.fingerprints.precision), a present claim; None: the
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
    experiment_key: str | None = None  # the cell's series (atlas.records.experiment); None in older models.json files
    experiment: str | None = None  # that key spelled out: revision, head, draft vocabulary, kernels, engine, precision, threads, machine


class DrafterLink(BaseModel):
    """This repo is a speculative drafter (not MTP) for a model in another repo (a present claim from
    its config, atlas.fingerprints.rules DRAFTER_RULES), and the target the store's mtp_drafter_links found."""

    kind: str  # e.g. gemma4_assistant, eagle3
    kind_key: str  # the config key that says so (model_type or architectures)
    target: str | None  # None: target unknown
    evidence: str | None  # 'base_model' (the card) or 'name' (the repo's name); None: target unknown
    target_slug: str | None = None  # the target's page, when the target is in the snapshot
    # why the target is unknown (the store's rule: no claim, not a Hub id, itself, a cycle, a drafter);
    # None in a models.json written before the store gave a reason
    problem: str | None = None
    method: str | None = None  # the drafting method in words (EAGLE-3 drafter, ...); None in older files
    target_revision: str | None = None  # the target commit its card says it was trained against


class PublishedDrafter(BaseModel):
    """A speculative drafter repo of the same snapshot whose target is this model, and how it was linked."""

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
    # (atlas.families.coverage): "runs (...)", "refused: ...", "not shipped: ..."; None: no page
    runner: str | None = None
    drafter: DrafterLink | None = None  # set when this repo is a speculative drafter of its own (not MTP)
    drafters: list[PublishedDrafter] = []  # speculative drafter repos published for this model
    form: MTPForm | None = None  # the form it ships MTP in (atlas.site.parts.mtp_forms); None: not read


class Models(BaseModel):
    snapshot_id: int | None
    snapshot_date: str | None
    # after a crawl of the bundled mirror: the mirror's own date (its MIRROR.toml), which is the
    # data's date; the crawl's date is only when the same files were read again
    mirror_date: str | None
    servable_date: str
    models: list[Model]
    prefill: Prefill | None


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
           record_id, source_path, ideal_speedup, baseline, experiment_key, experiment
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


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params) if params else con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _snapshot(h: dict[str, Any]) -> Snapshot:
    return Snapshot(snapshot_id=h["snapshot_id"], snapshot_date=date_text(h["snapshot_date"]),
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


# A store last written before the view existed opens read-only without it: it has no drafter links
# (and one written before the view gave reasons has no target_problem: `*` reads what is there).
_DRAFTERS = "SELECT * FROM mtp_drafter_links WHERE snapshot_id = $latest ORDER BY drafter"


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
                                          target=r["target"], evidence=r["target_evidence"],
                                          problem=r.get("target_problem"), method=r.get("drafter_method"),
                                          target_revision=r.get("target_revision"))
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
    precision = _precision(con, latest)
    drafter_of, published = _drafter_links(con, latest)
    forms = read_forms(con, latest)
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
        archs = servable_matrix.arch_list((now or {}).get("architectures"))
        engines = matrix.serving(now["model_type"], archs, now["declared_num_mtp_layers"],
                                 now["shipped_mtp_layers"]) if now else []
        cells = [_measured_cell(m) for m in measured.get(rid, [])]
        declares = bool(now and (now["declared_num_mtp_layers"] or 0) > 0)
        ships = bool(now and (now["shipped_mtp_layers"] or 0) > 0)
        drafters = [PublishedDrafter(repo_id=d, evidence=e, slug=page_slugs[d])
                    for d, e in published.get(rid.lower(), [])] if now else []
        drafter = drafter_of.get(rid)
        if drafter is not None and drafter.target is not None and drafter.target.lower() in in_snapshot:
            drafter = drafter.model_copy(update={"target_slug": page_slugs[in_snapshot[drafter.target.lower()]]})
        # a drafter repo and its target declare no MTP layers of their own, yet each is the
        # other's MTP claim: both get a page, so the two can link to each other
        form = linked(forms.get(rid), page_slugs, in_snapshot)
        has_page = declares or ships or bool(cells) or drafter is not None or bool(drafters) or bool(form and form.noteworthy)
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
            drafter=drafter, drafters=drafters, form=form,
        ))
    snap_date = next((m.current.snapshot_date for m in models if m.current), None)
    return Models(snapshot_id=latest, snapshot_date=snap_date, mirror_date=mirror_date,
                  servable_date=matrix.date.isoformat(), models=models,
                  prefill=calculator_prefill(measured_rows, root))


def _precision(con: duckdb.DuckDBPyConnection, latest: int | None) -> dict[str, dict[str, Any]]:
    """The latest snapshot's MTP-layer precision fields (and the file and key each came from), by model."""
    precision: dict[str, dict[str, Any]] = {}
    for r in _rows(con, _PRECISION, {"latest": latest}) if latest is not None else []:
        precision.setdefault(r["repo_id"], {}).update({r["name"]: r["value"], r["name"] + "_evidence": r["path"]})
    return precision


def _measured_cell(m: dict[str, Any]) -> Measured:
    """One measurement_cells row as the model's page shows it, the engine named with its version."""
    return Measured(run_date=date_text(m["run_date"]), revision=m["revision"], hardware=m["hardware"],
                    engine=m["engine"] + (f" {m['engine_version']}" if m["engine_version"] else ""),
                    workload=m["workload"], temperature=m["temperature"],
                    draft_tokens=m["draft_tokens"], acceptance_rate=m["acceptance_rate"],
                    mean_accepted_length=m["mean_accepted_length"], speedup=m["speedup"],
                    speedup_slowest_repeat=m["speedup_slowest_repeat"], speedup_fastest_repeat=m["speedup_fastest_repeat"],
                    record_id=m["record_id"], source_path=m["source_path"], baseline=m["baseline"],
                    experiment_key=m["experiment_key"], experiment=m["experiment"])


def _runner(con: duckdb.DuckDBPyConnection, latest: int | None, wanted: set[str]) -> dict[str, str]:
    """Our loop's coverage of each wanted model's MTP layout, from its stored config.json and weight
    names (atlas.families.coverage, the family table's rules); a config the rules cannot read gets none."""
    from atlas import AtlasError
    from atlas.fingerprints.rules import parse_config_bytes
    from atlas.families.coverage import coverage

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
    from atlas.hub.local.mirror import MIRROR_PREFIX, load_mirror_date

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
    from atlas.store import db as store

    with store.reading(db) as con:
        cat = catalog.load(con, matrix_path.parent, matrix_path.parent.parent, servable=matrix_path, records=False)
        models = collect(con, cat.matrix, root, cat.verdicts)
    write(models, out)
    return models


def read(path: Path) -> Models | None:
    return read_written(path, Models, "atlas evidence")
