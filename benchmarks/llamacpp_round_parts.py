"""Where a llama.cpp draft-mtp round's time goes: the draft step(s), the verify pass, the MTP layer's
catch-up over the verified batch, and the server's own work between them, each timed inside a
running llama-server by perf uprobes on its functions, against a plain server's step, in one run.

llama-bench's pass costs leave parts of a round out (its pp(k + 1) asks for the last row's logits
only, and it runs no draft), so a record's rounds cost more than its pass costs add up to. This
names the parts. Each round of the server's loop (server_context_impl::update_slots) holds, in
order: common_speculative_impl_draft_mtp::draft with one llama_process per draft step, the verify
llama_process, then common_speculative_impl_draft_mtp::process with the catch-up llama_process.

    .venv/bin/python benchmarks/llamacpp_round_parts.py [--model data/real-models/smollm2-135m-mtp-v3]
        [--quant Q4_0] [--draft-vocab 8192] [--output Q4_0] [--threads 1] [--k 1] [--prompts-per-workload 1]

Needs `make llamacpp real-model-gguf`, perf, and the right to add uprobes (root); the probes are
removed at the end. Medians over rounds, in ms and in plain steps; the load average before and
after is printed; nothing is written to evidence/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

from atlas.checkpoints.smollm import DEFAULT_OUT_PATH
from atlas.engines.llamacpp import engine as llamacpp_engine
from atlas.engines.llamacpp.build import find_build, repack_setting
from atlas.engines.llamacpp.gguf import read_manifest
from atlas.engines.llamacpp.server import Server
from atlas.engines.options import Options
from atlas.paths import project_path

GROUP = "atlas_round"
PROBES = {  # event name: the function (mangled: perf probe takes it with --no-demangle)
    "loop": "_ZN19server_context_impl12update_slotsEv",
    "draft": "_ZN33common_speculative_impl_draft_mtp5draftERSt6vectorI31common_speculative_draft_paramsSaIS1_EE",
    "catchup": "_ZN33common_speculative_impl_draft_mtp7processERK12common_batch",
    "pass": "llama_process",
    "pass_end": "llama_process%return",
}


def add_probes(binary: Path) -> None:
    for name, func in PROBES.items():
        done = subprocess.run(["perf", "probe", "-q", "-x", str(binary), "--no-demangle", "-a", f"{GROUP}:{name}={func}"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            remove_probes()
            raise SystemExit(f"perf probe could not add {name} ({func}): {done.stderr.strip()[-300:]}")


def remove_probes() -> None:
    subprocess.run(["perf", "probe", "-q", "-d", f"{GROUP}:*"], capture_output=True)


def events(perf_data: Path) -> list[tuple[float, str]]:
    out = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "time,event"], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        stamp, _, rest = line.partition(":")
        found.append((float(stamp), rest.split(f"{GROUP}:")[1].split(":")[0].removesuffix("__return")))
    return found


def round_parts(found: list[tuple[float, str]]) -> dict[str, list[float]]:
    """Per round (update_slots to the next), seconds in each part: the passes between `draft` and the
    last pass before `catchup` are draft steps, that last one the verify, the one after `catchup` the
    catch-up; a plain server's round has its one pass as the verify (its step). A draft-mtp server's
    round without a draft (its prompt's prefill) is left out."""
    rounds: list[list[tuple[float, str]]] = [[]]
    for stamp, name in found:
        if name == "loop" and rounds[-1]:
            rounds.append([])
        rounds[-1].append((stamp, name))
    parts: dict[str, list[float]] = defaultdict(list)
    for r, following in zip(rounds, rounds[1:]):  # a round lasts until the next begins; the last one is left out
        length = following[0][0] - r[0][0]
        passes, start, seen = [], None, {"draft": False, "catchup": False}
        for stamp, name in r:
            if name in seen:
                seen[name] = True
            elif name == "pass":
                start = stamp
            elif name == "pass_end" and start is not None:
                passes.append((stamp - start, dict(seen)))
                start = None
        before = [d for d, s in passes if not s["catchup"]]
        if not before or (seen["catchup"] and not seen["draft"]):
            continue  # a draft-mtp server's round without a draft: the prompt's prefill (or an idle turn)
        if seen["draft"]:
            parts["draft"].append(sum(before[:-1]))
            parts["catch-up"].append(sum(d for d, s in passes if s["catchup"]))
        parts["verify"].append(before[-1])
        parts["outside the passes"].append(length - sum(d for d, _ in passes))
        parts["round"].append(length)
    return parts


def record(binary: Path, gguf: Path, args: list[str], prompts: list[list[int]], n: int, k: int) -> dict[str, list[float]]:
    with Server(binary, gguf, args) as server, tempfile.TemporaryDirectory() as tmp:
        server.complete(llamacpp_engine.request(prompts[0], 8, 0.0, 0, Options()), k=k)  # warm-up
        data = Path(tmp) / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-q", "-e", f"{GROUP}:*", "-p", str(server.proc.pid), "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for prompt in prompts:
                server.complete(llamacpp_engine.request(prompt, n, 0.0, 0, Options()), k=k)
        finally:
            perf.send_signal(2)
            perf.wait(timeout=60)
        return round_parts(events(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=project_path(DEFAULT_OUT_PATH))
    ap.add_argument("--quant", default="Q4_0")
    ap.add_argument("--draft-vocab", type=int, default=None)
    ap.add_argument("--output", default=None, help="the set's untied copy whose output layer is of this type (e.g. Q4_0)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--prompt-set", default="atlas-categories-v1")
    ap.add_argument("--prompts-per-workload", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from atlas.records.workloads import load_prompt_set

    build = find_build()
    binary = build.binary("llama-server")
    gguf = llamacpp_engine.gguf_set_dir(args.model) / read_manifest(llamacpp_engine.gguf_set_dir(args.model)).find(
        "combined", args.quant, args.draft_vocab, args.output).file
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    prompt_set = load_prompt_set(args.prompt_set)
    prompts = [prompt_set.encode(tokenizer, p) for w in prompt_set.workloads for p in w.prompts[:args.prompts_per_workload]]
    ctx = max(map(len, prompts)) + args.max_new_tokens + 16
    repack = repack_setting("auto")[0]
    print(f"llama.cpp b{build.version}; {gguf.name}; {args.threads} thread(s); k = {args.k}; {len(prompts)} prompts x "
          f"{args.max_new_tokens} tokens at T = 0; load before {os.getloadavg()}")
    add_probes(binary)
    try:
        plain = record(binary, gguf, llamacpp_engine.server_args(args.threads, 1, ctx, repack, 0), prompts, args.max_new_tokens, 0)
        spec = record(binary, gguf, llamacpp_engine.server_args(args.threads, 1, ctx, repack, args.k), prompts,
                      args.max_new_tokens, args.k)
    finally:
        remove_probes()
    step = statistics.median(plain["verify"])
    print(f"plain step: median {step * 1e3:.2f} ms over {len(plain['verify'])} steps "
          f"(outside the pass {statistics.median(plain['outside the passes']) * 1e3:.2f} ms)")
    for part, values in spec.items():
        med = statistics.median(values)
        print(f"  draft-mtp {part:<20} median {med * 1e3:6.2f} ms = {med / step:5.2f} plain steps  ({len(values)} rounds)")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
