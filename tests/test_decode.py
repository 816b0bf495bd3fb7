"""Losslessness of the decode loop: greedy identity, and the sampled output distribution against the
exact one enumerated from plain softmax (with planted wrong rules that the same harness rejects)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import MellumConfig, MellumForCausalLM
from transformers.modeling_layers import MtpModel

from atlas.decode.mtphead import head_from_transformers
from atlas.records.theory import round_distribution
from atlas.decode.generate import Sampling, generate_plain, generate_speculative, probs_from_logits, sample, speculative_accept
from atlas.decode import onepass
from atlas.decode.layers import FastLayer, ModuleLayer
from atlas.decode.model import FusedModel, build_fused_model

TEAM = Path(__file__).resolve().parents[1] / "data/hub-mirror/mtp-atlas/byte-mtp-8l"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


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
    engine = build_fused_model(model, mtp, 64, [1, 2, 3, 4, 5, 6])
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
    engine = FusedModel(model, head_from_transformers(mtp), 64, torch.device("cpu"), torch.float32, fast=False)
    assert isinstance(engine.layers[0], ModuleLayer)
    assert engine.validate([7, 3, 9, 1, 1, 0, 15, 4]) < 1e-4
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, [1, 2, 3], 24, Sampling(), gen)
    assert generate_speculative(engine, [1, 2, 3], 24, 2, Sampling(), gen).tokens == plain.tokens


def test_greedy_speculative_equals_plain_and_transformers() -> None:
    model, mtp = tiny_model()
    engine = build_fused_model(model, mtp, 128, [1, 2, 3])
    gen = torch.Generator().manual_seed(0)
    for prompt in ([1, 2, 3, 4, 5], [9], [15, 0, 15, 0, 3, 3, 3]):
        plain = generate_plain(engine, prompt, 40, Sampling(), gen)
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)
        assert plain.tokens == ref[0, len(prompt) :].tolist()
        for k in (1, 2, 3):
            spec = generate_speculative(engine, prompt, 40, k, Sampling(), gen)
            assert spec.tokens == plain.tokens
            assert sum(spec.accepted_per_position) + spec.verify_passes == len(spec.tokens) - 1


@pytest.mark.parametrize("kernels", ["rows", "mm", "auto", "onepass"])
def test_verify_rows_equal_one_row_steps(kernels: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The verify pass's rows (oneDNN for 2+ rows with kernels="rows", MKL for one, per row count
    as "auto" timed them where the one-pass kernel is not built, or the one-pass kernel) give the
    logits of one-row steps at the same positions to within 1e-5 of the logit scale, the stated
    tolerance of the kernels; and greedy speculation stays identical to plain decoding through them."""
    import atlas.decode.kernels as fused_kernels

    request.getfixturevalue("onepass_kernel" if kernels == "onepass" else "without_onepass")
    monkeypatch.setattr(fused_kernels, "PACKED_MIN_BYTES", 0)  # a tiny model's weights are packed too
    model, mtp = tiny_model(vocab=64, layers=3, d=64, seed=3)
    engine = build_fused_model(model, mtp, 96, [1, 2, 3], kernels=kernels)
    # what a record keeps: "auto" without the kernel says why it timed torch's paths instead, and
    # the one-pass kernel names the build's prefetch choice
    if kernels == "auto":
        assert engine.kernels.startswith("auto (one-pass kernel not built): ")
    else:
        assert engine.kernels == (f"onepass, {onepass.describe()}" if kernels == "onepass" else kernels)
    assert (engine.layers[0].qkv.packed is not None) == (kernels not in ("mm", "onepass"))
    assert engine.layers[0].qkv.onepass == (kernels == "onepass") and engine.mtp_layers[0].head.onepass == (kernels == "onepass")
    if kernels == "auto":  # every packed Linear, the MTP layer's included, follows the one choice
        chosen = engine.layers[0].qkv.packed_rows
        assert all(linear.packed_rows is chosen for linear in engine._linears())
        assert engine.mtp_layers[0].block.qkv in engine._linears()
    prompt = list(range(5, 40))
    ids = torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        engine.main(torch.tensor(prompt), 0)
        start = len(prompt)
        steps = torch.cat([engine.main(ids[i : i + 1], start + i)[1] for i in range(6)])
        for n in range(2, 7):
            _, rows = engine.main(ids[:n], start)
            assert (rows - steps[:n]).abs().max().item() <= 1e-5 * steps.abs().max().item(), n
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, prompt, 32, Sampling(), gen)
    for k in (1, 2, 3, 4):
        assert generate_speculative(engine, prompt, 32, k, Sampling(), gen).tokens == plain.tokens


