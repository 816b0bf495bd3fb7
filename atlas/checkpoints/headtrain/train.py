"""Training the MTP layer on the frozen main model: the teacher pass, the loss, the loop, and the
held-out measurement of how well its drafts would be accepted.

Teacher pass: each committed sequence goes once through the frozen main model, which gives the
post-norm final hidden at every position (what the MTP layer is fed) and, through the tied head,
the main model's distribution at every position: the soft target of the draft that predicts the
same token, truncated to its top `target_top_k` tokens (renormalised; the rest of the mass is
tiny and the truncation only drops it from the target).

Loss (FastMTP's recipe, arXiv 2509.18362): the one layer run recursively `depth` steps deep, as
decoding runs it for k = depth drafts, with step weights decaying by `beta` (0.51 / 0.31 / 0.18 for
three steps at beta = 0.6); at each step the forward KL from the main model's distribution over
that token to the draft's, at T = 1. Acceptance at T = 1 is exactly 1 - TV(p, q), for which KL is a
smooth stand-in, and it trains the argmax that greedy acceptance needs as well. Only answer tokens
are targets: what the main model itself wrote.

Measured on held-out sequences, teacher-forced: per chain position s, greedy acceptance given that
the drafts before it were accepted (the conditional the tokens-per-pass formula takes), first-draft
greedy acceptance per category, and the expected T = 1 acceptance Σ min(p, q) per position.
These score a draft at every position. T = 0 decoding drafts only where a round starts, so on the
greedy held-out answers `t0_decoded` counts the rounds it would run, for k = 1..depth.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field

from atlas import AtlasError
from atlas.checkpoints.headtrain.data import Sequence
from atlas.checkpoints.headtrain.head import INITS, Init, MtpLayer, Shape
from atlas.decode.generate import RoundCounts

# the measurement workloads the training categories stand for (the rest are reported as they are)
WORKLOAD_OF = {"chat": "chat", "code": "code", "math": "math", "summarise": "summarise", "adversarial": "adversarial"}


class HeadSpec(BaseModel):
    """Everything that determines the trained head, with the committed data, the main model and torch."""

    seed: int = 20261201
    init: Init = "last_layer"
    depth: int = Field(default=3, ge=1, le=8)  # chain steps trained (drafts deep)
    beta: float = Field(default=0.6, gt=0, le=1)  # step s weighs beta^(s-1), normalised
    epochs: float = Field(default=0.75, gt=0)  # passes over the training sequences (0.75: within 60 min on 2 cores)
    tokens_per_step: int = Field(default=512, ge=64)  # optimizer steps, not tokens, were what the head lacked
    lr: float = Field(default=1e-3, gt=0)
    warmup_steps: int = Field(default=30, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)  # cosine decay to this fraction of lr
    weight_decay: float = Field(default=0.0, ge=0)
    target_top_k: int = Field(default=64, ge=1)
    # The loss over the N most frequent training answer tokens only: the cut draft vocabulary that
    # decoding drafts from with --draft-vocab N (the same ranking, atlas.decode.draftvocab). The
    # frozen head is 49,152 x 576, and its forward and backward were 85 % of a training step; with a
    # cut of 8,192 a step took 0.9 s against 2.2-2.4 s in fp32 on 2 cores (ablation-loss_vocab.json:
    # 328 s against 656 s at equal steps, held-out checks included). The held-out figures stay over
    # the full vocabulary, as stock drafting scores it.
    loss_vocab: int | None = Field(default=None, ge=2)
    head_intermediate: int = Field(default=1536, ge=8)  # the MLP's size (= the main MLP's, which it may copy)
    threads: int = Field(default=2, ge=1)  # part of the spec: the thread count changes float sums
    # the training step's matmuls and the teacher pass over the training sequences (weights stay fp32;
    # the held-out sequences' teacher pass and every measurement run in fp32, as decoding does)
    precision: Literal["float32", "bfloat16"] = "bfloat16"
    eval_points: int = Field(default=6, ge=1)  # held-out measurements along the way (the acceptance curve)
    curve_sequences: int = Field(default=160, ge=1)  # the curve's points use about N held-out sequences, evenly spaced
    sequence_limit: int | None = Field(default=None, ge=2)  # tests and ablations: N sequences evenly spaced over the data
    max_positions: int = Field(default=2048, ge=16)

    @property
    def step_weights(self) -> list[float]:
        w = [self.beta**s for s in range(self.depth)]
        return [x / sum(w) for x in w]


@dataclass
class Teacher:
    """Per sequence: the main model's post-norm hiddens [L, d], and at every target position the
    top-k token ids and log-probabilities of its distribution (rows from prompt_len - 1 on)."""

    hidden: list[torch.Tensor]
    top_ids: list[torch.Tensor]
    top_logp: list[torch.Tensor]


def teacher_pass(main: Any, sequences: list[Sequence], top_k: int, log: Callable[[str], None], tokens_per_batch: int = 4096,
                 precision: str = "float32") -> Teacher:
    """One forward of the frozen main model over every sequence, batched by length, right-padded
    (causal attention never lets a real token see the padding after it). Held-out sequences always
    go through in fp32, as decoding computes them; training sequences in `precision`."""
    out = Teacher([torch.empty(0)] * len(sequences), [torch.empty(0)] * len(sequences), [torch.empty(0)] * len(sequences))
    for heldout in (True, False):
        which = [i for i, s in enumerate(sequences) if s.heldout == heldout]
        fast = precision == "bfloat16" and not heldout
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fast):
            _teacher_part(main, sequences, which, top_k, log, tokens_per_batch, out)
    return out


def _teacher_part(main: Any, sequences: list[Sequence], which: list[int], top_k: int, log: Callable[[str], None],
                  tokens_per_batch: int, out: Teacher) -> None:
    order = sorted(which, key=lambda i: len(sequences[i].ids))
    head = main.get_output_embeddings().weight
    done, start = 0, 0
    with torch.inference_mode():
        while start < len(order):
            width = len(sequences[order[start]].ids)
            rows = [order[start]]
            while start + len(rows) < len(order):
                nxt = order[start + len(rows)]
                if (len(rows) + 1) * max(width, len(sequences[nxt].ids)) > tokens_per_batch:
                    break
                rows.append(nxt)
                width = max(width, len(sequences[nxt].ids))
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            for r, i in enumerate(rows):
                ids[r, : len(sequences[i].ids)] = torch.tensor(sequences[i].ids)
            hidden = main.get_decoder()(input_ids=ids).last_hidden_state
            for r, i in enumerate(rows):
                s = sequences[i]
                h = hidden[r, : len(s.ids)].to(torch.float32, copy=True)
                logp = F.linear(h[s.prompt_len - 1:], head).float().log_softmax(-1)
                top = logp.topk(top_k, dim=-1)
                out.hidden[i], out.top_ids[i], out.top_logp[i] = h, top.indices.to(torch.int32), top.values
            start += len(rows)
            done += sum(len(sequences[i].ids) for i in rows)
            log(f"  teacher pass: {start}/{len(order)} sequences ({done} tokens)")


@dataclass
class Batch:
    ids: torch.Tensor  # [B, L]
    hidden: torch.Tensor  # [B, L, d]
    # per chain step s (1-based, index s - 1): rows (b, j) whose target position j + s is an answer
    # position, and their top-k target ids and probabilities (renormalised)
    rows: list[tuple[torch.Tensor, torch.Tensor]]
    target_ids: list[torch.Tensor]
    target_p: list[torch.Tensor]
    categories: list[list[str]] = field(default_factory=list)


def make_batch(sequences: list[Sequence], teacher: Teacher, pick: list[int], depth: int) -> Batch:
    width = max(len(sequences[i].ids) for i in pick)
    d = teacher.hidden[pick[0]].shape[1]
    ids = torch.zeros(len(pick), width, dtype=torch.long)
    hidden = torch.zeros(len(pick), width, d)
    for r, i in enumerate(pick):
        n = len(sequences[i].ids)
        ids[r, :n] = torch.tensor(sequences[i].ids)
        hidden[r, :n] = teacher.hidden[i]
    rows, t_ids, t_p, cats = [], [], [], []
    for s in range(1, depth + 1):
        bs, js, ti, tp, cs = [], [], [], [], []
        for r, i in enumerate(pick):
            seq = sequences[i]
            # target position t = j + s predicts token t + 1: an answer token, and t + 1 exists
            lo, hi = seq.prompt_len - 1, len(seq.ids) - 2
            if hi < max(lo, s):
                continue
            positions = torch.arange(max(lo, s), hi + 1)
            bs.append(torch.full_like(positions, r))
            js.append(positions - s)
            ti.append(teacher.top_ids[i][positions - lo].long())
            tp.append(teacher.top_logp[i][positions - lo].softmax(-1))  # renormalised top-k
            cs += [seq.category] * len(positions)
        empty = torch.zeros(0, dtype=torch.long)
        rows.append((torch.cat(bs) if bs else empty, torch.cat(js) if js else empty))
        t_ids.append(torch.cat(ti) if ti else empty.view(0, 1))
        t_p.append(torch.cat(tp) if tp else torch.zeros(0, 1))
        cats.append(cs)
    return Batch(ids, hidden, rows, t_ids, t_p, cats)


def frequencies(sequences: list[Sequence]) -> Counter[int]:
    """Answer tokens of the training (not held-out) sequences: what a cut draft vocabulary keeps."""
    return Counter(t for s in sequences if not s.heldout for t in s.ids[s.prompt_len:])


@dataclass
class LossVocab:
    """The loss's cut vocabulary: the kept token ids' embedding rows and each full id's place among them."""

    rows: torch.Tensor  # [n, d]: the frozen head's rows of the kept ids, in ascending id order
    place: torch.Tensor  # [V]: a full id's row in `rows`, -1 where the id is cut

    @classmethod
    def of(cls, sequences: list[Sequence], size: int, embed: torch.Tensor) -> "LossVocab":
        """The `size` most frequent answer tokens of the training sequences, ranked as the draft
        vocabulary file ranks them (count, then id), so training and decoding cut the same set."""
        ranked = sorted(frequencies(sequences).items(), key=lambda kv: (-kv[1], kv[0]))
        if len(ranked) < size:
            raise AtlasError(f"loss_vocab {size}: the training answers hold only {len(ranked)} distinct tokens")
        ids = torch.tensor(sorted(t for t, _ in ranked[:size]), dtype=torch.long)
        place = torch.full((embed.shape[0],), -1, dtype=torch.long)
        place[ids] = torch.arange(size)
        return cls(embed[ids].detach().contiguous(), place)

    def restrict(self, target_ids: torch.Tensor, target_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows kept, target ids as places in the cut, target renormalised over the cut). A row
        whose whole truncated target lies outside the cut has nothing to learn there and is dropped."""
        place = self.place[target_ids]
        p = target_p * (place >= 0)
        mass = p.sum(-1)
        keep = mass > 0
        return keep, place[keep].clamp_min(0), p[keep] / mass[keep, None]


def step_losses(head: MtpLayer, batch: Batch, depth: int, cut: LossVocab | None) -> list[torch.Tensor]:
    """The mean KL of every chain step's target rows (over the full vocabulary, or over `cut`)."""
    outs = head.chain(batch.hidden, batch.ids, depth)
    losses = []
    for s, (out, (b, j)) in enumerate(zip(outs, batch.rows)):
        post, ids, p = out[b, j], batch.target_ids[s], batch.target_p[s]
        if cut is None:
            losses.append(kl_to(head.logits(post), ids, p).mean())
        else:
            keep, ids, p = cut.restrict(ids, p)
            losses.append(kl_to(F.linear(post[keep], cut.rows), ids, p).mean())
    return losses


