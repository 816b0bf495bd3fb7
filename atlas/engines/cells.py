"""From runs to record cells, the same for every engine: the raw counts of one cell within one
repeat, each prompt's and their sums (RepeatCounts), the cell with its derived figures and gate
(build_cell), the seed of each run, fixed by what the run is (seed_for), and the progress line
every engine logs as a run goes (progress_line). For an external engine (vLLM, llama.cpp): the
order its plain and speculative runs go in (run_schedule) and each cell's repeats from them
(repeats_by_cell).
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from atlas.records.gating import is_greedy, judge
from atlas.decode.generate import RunStats
from atlas.records.fields import PromptRun
from atlas.records.record import Cell, PassCosts, Repeat

if TYPE_CHECKING:
    from atlas.engines.options import Options

E = TypeVar("E")  # an external engine's handle (a vLLM driver, a llama-server slot)
L = TypeVar("L")  # what loading it returned


@dataclass
class RepeatCounts:
    """Raw counts of one cell within one repeat: each prompt's (the gate's sampling unit) and their sums."""

    tokens: int = 0
    seconds: float = 0.0
    baseline_seconds: float = 0.0
    drafted: list[int] | None = None
    accepted: list[int] | None = None
    reached: list[int] | None = None
    passes: int = 0
    identical: bool = True
    costs: PassCosts | None = None  # timed just before this repeat
    prompts: list[PromptRun] = field(default_factory=list)

    def add(self, spec: RunStats, plain: RunStats) -> None:
        """One prompt's speculative run and its plain pair; every engine reports per-round counts
        (transformers' use_mtp through its streamer), kept the same way."""
        reached = spec.reached_per_position
        self.reached = reached if self.reached is None else [a + b for a, b in zip(self.reached, reached)]
        drafted = spec.drafted_per_position
        accepted = spec.accepted_per_position
        self.tokens += len(spec.tokens) - 1  # the decode phase's tokens (the first comes from the prefill)
        self.seconds += spec.seconds
        self.baseline_seconds += plain.seconds
        self.drafted = drafted if self.drafted is None else [a + b for a, b in zip(self.drafted, drafted)]
        self.accepted = accepted if self.accepted is None else [a + b for a, b in zip(self.accepted, accepted)]
        self.passes += spec.verify_passes
        self.identical &= spec.tokens == plain.tokens
        self.prompts.append(PromptRun(tokens=len(spec.tokens) - 1, seconds=spec.seconds, baseline_seconds=plain.seconds,
                                      drafted=sum(drafted), accepted=sum(accepted), verify_passes=spec.verify_passes,
                                      identical_to_baseline=spec.tokens == plain.tokens))

    def repeat(self, greedy: bool) -> Repeat:
        return Repeat(
            tokens=self.tokens,
            seconds=self.seconds,
            baseline_seconds=self.baseline_seconds,
            drafted_per_position=self.drafted or [],
            accepted_per_position=self.accepted or [],
            verify_passes=self.passes,
            identical_to_baseline=self.identical if greedy else None,
            reached_per_position=self.reached,
            pass_costs=self.costs,
            prompts=[p if greedy else p.model_copy(update={"identical_to_baseline": None}) for p in self.prompts],
        )


def build_cell(engine: str, version: str, baseline: str, workload: str, t: float, k: int, repeats: list[Repeat],
               costs: PassCosts | None, quick: bool) -> Cell:
    derived, g = judge(repeats, t, k, costs, quick)
    return Cell(engine=engine, engine_version=version, baseline=baseline, workload=workload, temperature=t, draft_tokens=k,
                repeats=repeats, derived=derived, gate_enabled=g.enabled, gate_verdict=g.verdict, gate_reason=g.reason)


def seed_for(*parts: object) -> int:
    """A run's seed from what the run is (base seed, temperature, workload, prompt, repeat, k), so
    that the same run draws the same numbers in every engine and every rerun."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)


def progress_line(workload: str, t: float, runs: dict[str, list[Repeat]]) -> str:
    """Acceptance and median speed-up of each labelled engine's repeats at one workload and
    temperature, as the run goes (the record has everything)."""
    parts = []
    for label, repeats in runs.items():
        drafted = sum(sum(r.drafted_per_position) for r in repeats)
        accepted = sum(sum(r.accepted_per_position) for r in repeats)
        speedup = statistics.median(r.baseline_seconds / r.seconds for r in repeats)
        parts.append(f"{label} acc {accepted / drafted if drafted else 0:.2f} x{speedup:.2f}")
    return f"  {workload:<10} T={t:g}: " + "; ".join(parts)


def run_schedule(base: E, spec: E, schedule: str, ks: list[int], cells_at: list[tuple], load: Callable[[E, int], L],
                 run_one: Callable[..., RunStats]) -> tuple[L, dict[int, L], dict[tuple, RunStats]]:
    """Every run in the schedule's order: (the k = 0 engine as loaded, each k's, the runs). `base` runs
    plain decoding, `spec` each k in turn (`load(spec, k)` readies it); interleaved, each prompt runs
    once on each, the order alternating by prompt and repeat; sequential, every k = 0 run first."""
    # runs[(k, pair, t, workload, repeat, prompt)]: k = 0 runs are keyed by the k they are paired
    # with (interleaved) or by None (sequential: one baseline run serves every k)
    runs: dict[tuple, RunStats] = {}
    spec_loaded = {}
    loaded = load(base, 0)
    if schedule == "sequential":
        for t, name, r, i, prompt in cells_at:
            runs[(0, None, t, name, r, i)] = run_one(base, 0, t, name, r, i, prompt)
    for k in ks:
        spec_loaded[k] = load(spec, k)
        for t, name, r, i, prompt in cells_at:
            if schedule == "sequential":
                runs[(k, k, t, name, r, i)] = run_one(spec, k, t, name, r, i, prompt)
                continue
            for kk in ([0, k] if (r + i) % 2 == 0 else [k, 0]):
                runs[(kk, k, t, name, r, i)] = run_one(base if kk == 0 else spec, kk, t, name, r, i, prompt)
    return loaded, spec_loaded, runs


def repeats_by_cell(runs: dict[tuple, RunStats], ks: list[int], interleaved: bool, options: Options, workloads: list[str],
                    prompts: dict[str, list[list[int]]], log: Callable[[str], None]) -> dict[tuple[str, float, int], list[Repeat]]:
    """Each cell's repeats, every prompt's k run summed against the k = 0 run it is paired with."""
    raw: dict[tuple[str, float, int], list[Repeat]] = {}
    for k in ks:
        pair = k if interleaved else None
        for t in options.temperatures:
            for w in workloads:
                repeats = []
                for r in range(options.repeats):
                    acc = RepeatCounts()
                    for i in range(len(prompts[w])):
                        acc.add(runs[(k, k, t, w, r, i)], runs[(0, pair, t, w, r, i)])
                    repeats.append(acc.repeat(is_greedy(t)))
                raw[(w, t, k)] = repeats
                log(progress_line(w, t, {f"k={k}": repeats}))
    return raw
