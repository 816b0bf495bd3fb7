"""The exact expectations and two-sided tests of the conformance suite's T = 1 checks: acceptance
against what a first-order target and its draft give exactly, and emitted tokens against the law P.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from atlas import AtlasError
from atlas.conformance.record import ALPHA, POWER, normal_quantile


def _two_sided_p(z: float) -> float:
    return 2 * (1 - statistics.NormalDist().cdf(abs(z)))


def prefix_acceptance(p: np.ndarray, q: np.ndarray, greedy: bool, k: int) -> np.ndarray:
    """[k, V]: row i = probability that drafts 1..i+1 are all accepted in a verify step that starts
    from each current token, for a first-order target P and draft Q ([V, V], row = current token).
    A draft d from context c passes with mass min(P[c, d], q(d | c)), where q is Q[c] for sampled
    drafts and one-hot at argmax Q[c] for greedy ones (vLLM's default); the next draft's context is d."""
    p = np.asarray(p, dtype=np.float64)
    if greedy:
        qq = np.zeros_like(p)
        qq[np.arange(p.shape[0]), np.asarray(q).argmax(-1)] = 1.0
    else:
        qq = np.asarray(q, dtype=np.float64)
    passes = np.minimum(p, qq)
    rows, v = [], np.ones(p.shape[0])
    for _ in range(k):
        v = passes @ v
        rows.append(v)
    return np.stack(rows) if rows else np.zeros((0, p.shape[0]))


def step_starts(tokens: list[int], per_step_accepted: list[int]) -> list[int]:
    """The current token each verify step started from: the first output token (from the prefill),
    then after a step that accepted a drafts, the token a + 1 places on."""
    starts, at = [], 0
    for a in per_step_accepted:
        if at >= len(tokens):
            raise AtlasError("the engine reported more verify steps than its output explains")
        starts.append(tokens[at])
        at += a + 1
    return starts


def acceptance_test(p: np.ndarray, q: np.ndarray, greedy: bool, k: int, runs: list[tuple[list[int], list[int], list[int]]]) -> dict:
    """Observed accepted drafts against their exact expectation given each step's start token.
    runs: (tokens, per_step_drafted, per_step_accepted). Accepted counts per step are sums of
    prefix indicators with known probabilities, so the total's variance is exact."""
    v = prefix_acceptance(p, q, greedy, k)
    observed = drafted = 0
    expected = variance = 0.0
    per_pos_obs, per_pos_exp = [0] * k, [0.0] * k
    for tokens, d_steps, a_steps in runs:
        for c, d, a in zip(step_starts(tokens, a_steps), d_steps, a_steps):
            probs = v[:d, c]
            mean = float(probs.sum())
            second = float(sum((2 * j + 1) * probs[j] for j in range(d)))  # E[a²] = Σ (2j−1)·P(a ≥ j)
            observed += a
            drafted += d
            expected += mean
            variance += second - mean * mean
            for i in range(d):
                per_pos_obs[i] += int(a > i)
                per_pos_exp[i] += float(probs[i])
    sd = math.sqrt(variance)
    z = (observed - expected) / sd if sd > 0 else (0.0 if observed == round(expected) else math.inf)
    return {"drafted": drafted, "accepted": observed, "expected_accepted": round(expected, 3), "sd": round(sd, 4),
            "acceptance": observed / drafted if drafted else None, "expected_acceptance": expected / drafted if drafted else None,
            "z": round(z, 2) if math.isfinite(z) else str(z), "p_value": _two_sided_p(z) if math.isfinite(z) else 0.0,
            "per_position": [round(o / e, 4) if e else None for o, e in zip(per_pos_obs, per_pos_exp)]}


# The distribution test's result when the outputs hold no transition: named, not a division by zero.
# It rejects nothing and has no power, so its check passes underpowered: inconclusive, never lossless.
NO_TRANSITIONS = {"transitions": 0, "result": "no transitions", "mean_nll": None, "mean_entropy": None, "z": None, "p_value": None,
                  "chi2": None, "chi2_df": 0, "chi2_p_value": None, "detectable_nll_shift": None, "power": POWER}


def distribution_test(p: np.ndarray, outputs: list[list[int]]) -> dict:
    """Do the emitted tokens follow the first-order law P? Two tests on the decode-phase
    transitions (token j -> j+1): mean NLL against the visited states' mean entropy (z-test, exact
    per-state variances), and a pooled chi-square of next-token counts per visited state (bins with
    an expected count under 5 merged), p-value by the Wilson-Hilferty approximation. Power: the
    smallest mean-NLL shift the z-test detects with probability POWER at level ALPHA."""
    logp = np.log(np.clip(np.asarray(p, dtype=np.float64), 1e-300, None))
    entropy = -(np.exp(logp) * logp).sum(-1)
    second = (np.exp(logp) * logp**2).sum(-1) - entropy**2  # Var of −log P[c, X], X ~ P[c]
    nll = mean_h = var = 0.0
    n = 0
    counts: dict[int, np.ndarray] = {}
    for tokens in outputs:
        for c, x in zip(tokens, tokens[1:]):
            nll -= logp[c, x]
            mean_h += entropy[c]
            var += second[c]
            n += 1
            counts.setdefault(c, np.zeros(p.shape[1]))[x] += 1
    if n == 0:  # every output a single token (or none): nothing to test, and no power (atlas.conformance.record.derive_power)
        return dict(NO_TRANSITIONS)
    z = (nll - mean_h) / math.sqrt(var)
    chi2 = 0.0
    df = 0
    for c, observed in counts.items():
        exp = observed.sum() * np.exp(logp[c])
        big = exp >= 5
        o_bins, e_bins = list(observed[big]), list(exp[big])
        if exp[~big].sum() > 0:
            o_bins.append(observed[~big].sum())
            e_bins.append(exp[~big].sum())
        if len(e_bins) < 2:
            continue
        chi2 += sum((o - e) ** 2 / e for o, e in zip(o_bins, e_bins))
        df += len(e_bins) - 1
    chi_z = ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df)) if df else 0.0
    detectable = (normal_quantile(1 - ALPHA / 2) + normal_quantile(POWER)) * math.sqrt(var) / n  # SD of the mean NLL
    return {"transitions": n, "mean_nll": round(nll / n, 4), "mean_entropy": round(mean_h / n, 4), "z": round(z, 2),
            "p_value": _two_sided_p(z), "chi2": round(chi2, 1), "chi2_df": df,
            "chi2_p_value": 1 - statistics.NormalDist().cdf(chi_z) if df else None,
            "detectable_nll_shift": round(detectable, 4), "power": POWER}
