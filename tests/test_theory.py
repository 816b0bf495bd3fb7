"""The closed-form formulas against direct enumeration or simulation of what they describe."""

from __future__ import annotations

import math

import numpy as np
import pytest

from atlas.records.theory import (
    accept_resample_distribution,
    acceptance_probability,
    bigram_acceptance,
    conditional_acceptance,
    ideal_speedup,
    round_distribution,
    tokens_per_pass,
    tokens_per_pass_iid,
)


def dist(rng: np.random.Generator, vocab: int, peak: float = 2.0) -> np.ndarray:
    x = np.exp(peak * rng.standard_normal(vocab))
    return x / x.sum()


def test_tokens_per_pass_with_one_alpha_is_the_geometric_sum() -> None:
    for alpha in (0.0, 0.3, 0.9, 1.0):
        for k in range(5):
            assert math.isclose(tokens_per_pass([alpha] * k), tokens_per_pass_iid(alpha, k))
            assert math.isclose(tokens_per_pass_iid(alpha, k), sum(alpha**i for i in range(k + 1)))
    assert tokens_per_pass([0.8, 0.5, 0.25]) == pytest.approx(1 + 0.8 + 0.4 + 0.1)


def test_pooled_rate_understates_tokens_per_pass() -> None:
    """Counts of a k = 3 cell: position i is reached only when i - 1 passed. Treating the pooled
    accepted/drafted as an alpha gives fewer tokens per pass than the counts show."""
    reached, accepted = [1000, 800, 400], [800, 400, 100]
    conditional = conditional_acceptance(reached, accepted)
    assert conditional == [0.8, 0.5, 0.25]
    observed = 1 + sum(accepted) / reached[0]  # tokens per pass straight from the counts
    assert tokens_per_pass(conditional) == pytest.approx(observed)
    # what a record's pooled rate gives when each round drafts all k (drafted = k per pass)
    pooled = sum(accepted) / (3 * reached[0])
    assert tokens_per_pass_iid(pooled, 3) < 0.85 * observed


def test_ideal_speedup_matches_leviathan() -> None:
    alpha, k, c = 0.7, 3, 0.1
    assert ideal_speedup(tokens_per_pass_iid(alpha, k), k, c, 1.0) == pytest.approx((1 - alpha ** (k + 1)) / ((1 - alpha) * (c * k + 1)))
    with pytest.raises(ValueError):
        ideal_speedup(2.0, 1, 0.1, 0.0)


def test_accept_resample_reproduces_the_target() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q = dist(rng, 7), dist(rng, 7)
        assert np.allclose(accept_resample_distribution(p, q), p, atol=1e-12)
        assert acceptance_probability(p, q) == pytest.approx(np.minimum(p, q).sum())
    one_hot = np.eye(7)[3]  # a greedy draft, as vLLM's default treats it
    p = dist(rng, 7)
    assert np.allclose(accept_resample_distribution(p, one_hot), p)
    assert acceptance_probability(p, one_hot) == pytest.approx(p[3])
    assert np.allclose(accept_resample_distribution(p, p), p) and acceptance_probability(p, p) == pytest.approx(1)


def test_round_distribution_is_lossless_position_by_position() -> None:
    """A round's law: x1 ~ p1; given the round went on past x1 (x1 was an accepted draft), x2 ~ p2,
    so that joined with a fresh round after a rejection, tokens follow the target exactly."""
    rng = np.random.default_rng(1)
    k, vocab = 3, 4
    p = np.stack([dist(rng, vocab) for _ in range(k + 1)])
    q = np.stack([dist(rng, vocab) for _ in range(k)])
    law = round_distribution(p, q)
    assert sum(law.values()) == pytest.approx(1.0)
    first = np.zeros(vocab)
    for x, m in law.items():
        first[x[0]] += m
    assert np.allclose(first, p[0])
    for depth in range(1, k + 1):
        nxt = np.zeros(vocab)
        for x, m in law.items():
            if len(x) > depth:
                nxt[x[depth]] += m
        assert np.allclose(nxt / nxt.sum(), p[depth])
    # expected accepted drafts = sum over i of the product of the per-position pass probabilities
    expected = sum((len(x) - 1) * m for x, m in law.items())
    betas = [acceptance_probability(p[i], q[i]) for i in range(k)]
    assert expected == pytest.approx(sum(math.prod(betas[: i + 1]) for i in range(k)))


def simulate_bigram(p: np.ndarray, q: np.ndarray, first: np.ndarray, max_new: int, k: int, runs: int, seed: int):
    """A plain simulation of the loop's rounds and counts on a bigram target and draft (independent
    of the DP): all k drafts first, then the tests in order."""
    rng = np.random.default_rng(seed)
    vocab = p.shape[0]
    drafted, reached, accepted, passes = np.zeros(k), np.zeros(k), np.zeros(k), 0
    for _ in range(runs):
        out = [rng.choice(vocab, p=first)]
        while len(out) < max_new:
            k_now = min(k, max_new - len(out) - 1)
            drafts, ctx = [], out[-1]
            for _ in range(k_now):
                drafts.append(rng.choice(vocab, p=q[ctx]))
                ctx = drafts[-1]
            drafted[:k_now] += 1
            ctx, token = out[-1], None
            for i, d in enumerate(drafts):
                reached[i] += 1
                if rng.random() < min(1.0, p[ctx, d] / q[ctx, d]):
                    accepted[i] += 1
                    out.append(d)
                    ctx = d
                    continue
                residual = np.clip(p[ctx] - q[ctx], 0, None)
                token = rng.choice(vocab, p=residual / residual.sum())
                break
            out.append(token if token is not None else rng.choice(vocab, p=p[ctx]))
            passes += 1
    return drafted / runs, reached / runs, accepted / runs, passes / runs


def test_bigram_acceptance_matches_simulation() -> None:
    rng = np.random.default_rng(2)
    vocab, k, max_new = 4, 2, 7
    p = np.stack([dist(rng, vocab) for _ in range(vocab)])
    q = np.stack([dist(rng, vocab, peak=1.0) for _ in range(vocab)])
    first = dist(rng, vocab)
    exact = bigram_acceptance(p, q, first, max_new, k)
    drafted, reached, accepted, verify = simulate_bigram(p, q, first, max_new, k, 4000, seed=3)
    # counts per run are bounded by max_new, so 4000 runs pin each mean to within ~0.1
    for want, got in ((exact.drafted, drafted), (exact.reached, reached), (exact.accepted, accepted)):
        assert np.allclose(want, got, atol=0.12)
    assert exact.verify_passes == pytest.approx(verify, abs=0.12)
    assert exact.reached[0] == exact.drafted[0] and exact.reached[1] < exact.drafted[1]
    same = bigram_acceptance(p, p, first, max_new, k)
    assert same.reached == pytest.approx(same.accepted) and same.drafted == pytest.approx(same.accepted)


def test_bad_inputs_are_errors() -> None:
    with pytest.raises(ValueError):
        tokens_per_pass([1.2])
    with pytest.raises(ValueError):
        conditional_acceptance([3], [4])
    with pytest.raises(ValueError):
        accept_resample_distribution(np.array([0.5, 0.4]), np.array([0.5, 0.5]))
