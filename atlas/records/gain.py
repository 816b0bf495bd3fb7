"""Where a measured speed-up came from, in terms that add up, and the ideal that is a bound.

A repeat's speed-up is baseline seconds / speculative seconds of the same tokens. Per verify pass
(a round) it splits exactly into three factors:

    speed-up = tokens per round x (seconds per plain step / seconds per round)

and each step or round cost splits into its forward passes (the pass costs, timed in isolation)
and everything outside them (sampling, the Python loop, cache bookkeeping): the overhead. The
forward-only ideal, tokens per round x plain forward / (verify + k draft forwards)
(gating.ideal_speedup), leaves both overheads out, and so is no bound: a plain step pays its
overhead once per token, a round once per several, and a loop whose plain step is mostly overhead
beats it (in the records committed by 2026-12-04, 23 of the 100 cells that carry an ideal beat
the stored one, by up to 1.15x). With the overhead a plain step was measured to pay, and a round
assumed to pay at least as much outside its forwards, the ideal

    tokens per round x (plain forward + overhead) / (round forwards + overhead)

is a bound whenever that assumption holds; 9 of those 100 cells still exceed it (median over
repeats), by up to 1.12x, where pass costs timed apart from the run moved by a median 8-27 %
between repeats.
"""

from __future__ import annotations

from typing import NamedTuple

from atlas.records.record import PassCosts, Repeat


class Accounting(NamedTuple):
    tokens_per_round: float  # emitted tokens / verify passes
    plain_step: float  # seconds per plain token: baseline seconds / tokens
    plain_forward: float  # one 1-row forward (pass costs)
    round: float  # seconds per verify pass of the speculative run
    round_forward: float  # one (k+1)-row verify plus k draft steps (pass costs)
    mean_accepted_length: float  # 1 + accepted / passes, what the ideal takes (gating.derive)

    @property
    def plain_overhead(self) -> float:
        """Seconds per plain step outside the forward pass (negative: timing noise between the
        pass costs and the run)."""
        return self.plain_step - self.plain_forward

    @property
    def round_overhead(self) -> float:
        return self.round - self.round_forward

    @property
    def speedup(self) -> float:
        """The repeat's speed-up, as the product of its factors (equal to baseline / seconds)."""
        return self.tokens_per_round * self.plain_step / self.round

    @property
    def forward_ideal(self) -> float:
        """The forward-only ideal the record stores (no overhead on either side): not a bound."""
        return self.mean_accepted_length * self.plain_forward / self.round_forward

    @property
    def overhead_ideal(self) -> float:
        """The ideal with the plain step's measured overhead paid once per round too (a negative
        measured overhead counts as none): a bound when a round's work outside its forwards is at
        least a plain step's."""
        h = max(0.0, self.plain_overhead)
        return self.mean_accepted_length * (self.plain_forward + h) / (self.round_forward + h)


def account(repeat: Repeat, k: int, costs: PassCosts) -> Accounting | None:
    """The accounting of one repeat with draft length k against `costs` (the repeat's own pass
    costs where it has them); None when it made no verify pass or its costs lack k."""
    verify = costs.verify.get(k)
    if not repeat.verify_passes or verify is None:
        return None
    passes = repeat.verify_passes
    return Accounting(
        tokens_per_round=repeat.tokens / passes,
        plain_step=repeat.baseline_seconds / repeat.tokens,
        plain_forward=costs.plain,
        round=repeat.seconds / passes,
        round_forward=verify + k * costs.draft,
        mean_accepted_length=(sum(repeat.accepted_per_position) + passes) / passes,
    )
