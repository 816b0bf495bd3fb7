"""`atlas measure run --engine llamacpp`: the same workloads, prompts, chat template and record schema
as our loop, measured through llama.cpp's own server (the pinned build, `make llamacpp`) on a GGUF
of the checkpoint (`make real-model-gguf`).

Two llama-servers are resident at once on 127.0.0.1, both on the same combined GGUF, threads and
options: plain decoding (the baseline) and `--spec-type draft-mtp --spec-draft-n-max k` (one per k,
in turn). Each prompt runs once on each, in an order that alternates between prompts and repeats
(cells.run_schedule, as for vLLM); warm-up runs are not recorded; prompts are tokenized here and
sent as token ids, so both servers see the ids our loop would. Speed is the server's own decode time
(timings.predicted_ms: after the first token, which the prefill gives). With --draft-vocab N both
servers run the set's copy whose MTP layer drafts over the head's N most frequent training tokens
(llamacpp_draftvocab; the build's nextn-d2t patch runs it): plain decoding never reads those tensors. Drafted and accepted counts
come from the server's counters and are checked against the streamed tokens and /metrics
(llamacpp_server says how), or nothing is written. llama-server times no pass on its own: the
record's pass costs come from llama-bench before the servers start, the draft's as the residual of
a k = 1 round (llamacpp_bench says how).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from atlas import AtlasError
from atlas.engines.llamacpp import bench as llamacpp_bench
from atlas.engines.llamacpp.build import NEXTN_D2T, Build, find_build, repack_setting, require_draft_mtp
from atlas.omp import engine_env
from atlas.engines.llamacpp.gguf import QUANTS, GgufInfo, Manifest, inspect, read_manifest, require_combined
from atlas.fingerprints.gguf import FILE_TYPES, GGML_TYPES
from atlas.paths import sha256_file
from atlas.engines.llamacpp.server import Server, run_stats
from atlas.decode.generate import RunStats
from atlas.engines.options import MAX_PROMPT_TOKENS, Options, VllmOptions, new_record, save_record
from atlas.records.record import Cell, PassCosts, Record
from atlas.records.runcontext import EngineRun

BASELINE = "llama-server without drafting (plain decoding), same build, GGUF, threads and prompts; runs interleaved"
SCHEDULE = ("two resident llama-servers on 127.0.0.1: plain, and draft-mtp at the measured k (one k at a time); each prompt "
            "once on each, order alternating by prompt and repeat; warm-up excluded; no prompt cache")
# (the record's field holds at most 200 characters)
DRAFT_SAMPLING = ("--spec-draft-sampling greedy (llama.cpp's default): the head's argmax is drafted, and accepted when "
                  "the target's own sample at that position (same sampler, same seed) equals it")
COUNTER_CHECK = ("every speculative request: the streamed tokens grouped by the server's running draft counters give each "
                 "round's drafted and accepted drafts (a round emits accepted + 1 tokens); their sums equal the final "
                 "timings (draft_n, draft_n_accepted) and the /metrics deltas, per draft position too")
# Sampling made neutral, so that T = 1 samples the model's own distribution (llama.cpp's defaults
# include min_p 0.05 and top_k 40); --top-k / --top-p still apply when given.
# What a GGUF set's file may be quantized to: f16, or a type llama-quantize names (llama.h's file types).
QUANT_NAMES = frozenset(name.removeprefix("MOSTLY_").removeprefix("ALL_") for name in FILE_TYPES.values())
NEUTRAL = {"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0, "top_n_sigma": -1.0}


@dataclass
class Slot:
    """The server one side of the schedule uses now (the speculative side restarts for each k)."""

    server: Server | None = None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def check(options: Options) -> None:
    """Refuse what llama.cpp does not take; the options it does are checked here, before anything runs."""
    if options.vllm != VllmOptions():
        raise AtlasError("--tensor-parallel-size, --pipeline-parallel-size, --engine-python and --engine-schedule are vLLM's; "
                         "--engine llamacpp runs one CPU server pair")
    if options.device not in ("auto", "cpu") or options.device_map:
        raise AtlasError("--device and --device-map do not apply to --engine llamacpp (the pinned build is CPU-only)")
    if options.dtype != "float32":
        raise AtlasError("--dtype does not apply to --engine llamacpp: the GGUF's type decides (--engine-option quant=Q4_1)")
    repack_setting(options.llamacpp.repack)
    lo = options.llamacpp
    if lo.quant.upper() not in QUANT_NAMES:
        raise AtlasError(f"--engine-option quant={lo.quant}: not a llama-quantize type (f16, {', '.join(QUANTS)}, ...)")
    if lo.output is not None and lo.output.upper() not in {name for name, _, _ in GGML_TYPES.values()}:
        raise AtlasError(f"--engine-option output={lo.output}: not a ggml type (e.g. Q4_0, Q8_0)")


def gguf_set_dir(folder: Path) -> Path:
    """Where `make real-model-gguf` puts a checkpoint's GGUF set: beside it, named after it."""
    return folder.parent / f"{folder.name}-gguf"