def test_auto_kernels_keep_the_faster_path_per_row_count_by_median() -> None:
    from atlas.decode.model import describe_rows, faster_rows

    times = {(2, True): [3.0, 1.0, 9.0], (2, False): [2.0, 2.0, 2.0],   # oneDNN's median 3.0 loses to 2.0
             (3, True): [1.0, 1.5, 50.0], (3, False): [2.0, 2.1, 1.0],  # one slow outlier does not decide
             (4, True): [2.0, 2.0, 2.0], (4, False): [2.0, 2.0, 2.0]}   # a tie keeps torch.mm
    assert faster_rows(times) == {3}
    assert describe_rows(frozenset({5, 3})) == "3, 5 rows"


@pytest.mark.usefixtures("without_onepass")
def test_auto_kernels_are_not_timed_through_a_recurrent_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timing passes would advance a recurrent layer's state, so a hybrid model keeps torch.mm
    (where the one-pass kernel is built, "auto" takes it untimed)."""
    import atlas.decode.kernels as fused_kernels
    from atlas.decode.checkpoint import load_checkpoint
    from atlas.checkpoints.oracles import write_checkpoint

    monkeypatch.setattr(fused_kernels, "PACKED_MIN_BYTES", 0)
    folder = write_checkpoint("qwen3_next", tmp_path / "hybrid", "random", seed=1)
    loaded = load_checkpoint(str(folder), torch.device("cpu"), torch.float32, peer=False)
    engine = build_fused_model(loaded.model, loaded.mtp, 64, [1, 2, 3])
    assert engine.kernels == "mm" and engine._linears()  # packed copies exist, and are not used
    assert not any(2 in linear.packed_rows for linear in engine._linears())


def test_cut_draft_vocab_is_greedy_lossless_and_only_drafts_its_tokens() -> None:
    model, mtp = tiny_model(vocab=64, seed=4)
    vocab = torch.arange(0, 64, 2)  # the even tokens only
    engine = build_fused_model(model, mtp, 96, [1, 2, 3], draft_vocab=vocab)
    full = build_fused_model(model, mtp, 96, [1, 2, 3])
    gen = torch.Generator().manual_seed(0)
    for prompt in ([1, 2, 3, 4, 5], [9, 9, 2]):
        plain = generate_plain(full, prompt, 32, Sampling(), gen)
        for k in (1, 3):
            trace: list[tuple[int, list[int]]] = []
            assert generate_speculative(engine, prompt, 32, k, Sampling(), gen, trace=trace).tokens == plain.tokens
            assert all(d % 2 == 0 for _, drafts in trace for d in drafts)
    with torch.inference_mode():  # inside the set the cut head scores exactly what the full head does
        h = torch.randn(1, 32, generator=torch.Generator().manual_seed(2))
        _, cut = engine.draft(torch.tensor([3]), h, 0)
        _, whole = full.draft(torch.tensor([3]), h, 0)
    assert torch.equal(cut[vocab], whole[vocab]) and torch.isneginf(cut[1::2]).all()


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
    if any(x not in dist for x in counts):
        return 0.0  # an outcome the exact law gives probability 0
    stat = 2 * sum(o * math.log(o / e) for o, e in zip(observed, expected) if o > 0)
    df = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def small_vocab():
    model, mtp = tiny_model(vocab=4, layers=1, d=16, seed=5)
    return model, build_fused_model(model, mtp, 32, [0, 1, 2, 3])


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


@pytest.mark.slow  # a distribution test
@pytest.mark.parametrize("k,s", CASES, ids=[f"k{k}-T{s.temperature}-topk{s.top_k}-topp{s.top_p}" for k, s in CASES])
def test_speculative_sampling_matches_exact_distribution(small_vocab, k: int, s: Sampling) -> None:
    model, engine = small_vocab
    prompt, n = [1, 3, 0], k + 2  # the prefill token, then one full round: k drafts and a bonus
    dist = exact_distribution(model, prompt, n, s)
    counts, accepted = draw(engine, prompt, n, k, s, speculative_accept, RUNS, seed=11)
    assert accepted > RUNS // 10, "drafts must be accepted often enough to exercise the rule"
    assert g_test_pvalue(counts, dist, RUNS) > 1e-3


@pytest.mark.slow  # a distribution test
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


@pytest.mark.slow  # a distribution test
def test_cut_draft_vocab_sampling_matches_exact_distribution(small_vocab) -> None:
    """Drafts only from tokens {0, 2}: q is zero on 1 and 3, and the output law is still exact."""
    model, _ = small_vocab
    engine = build_fused_model(model, small_vocab[1].mtp, 32, [0, 1, 2, 3], draft_vocab=torch.tensor([0, 2]))
    k, s, prompt, n = 2, Sampling(temperature=1.0), [1, 3, 0], 4
    dist = exact_distribution(model, prompt, n, s)
    counts, accepted = draw(engine, prompt, n, k, s, speculative_accept, RUNS, seed=12)
    assert accepted > RUNS // 10
    assert g_test_pvalue(counts, dist, RUNS) > 1e-3


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
    from atlas.decode.checkpoint import load_checkpoint
    from atlas.records.workloads import load_prompt_set

    loaded = load_checkpoint(str(TEAM), torch.device("cpu"), torch.float32)
    model, mtp, tokenizer = loaded.model, loaded.mtp, loaded.tokenizer
    prompts = load_prompt_set()
    engine = build_fused_model(model, mtp, 512, tokenizer.encode("def main():"))
    gen = torch.Generator().manual_seed(0)
    for workload in prompts.workloads:
        ids = tokenizer.encode(workload.prompts[0])[-256:]
        plain = generate_plain(engine, ids, 32, Sampling(), gen)
        for k in (1, 2, 3):
            assert generate_speculative(engine, ids, 32, k, Sampling(), gen).tokens == plain.tokens, workload.name


# ---- the accept rule on its own, against the exact law of a whole multi-draft round ---------------


def reused_uniform(p, q, drafts, gen):
    """Planted bug: one uniform number for every draft position (lossy at k >= 2: after draft 1
    passed, u is no longer uniform, so draft 2's test is biased)."""
    k = drafts.shape[0]
    u = float(torch.rand((), generator=gen))
    for i, d in enumerate(drafts.tolist()):
        if u * float(q[i, d]) >= float(p[i, d]):
            residual = (p[i] - q[i]).clamp_min(0.0)
            return i, sample(residual, gen)
    return k, sample(p[k], gen)


def round_counts(rule, p: torch.Tensor, q: torch.Tensor, rounds: int, seed: int) -> dict[tuple[int, ...], int]:
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(rounds):
        drafts = torch.tensor([sample(row, gen) for row in q])
        n, token = rule(p, q, drafts, gen)
        key = (*drafts[:n].tolist(), token)
        counts[key] = counts.get(key, 0) + 1
    return counts


ROUND_P = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.6, 0.3, 0.1], [0.3, 0.4, 0.3]], dtype=torch.float64)
ROUND_Q = torch.tensor([[0.4, 0.4, 0.2], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]], dtype=torch.float64)
ROUNDS = 10_000  # power: at 20 000 rounds the reused-uniform rule scored p ≈ 1e-87, at 10 000 about 1e-37


