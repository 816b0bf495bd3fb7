"""The `atlas` command line. Each command imports its module lazily so `atlas --help` stays fast
(torch and transformers load only for the commands that need them)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from atlas import AtlasError, __version__, is_interrupt, omp
from atlas.interrupts import Terminated, sigterm_as_interrupt
from atlas.terminal import echo
from atlas import cli_checkpoints
from atlas.engines import ENGINES

# Before any command imports torch (OpenMP reads it once); torch's only: external engines run without it
omp.passive_for_torch()


class AtlasGroup(click.Group):
    """Print AtlasError as a one-line message and exit 1 (130 for Interrupted), instead of a
    traceback; $HF_TOKEN is scrubbed from it (a hub or proxy may echo it in an error text). A Ctrl-C
    no command reported itself is one line too, however it surfaced (atlas.is_interrupt); SIGTERM
    takes Ctrl-C's way out (atlas.interrupts.sigterm_as_interrupt) and exits 143."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        from atlas.hub import redact

        redact.keep_secret(os.environ.get("HF_TOKEN"))
        try:
            with sigterm_as_interrupt():
                return super().invoke(ctx)
        except AtlasError as exc:
            echo(f"Error: {redact.text(str(exc))}", err=True, fg="red")
            sys.exit(getattr(exc, "exit_code", 1))
        except Terminated:
            echo("Terminated (SIGTERM).", err=True, fg="yellow")
            sys.exit(143)
        except (KeyboardInterrupt, RuntimeError, ValueError) as exc:  # a command with nothing of its own to say
            if not is_interrupt(exc):
                raise
            echo("Interrupted (Ctrl-C).", err=True, fg="yellow")
            sys.exit(130)


@click.group(cls=AtlasGroup)
@click.version_option(__version__, prog_name="atlas")
def cli() -> None:
    """MTP Atlas: crawl model configs, measure self-speculative decoding, render the course site."""


def _store_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path:
    from atlas.paths import default_db

    return value if value is not None else default_db()


# The one --db of every command that reads or writes the store: a Path, the default resolved here.
db_option = click.option(
    "--db", type=click.Path(dir_okay=False, path_type=Path), default=None, callback=_store_path,
    help="The atlas store (default: $ATLAS_DB, else data/atlas.duckdb of the project).",
)


# ---- crawl (hub -> store) -------------------------------------------------------------------


