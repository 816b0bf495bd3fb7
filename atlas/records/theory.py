"""Closed-form figures of self-speculative decoding, the formulas the records and the course cite.

Two acceptance figures exist and must not be mixed up:
- the *acceptance rate* a record stores is accepted drafts / drafted tokens, pooled over positions;
- the *conditional acceptance* at draft position i is P(draft i accepted | drafts 1..i-1 accepted),
  i.e. accepted at i / reached at i, where "reached" counts the rounds whose earlier drafts all
  passed. Only the conditional figures enter the tokens-per-pass formula: pooling a k = 3 round's
  positions as if they were independent understates tokens per pass by up to a quarter at T = 1.

Costs are in units of one plain decoding step (1-row forward of the main model).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class BigramCounts:
    """Expected counts per generation: per draft position, tokens drafted, rounds that reached the
    position (every earlier draft passed) and drafts accepted; and verify passes."""

    drafted: list[float]
    reached: list[float]
    accepted: list[float]
    verify_passes: float


def tokens_per_pass(conditional: Sequence[float]) -> float:
    """Expected tokens one verify pass emits with k = len(conditional) drafts:
    1 + a₁ + a₁a₂ + … + a₁…a_k. Draft i is emitted only when drafts 1..i all pass; the 1 is the
    token every verify pass adds (the correction at the first rejection, or the bonus)."""
    total, reach = 1.0, 1.0
    for a in conditional:
        _check_probability(a)
        reach *= a
        total += reach
    return total


def tokens_per_pass_iid(alpha: float, k: int) -> float:
    """The same with one acceptance probability α at every position (Leviathan et al. 2023):
    (1 − α^(k+1)) / (1 − α), which is k + 1 at α = 1."""
    _check_probability(alpha)
    if k < 0:
        raise ValueError(f"draft length must be >= 0, got {k}")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def conditional_acceptance(reached: Sequence[int], accepted: Sequence[int]) -> list[float | None]:
    """Per-position conditional acceptance from counts: accepted_i / reached_i (None where position i
    was never reached)."""
    if len(reached) != len(accepted):
        raise ValueError("reached and accepted differ in length")
    if any(a < 0 or a > r for a, r in zip(accepted, reached)):
        raise ValueError("accepted exceeds reached (or a count is negative)")
    return [a / r if r else None for a, r in zip(accepted, reached)]


def ideal_speedup(tokens: float, k: int, draft_cost: float, verify_cost: float) -> float:
    """Speed-up over plain decoding when each round costs one (k+1)-row verify pass plus k draft
    steps and emits `tokens` tokens on average: tokens / (verify_cost + k · draft_cost).
    With verify_cost = 1 and draft_cost = c this is Leviathan's (1 − α^(k+1)) / ((1 − α)(ck + 1))."""
    if draft_cost < 0 or verify_cost <= 0:
        raise ValueError("costs must be positive (draft cost may be 0)")
    return tokens / (verify_cost + k * draft_cost)


def acceptance_probability(p: np.ndarray, q: np.ndarray) -> float:
    """P(a draft x ~ q passes the test u < p(x)/q(x)) = Σ_x min(p(x), q(x))."""
    return float(np.minimum(_dist(p), _dist(q)).sum())


def accept_resample_distribution(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The law of the token one position emits under the accept/resample rule: the accepted draft,
    with mass min(p, q), or on rejection (mass 1 − Σ min(p, q)) a draw from norm(max(0, p − q)).
    Mathematically this equals p for every q; computed term by term so a test can check that."""
    p, q = _dist(p), _dist(q)
    accepted = np.minimum(p, q)
    residual = np.clip(p - q, 0.0, None)
    reject = 1.0 - accepted.sum()
    z = residual.sum()
    return accepted + (reject * residual / z if z > 0 else 0.0)


def round_distribution(p: np.ndarray, q: np.ndarray) -> dict[tuple[int, ...], float]:
    """Exact law of one round's emitted tokens under the rule, when the target rows p [k+1, V] and
    the draft rows q [k, V] do not depend on the drafted prefix: draft i ~ q_i, accepted with
    probability min(1, p_i/q_i); the first rejection emits a draw from norm(max(0, p_i − q_i)) and
    ends the round; if all pass, a bonus token from p_{k+1}. Keys are the emitted tuples (accepted
    drafts then the last token), so a tuple of length n + 1 means n drafts accepted.

    Enumerates every branch (V^k of them), so it is for small V and k: it is what a test of an
    accept-rule implementation compares its empirical counts against."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    k, vocab = q.shape
    if p.shape != (k + 1, vocab):
        raise ValueError(f"p must be [k+1, V] = [{k + 1}, {vocab}], got {list(p.shape)}")
    p = np.stack([_dist(row) for row in p])
    q = np.stack([_dist(row) for row in q]) if k else q
    law: dict[tuple[int, ...], float] = {}
    passes = np.minimum(p[:k], q)  # P(draft i = x and it passes)
    residual = np.clip(p[:k] - q, 0.0, None)  # P(the first rejection is at i and emits y)
    for n in range(k + 1):
        for prefix in itertools.product(range(vocab), repeat=n):
            reach = float(np.prod([passes[i, x] for i, x in enumerate(prefix)])) if n else 1.0
            if reach == 0.0:
                continue
            last = p[k] if n == k else residual[n]
            for y in range(vocab):
                if last[y] > 0:
                    law[(*prefix, y)] = law.get((*prefix, y), 0.0) + reach * float(last[y])
    return law


def bigram_acceptance(p: np.ndarray, q: np.ndarray, first: np.ndarray, max_new: int, k: int) -> BigramCounts:
    """Expected counts of one whole sampled generation, computed exactly, for a target whose next
    token depends only on the current one (p [V, V], row = current token) and a draft of the same
    kind (q [V, V]), as the oracle checkpoints are built. `first` is the law of the first (prefill)
    token; rounds near the end draft min(k, max_new − emitted − 1) tokens, as the loop does, and
    every round drafts all of them before the verify pass looks at any.

    Per round from current token t the masses over the context token at depth i are
    m₀ = δ_t, m_{i+1} = m_i · min(P, Q) (a draft d passes from context c with mass min(p(d|c), q(d|c))),
    a rejection at depth i emits y with mass m_i · max(0, P − Q), and the bonus m_k · P."""
    p, q, first = (np.asarray(a, dtype=np.float64) for a in (p, q, first))
    vocab = p.shape[0]
    passes, residual = np.minimum(p, q), np.clip(p - q, 0.0, None)
    counts = BigramCounts([0.0] * k, [0.0] * k, [0.0] * k, 0.0)
    # state[length] = mass over the last emitted token at the start of a round with `length` tokens out
    state = np.zeros((max_new + 1, vocab))
    state[1] = first
    for length in range(1, max_new):
        here = state[length]
        if not here.any():
            continue
        counts.verify_passes += float(here.sum())
        k_now = min(k, max_new - length - 1)
        mass = here
        for i in range(k_now):
            counts.drafted[i] += float(here.sum())
            counts.reached[i] += float(mass.sum())
            state[length + i + 1] += mass @ residual  # rejected at depth i: i accepted + 1 emitted
            mass = mass @ passes
            counts.accepted[i] += float(mass.sum())
        state[length + k_now + 1] += mass @ p
    return counts


def _dist(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or (x < 0).any() or not np.isclose(x.sum(), 1.0, atol=1e-9):
        raise ValueError("expected a probability vector (non-negative, summing to 1)")
    return x


def _check_probability(a: float) -> None:
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"an acceptance probability must lie in [0, 1], got {a}")