@pytest.mark.parametrize(("rule", "exact"), [(speculative_accept, True), (reused_uniform, False),
                                             (resample_from_p, False), (accept_if_argmax, False)])
def test_speculative_accept_against_the_exact_round_law(rule, exact: bool) -> None:
    """k = 3 drafts over a 3-token vocabulary: every emitted tuple's probability is enumerated
    exactly (atlas.records.theory.round_distribution, itself checked to be lossless), and the rule's
    empirical counts over 10 000 rounds are G-tested against it (94 tuples, each expected >= 6
    times). The lossy rules planted here are rejected far beyond the threshold."""
    law = round_distribution(ROUND_P.numpy(), ROUND_Q.numpy())
    counts = round_counts(rule, ROUND_P, ROUND_Q, ROUNDS, seed=3)
    pvalue = g_test_pvalue(counts, law, ROUNDS)
    assert pvalue > 1e-3 if exact else pvalue < 1e-9


# ---- the draft chain recomputed independently; counts recounted from the emitted tokens ----------


@pytest.fixture(scope="module")
def noisy_oracle(tmp_path_factory):
    """A MiMo-layout oracle with noise: drafts are right often (so rounds accept 0..k drafts) yet
    depend on the hidden fed and on the MTP layer's KV cache."""
    from atlas.checkpoints.oracles import write_checkpoint
    from atlas.decode.checkpoint import load_checkpoint

    folder = write_checkpoint("mimo", tmp_path_factory.mktemp("noisy"), "oracle", depth=2, noise=0.6, seed=0)
    got = load_checkpoint(str(folder), torch.device("cpu"), torch.float32)
    return got.model, got.mtp, build_fused_model(got.model, got.mtp, 96, [5, 9, 33, 2])