@cli.command()
@db_option
@click.option("--mirror", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Crawl this mirror folder through a local hub server on 127.0.0.1 instead of the Hub.")
@click.option("--watchlist", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Watch list TOML (default: MIRROR/watchlist.toml with --mirror, else atlas/hub/watchlist.toml).")
@click.option("--endpoint", default=None, help="Hub endpoint URL (default: https://huggingface.co).")
@click.option("--concurrency", type=int, default=8, show_default=True, help="Parallel downloads.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Cache for downloaded files (default: next to the DB, hf-cache/).")
@click.option("--refingerprint", is_flag=True,
              help="No crawl: recompute the fingerprints of every stored config with the current rules.")
@click.option("--plan", is_flag=True,
              help="No download: list the scope, then print the models in it, the expected requests per "
                   "rate-limit bucket and the expected duration for anonymous / free / PRO accounts.")
@click.option("--probe", is_flag=True,
              help="No crawl: a handful of requests printing each answer's status, X-Error-Code and RateLimit headers.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def crawl(db: Path, mirror: Path | None, watchlist: Path | None, endpoint: str | None, concurrency: int,
          cache_dir: Path | None, refingerprint: bool, plan: bool, probe: bool, no_progress: bool) -> None:
    """Crawl the watch list's models into a new dated snapshot of the store.

    Exit status: 0 for a complete snapshot; 2 when the snapshot is partial (an org's listing
    failed) or some repos could not be fetched for a reason a later crawl may get past (both
    named); 1 for an error (nothing written); 130 when interrupted (it says whether the
    snapshot was committed).
    """
    from contextlib import ExitStack

    from atlas.hub import crawl as crawler
    from atlas.hub.redact import text as shown

    if refingerprint:
        n = crawler.refingerprint(db)
        echo(f"re-fingerprinted {n} stored configs with rules {crawler.RULE_VERSION}")
        return
    if mirror is not None and endpoint is not None:
        raise AtlasError("--mirror and --endpoint exclude each other")
    if plan and probe:
        raise AtlasError("--plan and --probe exclude each other")
    with ExitStack() as stack:
        if mirror is not None:
            from atlas.hub.local.mirror import MIRROR_PREFIX
            from atlas.hub.local.server import HubServer, load_mirror

            hub = stack.enter_context(HubServer(load_mirror(mirror)))
            url, label, token = hub.url, MIRROR_PREFIX + mirror.as_posix(), False
            watch = watchlist or mirror / "watchlist.toml"
        else:
            url, label, token = endpoint or crawler.LIVE_ENDPOINT, None, None
            watch = watchlist or crawler.DEFAULT_WATCHLIST
        if plan or probe:
            from atlas.hub import preflight

            lines = (preflight.plan(db, watch, url, token=token) if plan
                     else preflight.probe(watch, url, token=token))
            for line in lines:
                echo(shown(line))
            return
        try:
            summary = crawler.crawl(db, watch, endpoint=url, endpoint_label=label, token=token, cache_dir=cache_dir,
                                    concurrency=concurrency, progress=not no_progress)
        except crawler.CrawlInterrupted as exc:
            echo(f"Interrupted: {exc}", err=True, fg="yellow")
            sys.exit(130)
    for line in crawler.iter_summary_lines(summary):
        echo(shown(line))
    if summary.status != "complete" or summary.incomplete:
        echo(shown("Snapshot is " + ("partial: " + "; ".join(summary.problems) if summary.status != "complete"
                   else f"complete, but {len(summary.incomplete)} repos could not be fetched (listed above)")),
             err=True, fg="yellow")
        sys.exit(2)


# ---- measure (team model, self-speculative decoding, records) ---------------------------------


@cli.group("measure")
def measure_group() -> None:
    """Self-speculative decoding with a checkpoint's own MTP head: run, record, import."""


def _numbers(text: str, option: str, kind: type[int] | type[float]) -> tuple:
    """A comma-separated option: whole numbers >= 1 (draft lengths) or reals >= 0 (temperatures)."""
    wanted = "positive whole numbers" if kind is int else "non-negative numbers"
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise AtlasError(f"{option} expects comma-separated {wanted}, got {text!r}") from None
    if not values or any(v < (1 if kind is int else 0) for v in values):
        raise AtlasError(f"{option} expects {wanted}, got {text!r}")
    return values


@contextmanager
def _interrupt_writes_no_record() -> Iterator[None]:
    """A measure run stopped by SIGINT exits 130 and says so; no record is written after the
    signal (atlas.records.record.no_record_after_interrupt)."""
    from atlas.records.record import no_record_after_interrupt

    try:
        with no_record_after_interrupt():
            yield
    except KeyboardInterrupt:
        echo("Interrupted: the run did not finish, so no record was written.", err=True, fg="yellow")
        sys.exit(130)


def engine_run_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options every command that runs an engine shares (`measure run`, `conformance run`): the
    engine environment's interpreter, the draft lengths and the seed."""
    for option in reversed([
        click.option("--engine-python", default=None,
                     help="vLLM: the interpreter of its environment (default: $ATLAS_VLLM_PYTHON or ~/.cache/mtp-atlas/)"),
        click.option("--draft-tokens", default="1,2,3", show_default=True, help="draft lengths k (the MTP layer is reused for k > 1)"),
        click.option("--seed", type=int, default=0, show_default=True),
    ]):
        command = option(command)
    return command


@measure_group.command("run")
@click.option("--engine", type=click.Choice(list(ENGINES)), default="atlas", show_default=True,
              help="; ".join(f"{name}: {e.help}" for name, e in ENGINES.items()))
@engine_run_options
@click.option("--model", default=None, help="checkpoint folder or hub repo id (default: the bundled team model)")
@click.option("--revision", default=None, help="hub revision (branch, tag or commit); hub ids only")
@click.option("--endpoint", default=None, help="hub endpoint for hub ids (default: huggingface_hub's, $HF_ENDPOINT or huggingface.co)")
@click.option("--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda, cuda:N")
@click.option("--device-map", default=None,
              help="place layers across devices: auto (all visible GPUs), auto+cpu (may spill to CPU memory), or cuda:0=0-29,cuda:1=30-60")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True)
@click.option("--workloads", default=None, help="comma-separated workload names (default: all bundled)")
@click.option("--prompt-set", default=None,
              help="bundled prompt set: atlas-entropy-v1 (default; byte-level text), atlas-chat-v1 or atlas-categories-v1 "
                   "(chat models, through their chat template; the latter 16 prompts in each of 10 categories); or a "
                   "prompt-set file of the same shape, identified by its sha256")
@click.option("--temperatures", default="0,1", show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=2), default=128, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--prompts-per-workload", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--top-k", type=click.IntRange(min=1), default=None)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=None)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads (default 1 on CPU); llamacpp: the server's threads")
@click.option("--draft-vocab", type=click.IntRange(min=1), default=None,
              help="our loop and llamacpp: the MTP head scores only the N tokens most frequent in its training data "
                   "(lossless; project-made heads only: needs draft_vocab.json in the checkpoint folder; llamacpp runs "
                   "the GGUF set's copy made by `atlas real-model-gguf --draft-vocab N`)")
