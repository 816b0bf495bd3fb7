"""The strict base and the bounded field types every measurement-record model is built from, with
the bounds themselves, one prompt's counts within a repeat (PromptRun) and the gate's verdict
words (atlas.records.record, atlas.records.runcontext).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# Bounds on what one record may hold, so that no single file can cost the import or the site more
# than a few times its own size (a 20 MB command was copied into every cell's row; a claimed draft
# length of 20 million became 20 million chart ticks). Each is far above any real run.
MAX_NAME_CHARS = 200  # ids, names, versions, workloads
MAX_TEXT_CHARS = 4096  # free text: the command line, hardware, baseline, gate reasons
MAX_DRAFT_TOKENS = 64  # draft length k (real MTP runs use 1-8)
MAX_CELLS = 1000
MAX_REPEATS = 1000
MAX_LIST = 1000  # workloads, temperatures, draft lengths, GPUs of one run
MAX_NEW_TOKENS = 1_000_000  # per prompt
MAX_PROMPTS = 10_000  # per workload
MAX_TEMPERATURE = 10.0  # sampling at T > 2 is already noise; anything above 10 is an error


Verdict = Literal["on", "off", "undecided"]
VERDICTS: tuple[Verdict, ...] = ("on", "off", "undecided")


class Strict(BaseModel):
    # allow_inf_nan: JSON `Infinity`/`NaN` (which pydantic reads by default) is never a measurement
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


Name = Annotated[str, StringConstraints(max_length=MAX_NAME_CHARS)]
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)]
Temperature = Annotated[float, Field(ge=0, le=MAX_TEMPERATURE)]
DraftTokens = Annotated[int, Field(gt=0, le=MAX_DRAFT_TOKENS)]
Count = Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS * MAX_PROMPTS)]
PerPosition = Annotated[list[Count], Field(max_length=MAX_DRAFT_TOKENS)]
Seconds = Annotated[float, Field(gt=0, le=1e9)]
# 40-hex Hub commit, or sha256:<digest> of local checkpoint files. Rust's regex engine (pydantic's)
# reads `$` as the end of the text, never before a final newline.
REVISION = r"^(?:[0-9a-f]{40}|sha256:[0-9a-f]{64})$"


class PromptRun(Strict):
    """One prompt's speculative run and its plain pair within one repeat (schema 4): the sampling
    unit of the gate's bound (atlas.records.gating.sampling_units), which the repeat's sums hide."""

    tokens: Count
    seconds: Seconds
    baseline_seconds: Seconds
    drafted: Count
    accepted: Count
    verify_passes: Count
    identical_to_baseline: bool | None = None  # greedy only


def check_prompt_sums(repeat: Any, prompts: list[PromptRun]) -> None:
    """A repeat's counts are its prompts' sums (records.Repeat): a per-prompt figure that disagrees
    with the total it was summed into is named (seconds within float summation slack)."""
    counts = {"tokens": (repeat.tokens, sum(p.tokens for p in prompts)),
              "drafted": (sum(repeat.drafted_per_position), sum(p.drafted for p in prompts)),
              "accepted": (sum(repeat.accepted_per_position), sum(p.accepted for p in prompts)),
              "verify_passes": (repeat.verify_passes, sum(p.verify_passes for p in prompts))}
    for name, (total, summed) in counts.items():
        if total != summed:
            raise ValueError(f"the prompts' {name} sum to {summed}, not the repeat's {total}")
    for name in ("seconds", "baseline_seconds"):
        summed = math.fsum(getattr(p, name) for p in prompts)
        if not math.isclose(getattr(repeat, name), summed, rel_tol=1e-9):
            raise ValueError(f"the prompts' {name} sum to {summed!r}, not the repeat's {getattr(repeat, name)!r}")


def verdict_in(reason: str) -> Verdict | None:
    """The verdict a record older than schema 3 gave only as the first word of a gate's reason
    ("on: ...", "on with k=2: ...", "off: ...", "undecided: ..."); None when it names none."""
    word = reason.split(":", 1)[0].split(" ", 1)[0].strip()
    return cast(Verdict, word) if word in VERDICTS else None


def with_verdict(data: Any, field: str, reason: str) -> Any:
    """Raw input of a cell or gate that lacks its verdict field (written before schema 3): the
    verdict derived from its reason."""
    if isinstance(data, dict) and field not in data and isinstance(data.get(reason), str):
        return {**data, field: verdict_in(data[reason])}
    return data
