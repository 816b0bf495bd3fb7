"""The cell-level parts of a measurement record (atlas.records.record): one repeat's raw counts,
the pass costs, the figures derived from them, a cell, and a gate decision. They sit below the
record and below the gate (atlas.records.gating derives and decides over them), so that the record
can call the gate without an import circle."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from atlas.records.fields import (
    MAX_DRAFT_TOKENS,
    MAX_NEW_TOKENS,
    MAX_PROMPTS,
    MAX_REPEATS,
    Count,
    DraftTokens,
    Name,
    PerPosition,
    PromptRun,
    check_prompt_sums,
    Seconds,
    Strict,
    Temperature,
    Text,
    Verdict,
    with_verdict,
)


class PassCosts(Strict):
    """Median seconds of one forward, timed in isolation on this run's model and cache."""

    plain: Seconds  # main model, 1 row
    verify: dict[DraftTokens, Seconds] = Field(max_length=MAX_DRAFT_TOKENS)  # draft tokens k -> main model over k+1 rows
    draft: Seconds  # MTP layer, 1 row (one draft step)


class Repeat(Strict):
    """Raw counts of one repeat of a cell: every prompt of the workload, summed (and, from schema
    4, each prompt's own counts in `prompts`, in the workload's prompt order)."""

    tokens: int = Field(gt=0, le=MAX_NEW_TOKENS * MAX_PROMPTS)
    seconds: Seconds
    baseline_seconds: Seconds  # the interleaved plain run of the same tokens
    drafted_per_position: PerPosition
    accepted_per_position: PerPosition
    verify_passes: Count
    identical_to_baseline: bool | None = None  # greedy only: same tokens as the plain run
    # rounds whose drafts before position i all passed (schema 2; None in schema 1 files)
    reached_per_position: PerPosition | None = None
    pass_costs: PassCosts | None = None  # timed just before this repeat (schema 2, atlas cells)
    prompts: list[PromptRun] | None = Field(default=None, max_length=MAX_PROMPTS)  # schema 4; None in older files

    @model_validator(mode="after")
    def _counts(self) -> "Repeat":
        if len(self.drafted_per_position) != len(self.accepted_per_position):
            raise ValueError("drafted and accepted per position differ in length")
        if any(a < 0 or a > d for a, d in zip(self.accepted_per_position, self.drafted_per_position)):
            raise ValueError("accepted exceeds drafted at some position")
        if self.reached_per_position is not None and len(self.reached_per_position) != len(self.drafted_per_position):
            raise ValueError("reached and drafted per position differ in length")
        if self.prompts is not None:
            check_prompt_sums(self, self.prompts)
        return self


class Derived(Strict):
    # The slowest and fastest repeat's speed-ups are named for what they are (never confidence
    # bounds: those are speedup_bound_lo/hi); the record files keep their first keys, speedup_lo
    # and speedup_hi, so a record's bytes and its id stay what they were.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    drafted: int
    accepted: int
    acceptance_rate: float | None  # accepted / drafted, pooled over positions
    per_position_acceptance: list[float | None] = Field(max_length=MAX_DRAFT_TOKENS)  # accepted_i / drafted_i
    mean_accepted_length: float | None  # tokens per verify pass, bonus included = 1 + accepted/passes
    tokens_per_second: float
    baseline_tokens_per_second: float
    speedup: float  # median over repeats of baseline_seconds / seconds
    speedup_slowest_repeat: float = Field(alias="speedup_lo")  # min over repeats
    speedup_fastest_repeat: float = Field(alias="speedup_hi")  # max over repeats
    ideal_speedup: float | None
    efficiency: float | None  # median over repeats of speedup / ideal (schema 1: median speedup / ideal)
    greedy_lossless: bool | None  # None when T > 0
    # schema 2
    conditional_acceptance: list[float | None] | None = Field(default=None, max_length=MAX_DRAFT_TOKENS)  # accepted_i / reached_i
    efficiency_lo: float | None = None  # min / max over repeats, each against its own pass costs
    efficiency_hi: float | None = None
    # one-sided gating.GATE_CONFIDENCE bounds on the geometric-mean paired speed-up (t over log ratios)
    speedup_bound_lo: float | None = None
    speedup_bound_hi: float | None = None


class Cell(Strict):
    engine: Name  # "atlas", "transformers-use_mtp", or another engine's name
    engine_version: Name
    baseline: Text  # what the speed-up divides by, e.g. "atlas plain decoder (same cache)"
    workload: Name
    temperature: Temperature
    draft_tokens: DraftTokens
    repeats: list[Repeat] = Field(min_length=1, max_length=MAX_REPEATS)
    derived: Derived
    gate_enabled: bool
    gate_verdict: Verdict | None = None  # schema 3; derived from gate_reason in older files (None: it names none)
    gate_reason: Text  # the verdict, then why

    @model_validator(mode="before")
    @classmethod
    def _old_verdict(cls, data: Any) -> Any:
        return with_verdict(data, "gate_verdict", "gate_reason")

    @model_validator(mode="after")
    def _width(self) -> "Cell":
        # an engine without per-position counts records none; otherwise one count per draft position
        if any(len(r.drafted_per_position) not in (0, self.draft_tokens) for r in self.repeats):
            raise ValueError(f"per-position counts must have draft_tokens = {self.draft_tokens} entries (or none)")
        return self


class GateDecision(Strict):
    """Per workload x temperature: whether to run our MTP loop at all, with which draft length, why."""

    workload: Name
    temperature: Temperature
    enabled: bool
    verdict: Verdict | None = None  # schema 3; derived from reason in older files
    draft_tokens: DraftTokens | None
    reason: Text

    @model_validator(mode="before")
    @classmethod
    def _old_verdict(cls, data: Any) -> Any:
        return with_verdict(data, "verdict", "reason")
