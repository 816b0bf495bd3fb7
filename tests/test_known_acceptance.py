"""Known acceptance: oracle checkpoints whose MTP head agrees with the main model only part of the
time, by construction (`write_checkpoint(..., disagree=...)`: the head's final norm is the main
model's plus random noise, so its argmax differs from the main model's on some tokens and its law
differs everywhere). Both laws are first order and read straight from the tensors
(`bigram_tables`), so the expected drafted / reached / accepted counts of a whole generation follow
exactly (`bigram_acceptance`): at T = 0 from the argmax tables (one-hot rows: a greedy draft passes
iff it is the target's argmax), at T = 1 from the softmax tables.

The measured counts must equal that value exactly at T = 0 (greedy decoding has no randomness) and
lie within 3 standard errors of it at T = 1. Rounds whose first draft is rejected occur in every
case, so a loop that mishandles them (no MTP catch-up after a round with no accepted draft) drafts
from a stale state and its counts leave the known value, although its greedy output stays exact.

One hybrid family (Qwen3.5: Gated DeltaNet main layers, its MTP layer under mtp.*) and one
full-attention family (MiMo)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atlas.decode.checkpoint import load_checkpoint
from atlas.decode.generate import Sampling, generate_plain, generate_speculative
from atlas.decode.model import build_fused_model
from atlas.checkpoints.oracles import bigram_tables, write_checkpoint
from atlas.records.theory import BigramCounts, bigram_acceptance

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CPU = torch.device("cpu")
# Several prompts: the first-order main model's generation depends only on the last prompt token,
# so the prompts end on different tokens.
PROMPTS = ([5, 9, 33, 2, 7], [3, 1, 4, 1, 5, 100], [8, 2, 33, 9], [6, 4])
FAMILIES = {"qwen3_5": 4, "mimo": 2}  # family -> main depth (Qwen3.5: three GDN layers, one full attention)
MAX_NEW = 16


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def leaky(request, tmp_path_factory):
    family = request.param
    folder = write_checkpoint(family, tmp_path_factory.mktemp(family), "oracle", depth=FAMILIES[family],
                              draft_scale=0.8, disagree=0.3, seed=0)
    got = load_checkpoint(str(folder), CPU, torch.float32)
    p, q = bigram_tables(folder, family)
    return build_fused_model(got.model, got.mtp, 64, PROMPTS[0]), p, q


def _vector(counts) -> np.ndarray:
    if isinstance(counts, BigramCounts):
        return np.array([*counts.drafted, *counts.reached, *counts.accepted, counts.verify_passes])
    return np.array([*counts.drafted_per_position, *counts.reached_per_position, *counts.accepted_per_position, counts.verify_passes], dtype=float)


def _margins(table: np.ndarray) -> np.ndarray:
    top = np.sort(np.log(table), axis=1)
    return top[:, -1] - top[:, -2]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_acceptance_equals_the_known_value(leaky, k: int) -> None:
    engine, p, q = leaky
    # No near-tie that float32 arithmetic could flip: the argmax tables are the loop's decisions.
    assert _margins(p).min() > 1e-4 and _margins(q).min() > 1e-4
    eye = np.eye(p.shape[0])
    p1, q1 = eye[p.argmax(1)], eye[q.argmax(1)]
    gen = torch.Generator().manual_seed(0)
    total = np.zeros(3 * k + 1)
    for prompt in PROMPTS:
        run = generate_speculative(engine, prompt, MAX_NEW, k, Sampling(), gen)
        assert run.tokens == generate_plain(engine, prompt, MAX_NEW, Sampling(), gen).tokens
        known = bigram_acceptance(p1, q1, p1[prompt[-1]], MAX_NEW, k)
        assert np.array_equal(_vector(run), _vector(known)), (prompt, _vector(run), _vector(known))
        total += _vector(run)
    drafted0, accepted0 = total[0], total[2 * k]
    assert 0 < accepted0 < drafted0  # rounds with no accepted draft occur, and rounds with some


@pytest.mark.parametrize("k", [1, 2])
def test_sampled_acceptance_matches_the_known_value_within_3_se(leaky, k: int) -> None:
    engine, p, q = leaky
    repeats, s = 60, Sampling(temperature=1.0)
    gen = torch.Generator().manual_seed(1)
    deviations, accepted, drafted = [], 0.0, 0.0
    for prompt in PROMPTS:
        known = bigram_acceptance(p, q, p[prompt[-1]], MAX_NEW, k)
        accepted, drafted = accepted + sum(known.accepted), drafted + sum(known.drafted)
        for _ in range(repeats):
            deviations.append(_vector(generate_speculative(engine, prompt, MAX_NEW, k, s, gen)) - _vector(known))
    dev = np.array(deviations)
    se = dev.std(0, ddof=1) / len(dev) ** 0.5
    assert np.all(np.abs(dev.mean(0)) <= 3 * se + 1e-9), (dev.mean(0), se)
    assert 0.3 < accepted / drafted < 0.9  # the known acceptance is neither trivial nor hopeless
