"""What a measurement run is asked to do (`atlas measure run`'s options, Options), for every engine,
with vLLM's own options among them (VllmOptions, from --engine-option pairs by parse_vllm_options)."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from atlas import AtlasError
from atlas.decode.checkpoint import DEFAULT_MODEL
from atlas.records.gating import GATE_RULE, MIN_GATE_REPEATS
from atlas.records.record import DEFAULT_DIR, SCHEMA_VERSION, Cell, Record, read_provenance, write_record
from atlas.records.fields import MAX_DRAFT_TOKENS, MAX_TEMPERATURE
from atlas.records.runcontext import Hardware, Settings
from atlas.engines.stamp import load_average, software
from atlas.records.workloads import PromptSet, load_prompt_set
from atlas.paths import ROOT

MAX_PROMPT_TOKENS = 256


@dataclass
class VllmOptions:
    """What only `--engine vllm` takes; every other engine refuses any of them set (their defaults)."""

    python: str | None = None  # the interpreter of vLLM's environment (atlas.engines.vllm.client.find_python)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    options: dict[str, Any] = field(default_factory=dict)  # LLM(...) keyword arguments, recorded
    speculative: dict[str, Any] = field(default_factory=dict)  # extra speculative_config keys
    schedule: str = "interleaved"  # or "sequential" (atlas.engines.vllm.engine.SCHEDULES)


@dataclass
class LlamacppOptions:
    """What only `--engine llamacpp` takes (from --engine-option KEY=VALUE, parse_llamacpp_options);
    every other engine refuses any of them set."""

    gguf: str | None = None  # a combined GGUF; default: the checkpoint's GGUF set (`make real-model-gguf`) at `quant`
    quant: str = "Q4_1"  # which file of the GGUF set: f16, Q8_0, Q4_1, Q4_K_M
    # the set's untied copy whose output layer is an output.weight of this type (llamacpp_gguf); None: as converted
    output: str | None = None
    build: str | None = None  # the build folder (default: $ATLAS_LLAMACPP_DIR or `make llamacpp`'s)
    repack: str = "auto"  # weight repacking: auto (off only on CPUs with AMX tiles), on, off
    # flash attention (-fa): auto (llama.cpp's default: on for the CPU), on, off. Build 11434's CPU kernel
    # splits a 1-row query's keys across threads from 512 cached positions on, and a verify pass's rows
    # are not split, so with 2+ threads and a long context plain and verify sum in different orders
    flash_attn: str = "auto"
    parallel: int = 1  # server slots (--parallel); requests still go one at a time


@dataclass
class Options:
    engine: str = "atlas"  # a name in atlas.engines.ENGINES
    model: str = str(DEFAULT_MODEL)
    revision: str | None = None
    endpoint: str | None = None
    device: str = "auto"
    device_map: str | None = None  # auto, auto+cpu or DEVICE=FIRST-LAST,... (atlas.decode.placement)
    dtype: str = "float32"
    prompt_set: str | None = None  # a bundled set's name (atlas.records.workloads.PROMPT_SETS) or a prompt-set file; None: the default
    workloads: list[str] | None = None
    temperatures: tuple[float, ...] = (0.0, 1.0)
    draft_tokens: tuple[int, ...] = (1, 2, 3)
    max_new_tokens: int = 128
    repeats: int = 5
    prompts_per_workload: int = 3
    seed: int = 0
    top_k: int | None = None
    top_p: float | None = None
    threads: int | None = None
    draft_vocab: int | None = None  # our loop, llamacpp: the MTP head scores only the N most frequent training tokens (atlas.decode.draftvocab)
    peer: bool = True
    vllm: VllmOptions = field(default_factory=VllmOptions)
    llamacpp: LlamacppOptions = field(default_factory=LlamacppOptions)
    out: Path = ROOT / DEFAULT_DIR
    command: str = ""
    quick: bool = False

    @property
    def ours(self) -> bool:
        """Our loop is measured; --engine transformers runs the same harness for transformers' generate pair alone."""
        return self.engine == "atlas"