@click.option("--no-peer", is_flag=True, help="skip timing transformers' generate / generate(use_mtp=True)")
@click.option("--quick", is_flag=True, help="short run for `make demo`: every workload, 24 tokens, 1 prompt, 3 repeats")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="record folder (default: evidence/measurements/ of the project)")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True, help="vLLM: GPUs per pipeline stage")
@click.option("--pipeline-parallel-size", type=click.IntRange(min=1), default=1, show_default=True, help="vLLM: pipeline stages")
@click.option("--engine-option", "engine_options", multiple=True, metavar="KEY=VALUE",
              help="vLLM: an LLM(...) argument (VALUE as JSON, else text), or speculative.KEY=VALUE for speculative_config "
                   "(e.g. speculative.draft_sample_method=probabilistic); llamacpp: gguf=PATH, quant=Q4_1, output=Q4_0 (the set's untied copy), "
                   "build=DIR, repack=auto|on|off, flash_attn=auto|on|off, parallel=N; repeatable, recorded")
@click.option("--engine-schedule", type=click.Choice(["interleaved", "sequential"]), default="interleaved", show_default=True,
              help="vLLM: k=0 and speculative engines resident together, runs alternated; or one at a time (models that fit only once)")
def measure_run(engine: str, engine_python: str | None, draft_tokens: str, seed: int, model: str | None, revision: str | None,
                endpoint: str | None, device: str, device_map: str | None, dtype: str, workloads: str | None, prompt_set: str | None,
                temperatures: str, max_new_tokens: int, repeats: int, prompts_per_workload: int, top_k: int | None,
                top_p: float | None, threads: int | None, draft_vocab: int | None, no_peer: bool, quick: bool, out: str | None,
                tensor_parallel_size: int, pipeline_parallel_size: int, engine_options: tuple[str, ...], engine_schedule: str) -> None:
    """Measure plain vs self-speculative decoding and write one record under --out."""
    from atlas.decode.checkpoint import DEFAULT_MODEL_PATH
    from atlas.engines.options import Options, parse_llamacpp_options, parse_vllm_options, preflight, quick as quick_run
    from atlas.records.record import DEFAULT_DIR
    from atlas.engines.stamp import command_line
    from atlas.paths import project_path

    options = Options(
        engine=engine, model=model or str(project_path(DEFAULT_MODEL_PATH)), revision=revision, endpoint=endpoint, device=device,
        device_map=device_map, dtype=dtype, prompt_set=prompt_set,
        workloads=[w.strip() for w in workloads.split(",")] if workloads else None,
        temperatures=_numbers(temperatures, "--temperatures", float), draft_tokens=_numbers(draft_tokens, "--draft-tokens", int),
        max_new_tokens=max_new_tokens, repeats=repeats, prompts_per_workload=prompts_per_workload, seed=seed, top_k=top_k,
        top_p=top_p, threads=threads, draft_vocab=draft_vocab, peer=not no_peer,
        vllm=parse_vllm_options(() if engine == "llamacpp" else engine_options, engine_python, tensor_parallel_size,
                                pipeline_parallel_size, engine_schedule),
        llamacpp=parse_llamacpp_options(engine_options if engine == "llamacpp" else ()),
        out=Path(out) if out else project_path(DEFAULT_DIR), command=command_line(),
    )
    options = quick_run(options) if quick else options
    backend = ENGINES[engine].load()
    backend.check(options)
    preflight(options)  # before any model loads: a run is never measured and then lost to its options
    with _interrupt_writes_no_record():
        record, path = backend.run(options, log=echo)
    for g in record.gates:
        echo(f"  gate {g.workload} T={g.temperature:g}: {g.reason}")
    gated = (f"MTP on for {sum(g.enabled for g in record.gates)} of {len(record.gates)} workload x temperature" if record.gates
             else "no gate: it decides for our loop's or vLLM's cells, and this record has none")
    package = f", {record.engine_run.package} {record.engine_run.version}" if record.engine_run else ""
    echo(f"wrote {path} ({len(record.cells)} cells{package}; {gated})")


