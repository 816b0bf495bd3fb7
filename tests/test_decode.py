"""Losslessness of the decode loop: greedy identity, and the sampled output distribution against the
exact one enumerated from plain softmax (with planted wrong rules that the same harness rejects)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from transformers import MellumConfig, MellumForCausalLM
from transformers.modeling_layers import MtpModel

from atlas.measure.families import head_from_transformers
from atlas.measure.loop import (
    Engine,
    FastLayer,
    ModuleLayer,
    Sampling,
    build_engine,
    generate_plain,
    generate_speculative,
    probs_from_logits,
    sample,
    speculative_accept,
)

TEAM = Path(__file__).resolve().parents[1] / "data/hub-mirror/mtp-atlas/byte-mtp-8l"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls gain nothing from threads, and on shared cores OpenMP spinning made a step ~20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model(vocab: int = 16, layers: int = 2, d: int = 32, mlp: str = "dense", seed: int = 0, window: int | None = None):
    """A random MellumForCausalLM with one MTP layer. Large init and perturbed norm weights so that
    distributions are peaked and every weight matters (a unit norm would hide a wiring mistake)."""
    config = MellumConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=2 * d,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=d // 4,
        mlp_layer_types=[mlp] * layers,
        layer_types=["sliding_attention" if window else "full_attention"] * layers,
        sliding_window=window,
        num_mtp_layers=1,
        mtp_layer_types=["sliding_attention" if window else "full_attention"],
        mtp_mlp_layer_types=[mlp],
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=d,
        max_position_embeddings=256,
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    model = MellumForCausalLM(config).eval()
    mtp = MtpModel(model, 1).eval()
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *mtp.named_parameters()]:
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model, mtp


@pytest.mark.parametrize("mlp,window", [("dense", None), ("sparse", None), ("dense", 3)])
def test_engine_reproduces_transformers(mlp: str, window: int | None) -> None:
    model, mtp = tiny_model(mlp=mlp, window=window)
    engine = build_engine(model, mtp, 64, [1, 2, 3, 4, 5, 6])
    assert isinstance(engine.layers[0], FastLayer), "the fast path should recognise a Mellum layer"
    assert engine.validate([7, 3, 9, 1, 1, 0, 15, 4]) < 1e-4
    if window:  # the window cuts single-row steps too: decode past it, spec against plain
        gen = torch.Generator().manual_seed(0)
        plain = generate_plain(engine, [1, 2], 30, Sampling(), gen)
        ref = model.generate(torch.tensor([[1, 2]]), max_new_tokens=30, do_sample=False)
        assert plain.tokens == ref[0, 2:].tolist()
        assert generate_speculative(engine, [1, 2], 30, 3, Sampling(), gen).tokens == plain.tokens


def test_module_fallback_path() -> None:
    """Layers the fast path does not recognise run as whole transformers modules over slot caches;
    that path must reproduce transformers and stay lossless too."""
    model, mtp = tiny_model(mlp="sparse")
    engine = Engine(model, head_from_transformers(mtp), 64, torch.device("cpu"), torch.float32, fast=False)
    assert isinstance(engine.layers[0], ModuleLayer)
    assert engine.validate([7, 3, 9, 1, 1, 0, 15, 4]) < 1e-4
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, [1, 2, 3], 24, Sampling(), gen)
    assert generate_speculative(engine, [1, 2, 3], 24, 2, Sampling(), gen).tokens == plain.tokens


def test_greedy_speculative_equals_plain_and_transformers() -> None:
    model, mtp = tiny_model()
    engine = build_engine(model, mtp, 128, [1, 2, 3])
    gen = torch.Generator().manual_seed(0)
    for prompt in ([1, 2, 3, 4, 5], [9], [15, 0, 15, 0, 3, 3, 3]):
        plain = generate_plain(engine, prompt, 40, Sampling(), gen)
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)
        assert plain.tokens == ref[0, len(prompt) :].tolist()
        for k in (1, 2, 3):
            spec = generate_speculative(engine, prompt, 40, k, Sampling(), gen)
            assert spec.tokens == plain.tokens
            assert sum(spec.accepted_per_position) + spec.verify_passes == len(spec.tokens) - 1


# ---- the distribution ----------------------------------------------------------------------------


def accept_if_argmax(p, q, drafts, gen):
    """Planted bug: 'accept only if equal' to the target's greedy choice, else sample from p (the
    exact-match verification that collapsed acceptance in several engines at T > 0). Comparing with
    a token *sampled* from p instead would be lossless, only wasteful, so it is not a planted bug."""
    target = p.argmax(-1)
    for i, d in enumerate(drafts.tolist()):
        if d != int(target[i]):
            return i, sample(p[i], gen)
    return len(drafts), sample(p[len(drafts)], gen)


def resample_from_p(p, q, drafts, gen):
    """Planted bug: the right acceptance test, but a rejection resamples from p, not max(0, p - q)."""
    k = drafts.shape[0]
    ratio = p[torch.arange(k), drafts] / q[torch.arange(k), drafts]
    for i in range(k):
        if float(torch.rand((), generator=gen)) >= float(ratio[i]):
            return i, sample(p[i], gen)
    return k, sample(p[k], gen)


def exact_distribution(model, prompt: list[int], n: int, s: Sampling) -> dict[tuple[int, ...], float]:
    """P(x_1..x_n) = prod p(x_i | prompt, x_<i) by enumerating every prefix in batched forwards."""
    vocab = model.config.vocab_size
    dist: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.no_grad():
        for _ in range(n):
            prefixes = list(dist)
            batch = torch.tensor([prompt + list(x) for x in prefixes])
            probs = probs_from_logits(model(batch).logits[:, -1], s).double()
            dist = {x + (t,): dist[x] * float(probs[i, t]) for i, x in enumerate(prefixes) for t in range(vocab)}
    return dist


def g_test_pvalue(counts: dict[tuple[int, ...], int], dist: dict[tuple[int, ...], float], total: int) -> float:
    """G-test of observed sequence counts against the exact distribution; cells with an expected
    count under 5 are pooled so the chi-square approximation holds."""
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for x, prob in dist.items():
        if prob * total >= 5:
            observed.append(counts.get(x, 0))
            expected.append(prob * total)
        else:
            pooled_o += counts.get(x, 0)
            pooled_e += prob * total
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    stat = 2 * sum(o * math.log(o / e) for o, e in zip(observed, expected) if o > 0)
    df = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def small_vocab():
    model, mtp = tiny_model(vocab=4, layers=1, d=16, seed=5)
    return model, build_engine(model, mtp, 32, [0, 1, 2, 3])


def draw(engine, prompt, n, k, s, rule, runs, seed):
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    accepted = 0
    for _ in range(runs):
        out = generate_speculative(engine, prompt, n, k, s, gen, rule=rule)
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
        accepted += sum(out.accepted_per_position)
    return counts, accepted


CASES = [
    (2, Sampling(temperature=1.0)),
    (1, Sampling(temperature=0.6)),
    (3, Sampling(temperature=1.5, top_k=3)),
    (2, Sampling(temperature=0.9, top_p=0.8)),
]
RUNS = 1500


@pytest.mark.parametrize("k,s", CASES, ids=[f"k{k}-T{s.temperature}-topk{s.top_k}-topp{s.top_p}" for k, s in CASES])
def test_speculative_sampling_matches_exact_distribution(small_vocab, k: int, s: Sampling) -> None:
    model, engine = small_vocab
    prompt, n = [1, 3, 0], k + 2  # the prefill token, then one full round: k drafts and a bonus
    dist = exact_distribution(model, prompt, n, s)
    counts, accepted = draw(engine, prompt, n, k, s, speculative_accept, RUNS, seed=11)
    assert accepted > RUNS // 10, "drafts must be accepted often enough to exercise the rule"
    assert g_test_pvalue(counts, dist, RUNS) > 1e-3


def test_sampling_over_several_rounds_matches_exact_distribution(small_vocab) -> None:
    """k=1 over 5 new tokens (4^5 = 1024 sequences): most runs reject a draft and go on, so the MTP
    catch-up after a rejection and the overwriting of rejected KV slots are on the checked path."""
    model, engine = small_vocab
    k, s, prompt, n, runs = 1, Sampling(temperature=1.0), [2, 0, 1], 5, 4000
    dist = exact_distribution(model, prompt, n, s)
    gen = torch.Generator().manual_seed(23)
    counts: dict[tuple[int, ...], int] = {}
    drafted = accepted = rejected_then_more = 0
    for _ in range(runs):
        out = generate_speculative(engine, prompt, n, k, s, gen)
        counts[tuple(out.tokens)] = counts.get(tuple(out.tokens), 0) + 1
        drafted += sum(out.drafted_per_position)
        accepted += sum(out.accepted_per_position)
        # a first-round rejection emits 1 token, leaving rounds to run on the rolled-back caches
        rejected_then_more += out.verify_passes >= 3
    assert accepted > drafted // 5 and drafted - accepted > drafted // 5, "both outcomes must be common"
    assert rejected_then_more > runs // 4
    assert g_test_pvalue(counts, dist, runs) > 1e-3


@pytest.mark.parametrize("rule", [accept_if_argmax, resample_from_p])
def test_planted_wrong_rules_are_rejected(small_vocab, rule) -> None:
    model, engine = small_vocab
    k, s = 2, Sampling(temperature=1.0)
    prompt, n = [1, 3, 0], k + 2
    dist = exact_distribution(model, prompt, n, s)
    counts, _ = draw(engine, prompt, n, k, s, rule, RUNS, seed=11)
    assert g_test_pvalue(counts, dist, RUNS) < 1e-6
    # ... while the same harness, seed and sample size pass the exact rule (test above, first case)


def test_processed_probabilities_match_transformers_warpers() -> None:
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    for s in (Sampling(0.7), Sampling(1.3, top_k=5), Sampling(1.0, top_p=0.9), Sampling(0.5, top_k=10, top_p=0.7)):
        ref = TemperatureLogitsWarper(s.temperature)(None, logits)
        if s.top_k:
            ref = TopKLogitsWarper(s.top_k)(None, ref)
        if s.top_p:
            ref = TopPLogitsWarper(s.top_p)(None, ref)
        assert torch.allclose(probs_from_logits(logits, s), ref.softmax(-1), atol=1e-6)


@pytest.mark.skipif(not (TEAM / "config.json").exists(), reason="team checkpoint not built yet")
def test_team_checkpoint_greedy_lossless_on_every_workload() -> None:
    """The team checkpoint loads through transformers' own MTP path, and greedy speculative output is
    token-identical to plain greedy on every bundled workload, for k = 1..3 (fp32, short horizon)."""
    from atlas.measure.runner import load_checkpoint
    from atlas.measure.workloads import load_prompt_set

    loaded = load_checkpoint(str(TEAM), torch.device("cpu"), torch.float32)
    model, mtp, tokenizer = loaded.model, loaded.mtp, loaded.tokenizer
    prompts = load_prompt_set()
    engine = build_engine(model, mtp, 512, tokenizer.encode("def main():"))
    gen = torch.Generator().manual_seed(0)
    for workload in prompts.workloads:
        ids = tokenizer.encode(workload.prompts[0])[-256:]
        plain = generate_plain(engine, ids, 32, Sampling(), gen)
        for k in (1, 2, 3):
            assert generate_speculative(engine, ids, 32, k, Sampling(), gen).tokens == plain.tokens, workload.name