def save_record(record: Record, out: Path, log: Callable[[str], None], against: str, why: str = "") -> Path:
    """Write an external engine's record, then say (never hide) where its greedy output differed
    from `against`, the plain decoding it was paired with; the record holds every such cell."""
    path = write_record(record, out)
    differed = [c for c in record.cells if c.derived.greedy_lossless is False]
    if differed:
        log(f"note: greedy output differed from {against} in {len(differed)} cell(s) (recorded, e.g. "
            f"{differed[0].workload} k={differed[0].draft_tokens}){why}")
    return path


def new_record(options: Options, *, folder: Path, model_id: str, revision: str, hardware: Hardware, prompt_set: PromptSet,
               device: str, workloads: list[str], draft_tokens: list[int], cells: list[Cell], load_before: list[float] | None,
               settings: dict[str, Any] | None = None, **fields: Any) -> Record:
    """The record of a finished run, dated now, with what every engine's record holds: the run's
    options as its settings (plus engine-specific `settings`), the software, the checkpoint's
    provenance and the load after the run; `fields` are the engine's own (pass costs, engine run)."""
    return Record(
        schema_version=SCHEMA_VERSION,
        run_date=datetime.now(timezone.utc).replace(microsecond=0),
        model_id=model_id,
        revision=revision,
        hardware=hardware,
        software=software(),
        command=options.command,
        seed=options.seed,
        prompt_set=prompt_set.name,
        prompt_set_digest=prompt_set.digest,
        settings=Settings(
            device=device, dtype=options.dtype, workloads=workloads,
            temperatures=list(options.temperatures), draft_tokens=draft_tokens, max_new_tokens=options.max_new_tokens,
            repeats=options.repeats, prompts_per_workload=options.prompts_per_workload, top_k=options.top_k,
            top_p=options.top_p, quick=options.quick, **(settings or {}),
        ),
        cells=cells,
        load_before=load_before,
        load_after=load_average(),
        provenance=read_provenance(folder),
        gate_rule=GATE_RULE,
        **fields,
    )


# A record is well under 1 MiB; the folder must have room for it and more when the run ends.
MIN_FREE_BYTES = 16 * 2**20


def preflight(options: Options) -> PromptSet:
    """Everything about a run that can be checked before its model loads, checked there, so that a
    run is never measured for hours and then lost to its own options (duplicate workloads or
    temperatures, a temperature or draft length no record holds, a bad prompt-set file, a full or
    unwritable --out). Returns the prompt set the run will use."""
    for option, values in (("--temperatures", options.temperatures), ("--draft-tokens", options.draft_tokens),
                           ("--workloads", options.workloads or [])):
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise AtlasError(f"{option} lists {twice[0]:g} twice" if not isinstance(twice[0], str)
                             else f"{option} lists {twice[0]!r} twice")
    for t in options.temperatures:
        if not math.isfinite(t) or not 0 <= t <= MAX_TEMPERATURE:
            raise AtlasError(f"--temperatures: {t:g} is not a temperature a record holds (0 to {MAX_TEMPERATURE:g})")
    for k in options.draft_tokens:
        if not 1 <= k <= MAX_DRAFT_TOKENS:
            raise AtlasError(f"--draft-tokens: {k} is not a draft length a record holds (1 to {MAX_DRAFT_TOKENS})")
    prompt_set = load_prompt_set(options.prompt_set)
    workloads = prompt_set.get(options.workloads)
    try:  # the settings the record will hold, by the record's own rules
        Settings(device=options.device, dtype=options.dtype, workloads=[w.name for w in workloads],
                 temperatures=list(options.temperatures), draft_tokens=list(options.draft_tokens),
                 max_new_tokens=options.max_new_tokens, repeats=options.repeats,
                 prompts_per_workload=options.prompts_per_workload, top_k=options.top_k, top_p=options.top_p)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise AtlasError(f"these options make no valid record: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    check_out(options.out)
    return prompt_set


def check_out(folder: Path) -> None:
    """The record folder exists (made now if not), takes a file, and has MIN_FREE_BYTES free."""
    where = f"--out {folder}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        fd, probe = tempfile.mkstemp(prefix=".atlas-probe-", dir=folder)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise AtlasError(f"{where}: {'the disk is full' if full else 'cannot write there'} ({exc.strerror or exc}); "
                         "nothing was run: free some space or choose another --out") from None
    if free < MIN_FREE_BYTES:
        raise AtlasError(f"{where}: only {free / 2**20:.1f} MiB free, and a run needs {MIN_FREE_BYTES // 2**20} MiB "
                         "there for its record; nothing was run: free some space or choose another --out")