@measure_group.command("import")
@db_option
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="record folder (default: evidence/measurements/ of the project)")
def measure_import(db: Path, directory: str | None) -> None:
    """Load measurement records into the store (idempotent; bad or tampered files are rejected)."""
    from atlas.store import db as store
    from atlas.records import record as records
    from atlas.paths import project_path

    folder = Path(directory) if directory else project_path(records.DEFAULT_DIR)
    if not folder.is_dir():
        raise AtlasError(f"no measurement folder {folder}")
    with store.connect(db) as con:
        loaded, present, errors = records.import_records(con, folder)
    echo(f"measurements: {loaded} record(s) loaded, {present} already present, {len(errors)} rejected")
    if errors:
        raise AtlasError("rejected:\n  " + "\n  ".join(errors))


@measure_group.command("gates")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
def measure_gates(paths: tuple[str, ...]) -> None:
    """Each record's gate decisions as recorded (by its own rule) and by today's, recomputed from its raw counts (files only read)."""
    from atlas.records import gating, record as records
    for path in paths:
        record = records.read_record(Path(path))
        echo(f"{path}: recorded under gate rule {record.rule}; current rule {gating.GATE_RULE}: {gating.GATE_RULES[gating.GATE_RULE]}")
        recorded = {(g.workload, g.temperature): g for g in record.gates}
        for g in gating.regate(record):
            was = gating.verdict_text(recorded.get((g.workload, g.temperature)))
            echo(f"  {g.workload} T={g.temperature:g}: recorded {was}; now {gating.verdict_text(g)}. {g.reason}")


@measure_group.command("forget")
@db_option
@click.argument("record")
def measure_forget(db: Path, record: str) -> None:
    """Remove an imported record from the store, by its id (12 characters at least) or source path:
    for a record whose file is gone (evidence and export read every imported record's file)."""
    from atlas.store import db as store
    from atlas.records import record as records

    with store.connect(db) as con:
        [(record_id, source)] = records.forget_record(con, record)
    echo(f"forgot measurement record {record_id[:12]} (imported from {source})")


@cli.group("conformance")
def conformance_group() -> None:
    """Engine conformance: is an engine's MTP lossless? Dated records under evidence/conformance/."""


@conformance_group.command("run")
@click.option("--engine", type=click.Choice(["vllm", "llamacpp"]), default="vllm", show_default=True,
              help="vllm: in its own environment (`make vllm-env`); llamacpp: the pinned build (`make llamacpp`), oracles as f32 GGUF")
