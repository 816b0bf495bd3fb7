"""llama.cpp's pass costs, timed with its own llama-bench: what one forward over 1, 2, ... k+1 rows
costs on the run's build, GGUF, threads and repacking, at the run's typical context depth.

llama-server times a whole decode, never a pass, so the costs come from llama-bench, timed before
the servers start: pp1 (a 1-row forward: a plain step) and pp(k+1) (the verify pass of draft length
k). llama-bench's pp(n) asks for logits of its last row only (common_batch_get_one marks only that
token as an output), while a verify pass needs every row's: so the verify figure leaves out k rows
of the output layer, and a run's rounds cost more than verify + draft (the record keeps both; the
pages set the run's own round beside them). llama.cpp has no switch that runs its MTP draft alone, but a draft whose top candidate falls
below --spec-draft-p-min is computed and then dropped before verification; at p-min 1 every draft
is, so each step runs the plain 1-row pass plus the whole draft side (the MTP layer's catch-up over
the verified row, the draft step with its output layer, the draft's sampling). That server's time
per token minus a plain server's, paired by prompt, is the draft cost (`draft_seconds`). The record
says both methods.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atlas import AtlasError
from atlas.engines.llamacpp.build import Build
from atlas.omp import engine_env

REPETITIONS = 7  # llama-bench's own timed repetitions per row count, after its warm-up run
TIMEOUT_S = 600
METHOD = ("plain and verify: llama-bench pp1 and pp(k+1) of the same build, GGUF, threads and repacking at the run's median "
          "context depth, median of {reps} timed runs, before the servers start (pp's output layer runs for the last row only, "
          "so verify leaves out k rows of it); draft: llama-server's decode seconds per "
          "token with draft-mtp k = 1 at --spec-draft-p-min 1 (every draft computed, then dropped) minus plain's, paired "
          "over {prompts} prompts (one per workload, T = 0), median: the MTP catch-up, draft step and draft sampling")


class BenchRow(BaseModel):
    """The fields of one llama-bench JSON result that the costs use (it prints many more)."""

    model_config = ConfigDict(extra="ignore")
    n_prompt: int = Field(ge=0)
    n_gen: int = Field(ge=0)
    n_depth: int = Field(ge=0)
    n_threads: int = Field(ge=1)
    repack: bool
    samples_ns: list[int] = Field(min_length=1)


def bench_args(gguf: Path, threads: int, repack: bool, depth: int, ks: list[int], reps: int = REPETITIONS,
               flash_attn: str = "auto") -> list[str]:
    rows = ",".join(str(n) for n in range(1, max(ks) + 2))
    return ["-m", str(gguf), "-t", str(threads), "-p", rows, "-n", "0", "-d", str(depth), "-r", str(reps),
            "--repack", "1" if repack else "0", "-fa", flash_attn, "-o", "json"]


def parse(text: str, threads: int, repack: bool, depth: int, ks: list[int]) -> tuple[float, dict[int, float]]:
    """(seconds of a 1-row forward, k -> seconds of a (k+1)-row forward) from llama-bench's JSON:
    the median of each test's samples. Every row count asked for must be there, once, with the
    threads, repacking and depth asked for, or the output is refused."""
    try:
        rows = [BenchRow.model_validate(r) for r in json.loads(text)]
    except (json.JSONDecodeError, TypeError, ValidationError) as e:
        raise AtlasError(f"llama-bench printed no result list the atlas can read: {str(e)[:300]}") from e
    seconds: dict[int, float] = {}
    for r in rows:
        if r.n_gen or r.n_depth != depth or r.n_threads != threads or r.repack != repack:
            raise AtlasError(f"llama-bench ran another test than asked (pp{r.n_prompt}, tg{r.n_gen}, depth {r.n_depth}, "
                             f"{r.n_threads} threads, repack {r.repack})")
        if r.n_prompt in seconds:
            raise AtlasError(f"llama-bench reported pp{r.n_prompt} twice")
        seconds[r.n_prompt] = statistics.median(r.samples_ns) / 1e9
    missing = [n for n in range(1, max(ks) + 2) if n not in seconds]
    if missing:
        raise AtlasError(f"llama-bench's output lacks pp{missing[0]}")
    return seconds[1], {k: seconds[k + 1] for k in ks}


def time_passes(build: Build, gguf: Path, threads: int, repack: bool, depth: int, ks: list[int],
                flash_attn: str = "auto") -> tuple[float, dict[int, float]]:
    """Run llama-bench once for every row count the run's draft lengths need, with the servers'
    flash attention setting; see `parse`."""
    cmd = [str(build.binary("llama-bench")), *bench_args(gguf, threads, repack, depth, ks, flash_attn=flash_attn)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=engine_env())
    except subprocess.TimeoutExpired as e:
        raise AtlasError(f"llama-bench ran over {TIMEOUT_S} s timing the pass costs") from e
    if done.returncode != 0:
        raise AtlasError(f"llama-bench failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    return parse(done.stdout, threads, repack, depth, ks)


def draft_seconds(plain_ms: list[float], discarded_ms: list[float]) -> float | None:
    """Seconds the draft side adds to a step: the median over prompts of (per-token decode time with
    every draft computed and discarded) minus (plain), paired by prompt. None when it is not
    positive (timing noise larger than the draft: the record then keeps no pass costs)."""
    if len(plain_ms) != len(discarded_ms) or not plain_ms:
        raise AtlasError("the draft timing needs one plain and one discarded-draft run per prompt")
    extra = statistics.median(d - p for p, d in zip(plain_ms, discarded_ms)) / 1e3
    return extra if extra > 0 else None
