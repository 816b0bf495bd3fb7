"""The real team model's head training (atlas.checkpoints.headtrain), on a tiny random Llama so that it
runs everywhere: the trained layer is what our decode loop runs, several drafts deep; the held-out
acceptance it records equals an independent count through that loop; training lowers the loss;
the committed data reads back exactly and refuses a changed file; no training prompt overlaps a
measurement prompt."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from atlas import AtlasError
from atlas.decode import draftvocab
from atlas.checkpoints import smollm
from atlas.decode.mtphead import load_family
from atlas.families.table import FAMILIES
from atlas.checkpoints.headtrain import data, prompts, teachercache
from atlas.checkpoints.headtrain.head import MtpLayer, Shape
from atlas.checkpoints.headtrain.train import (HeadSpec, LossVocab, frequencies, make_batch, measure, residual_rms, step_losses,
                                               teacher_pass, train)
from atlas.decode.generate import Sampling, generate_plain, generate_speculative
from atlas.decode.model import build_fused_model
from atlas.checkpoints.team_corpus import build_tokenizer
from atlas.records.workloads import bundled_texts
from model_helpers import tiny_llama

GLM = next(f for f in FAMILIES if f.name == "GLM-4-MoE")
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def perturbed_head(llama, seed: int = 0, scale: float = 0.05) -> MtpLayer:
    head = MtpLayer(Shape.of(llama.config, llama.config.intermediate_size), llama.get_input_embeddings().weight, 256)
    head.initialise("last_layer", llama.model.layers[-1], llama.model.norm, torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return head


def checkpoint_with(head: MtpLayer, llama, folder: Path) -> Path:
    record = smollm.provenance({"head_sha256": "0" * 64, "target": "t", "steps": 1, "init": "last_layer", "seed": 0,
                                "data": {"sha256": "1" * 64, "training_answer_tokens": 1},
                                "heldout_after": {"t0_conditional": [0.5], "t1_expected": [0.4]}})
    tensors = head.tensors(smollm.mtp_prefix(llama.config.num_hidden_layers))
    smollm.write_checkpoint(folder, llama, build_tokenizer(), tensors, llama.config.intermediate_size, record)
    return folder


def random_sequences(n: int, vocab: int = 300, seed: int = 3) -> list[data.Sequence]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length, prompt = 20 + int(torch.randint(0, 16, (1,), generator=g)), 6 + i % 3
        ids = torch.randint(0, vocab, (length,), generator=g).tolist()
        out.append(data.Sequence(ids, prompt, ["chat", "code", "math"][i % 3], data.MODES[i % 2], i % 4 == 3))
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    llama = tiny_llama()
    head = perturbed_head(llama)
    folder = checkpoint_with(head, llama, tmp_path_factory.mktemp("head") / "glm")
    model, mtp = load_family(folder, GLM, torch.device("cpu"), torch.float32)
    return llama, head, build_fused_model(model, mtp, 128, list(range(3, 30)), max_draft=4)


def test_the_trained_chain_is_what_the_decode_loop_runs(tiny) -> None:
    """Step s of the chain that starts at pair j, in training, equals our loop's s-th draft of a
    round whose catch-up ended at j and whose earlier drafts were the true tokens: same logits."""
    llama, head, fused = tiny
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        hidden = llama.model(input_ids=ids).last_hidden_state
        chain = head.chain(hidden, ids, 4)
        for j in (0, 5, 20, 33):
            for s in range(4):
                if s == 0:  # the catch-up over pairs 0..j ends with chain j's first draft
                    h, logits = fused.catch_up(ids[0, 1 : j + 2], hidden[0, : j + 1], 0)
                else:  # draft s + 1, fed the previous step's output and the true token j + s + 1
                    h, logits = fused.draft(ids[0, j + s + 1 : j + s + 2], h, j + s)
                ours = head.logits(chain[s][0, j])
                assert (ours - logits).abs().max().item() < 1e-4, (j, s)


def test_recorded_acceptance_equals_an_independent_count_through_the_loop(tiny) -> None:
    """measure()'s per-position T = 0 acceptance, recounted chain by chain with the fused loop's
    drafts (catch-up, then one draft step per position, stopping at the first miss)."""
    llama, head, fused = tiny
    seqs = random_sequences(6)
    teacher = teacher_pass(llama, seqs, 8, lambda _: None)
    got = measure(head, seqs, teacher, list(range(len(seqs))), 3)
    reached, accepted = [0, 0, 0], [0, 0, 0]
    with torch.inference_mode():
        for seq, hidden in zip(seqs, teacher.hidden):
            ids = torch.tensor(seq.ids)
            target = llama.lm_head(hidden).argmax(-1)  # the main model's argmax at every position
            for j in range(len(ids) - 2):
                if j + 1 < seq.prompt_len - 1:  # the first draft's target is a prompt token
                    continue
                h, logits = fused.catch_up(ids[1 : j + 2], hidden[: j + 1], 0)
                for s in range(3):
                    t = j + s + 1  # the target position of step s + 1
                    if t > len(ids) - 2:
                        break
                    if s > 0:
                        h, logits = fused.draft(ids[t : t + 1], h, j + s)
                    reached[s] += 1
                    ok = int(logits.argmax()) == int(target[t])
                    accepted[s] += ok
                    if not ok:
                        break
    assert got["t0_reached"] == reached
    assert got["t0_conditional"] == [round(a / r, 4) if r else None for a, r in zip(accepted, reached)]
    assert sum(reached) > 60 and accepted[0] > 0


def test_decoded_acceptance_equals_the_rounds_our_loop_runs(tiny) -> None:
    """measure()'s t0_decoded, scheduled from teacher-forced chains over the main model's greedy
    answers, counts exactly the rounds and first-draft acceptances that generate_speculative counts
    decoding the same prompts at T = 0, for k = 1..3; a sampled answer is left out."""
    llama, head, fused = tiny
    g = torch.Generator().manual_seed(11)
    prompts_ = [torch.randint(0, 300, (int(n),), generator=g).tolist() for n in (5, 9, 7, 12, 6, 8)]
    seqs = []
    for i, prompt in enumerate(prompts_):
        answer = generate_plain(fused, prompt, 24 + i, Sampling(), g).tokens
        seqs.append(data.Sequence(prompt + answer, len(prompt), "chat", "greedy", True))
    seqs.append(data.Sequence(seqs[0].ids[:-3] + [1, 2, 3], seqs[0].prompt_len, "chat", "sampled", True))
    teacher = teacher_pass(llama, seqs, 8, lambda _: None)
    got = measure(head, seqs, teacher, list(range(len(seqs))), 3)["t0_decoded"]
    for k in (1, 2, 3):
        rounds = drafted = accepted = emitted = 0
        for seq in seqs[:-1]:
            prompt, answer = seq.ids[: seq.prompt_len], seq.ids[seq.prompt_len :]
            run = generate_speculative(fused, prompt, len(answer), k, Sampling(), g)
            assert run.tokens == answer
            rounds += run.verify_passes
            drafted += run.drafted_per_position[0]
            accepted += run.accepted_per_position[0]
            emitted += len(answer) - 1
        assert got[k] == {"answers": 6, "rounds": rounds, "first_draft": round(accepted / drafted, 4),
                          "tokens_per_round": round(emitted / rounds, 4)}, k
        assert 0 < accepted < drafted  # the schedule matters only where some drafts pass and some fail


def test_the_cut_loss_is_the_kl_over_the_set_decoding_drafts_from(tiny, tmp_path: Path) -> None:
    """With loss_vocab N, training cuts the same N ids as the draft vocabulary file decoding reads,
    and each step's loss equals a KL recomputed here by hand: the target's truncated top-k kept on
    the cut and renormalised, against the full logits' softmax over the cut ids alone; a row whose
    target lies wholly outside the cut is dropped."""
    llama, head, _ = tiny
    seqs = random_sequences(12)
    embed = llama.get_input_embeddings().weight
    cut = LossVocab.of(seqs, 40, embed)
    draftvocab.write(tmp_path, frequencies(seqs), "test")
    kept = draftvocab.read(tmp_path, 40, embed.shape[0])[0]
    assert torch.equal(cut.place.ge(0).nonzero().flatten(), kept) and torch.equal(cut.rows, embed[kept])
    with pytest.raises(AtlasError, match="distinct tokens"):
        LossVocab.of(seqs, embed.shape[0] + 1, embed)

    teacher = teacher_pass(llama, seqs, 8, lambda _: None)
    train_ids = [i for i, s in enumerate(seqs) if not s.heldout]
    batch = make_batch(seqs, teacher, train_ids[:4], 2)
    with torch.no_grad():
        got = step_losses(head, batch, 2, cut)
        outs = head.chain(batch.hidden, batch.ids, 2)
    kept_set = set(kept.tolist())
    for s, (out, (b, j)) in enumerate(zip(outs, batch.rows)):
        total, rows, dropped = 0.0, 0, 0
        for r in range(len(b)):
            full = head.logits(out[b[r], j[r]]).double()
            log_q = dict(zip(kept.tolist(), full[kept].log_softmax(-1).tolist()))
            pairs = [(t, p) for t, p in zip(batch.target_ids[s][r].tolist(), batch.target_p[s][r].tolist()) if t in kept_set]
            mass = sum(p for _, p in pairs)
            if mass == 0:
                dropped += 1
                continue
            total += sum(p / mass * (torch.tensor(p / mass).log().item() - log_q[t]) for t, p in pairs if p > 0)
            rows += 1
        assert rows > 10 and dropped > 0  # 40 of ~300 ids: some targets fall wholly outside
        assert got[s].item() == pytest.approx(total / rows, rel=1e-4), s


def test_a_stored_teacher_pass_reads_back_exactly_and_only_for_its_own_facts(tmp_path: Path, monkeypatch) -> None:
    """The cache gives the same tensors the pass computed; a run with other facts, a truncated file
    or a file of another sequence count computes it again (never trusts it)."""
    import atlas.checkpoints.headtrain.teachercache as cache

    llama = tiny_llama()
    seqs = random_sequences(6)
    spec = HeadSpec(threads=1, target_top_k=8, precision="float32")
    passes = []
    real_pass = cache.teacher_pass
    monkeypatch.setattr(cache, "teacher_pass", lambda *a, **k: passes.append(1) or real_pass(*a, **k))
    facts = {"data_sha256": "a" * 64}
    first = teachercache.teacher(llama, seqs, spec, facts, lambda _: None, tmp_path)
    again = teachercache.teacher(llama, seqs, spec, facts, lambda _: None, tmp_path)
    assert len(passes) == 1
    for field in ("hidden", "top_ids", "top_logp"):
        assert all(torch.equal(x, y) for x, y in zip(getattr(first, field), getattr(again, field), strict=True))
    teachercache.teacher(llama, seqs, spec, {"data_sha256": "b" * 64}, lambda _: None, tmp_path)
    assert len(passes) == 2 and len(list(tmp_path.glob("*.safetensors"))) == 2
    stored = sorted(tmp_path.glob("*.safetensors"))[0]
    stored.write_bytes(stored.read_bytes()[:-100])  # one of the two truncated: computed again, and stored whole
    teachercache.teacher(llama, seqs, spec, facts, lambda _: None, tmp_path)
    teachercache.teacher(llama, seqs, spec, {"data_sha256": "b" * 64}, lambda _: None, tmp_path)
    assert len(passes) == 3


def own_answers(llama, n: int) -> list[data.Sequence]:
    """The tiny model's own sampled continuations of random prompts: data a head can learn from."""
    torch.manual_seed(11)
    prompts_ = torch.randint(0, 300, (n, 6), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        out = llama.generate(prompts_, max_new_tokens=24, min_new_tokens=24, do_sample=True, top_k=0, eos_token_id=None, pad_token_id=0)
    return [data.Sequence(out[i].tolist(), 6, ["chat", "code"][i % 2], "sampled", i % 4 == 3) for i in range(n)]


def test_training_lowers_the_held_out_loss_and_is_deterministic() -> None:
    llama = tiny_llama()
    seqs = own_answers(llama, 24)
    spec = HeadSpec(epochs=12, tokens_per_step=160, lr=1e-2, warmup_steps=2, threads=1, eval_points=2, head_intermediate=96,
                    target_top_k=16, max_positions=256)
    a = train(spec, seqs, llama, log=lambda _: None)
    b = train(spec, seqs, llama, log=lambda _: None)
    assert a.after["kl"] < a.before["kl"] - 0.1  # a random model's next-next law is nearly flat: a small, certain drop
    assert all(torch.equal(x, y) for x, y in zip(a.head.tensors("").values(), b.head.tensors("").values()))
    assert [p["step"] for p in a.curve] == [a.steps // 2, a.steps] and a.curve[-1]["answer_tokens_seen"] > 0


def test_the_block_starts_at_the_scale_the_copied_layer_reads() -> None:
    """eh_proj starts at the median RMS of the stream that enters the main model's last layer,
    counted here from what that layer is handed (a hook), not from the hidden states returned."""
    llama = tiny_llama()
    seqs = own_answers(llama, 4)
    handed: list[torch.Tensor] = []

    def grab(_module, args, kwargs) -> None:
        x = args[0] if args else kwargs["hidden_states"]
        handed.append(x[0].float().pow(2).mean(-1).sqrt())

    hook = llama.model.layers[-1].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        got = residual_rms(llama, seqs)
    finally:
        hook.remove()
    assert got == round(torch.cat(handed).median().item(), 4) and len(handed) == len(seqs)
    head = MtpLayer(Shape.of(llama.config, llama.config.intermediate_size), llama.get_input_embeddings().weight, 64)
    head.initialise("random", llama.model.layers[-1], llama.model.norm, torch.Generator().manual_seed(0), got)
    d = llama.config.hidden_size
    assert torch.allclose(head.eh_proj.weight[:, :d], got / 4 * torch.eye(d)) and torch.allclose(head.eh_proj.weight[:, d:], got * torch.eye(d))


def test_committed_data_reads_back_and_a_changed_file_is_refused(tmp_path: Path) -> None:
    seqs = random_sequences(9)
    side = data.save(seqs, data.DataSpec(), tmp_path, "atlas real-model-head-data", 1.0)
    back, side2 = data.load(tmp_path)
    assert back == seqs and side2 == side
    assert side["answer_tokens"] == sum(len(s.ids) - s.prompt_len for s in seqs)
    raw = bytearray((tmp_path / data.DATA_FILE).read_bytes())
    raw[-1] ^= 1
    (tmp_path / data.DATA_FILE).write_bytes(bytes(raw))
    with pytest.raises(AtlasError, match="sha256"):
        data.load(tmp_path)


def test_no_training_prompt_overlaps_a_measurement_prompt() -> None:
    measured = bundled_texts()  # every turn of every bundled set
    first = prompts.expand()
    assert len(first) > 1000 and len({p.text for p in first}) == len(first)
    assert {p.category for p in first} >= {"chat", "code", "math", "summarise", "adversarial", "passages"}
    # the second stage wraps passages the main model wrote: every summarise instruction is checked too
    wrapped = prompts.summarise_prompts(["a passage about a river", "another about a city"] * 3)
    assert prompts.overlaps([p.text for p in first + wrapped], measured) == []
    # the check itself finds a copied prompt, and one that keeps a long run of its words
    assert prompts.overlaps([measured[3]], measured) == [(measured[3], measured[3])]
    near = "Please: " + " ".join(measured[5].split()[:prompts.OVERLAP_WORDS]) + " and nothing else."
    assert prompts.overlaps([near], measured) == [(near, measured[5])]


def test_draft_vocab_table_round_trip_and_refusals(tmp_path: Path) -> None:
    counts = Counter({5: 10, 2: 10, 9: 3, 1: 1})
    table = draftvocab.write(tmp_path, counts, "test")
    assert table["token_ids"] == [2, 5, 9, 1]  # by frequency, ties by id
    ids, info = draftvocab.read(tmp_path, 3, 16)
    assert ids.tolist() == [2, 5, 9] and info["size"] == 3 and info["coverage"] == round(23 / 24, 4)
    with pytest.raises(AtlasError, match="ranks only 4"):
        draftvocab.read(tmp_path, 5, 16)
    with pytest.raises(AtlasError, match="below 8"):
        draftvocab.read(tmp_path, 2, 8)
    with pytest.raises(AtlasError, match="only a project-made head ships"):
        draftvocab.read(tmp_path / "none", 2, 16)
    (tmp_path / draftvocab.FILE).write_text(json.dumps({"token_ids": [1, 1], "counts": [2, 2]}))
    with pytest.raises(AtlasError, match="distinct"):
        draftvocab.read(tmp_path, 1, 16)