@engine_run_options
@click.option("--layouts", default=None, help="MTP layouts to check (default: vllm mimo,deepseek_v3,qwen3_next; llamacpp glm4_moe)")
@click.option("--draft-sampling", default="greedy,probabilistic", show_default=True,
              help="draft rules checked at T > 0: vLLM's draft_sample_method, llama.cpp's --spec-draft-sampling")
@click.option("--requests", type=click.IntRange(min=1), default=16, show_default=True,
              help="requests per check (at least 4: the batching control reruns 4 of them one at a time)")
@click.option("--max-new-tokens", type=click.IntRange(min=8), default=64, show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option("--patch", "patches", multiple=True, type=click.Choice(["expand-kernel-fix"]),
              help="a named run-time patch applied in the driver process first; the record names a patched build (with the "
                   "patch's sha256), never the release")
@click.option("--draft-vocab", type=click.IntRange(min=1), default=None,
              help="llamacpp: the head drafts over token ids 0..N-1 only (the build's nextn-d2t patch); every expectation follows the cut")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="record folder (default: evidence/conformance/ of the project)")
def conformance_run(engine: str, engine_python: str | None, layouts: str | None, draft_tokens: str, draft_sampling: str,
                    requests: int, max_new_tokens: int, dtype: str, seed: int, patches: tuple[str, ...], draft_vocab: int | None,
                    out: str | None) -> None:
    """Run the conformance suite against an engine and write one dated record."""
    from atlas.conformance import record as conformance
    from atlas.engines import conformance_suite as conformancesuite
    from atlas.engines.vllm.client import find_python
    from atlas.engines.stamp import command_line
    from atlas.paths import project_path

    conformancesuite.check_requests(requests)  # before the engine starts: a run this small could only fail its control
    llamacpp = engine == "llamacpp"
    samplings = [s.strip() for s in draft_sampling.split(",") if s.strip()]
    if not samplings or any(s not in ("greedy", "probabilistic") for s in samplings):
        raise AtlasError(f"--draft-sampling expects greedy and/or probabilistic, got {draft_sampling!r}")
    if llamacpp and (patches or engine_python):
        raise AtlasError("--patch and --engine-python are vLLM's; llama.cpp runs its pinned build")
    if draft_vocab is not None and not llamacpp:
        raise AtlasError("--draft-vocab is llama.cpp's (its nextn-d2t patch); vLLM drafts over the whole vocabulary")
    if llamacpp:
        from atlas.engines.llamacpp.build import NEXTN_D2T, find_build, require_draft_mtp
        from atlas.engines.llamacpp.conformance import LlamacppDriver
        from atlas.engines.llamacpp.gguf import source_of

        build = find_build()
        require_draft_mtp(build)
        if draft_vocab is not None and not build.info.has_patch(NEXTN_D2T):
            raise AtlasError(f"--draft-vocab needs the build's {NEXTN_D2T}: rerun `make llamacpp`")
        open_driver, shapes = (lambda: LlamacppDriver(build, source_of(build), draft_vocab)), conformance.LLAMACPP_SHAPES
        patches = tuple(p.file for p in build.info.patches)  # applied when it was built: the record names them
    else:
        from atlas.engines.vllm.client import Driver

        python = find_python(engine_python)
        open_driver, shapes = (lambda: Driver(python)), conformance.ENGINE_SHAPES
    record = conformancesuite.run_suite(
        open_driver, engine, [x.strip() for x in (layouts or ",".join(shapes)).split(",") if x.strip()],
        _numbers(draft_tokens, "--draft-tokens", int), samplings, requests, max_new_tokens, seed, dtype, command_line(),
        log=echo, patches=patches, shapes=shapes, draft_vocab=draft_vocab,
    )
    path = conformance.write_record(record, Path(out) if out else project_path(conformance.DEFAULT_DIR))
    failed = [c for c in record.checks if not c.passed]
    echo(f"wrote {path} ({record.build}): {len(record.checks) - len(failed)} of {len(record.checks)} checks passed")
    for v in conformance.verdicts([(path, record)]):
        echo(f"  {v.layout:<12} T {v.temperature:<3} drafts {v.draft_sampling:<13} {v.result}: {v.reason}")