def resolve_gguf(options: Options, folder: Path) -> tuple[Path, dict[str, Any]]:
    """(the combined GGUF to serve, what the record keeps about it). A file from a GGUF set must
    still have the sha256 its manifest lists and come from this very checkpoint."""
    from atlas.decode.checkpoint import digest

    lo = options.llamacpp
    manifest: Manifest | None = None
    if lo.gguf:
        path = Path(lo.gguf)
        if (path.parent / "manifest.json").is_file():
            manifest = read_manifest(path.parent)
    else:
        manifest = read_manifest(gguf_set_dir(folder))
        path = gguf_set_dir(folder) / manifest.find("combined", lo.quant, options.draft_vocab, lo.output).file
    info = require_combined(path)
    if info.draft_vocab != options.draft_vocab:
        has = f"drafts over {info.draft_vocab} tokens" if info.draft_vocab else "drafts over the whole vocabulary"
        raise AtlasError(f"{path} {has}, the run asks for " + (f"--draft-vocab {options.draft_vocab}" if options.draft_vocab
                                                                 else "the whole vocabulary (no --draft-vocab)"))
    if lo.output is not None and (info.output or "").lower() != lo.output.lower():
        has = f"an output.weight of type {info.output}" if info.output else f"its output layer tied to token_embd ({info.embedding})"
        raise AtlasError(f"{path} has {has}; the run asks for output={lo.output}")
    sha = sha256_file(path)
    entry = next((f for f in manifest.files if f.file == path.name), None) if manifest else None
    if entry is not None:
        if entry.sha256 != sha:
            raise AtlasError(f"{path}: its sha256 {sha[:12]}… is not the {entry.sha256[:12]}… its manifest lists; remake the set")
        if manifest is not None and manifest.source_digest != digest(folder):
            raise AtlasError(f"{path} was made from another checkpoint ({manifest.source_digest[:19]}…) than {folder}")
    return path, {
        "gguf": path.name, "sha256": sha, "file_type": info.file_type, "layout": info.layout, "architecture": info.architecture,
        "tensors": info.tensors, "draft_vocab": info.draft_vocab, "output_layer": output_layer(info), "made_by": entry.command if entry else "not listed in a manifest of `make real-model-gguf`",
        "converter": ("llama.cpp's convert_hf_to_gguf.py of the pinned source via atlas's llamacpp/convert.py (GPT-2-style "
                      "vocabulary; zero-size shared_experts left out), then llama-quantize"),
        "source_digest": manifest.source_digest if manifest else None,
    }


def output_layer(info: GgufInfo) -> str:
    """The output layer as the file holds it: its own output.weight and type, or tied to token_embd."""
    return f"output.weight, {info.output}" if info.output else f"tied to token_embd, {info.embedding}"


def dtype(info: GgufInfo) -> str:
    """The weights' precision as the record's settings name it: the GGUF's file type, and the output
    layer's type where the file has one of its own (an untied copy's output layer changes the figures)."""
    kind = f"gguf-{info.file_type.removeprefix('MOSTLY_')}"
    return f"{kind}, output {info.output}" if info.output else kind