def quick(options: Options) -> Options:
    """`--quick`: every workload still runs (so greedy losslessness is checked on each), but with
    short horizons, one prompt each and three repeats; about 30-40 s on 2 CPU cores. Its record
    says so, and its gates stay undecided: too few tokens to decide anything."""
    options.quick = True
    options.max_new_tokens = min(options.max_new_tokens, 24)
    options.repeats = min(options.repeats, MIN_GATE_REPEATS)
    options.prompts_per_workload = 1
    return options


# LLM(...) arguments atlas sets itself (from its own options), and one it never allows.
_RESERVED = {"model", "dtype", "seed", "tensor_parallel_size", "pipeline_parallel_size", "speculative_config",
             "skip_tokenizer_init", "max_model_len", "per_request_spec_decode_metrics", "disable_log_stats"}


def parse_vllm_options(pairs: Iterable[str], python: str | None, tp: int, pp: int, schedule: str = "interleaved") -> VllmOptions:
    """`--engine-option KEY=VALUE` pairs: VALUE is JSON when it parses (numbers, true, lists), else
    text; `speculative.KEY` goes into speculative_config."""
    options: dict[str, Any] = {}
    speculative: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise AtlasError(f"--engine-option expects KEY=VALUE, got {pair!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        if key == "trust_remote_code":
            raise AtlasError("--engine-option trust_remote_code: never; checkpoints run only through the engine's own code")
        if key.startswith("speculative."):
            name = key.removeprefix("speculative.")
            if name in ("method", "num_speculative_tokens"):
                raise AtlasError(f"--engine-option {key}: set by atlas (method mtp, k from --draft-tokens)")
            speculative[name] = value
        elif key in _RESERVED:
            raise AtlasError(f"--engine-option {key}: set by atlas from its own options (--dtype, --seed, "
                             "--tensor-parallel-size, --pipeline-parallel-size, --draft-tokens)")
        else:
            options[key] = value
    return VllmOptions(python=python, tensor_parallel_size=tp, pipeline_parallel_size=pp, options=options,
                       speculative=speculative, schedule=schedule)


def parse_llamacpp_options(pairs: Iterable[str]) -> LlamacppOptions:
    """`--engine-option KEY=VALUE` pairs of --engine llamacpp: gguf, quant, output, build, repack, flash_attn, parallel."""
    options = LlamacppOptions()
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key or not text:
            raise AtlasError(f"--engine-option expects KEY=VALUE, got {pair!r}")
        if key not in LlamacppOptions.__dataclass_fields__:
            raise AtlasError(f"--engine-option {key}: --engine llamacpp takes gguf, quant, output, build, repack, flash_attn and "
                             "parallel")
        if key in ("repack", "flash_attn") and text not in ("auto", "on", "off"):
            raise AtlasError(f"--engine-option {key}={text}: expected auto, on or off")
        if key == "parallel":
            if not text.isdigit() or int(text) < 1:
                raise AtlasError(f"--engine-option parallel={text}: expected a whole number >= 1")
            options.parallel = int(text)
            continue
        setattr(options, key, text)
    return options