@conformance_group.command("show")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None, help="record folder (default: evidence/conformance/)")
def conformance_show(directory: str | None) -> None:
    """Print the verdicts of every conformance record, grouped by record (named by its file), the
    latest record of each build and hardware marked: that is the one pages and refusals read."""
    from atlas.conformance import record as conformance
    from atlas.paths import project_path

    folder = Path(directory) if directory else project_path(conformance.DEFAULT_DIR)
    latest = {path for path, _ in conformance.latest_records(folder)}
    for path, record in conformance.load_records(folder):
        mark = "  [latest for this build]" if path in latest else ""
        echo(f"{path.name}: {record.build}, {record.hardware}, {record.run_date:%Y-%m-%d %H:%M} UTC{mark}")
        for v in conformance.verdicts([(path, record)]):
            echo(f"  {v.layout:<12} T {v.temperature:<3} drafts {v.draft_sampling:<13} "
                       f"{v.result}: {v.reason}; {v.detail}")


@cli.command("query")
@click.argument("sql")
@db_option
@click.option("--max-rows", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Print at most this many rows; the output says when more were left out.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True,
              help="Stop the query after this many seconds (one line says so, exit 1).")
@click.option("--max-memory", default="1GB", show_default=True,
              help="DuckDB's memory_limit for the query (e.g. 512MB, 4GB; nothing spills to disk); past it the "
                   "query stops with one line, exit 1.")
