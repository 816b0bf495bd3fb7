"""Self-speculative decoding with a checkpoint's own MTP head, in the gpt-fast manner (this file is
its generate.py; the fused model it drives is atlas.decode.model): sampling, the accept/resample
rule, the two decoding loops, plain (the baseline) and speculative, over the same pieces and
static caches, and the per-round draft counts every engine keeps (RoundCounts).

A round drafts k tokens with the MTP layer, verifies [current, d_1..d_k] in one main-model
forward and accepts by the Leviathan/Chen rule; the next round's writes overwrite a rejected
draft's cache slots, so rollback costs nothing (atlas.decode.model says why that is safe).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from atlas import AtlasError
from atlas.records.gating import is_greedy
from atlas.decode.model import FusedModel


# ---- sampling ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """Temperature 0 means greedy (argmax); top_k/top_p follow transformers' warpers."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)


def probs_from_logits(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The final sampling distribution over the last dim: temperature, then top-k, then top-p."""
    logits = logits.float()
    if s.temperature != 1.0:
        logits = logits / s.temperature
    if s.top_k is not None and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p is not None and s.top_p < 1.0:
        # Same cut as transformers' TopPLogitsWarper: drop the low tail holding at most 1 - top_p.
        sorted_logits, order = torch.sort(logits, dim=-1)
        tail = sorted_logits.softmax(-1).cumsum(-1) <= 1.0 - s.top_p
        tail[..., -1] = False
        logits = logits.masked_fill(tail.scatter(-1, order, tail), float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, gen: torch.Generator) -> int:
    """One draw from `probs` (any non-negative weights) by the exponential race argmax(p / E),
    E ~ Exp(1): exact, and several times cheaper than torch.multinomial on CPU for one row."""
    race = torch.empty_like(probs).exponential_(generator=gen).clamp_min_(torch.finfo(probs.dtype).tiny)  # no 0/0
    return int(torch.div(probs, race).argmax())


AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], tuple[int, int]]


def speculative_accept(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, gen: torch.Generator
) -> tuple[int, int]:
    """Leviathan/Chen rule. p: [k+1, V] target rows, q: [k, V] draft rows, drafts: [k].

    Accept draft i with probability min(1, p_i/q_i); at the first rejection emit a token from
    norm(max(0, p - q)); if all pass, emit the bonus token from p_{k+1}. Returns (accepted, token).
    """
    k = drafts.shape[0]
    if k == 0:
        return 0, sample(p[0], gen)
    at = drafts[:, None]
    r = torch.rand(k, generator=gen, device=p.device)
    # r >= p/q, without dividing (q > 0 for a drafted token); one host transfer for all k tests
    rejected = (r * q.gather(1, at)[:, 0] >= p[:k].gather(1, at)[:, 0]).tolist()
    if True not in rejected:
        return k, sample(p[k], gen)
    j = rejected.index(True)
    residual = (p[j] - q[j]).clamp_min_(0.0)
    # Only reachable when p_j == q_j almost everywhere; p_j is then the exact residual's limit.
    return j, sample(residual if float(residual.sum()) > 0 else p[j], gen)


# ---- the loops ---------------------------------------------------------------------------------


@dataclass
class RunStats:
    """One generation. `seconds` leaves out only the main model's prefill over the prompt and the
    first token it gives (common to plain and speculative decoding, so both time the same phase);
    for speculation it includes the MTP layer's prefill over the prompt, a cost only it pays.
    Per draft position i: drafted (rounds that drafted it), reached (rounds whose drafts before i all
    passed, so i was tested) and accepted. `verify_passes` counts the main-model forwards of the
    timed phase."""

    tokens: list[int]
    seconds: float
    drafted_per_position: list[int]
    accepted_per_position: list[int]
    verify_passes: int
    reached_per_position: list[int] = field(default_factory=list)


class RoundCounts:
    """Per draft position, over the verify rounds of one generation: how many rounds drafted it,
    reached it (every draft before it passed, so it was tested) and accepted it; with the rounds
    and the tokens they emitted. Our loop, transformers' use_mtp peer (from its streamer) and vLLM
    (from its per-step metrics) all feed it one round at a time, as vLLM's SpecDecodingStats is fed."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.drafted, self.reached, self.accepted = [0] * k, [0] * k, [0] * k
        self.rounds = 0
        self.emitted = 0  # accepted drafts plus the token each verify pass adds (correction or bonus)

    def observe(self, drafted: int, accepted: int) -> None:
        """One verify round that drafted `drafted` tokens and accepted the first `accepted` of them."""
        if not 0 <= accepted <= drafted <= self.k:
            raise AtlasError(f"a round accepted {accepted} of {drafted} drafts, where at most {self.k} are drafted per round")
        for i in range(drafted):
            self.drafted[i] += 1
            self.reached[i] += int(i <= accepted)
            self.accepted[i] += int(i < accepted)
        self.rounds += 1
        self.emitted += accepted + 1

    def stats(self, tokens: list[int], seconds: float) -> RunStats:
        """The generation these rounds made, one verify pass per round."""
        return RunStats(tokens, seconds, self.drafted, self.accepted, self.rounds, self.reached)


class Stopwatch:
    """Wall time of device work: CUDA events on one GPU (no host timing of asynchronous launches);
    across several GPUs, perf_counter between synchronisations of all of them; perf_counter on CPU."""

    def __init__(self, device: torch.device, others: list[torch.device] | None = None) -> None:
        gpus = {d for d in [device, *(others or [])] if d.type == "cuda"}
        self.cuda = len(gpus) == 1 and device.type == "cuda"
        self.sync = sorted(gpus, key=str) if len(gpus) > 1 else []
        self.t0 = 0.0

    def start(self) -> None:
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            for d in self.sync:
                torch.cuda.synchronize(d)
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if not self.cuda:
            for d in self.sync:
                torch.cuda.synchronize(d)
            return time.perf_counter() - self.t0
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return self.begin.elapsed_time(end) / 1000


def _pick(logits: torch.Tensor, s: Sampling, gen: torch.Generator) -> int:
    return int(logits.argmax()) if s.greedy else sample(probs_from_logits(logits, s), gen)


@torch.inference_mode()
def generate_plain(model: FusedModel, prompt: list[int], max_new: int, s: Sampling, gen: torch.Generator) -> RunStats:
    """The baseline: the same pieces and static cache, one token per forward."""
    ids = torch.tensor(prompt, device=model.device)
    _, logits = model.main(ids, 0)
    out = [_pick(logits[-1], s, gen)]
    pos = len(prompt)
    watch = Stopwatch(model.device, model.devices)
    watch.start()
    cur = torch.empty(1, dtype=torch.long, device=model.device)
    while len(out) < max_new:
        cur.fill_(out[-1])
        _, logits = model.main(cur, pos)
        out.append(_pick(logits[-1], s, gen))
        pos += 1
    return RunStats(out, watch.stop(), [], [], max_new - 1)


@torch.inference_mode()
def generate_speculative(
    model: FusedModel,
    prompt: list[int],
    max_new: int,
    k: int,
    s: Sampling,
    gen: torch.Generator,
    rule: AcceptRule = speculative_accept,
    trace: list[tuple[int, list[int]]] | None = None,
) -> RunStats:
    """Draft k tokens with the MTP layer, verify [cur, d_1..d_k] in one forward, accept by `rule`.
    `trace`, when given, receives each round's (slot of the current token, drafts), so a test can
    recount and recompute the rounds independently.

    Drafts are sampled from q (the MTP logits through the same temperature/top-k/top-p as p) at
    T > 0 and argmax at T = 0, where the rule reduces to comparing with the target's argmax.
    Rounds near the end draft fewer tokens so exactly `max_new` tokens come out.
    """
    dev = model.device
    ids = torch.tensor(prompt, device=dev)
    hidden, logits = model.main(ids, 0)
    out = [_pick(logits[-1], s, gen)]
    pos = len(prompt)  # slot of the current (last emitted, not yet forwarded) token
    watch = Stopwatch(dev, model.devices)
    watch.start()  # the MTP layer's prefill is a cost only speculation pays: timed
    h_mtp, q_logits = model.catch_up(torch.cat([ids[1:], ids.new_tensor(out)]), hidden, 0)
    counts = RoundCounts(k)
    n_mtp = len(model.mtp_layers)
    while len(out) < max_new:
        k_now = min(k, max_new - len(out) - 1)
        drafts: list[int] = []
        q_rows: list[torch.Tensor] = []
        for i in range(k_now):
            if i > 0:  # draft i from MTP layer i mod n, fed the previous step's output (vLLM's reuse)
                h_mtp, q_logits = model.draft(ids.new_tensor(drafts[-1:]), h_mtp, pos + i - 1, i % n_mtp)
            if s.greedy:
                drafts.append(int(q_logits.argmax()))
            else:
                q_rows.append(probs_from_logits(q_logits, s))
                drafts.append(sample(q_rows[-1], gen))
        if trace is not None:
            trace.append((pos, list(drafts)))
        hidden, logits = model.main(ids.new_tensor([out[-1], *drafts]), pos)
        if s.greedy:
            target = logits.argmax(-1).tolist()
            n = 0
            while n < k_now and drafts[n] == target[n]:
                n += 1
            token = target[n]
        else:
            d = ids.new_tensor(drafts)
            n, token = rule(probs_from_logits(logits, s), torch.stack(q_rows) if q_rows else logits[:0], d, gen)
        counts.observe(k_now, n)
        out.extend(drafts[:n])
        out.append(token)
        if len(out) < max_new:
            # Catch the MTP caches up on the accepted pairs (h_j, t_{j+1}), overwriting the chain's
            # guesses; layer 0's last row drafts the next round's first token.
            h_mtp, q_logits = model.catch_up(ids.new_tensor([*drafts[:n], token]), hidden[: n + 1], pos)
        pos += n + 1
    return counts.stats(out, watch.stop())