def reference_drafts(model, head, seq: list[int], pos: int, k: int) -> list[tuple[int, float]]:
    """Greedy drafts of the round whose current token sits at `pos`, recomputed without caches:
    the main model's post-norm hiddens from transformers' own forward over seq[:pos+1]; MTP pairs
    (h_j, t_{j+1}) at RoPE position j+1 for j < pos, then each draft paired with the MTP output
    hidden that produced it. Returns (draft, top-1 minus top-2 logit margin) per step."""
    ids = torch.tensor(seq[: pos + 1])
    hidden = model(ids[None], output_hidden_states=True).hidden_states[-1][0]
    hs, toks = list(hidden[:pos]), seq[1 : pos + 1]
    out = []
    for _ in range(k):
        y, logits = head.reference(torch.stack(hs), torch.tensor(toks), torch.arange(1, len(toks) + 1))
        top = logits[-1].topk(2).values
        d = int(logits[-1].argmax())
        out.append((d, float(top[0] - top[1])))
        hs.append(y[-1])
        toks.append(d)
    return out


def recount(trace: list[tuple[int, list[int]]], tokens: list[int], prompt_len: int) -> tuple[list[int], list[int], list[int], int]:
    """(drafted, reached, accepted per position, verify passes) from the rounds' drafts and the
    emitted tokens alone: a round's accepted drafts are the leading drafts equal to the tokens it
    emitted (a rejected draft is never the emitted token: at T = 0 it differs from the argmax, at
    T > 0 the residual max(0, p - q) is zero at a draft that failed its test)."""
    k = max(len(d) for _, d in trace)
    drafted, reached, accepted = [0] * k, [0] * k, [0] * k
    for pos, drafts in trace:
        emitted = tokens[pos - prompt_len + 1 :]
        n = 0
        while n < len(drafts) and drafts[n] == emitted[n]:
            n += 1
        for i in range(len(drafts)):
            drafted[i] += 1
            reached[i] += i <= n
            accepted[i] += i < n
    return drafted, reached, accepted, len(trace)


@pytest.mark.parametrize("s", [Sampling(), Sampling(temperature=1.0)], ids=["T0", "T1"])
def test_draft_chain_and_counts_recomputed_independently(noisy_oracle, s: Sampling) -> None:
    model, head, engine = noisy_oracle
    prompt, k = [5, 9, 33, 2, 7, 100], 3
    gen = torch.Generator().manual_seed(7)
    checked = 0
    for _ in range(4):
        trace: list[tuple[int, list[int]]] = []
        run = generate_speculative(engine, prompt, 30, k, s, gen, trace=trace)
        drafted, reached, accepted, passes = recount(trace, run.tokens, len(prompt))
        assert (run.drafted_per_position, run.reached_per_position, run.accepted_per_position, run.verify_passes) == (drafted, reached, accepted, passes)
        assert sum(run.accepted_per_position) + run.verify_passes == len(run.tokens) - 1
        if not s.greedy:
            continue
        seq = prompt + run.tokens
        with torch.inference_mode():
            for pos, drafts in trace:
                for i, (want, margin) in enumerate(reference_drafts(model, head, seq, pos, len(drafts))):
                    if margin > 1e-3:  # a near-tie may flip between cached and uncached arithmetic
                        assert drafts[i] == want, f"round at slot {pos}, draft {i + 1}"
                        checked += 1
                    break_chain = drafts[i] != want
                    if break_chain:
                        break
    if s.greedy:
        assert checked > 40
        # both outcomes occur, so catch-up after partial acceptance is on the checked path
        assert 0 < sum(accepted) < sum(drafted)


# ---- what is timed ---------------------------------------------------------------------------------


def test_timed_region_covers_all_but_the_shared_prefill(noisy_oracle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain and speculative runs leave out the same thing from their seconds: the main model's
    prefill over the prompt. Every other forward, the MTP layer's prefill included, is timed."""
    import atlas.decode.generate as generate

    _, _, engine = noisy_oracle
    state = {"timing": False}
    calls: list[tuple[str, int, bool]] = []

    class Watch:
        def __init__(self, *devices) -> None:
            pass

        def start(self) -> None:
            state["timing"] = True

        def stop(self) -> float:
            state["timing"] = False
            return 1.0

    def spy(name, fn):
        def wrapped(ids, *args):
            calls.append((name, ids.shape[0], state["timing"]))
            return fn(ids, *args)
        return wrapped

    monkeypatch.setattr(generate, "Stopwatch", Watch)
    monkeypatch.setattr(engine, "main", spy("main", engine.main))
    monkeypatch.setattr(engine, "draft", spy("draft", engine.draft))
    prompt = [5, 9, 33, 2, 7]
    for run in (lambda: generate_plain(engine, prompt, 12, Sampling(), torch.Generator()),
                lambda: generate_speculative(engine, prompt, 12, 2, Sampling(), torch.Generator())):
        calls.clear()
        run()
        untimed = [c for c in calls if not c[2]]
        assert untimed == [("main", len(prompt), False)], untimed
        assert any(name == "main" for name, _, _ in calls[1:])