@click.option("--max-cell-bytes", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Print at most this many bytes of one cell (UTF-8); a longer one is cut, ends in … and is counted.")
def query_cmd(sql: str, db: Path, max_rows: int, timeout: float, max_memory: str, max_cell_bytes: int) -> None:
    """Run SQL against the store, read-only in fact (no other file, no write, no extension), and
    print the result as a plain table; text from the store is shown with control characters escaped.
    Ctrl-C and SIGTERM stop a running query at once."""
    from atlas.store import query as storequery

    limits = storequery.Limits(max_rows=max_rows, timeout_s=timeout, max_memory=storequery.check_memory(max_memory),
                               max_cell_bytes=max_cell_bytes)
    result = storequery.query(db, sql, limits)
    table, cut = storequery.plain_table(result.columns, result.rows, max_cell_bytes)
    echo(table)
    n = len(result.rows)
    if result.more:
        echo(f"(first {n:,} rows shown, more left out: add a LIMIT or raise --max-rows)")
    else:
        echo(f"({n} row{'' if n == 1 else 's'})")
    if cut:
        echo(f"({cut:,} cell{'' if cut == 1 else 's'} cut at {max_cell_bytes:,} bytes: raise --max-cell-bytes to see more)")


# ---- evidence and site (store -> evidence -> site) ---------------------------------------------


@cli.command("evidence")
@db_option
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Evidence file (default: evidence/module-08.evidence.md of the project).")
@click.option("--servable", "servable_path", type=click.Path(dir_okay=False), default=None,
              help="The dated, cited support matrix joined to the models "
                   "(default: evidence/servable.toml of the project).")
@click.option("--mirror-sources", type=click.Path(dir_okay=False), default=None,
              help="Provenance of the bundled mirror's files, shown after a mirror crawl "
                   "(default: data/hub-mirror/SOURCES.tsv of the project).")
def evidence_cmd(db: Path, out: str | None, servable_path: str | None,
                 mirror_sources: str | None) -> None:
    """Run the named evidence queries against the store and write the module 8 evidence file."""
    from atlas.site.pages import write_evidence as evidence
    from atlas.site.parts import models_json as modelpages
    from atlas.paths import project_path, project_root
    from atlas.store.db import require_complete_snapshot

    out_path = Path(out) if out else project_path("evidence/module-08.evidence.md")
    matrix = Path(servable_path) if servable_path else project_path("evidence/servable.toml")
    sources = Path(mirror_sources) if mirror_sources else project_path("data/hub-mirror/SOURCES.tsv")
    require_complete_snapshot(db)  # evidence from no snapshot would only count zeros
    ev = evidence.generate(db, out_path, matrix, sources)
    # the per-model pages' data, next to the evidence file it belongs with
    models_path = out_path.with_name(modelpages.FILE_NAME)
    models = modelpages.generate(db, models_path, matrix, project_root())
    f = ev.facts
    echo(
        f"Wrote {out_path}: snapshot {f.snapshot_id} ({f.snapshot_date}), {f.n_models} models, "
        f"{f.n_declaring} declare MTP, {f.n_mismatches} mismatches, "
        f"{f.n_measurements} measured cells; {models_path.name}: "
        f"{sum(m.has_page for m in models.models)} model pages."
    )


@cli.command("export")
@db_option
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output folder, rebuilt whole (default: build/data/ of the project, where "
                   "`atlas site build` finds it).")
@click.option("--evidence", "evidence_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="Folder of the conformance records, support matrix and reported figures "
                                 "(default: evidence/ of the project).")
def export_cmd(db: Path, out: str | None, evidence_dir: Path | None) -> None:
    """Write the store's tables as Parquet and CSV (DuckDB COPY), with a data dictionary, a dataset
    card (README.md), a manifest and the changelog's data."""
    from atlas.export import tables as export
    from atlas.paths import project_path, project_root

    out_path = Path(out) if out else project_path(export.DEFAULT_OUT)
    manifest = export.export(db, out_path, evidence_dir or project_path("evidence"), project_root())
    # one write: a Ctrl-C after the export landed leaves no half-printed summary above its one line
    echo("\n".join([*(f"  {f.table:<22} {f.rows:>6} rows  (data as of {f.as_of or '—'})" for f in manifest.files if f.format == "parquet"),
                     f"Wrote {out_path}: {len(manifest.files)} files (Parquet and CSV), README.md (the dataset card), croissant.json, manifest and changelog."]))


@cli.group("site")
def site_group() -> None:
    """Render the course pages and build or serve the static site."""


_ROOT_OPTION = click.option(
    "--root", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="Project folder holding modules/, evidence/ and site/ (default: this checkout).",
)


def _layout(root: Path | None, evidence_dir: Path | None = None, data_dir: Path | None = None):
    from atlas.site.pages import render
    from atlas.paths import project_root

    return render.Layout(root=root or project_root(), evidence_dir=evidence_dir, data_dir=data_dir)


@site_group.command("build")
@_ROOT_OPTION
@click.option("--evidence", "evidence_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="Folder of the module evidence files (default: evidence/ of --root); "
                                 "`make demo` builds from its own, under build/.")
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None, help="Folder `atlas export` wrote, for the Data and Changelog pages "
                                 "(default: build/data/ of --root, when there is one).")
def site_build(root: Path | None, evidence_dir: Path | None, data_dir: Path | None) -> None:
    """Render modules/ + evidence/ into site/docs/, then `mkdocs build --strict` into site/build/."""
    from atlas.site.pages import render

    layout = _layout(root, evidence_dir, data_dir)
    pages = render.build(layout)
    echo(f"Rendered {len(pages)} pages; built {layout.build}/ (mkdocs build --strict).")


@site_group.command("serve")
@_ROOT_OPTION
@click.option("--port", type=int, default=8000, show_default=True)
def site_serve(root: Path | None, port: int) -> None:
    """Serve site/build/ on http://127.0.0.1:PORT/ (loopback only)."""
    from atlas.site.pages import render

    render.serve(_layout(root).build, port)


if __name__ == "__main__":
    cli()


# The checkpoint builders live beside the group (atlas/cli_checkpoints.py), each added by name.
for _command in (cli_checkpoints.team_model, cli_checkpoints.real_model_head_data, cli_checkpoints.real_model_head_wraps,
                 cli_checkpoints.real_model_head,
                 cli_checkpoints.real_model, cli_checkpoints.real_model_gguf):
    cli.add_command(_command)