def kl_to(logits: torch.Tensor, target_ids: torch.Tensor, target_p: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per row, p the truncated target over its top-k ids, q = softmax(logits)."""
    log_q = logits.float().log_softmax(-1).gather(1, target_ids)
    return (target_p * (target_p.clamp_min(1e-30).log() - log_q)).sum(-1)


def _step_batches(train: list[int], sequences: list[Sequence], spec: HeadSpec) -> Iterator[list[int]]:
    """Shuffled passes over the training sequences, cut into batches of about tokens_per_step."""
    generator = torch.Generator().manual_seed(spec.seed + 1)
    while True:
        perm = [train[i] for i in torch.randperm(len(train), generator=generator).tolist()]
        pick: list[int] = []
        for i in perm:
            pick.append(i)
            if sum(len(sequences[j].ids) for j in pick) >= spec.tokens_per_step:
                yield pick
                pick = []


def measure(head: MtpLayer, sequences: list[Sequence], teacher: Teacher, which: list[int], depth: int) -> dict[str, Any]:
    """Teacher-forced acceptance on `which` (see the module docstring), at T = 0 and T = 1."""
    reached, accepted = [0] * depth, [0] * depth
    overlap, counted = [0.0] * depth, [0] * depth
    first: dict[str, list[int]] = {}
    runs: dict[tuple[int, int], int] = {}  # (sequence, chain start) -> leading drafts accepted at T = 0
    kl_sum, kl_n = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(which), 8):
            pick = which[start:start + 8]
            batch = make_batch(sequences, teacher, pick, depth)
            outs = head.chain(batch.hidden, batch.ids, depth)
            chain_ok: dict[tuple[int, int], bool] = {}  # (batch row, chain start j) -> drafts so far accepted
            for s in range(depth):
                b, j = batch.rows[s]
                if not len(b):
                    continue
                logits = head.logits(outs[s][b, j])
                agree = (logits.argmax(-1) == batch.target_ids[s][:, 0]).tolist()  # top-1 of the target = main argmax
                q = logits.softmax(-1)
                # Σ min(p, q) over the target's top-k (the rest of p is below the truncation)
                p_full = batch.target_p[s]
                overlap[s] += torch.minimum(p_full, q.gather(1, batch.target_ids[s])).sum().item()
                counted[s] += len(b)
                if s == 0:
                    kl_sum += kl_to(logits, batch.target_ids[s], p_full).sum().item()
                    kl_n += len(b)
                for r, jj, ok, cat in zip(b.tolist(), j.tolist(), agree, batch.categories[s]):
                    before = chain_ok.get((r, jj)) if s > 0 else True
                    if before is None:  # its earlier drafts target prompt tokens: not a chain decoding runs
                        continue
                    if s == 0:
                        first.setdefault(cat, [0, 0])
                        first[cat][0] += ok
                        first[cat][1] += 1
                    if before:
                        reached[s] += 1
                        accepted[s] += ok
                        runs[(pick[r], jj)] = s + ok
                    chain_ok[(r, jj)] = before and ok
    return {
        "kl": round(kl_sum / max(kl_n, 1), 4),
        "positions": kl_n,
        "t0_conditional": [round(a / r, 4) if r else None for a, r in zip(accepted, reached)],
        "t0_reached": reached,
        "t1_expected": [round(o / c, 4) if c else None for o, c in zip(overlap, counted)],
        "t0_first_by_category": {c: round(a / n, 4) for c, (a, n) in sorted(first.items())},
        "t0_first_by_workload": _by_workload(first),
        "t0_decoded": {k: decoded(sequences, which, runs, k) for k in range(1, depth + 1)},
    }


def decoded(sequences: list[Sequence], which: list[int], runs: dict[tuple[int, int], int], k: int) -> dict[str, Any]:
    """What T = 0 decoding with k drafts a round would count over the greedy answers in `which`:
    the rounds it runs, scheduled as our loop schedules them, each round's accepted drafts read off
    the teacher-forced chains (`runs`). A round starts where the last one's verify pass ended, so
    the position right after an accepted draft is never drafted: where easy positions come in
    runs, this first-draft share is lower than the per-position one. The same round lengths as
    generate_speculative: the first token from the prefill, at most k drafts and never past the
    answer's end; the tests count that loop's rounds beside it."""
    counts = RoundCounts(k)
    answers = 0
    for i in which:
        seq = sequences[i]
        if seq.mode != "greedy":  # a sampled answer is not what T = 0 decoding emits
            continue
        answers += 1
        n_new, emitted = len(seq.ids) - seq.prompt_len, 1
        while emitted < n_new:
            k_now = min(k, n_new - emitted - 1)
            start = seq.prompt_len - 2 + emitted  # chain start: the hidden before the last emitted token
            n = min(runs[(i, start)], k_now) if k_now else 0
            counts.observe(k_now, n)
            emitted += n + 1
    return {
        "answers": answers,
        "rounds": counts.rounds,
        "first_draft": round(counts.accepted[0] / counts.drafted[0], 4) if counts.drafted[0] else None,
        "tokens_per_round": round(counts.emitted / counts.rounds, 4) if counts.rounds else None,
    }


def _by_workload(first: dict[str, list[int]]) -> dict[str, float]:
    pooled: dict[str, list[int]] = {}
    for cat, (a, n) in first.items():
        w = WORKLOAD_OF.get(cat)
        if w:
            pooled.setdefault(w, [0, 0])
            pooled[w][0] += a
            pooled[w][1] += n
    total = [sum(v[0] for v in pooled.values()), sum(v[1] for v in pooled.values())]
    out = {w: round(a / n, 4) for w, (a, n) in sorted(pooled.items())}
    if total[1]:
        out["pooled"] = round(total[0] / total[1], 4)
    return out


def residual_rms(main: Any, sequences: list[Sequence]) -> float:
    """The median RMS, over the tokens of `sequences`, of the main model's residual stream where its
    last decoder layer reads it (the scale a copy of that layer expects; MtpLayer.initialise)."""
    rms = []
    with torch.inference_mode():
        for s in sequences:
            states = main(input_ids=torch.tensor([s.ids]), output_hidden_states=True).hidden_states
            rms.append(states[-2][0].float().pow(2).mean(-1).sqrt())
    return round(torch.cat(rms).median().item(), 4)


@dataclass
class Trained:
    head: MtpLayer
    curve: list[dict[str, Any]]
    before: dict[str, Any]
    after: dict[str, Any]
    seconds: dict[str, float]
    steps: int
    train_tokens: int
    residual: float  # eh_proj's initial scale (residual_rms)


def train(spec: HeadSpec, sequences: list[Sequence], main: Any, log: Callable[[str], None] = print,
          teacher: Teacher | None = None) -> Trained:
    """Deterministic on CPU for a given spec, data and thread count."""
    previous = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    torch.set_num_threads(spec.threads)
    torch.use_deterministic_algorithms(True)
    try:
        return _train(spec, sequences, main, log, teacher)
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1])


def subset(sequences: list[Sequence], limit: int | None) -> list[Sequence]:
    """`limit` sequences evenly spaced over the data (every category, both modes, held-out or not,
    in their proportions), or all of them."""
    if limit is None or limit >= len(sequences):
        return sequences
    return [sequences[i * len(sequences) // limit] for i in range(limit)]


def _train(spec: HeadSpec, sequences: list[Sequence], main: Any, log: Callable[[str], None], teacher: Teacher | None) -> Trained:
    if spec.init not in INITS:
        raise AtlasError(f"unknown init {spec.init!r}: {', '.join(INITS)}")
    sequences = subset(sequences, spec.sequence_limit)
    train_ids = [i for i, s in enumerate(sequences) if not s.heldout]
    heldout_ids = [i for i, s in enumerate(sequences) if s.heldout]
    if not train_ids or not heldout_ids:
        raise AtlasError("too few sequences for a training and a held-out part")
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if teacher is None:
        teacher = teacher_pass(main, sequences, spec.target_top_k, log, precision=spec.precision)
    seconds["teacher_pass"] = time.perf_counter() - t0

    generator = torch.Generator().manual_seed(spec.seed)
    config = main.config
    head = MtpLayer(Shape.of(config, spec.head_intermediate), main.get_input_embeddings().weight, spec.max_positions)
    decoder = main.get_decoder()
    residual = residual_rms(main, [sequences[i] for i in train_ids[:8]])
    head.initialise(spec.init, decoder.layers[-1], decoder.norm, generator, residual)
    before = measure(head, sequences, teacher, heldout_ids, spec.depth)
    log(f"before training (held-out): first-draft T=0 {before['t0_conditional'][0]}, T=1 {before['t1_expected'][0]}")

    answer_tokens = sum(len(sequences[i].ids) - sequences[i].prompt_len for i in train_ids)
    all_tokens = sum(len(sequences[i].ids) for i in train_ids)
    steps = max(1, math.ceil(spec.epochs * all_tokens / spec.tokens_per_step))
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=spec.weight_decay)
    weights = spec.step_weights
    cut = None if spec.loss_vocab is None else LossVocab.of([sequences[i] for i in train_ids], spec.loss_vocab, head.embed)

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return spec.lr * (step + 1) / spec.warmup_steps
        progress = (step - spec.warmup_steps) / max(1, steps - spec.warmup_steps)
        return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    eval_at = {round(steps * (i + 1) / spec.eval_points) for i in range(spec.eval_points)}
    curve_ids = heldout_ids[:: max(1, len(heldout_ids) // spec.curve_sequences)]  # spread over the categories
    curve: list[dict[str, Any]] = []
    batches = _step_batches(train_ids, sequences, spec)
    seen_answers, bucket, n_bucket = 0, [0.0] * spec.depth, 0
    t0 = time.perf_counter()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        pick = next(batches)
        batch = make_batch(sequences, teacher, pick, spec.depth)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.precision == "bfloat16"):
            losses = step_losses(head, batch, spec.depth, cut)
        loss = sum(w * x for w, x in zip(weights, losses))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        seen_answers += sum(len(sequences[i].ids) - sequences[i].prompt_len for i in pick)
        bucket = [b + x.item() for b, x in zip(bucket, losses)]
        n_bucket += 1
        if step + 1 in eval_at:
            point = measure(head, sequences, teacher, curve_ids, spec.depth)
            curve.append({"step": step + 1, "answer_tokens_seen": seen_answers, "seconds": round(time.perf_counter() - t0, 1),
                          "lr": round(lr_at(step), 7), "train_kl": [round(b / n_bucket, 4) for b in bucket],
                          "heldout_kl": point["kl"], "heldout_t0_conditional": point["t0_conditional"],
                          "heldout_t1_expected": point["t1_expected"]})
            bucket, n_bucket = [0.0] * spec.depth, 0
            log(f"step {step + 1}/{steps}: train KL {curve[-1]['train_kl']}, held-out T=0 {point['t0_conditional']} "
                f"({curve[-1]['seconds']:.0f} s, {seen_answers} answer tokens)")
    seconds["train"] = time.perf_counter() - t0
    round_to_stored(head)
    after = measure(head, sequences, teacher, heldout_ids, spec.depth)
    log(f"after training (held-out, stored bf16 weights): T=0 {after['t0_conditional']}, T=1 {after['t1_expected']}")
    return Trained(head, curve, before, after, {k: round(v, 1) for k, v in seconds.items()}, steps, answer_tokens, residual)


def round_to_stored(head: MtpLayer) -> None:
    """Round the trained tensors to bfloat16, how they are committed, so the figures recorded are
    those of the stored head."""
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