def cut_draft(build: Build, options: Options, folder: Path) -> dict[str, Any] | None:
    """What the record says of --draft-vocab (size, coverage, the table's sha256), after checking
    that the build carries the patch that drafts over a cut vocabulary; None without it."""
    from atlas.decode import draftvocab

    if options.draft_vocab is None:
        return None
    if not build.info.has_patch(NEXTN_D2T):
        raise AtlasError(f"--draft-vocab needs the build's {NEXTN_D2T} (a cut draft vocabulary inside llama.cpp); the build at "
                         f"{build.dir} has {', '.join(p.file for p in build.info.patches) or 'no patches'}: rerun `make llamacpp`")
    vocab_size = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    return draftvocab.read(folder, options.draft_vocab, vocab_size)[1]


def server_args(threads: int, parallel: int, ctx: int, repack: bool, k: int, sampling: str = "greedy",
                flash_attn: str = "auto", p_min: float = 0.0) -> list[str]:
    """llama-server's arguments after the model: the same for both sides but the draft options.
    `sampling`: --spec-draft-sampling, greedy (the default, named so the record says it) or
    probabilistic (the draft sampled from the head's top 10 at the request's temperature, verified
    by rejection). `flash_attn`: -fa, always written so the record names it. `p_min`:
    --spec-draft-p-min, a round drafts only while the head's top probability reaches it (0: every
    round drafts k, the records' setting; benchmarks/llamacpp_p_min.py tries others)."""
    args = ["-t", str(threads), "-tb", str(threads), "-c", str(ctx * parallel), "-np", str(parallel), "--cache-ram", "0",
            "-fa", flash_attn]
    if not repack:
        args.append("--no-repack")
    if k:
        args += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(k), "--spec-draft-p-min", f"{p_min:g}", "--spec-draft-sampling", sampling]
    return args


def request(prompt: list[int], n: int, t: float, seed: int, options: Options) -> dict[str, Any]:
    """One /completion body: token ids, exactly n tokens (ignore_eos), neutral sampling at T = t."""
    return {"prompt": prompt, "n_predict": n, "temperature": t, "seed": seed % (2**32 - 1), "ignore_eos": True,
            "cache_prompt": False, "top_k": options.top_k or 0, "top_p": options.top_p or 1.0, **NEUTRAL}


@contextmanager
def plain_answers(build_dir: str | None, gguf: Path, threads: int, parallel: int,
                  ctx: int) -> Iterator[tuple[Callable[[list[int], float, int, int], list[int]], dict[str, Any]]]:
    """A plain llama-server on `gguf` with `parallel` slots of `ctx` tokens, as (complete, facts):
    complete(prompt ids, temperature, seed, n) is one answer of at most n tokens, every sampler but
    the temperature neutral, ended at and with the end-of-turn token it stops at (llama-server lists
    it among the ids); facts say which build ran it, how (the head's training data keeps them)."""
    build = find_build(build_dir)
    args = server_args(threads, parallel, ctx, repack_setting("auto")[0], 0)  # a measurement's plain side, slots aside
    with Server(build.binary("llama-server"), gguf, args) as server:
        def complete(prompt: list[int], t: float, seed: int, n: int) -> list[int]:
            body = {"prompt": prompt, "n_predict": n, "temperature": t, "seed": seed % (2**32 - 1), "top_k": 0, "top_p": 1.0,
                    "cache_prompt": False, **NEUTRAL}
            return list(server.whole(body)[0])

        yield complete, {"name": "llama.cpp llama-server", "build": build.version, "patches": [p.file for p in build.info.patches],
                         "args": args, "omp_wait_policy": engine_env().get("OMP_WAIT_POLICY")}  # its threads' (None: unset)


