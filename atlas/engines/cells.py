"""From runs to record cells, the same for every engine: the raw counts of one cell within one
repeat, each prompt's and their sums (RepeatCounts), the cell with its derived figures and gate
(build_cell), the seed of each run, fixed by what the run is (seed_for), and the progress line
every engine logs as a run goes (progress_line).
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, field

from atlas.records.gating import judge
from atlas.decode.generate import RunStats
from atlas.records.fields import PromptRun
from atlas.records.record import Cell, PassCosts, Repeat


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
