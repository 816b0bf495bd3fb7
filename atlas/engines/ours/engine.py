"""Our own loop as an engine: load a checkpoint and its MTP layer, run plain and self-speculative
decoding interleaved over the bundled workloads, and write one dated record.

Per workload x temperature x repeat, every prompt runs once plainly and once per draft length, in an
order that rotates between repeats (so drift in a shared machine's speed does not favour one side).
transformers' own `generate` and `generate(use_mtp=True)` run on the same prompts as the peer.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from atlas import AtlasError, __version__
from atlas.decode import draftvocab
from atlas.engines.cells import RepeatCounts, build_cell, progress_line, seed_for
from atlas.decode.checkpoint import Loaded, load_checkpoint, pick_device, place_model, resolve
from atlas.engines.ours.transformers_peer import PEER_BASELINE, Peer
from atlas.decode.generate import RunStats, Sampling, Stopwatch, generate_plain, generate_speculative
from atlas.decode.model import FusedModel, build_fused_model, dense_regime
from atlas.engines.options import MAX_PROMPT_TOKENS, LlamacppOptions, Options, VllmOptions, new_record
from atlas.decode.placement import Placement
from atlas.decode.recurrent import summary as recurrent_summary
from atlas.records.record import Cell, PassCosts, Record, Repeat, write_record
from atlas.records.runcontext import RecurrentState
from atlas.engines.stamp import hardware, load_average
from atlas.records.workloads import load_prompt_set

ATLAS_BASELINE = "atlas plain decoder, same model and static cache (MTP prefill counted on the speculative side)"


class PassTimer:
    """Times single forwards: a 1-row main step, a (k+1)-row verify pass per k, and a 1-row MTP draft
    step, at `position` (mid-generation, so attention spans a typical cache). Each is timed in the
    company it keeps in the loops (a plain step after a plain step; a verify pass right after its k
    draft steps, which have pushed some main-model weights out of the CPU caches), round-robin, and
    again before every workload so the samples see the same machine load as the runs; the record
    keeps their medians. Cache contents do not affect timing, so overwritten slots need no restoring."""

    def __init__(self, fused: FusedModel, ks: list[int], position: int) -> None:
        self.fused, self.ks, self.position = fused, ks, position
        self.ids = torch.zeros(max(ks) + 1, dtype=torch.long, device=fused.device)
        self.hidden = torch.zeros(1, fused.embed.shape[1], dtype=fused.dtype, device=fused.device)
        self.samples: dict[str, list[float]] = {}
        self.watch = Stopwatch(fused.device, fused.devices)

    def _time(self, name: str, fn: Callable[[], object]) -> None:
        self.watch.start()
        fn()
        self.samples.setdefault(name, []).append(self.watch.stop())

    def sample(self, reps: int) -> PassCosts:
        """Time `reps` rounds; returns their medians (the repeat they precede records them)."""
        f, p = self.fused, self.position
        before = {name: len(times) for name, times in self.samples.items()}
        with torch.inference_mode():
            for _ in range(reps):
                f.main(self.ids[:1], p)
                self._time("plain", lambda: f.main(self.ids[:1], p))
                for k in self.ks:
                    for i in range(k):
                        self._time("draft", lambda i=i: f.draft(self.ids[:1], self.hidden, p + i, i % len(f.mtp_layers)))
                    self._time(f"verify{k}", lambda k=k: f.main(self.ids[: k + 1], p))
        return self._costs({name: times[before.get(name, 0):] for name, times in self.samples.items()})

    def costs(self) -> PassCosts:
        """Medians over every sample of the run."""
        return self._costs(self.samples)

    def _costs(self, samples: dict[str, list[float]]) -> PassCosts:
        med = {name: statistics.median(times) for name, times in samples.items()}
        return PassCosts(plain=med["plain"], verify={k: med[f"verify{k}"] for k in self.ks}, draft=med["draft"])


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _measure_workload(
    fused: FusedModel, peer: Peer | None, prompts: list[list[int]], s: Sampling, ks: list[int], mtp_k: int, name: str, options: Options,
    timer: PassTimer, pass_reps: int,
) -> tuple[dict[int, list[Repeat]], list[Repeat]]:
    """Raw counts of one workload at one temperature: per repeat, the pass costs timed afresh (so
    each repeat's efficiency uses costs measured next to it), then every prompt once plainly and
    once per k (in an order rotated each repeat), then the transformers pair, alternating which
    goes first."""
    ours: dict[int, list[Repeat]] = {k: [] for k in ks} if options.ours else {}
    theirs: list[Repeat] = []
    n = options.max_new_tokens
    for r in range(options.repeats):
        costs = timer.sample(pass_reps) if options.ours else None
        acc = {k: RepeatCounts(costs=costs) for k in ks}
        peer_acc = RepeatCounts()
        for i, prompt in enumerate(prompts):
            order: list[int | None] = [None, *ks] if options.ours else []  # None = the plain run
            shift = r % max(1, len(order))
            runs: dict[int | None, RunStats] = {}
            for k in order[shift:] + order[:shift]:
                gen = _generator(fused.device, seed_for(options.seed, s.temperature, name, i, r, k))
                runs[k] = generate_plain(fused, prompt, n, s, gen) if k is None else generate_speculative(fused, prompt, n, k, s, gen)
            for k in ks if options.ours else []:
                acc[k].add(runs[k], runs[None])
            if peer:
                pair = [False, True] if r % 2 == 0 else [True, False]
                got = {m: peer.run(prompt, n, s, m, seed_for(options.seed, s.temperature, name, i, r, "peer", m)) for m in pair}
                peer_acc.add(got[True], got[False])
        for k in ks if options.ours else []:
            ours[k].append(acc[k].repeat(s.greedy))
        if peer:
            theirs.append(peer_acc.repeat(s.greedy))
    return ours, theirs


def check(options: Options) -> None:
    """Refuse vLLM's options; a bad --device fails here, before anything loads."""
    if options.vllm != VllmOptions() or options.llamacpp != LlamacppOptions():
        raise AtlasError("--tensor-parallel-size, --pipeline-parallel-size, --engine-option, --engine-python and "
                         "--engine-schedule need --engine vllm (--engine-option also --engine llamacpp)")
    if not options.ours and not options.peer:
        raise AtlasError("--engine transformers measures transformers' generate pair itself; --no-peer leaves nothing to run")
    pick_device(options.device)


def _load(options: Options, folder: Path, model_id: str, revision: str, device: torch.device, dtype: torch.dtype,
          log: Callable[[str], None]) -> tuple[Loaded, Placement | None, torch.device]:
    """The checkpoint on `device`, or placed by --device-map (then on the device of its embedding)."""
    if options.device_map:  # loaded in CPU memory, then each piece moved to its device
        log(f"loading {model_id} ({revision[:19]}) for placement {options.device_map} as {options.dtype}")
        loaded = load_checkpoint(str(folder), torch.device("cpu"), dtype, peer=options.peer)
        placement = place_model(loaded, options.device_map)
        log("placement: " + ", ".join(f"{d}: {placement.layers.count(d)} layers" for d in placement.devices()) + f"; head and MTP on {placement.head}")
        return loaded, placement, torch.device(placement.embed)
    log(f"loading {model_id} ({revision[:19]}) on {device} as {options.dtype}")
    return load_checkpoint(str(folder), device, dtype, peer=options.peer), None, device


def _peer(options: Options, loaded: Loaded, device: torch.device, model_id: str, log: Callable[[str], None]) -> tuple[Peer | None, str]:
    """transformers' use_mtp pair where it is asked for and can run, and the baseline it is named by."""
    if options.peer and not loaded.transformers_mtp:
        log(f"no transformers use_mtp peer: {loaded.transformers_note or 'transformers has no MTP loader for this checkpoint'}")
    peer = Peer(loaded.model, device, loaded.transformers_mtp) if options.peer and loaded.transformers_mtp else None
    peer_baseline = f"{PEER_BASELINE}; {loaded.transformers_note}" if loaded.transformers_note else PEER_BASELINE
    if peer and loaded.transformers_note:
        log(f"transformers use_mtp peer: {loaded.transformers_note}")
    if not options.ours and peer is None:
        raise AtlasError(f"--engine transformers: transformers' own use_mtp cannot run {model_id} (no MTP loader for it)")
    if not options.ours:
        log(f"--engine transformers: generate(use_mtp=True) drafts num_mtp_layers = {loaded.transformers_mtp} per pass; --draft-tokens is not used")
    return peer, peer_baseline


def _warm_up(fused: FusedModel, peer: Peer | None, warm: list[int], ks: list[int], options: Options, device: torch.device) -> None:
    for t in options.temperatures:  # warm-up: allocator, kernels, caches; not timed
        s = Sampling(t, options.top_k, options.top_p)
        generate_plain(fused, warm, 8, s, _generator(device, 0))
        for k in ks if options.ours else []:
            generate_speculative(fused, warm, 8, k, s, _generator(device, 0))
        if peer:
            peer.run(warm, 4, s, False, 0)
            peer.run(warm, 4, s, True, 0)


def _cells(raw: list[tuple[str, float, dict[int, list[Repeat]], list[Repeat]]], costs: PassCosts | None, peer: Peer | None,
           peer_baseline: str, mtp_k: int, quick: bool) -> list[Cell]:
    cells: list[Cell] = []
    for name, t, ours, theirs in raw:
        cells.extend(build_cell("atlas", __version__, ATLAS_BASELINE, name, t, k, ours[k], costs, quick) for k in ours)
        if theirs:
            cells.append(build_cell("transformers-use_mtp", peer.version, peer_baseline, name, t, mtp_k, theirs, None, quick))
    return cells


def run(options: Options, log: Callable[[str], None] = print) -> tuple[Record, Path]:
    """Measure `options` with our loop and, unless `options.peer` is off, transformers' generate pair
    on the same prompts (only that pair for --engine transformers); write and return the record."""
    load_before = load_average()
    device = pick_device(options.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(options.dtype)
    if dtype is None:
        raise AtlasError(f"unknown dtype {options.dtype!r} (float32, bfloat16, float16)")
    # On CPU one thread by default: the matmuls of a small model are too small to share, and on
    # busy shared cores OpenMP threads waiting on each other made a step several times slower.
    torch.set_num_threads(options.threads or (1 if device.type == "cpu" else torch.get_num_threads()))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # use_mtp reloads the MTP weights on every generate() call
    prompt_set = load_prompt_set(options.prompt_set)
    workloads = prompt_set.get(options.workloads)
    folder, model_id, revision = resolve(options.model, options.revision, options.endpoint)
    loaded, placement, device = _load(options, folder, model_id, revision, device, dtype, log)
    model, tokenizer = loaded.model, loaded.tokenizer
    log(f"MTP layer built by: {loaded.family}")
    shared = {k: v for h in (loaded.mtp, *loaded.mtp.next_layers) for k, v in h.shared.items()}
    if shared:
        log("shared with the target (the checkpoint has no layer-local copy): " + ", ".join(f"{k} <- {v}" for k, v in shared.items()))
    prompts = prompt_set.encode_workloads(tokenizer, workloads, options.prompts_per_workload, MAX_PROMPT_TOKENS)
    ks = sorted(set(options.draft_tokens))
    longest = max(len(p) for ps in prompts.values() for p in ps)
    regime = None
    dense_limit = getattr(model.config.get_text_config(), "index_topk", None)  # DSA: see atlas.decode.mtphead.AllKeys
    if dense_limit is not None:
        regime = dense_regime(loaded.family, dense_limit, longest, options.max_new_tokens)
        log(f"regime: {regime}")
    draft_vocab, vocab_info = None, None
    if options.draft_vocab is not None:
        draft_vocab, vocab_info = draftvocab.read(folder, options.draft_vocab, model.get_output_embeddings().weight.shape[0])
        log(f"draft vocabulary: the {vocab_info['size']} most frequent training tokens ({vocab_info['coverage']:.1%} of those counted)")
    fused = build_fused_model(model, loaded.mtp, longest + options.max_new_tokens + max(ks) + 2, prompts[workloads[0].name][0][:64],
                              max_draft=max(ks), draft_vocab=draft_vocab)
    timer = PassTimer(fused, ks, int(statistics.median(len(p) for ps in prompts.values() for p in ps)) + options.max_new_tokens // 2)
    pass_reps = 10  # pass-cost rounds before every repeat
    peer, peer_baseline = _peer(options, loaded, device, model_id, log)
    _warm_up(fused, peer, prompts[workloads[0].name][0], ks, options, device)
    mtp_k = loaded.transformers_mtp
    raw: list[tuple[str, float, dict[int, list[Repeat]], list[Repeat]]] = []
    for t in options.temperatures:
        s = Sampling(t, options.top_k, options.top_p)
        for w in workloads:
            ours, theirs = _measure_workload(fused, peer, prompts[w.name], s, ks, mtp_k, w.name, options, timer, pass_reps)
            raw.append((w.name, t, ours, theirs))
            log(progress_line(w.name, t, {f"k={k}": r for k, r in ours.items()} | ({"hf": theirs} if theirs else {})))
    costs = timer.costs() if options.ours else None
    if costs:
        log(f"pass costs: plain {costs.plain * 1e3:.2f} ms, " + ", ".join(f"verify k={k} {v * 1e3:.2f} ms" for k, v in costs.verify.items()) + f", draft {costs.draft * 1e3:.2f} ms")
    cells = _cells(raw, costs, peer, peer_baseline, mtp_k, options.quick)
    record = new_record(
        options, folder=folder, model_id=model_id, revision=revision, hardware=hardware(device, placement), prompt_set=prompt_set,
        device=str(device), workloads=[w.name for w in workloads], draft_tokens=ks if options.ours else [mtp_k], cells=cells,
        load_before=load_before, pass_costs=costs,
        settings={"placement": placement, "regime": regime, "kernels": fused.kernels if device.type == "cpu" else "F.linear",
                  "draft_vocab": vocab_info, "shared_tensors": shared or None},
        recurrent_state=RecurrentState(**state) if (state := recurrent_summary(fused.layers)) else None,
    )
    path = write_record(record, options.out)
    lossy = [c for c in cells if c.engine == "atlas" and c.derived.greedy_lossless is False]
    # In bf16/fp16 a (k+1)-row verify and a 1-row step round differently and near-ties flip often
    # (expected numerics). In fp32 a flip is rare enough to stop and look: it is a defect unless the
    # two tokens' logits tie to rounding (one did on 2026-12-05: translate, margin 1.1e-5 at 35.3,
    # where 1-row and 2-row matmuls sum in different orders). The record and the gate say so either way.
    if lossy and dtype == torch.float32:
        raise AtlasError(
            f"greedy speculative output differed from plain greedy in {len(lossy)} cell(s) "
            f"(e.g. {lossy[0].workload}, k={lossy[0].draft_tokens}); record written to {path}: check the top two "
            "logits where the outputs part (a tie to rounding between 1-row and multi-row kernels, or a defect)"
        )
    return record, path