def time_draft(binary: Path, gguf: Path, plain_args: list[str], prompts: list[list[int]], n: int,
               options: Options) -> tuple[list[float], list[float]]:
    """Per prompt, decode milliseconds per token of a plain server and of a draft-mtp k = 1 server
    at --spec-draft-p-min 1, which computes every draft and drops it unverified (llamacpp_bench):
    runs alternate by prompt, at T = 0, after one warm-up each. Any draft that reached verification
    makes the timing wrong, and is refused."""
    discard_args = [*plain_args, "--spec-type", "draft-mtp", "--spec-draft-n-max", "1", "--spec-draft-p-min", "1", "--spec-draft-sampling", "greedy"]
    plain_ms: list[float] = []
    discarded_ms: list[float] = []
    with Server(binary, gguf, plain_args) as plain, Server(binary, gguf, discard_args) as discard:
        for server in (plain, discard):
            server.complete(request(prompts[0], 8, 0.0, 0, options))
        for i, prompt in enumerate(prompts):
            for server, out in ((plain, plain_ms), (discard, discarded_ms))[:: 1 if i % 2 == 0 else -1]:
                done = server.complete(request(prompt, n, 0.0, 0, options))
                if done.timings.draft_n:
                    raise AtlasError(f"llama-server verified {done.timings.draft_n} draft(s) at --spec-draft-p-min 1; "
                                     "the draft's cost cannot be timed this way")
                out.append(done.timings.predicted_ms / max(1, done.timings.predicted_n))
    return plain_ms, discarded_ms


def _engine_run(build: Build, options: Options, gguf: dict[str, Any], base_args: list[str], k_args: dict[int, list[str]], repack_why: str,
                threads: int, bench: dict[str, Any]) -> EngineRun:
    import platform

    import torch
    import transformers

    return EngineRun(
        name="llamacpp", package="llama.cpp", version=f"b{build.version}", python=platform.python_version(), torch=torch.__version__,
        transformers=transformers.__version__, device="cpu", gpus=[], dtype=gguf["file_type"], tensor_parallel_size=1,
        pipeline_parallel_size=1, draft_sample_method=DRAFT_SAMPLING,
        options={"gguf": options.llamacpp.gguf, "quant": options.llamacpp.quant, "output": options.llamacpp.output,
                 "repack": options.llamacpp.repack,
                 "flash_attn": options.llamacpp.flash_attn, "parallel": options.llamacpp.parallel},
        engine_args={"llama-server": base_args, "threads": threads, "repack": repack_why, "pass_costs": bench,
                     "omp_wait_policy": engine_env().get("OMP_WAIT_POLICY")},  # what its OpenMP threads saw (None: unset)
        speculative_config={f"k={k}": args for k, args in k_args.items()}, layout=gguf["architecture"], conversion=gguf,
        counter_check=COUNTER_CHECK, schedule=SCHEDULE, build=build.record(),
    )


def run(options: Options, log: Callable[[str], None] = print) -> tuple[Record, Path]:
    """Measure `options` through llama-server; write and return the record."""
    import torch
    from transformers import AutoTokenizer

    from atlas.engines.cells import build_cell, repeats_by_cell, run_schedule, seed_for
    from atlas.decode.checkpoint import resolve
    from atlas.engines.stamp import hardware, load_average
    from atlas.records.workloads import load_prompt_set

    prompt_set = load_prompt_set(options.prompt_set)
    workloads = prompt_set.get(options.workloads)
    folder, model_id, revision = resolve(options.model, options.revision, options.endpoint)
    gguf, conversion = resolve_gguf(options, folder)  # the GGUF and its set before the build: each input said at once
    build = find_build(options.llamacpp.build)
    require_draft_mtp(build)
    vocab_info = cut_draft(build, options, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    prompts = prompt_set.encode_workloads(tokenizer, workloads, options.prompts_per_workload, MAX_PROMPT_TOKENS)
    ks, n, threads = sorted(set(options.draft_tokens)), options.max_new_tokens, options.threads or 1
    repack, repack_why = repack_setting(options.llamacpp.repack)
    ctx = max(len(p) for ps in prompts.values() for p in ps) + n + max(ks) + 16
    binary = build.binary("llama-server")
    depth = int(statistics.median(len(p) for ps in prompts.values() for p in ps)) + n // 2  # a typical position mid-answer
    fa = options.llamacpp.flash_attn
    plain_s, verify_s = llamacpp_bench.time_passes(build, gguf, threads, repack, depth, ks, flash_attn=fa)
    firsts = [prompts[w.name][0] for w in workloads]
    draft_s = llamacpp_bench.draft_seconds(*time_draft(binary, gguf, server_args(threads, 1, ctx, repack, 0, flash_attn=fa),
                                                       firsts, n, options))
    log(f"pass costs (llama-bench, depth {depth}): plain {plain_s * 1e3:.2f} ms, "
        + ", ".join(f"verify k={k} {v * 1e3:.2f} ms ({v / plain_s:.2f} plain)" for k, v in verify_s.items())
        + (f", draft {draft_s * 1e3:.2f} ms ({draft_s / plain_s:.2f} plain)" if draft_s else ", draft: not above timing noise"))
    cells_at = [(t, w.name, r, i, p) for t in options.temperatures for w in workloads
                for r in range(options.repeats) for i, p in enumerate(prompts[w.name])]
    warm = prompts[workloads[0].name][0]
    log(f"llama.cpp b{build.version} ({build.built_with}); {gguf.name} ({conversion['file_type']}, sha256 {conversion['sha256'][:12]}…), "
        f"{threads} thread(s), repacking {repack_why}, flash attention {fa}")

    def load(slot: Slot, k: int) -> list[str]:
        slot.close()
        args = server_args(threads, options.llamacpp.parallel, ctx, repack, k, flash_attn=fa)
        log("llama-server: starting " + (f"draft-mtp k={k}" if k else "plain decoding (the baseline)"))
        slot.server = Server(binary, gguf, args)
        for t in options.temperatures:  # warm-up, not recorded
            slot.server.complete(request(warm, 8, t, 0, options), k=k)
        return args

    def run_one(slot: Slot, k: int, t: float, name: str, r: int, i: int, prompt: list[int]) -> RunStats:
        assert slot.server is not None
        try:
            done = slot.server.complete(request(prompt, n, t, seed_for(options.seed, t, name, i, r, k), options), k=k)
        except AtlasError as exc:  # which request, so that it can be run again alone (--workloads, --temperatures)
            raise AtlasError(f"{name} prompt {i + 1}, T = {t:g}, k = {k}, repeat {r + 1}: {exc}") from None
        if len(done.tokens) != n:
            raise AtlasError(f"llama-server returned {len(done.tokens)} tokens where {n} were asked (ignore_eos)")
        return run_stats(done, k)

    plain, spec = Slot(), Slot()
    load_before = load_average()
    try:
        base_args, spec_args, runs = run_schedule(plain, spec, "interleaved", ks, cells_at, load, run_one)
    finally:
        plain.close()
        spec.close()
    raw = repeats_by_cell(runs, ks, True, options, [w.name for w in workloads], prompts, log)
    version = f"llama.cpp b{build.version}"
    cells: list[Cell] = [build_cell("llamacpp", version, BASELINE, name, t, k, repeats, None, options.quick)
                         for (name, t, k), repeats in raw.items()]
    costs = None if draft_s is None else PassCosts(plain=plain_s, verify=verify_s, draft=draft_s)
    bench = {"method": llamacpp_bench.METHOD.format(reps=llamacpp_bench.REPETITIONS, prompts=len(firsts)), "depth": depth,
             "plain_s": plain_s, "verify_s": {str(k): v for k, v in verify_s.items()}, "draft_s": draft_s}
    engine_run = _engine_run(build, options, conversion, base_args, spec_args, repack_why, threads, bench)
    record = new_record(
        replace(options, dtype=dtype(inspect(gguf))), folder=folder, model_id=model_id,
        revision=revision, hardware=hardware(torch.device("cpu")).model_copy(update={"torch_threads": threads}),
        prompt_set=prompt_set, device="cpu", workloads=[w.name for w in workloads], draft_tokens=ks, cells=cells,
        load_before=load_before, pass_costs=costs, engine_run=engine_run, settings={"draft_vocab": vocab_info},
    )
    path = save_record(record, options.out, log, "plain decoding")
    return record, path
