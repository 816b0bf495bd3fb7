"""The fused model: a checkpoint's main model and its MTP layer split into pieces over static,
position-addressed KV caches, in the gpt-fast manner (this file is its model.py; the loops that
drive it are in atlas.decode.generate; its layers are atlas.decode.layers, their CPU kernels
atlas.decode.kernels).

The main model is loaded by transformers and its MTP layer by atlas.decode.mtphead (an MtpHead,
from the family table or from transformers' own MtpModel); this module takes their pieces
(embedding, decoder layers, final norm, lm_head, the MTP layer's norms/projection/block) and runs them against
its own static, position-addressed KV caches. Rollback is free: a rejected draft's cache slots are
simply overwritten by the next round, and the attention mask never lets a query see a later slot.
Recurrent layers (Gated DeltaNet, Mamba2) keep position-addressed state slots instead
(atlas.decode.recurrent), so the same holds for them.

Why not call `model(...)`: on CPU a transformers forward spends most of its time in per-call Python
(mask creation, output capture, kwargs plumbing), and a small model's step is dominated by per-op
dispatch. So recognised pieces run as few, fused tensor ops (norm weights folded into one
pre-transposed qkv matmul and one gate/up matmul, q and k normed and rotated together, attention as
two bmm), and anything unrecognised runs as its own transformers module. `FusedModel.validate` checks
the result against transformers' own forward and the MTP head's reference forward, so an architecture this loop cannot
reproduce is refused instead of measured wrongly.

MTP wiring (as the families' inference code and transformers' MtpModel): the draft for position j+2 comes from
the MTP layer fed e = embed(token j+1) and h = the main model's final *post-norm* hidden at j,
concatenated in the order the MTP layer itself uses, at RoPE position j+1. For k > 1 the same layer is
reused, fed its own output hidden and its own draft (vLLM style). MTP slot j holds that pair (h_j,
t_{j+1}); after each verify pass one catch-up call over the accepted tokens rewrites those slots.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from atlas import AtlasError
from atlas.decode import onepass
from atlas.decode.mtphead import MtpHead, head_from_transformers
from atlas.decode.kernels import ALL_ROWS, CALIBRATION_ROUNDS, Linear, fused, rms_of, unit
from atlas.decode.layers import Layer, Masks, Rope, Step, build_layer, device_of, layer_forward, linear_of, rope_table
from atlas.decode.recurrent import RecurrentLayer


def beyond_dense(keys: int, limit: int) -> str:
    return (f"DSA sparse attention: not measured beyond index_topk = {limit} keys ({keys} asked): past it the indexer "
            "selects a subset, and transformers' own cached and uncached paths already disagree there")


def dense_keys(prompt: int, new: int) -> int:
    """The most keys any forward of a generation attends: the prompt and every emitted token but the
    last, which is returned and never forwarded (plain and speculative alike: a final round drafts
    only up to the token before the last). The indexer keeps min(index_topk, keys) keys, so
    dense_keys <= index_topk is exactly the dense-equivalent regime."""
    return prompt + new - 1


def dense_regime(family: str, limit: int, prompt: int, new: int) -> str:
    """A DSA run's regime statement, or its refusal by name when some forward would see a key subset."""
    keys = dense_keys(prompt, new)
    if keys > limit:
        raise AtlasError(f"{family}: " + beyond_dense(keys, limit))
    return (f"dense-equivalent DSA: prompt + new tokens - 1 = {keys} keys <= index_topk = {limit} (the last token is "
            "never forwarded), so the indexer selects every key and attention is exactly dense MLA; the indexer "
            "weights are loaded and not run")


@dataclass
class MtpPieces:
    """One MTP layer's pieces over its own static cache."""

    device: torch.device
    embed: torch.Tensor
    enorm: Callable[[torch.Tensor], torch.Tensor]
    w_e: Linear
    hnorm: Callable[[torch.Tensor], torch.Tensor]
    w_h: Linear
    block: Layer
    post: list[Callable[[torch.Tensor], torch.Tensor]]
    head: Linear
    rope: Rope
    vocab: torch.Tensor | None = None  # the cut draft vocabulary: token ids `head`'s rows score (FusedModel.draft_vocab)


@dataclass
class FusedModel:
    """A loaded checkpoint (main model + its MTP layer) split into pieces over static caches."""

    model: nn.Module
    mtp: MtpHead
    max_len: int
    device: torch.device
    dtype: torch.dtype
    fast: bool = True
    max_draft: int = 4  # the longest draft a verify pass checks: recurrent layers keep max_draft + 2 state slots
    kernels: str = "auto"  # CPU matmul kernels (Linear, KERNELS); after "auto" it names what was chosen
    # A cut draft vocabulary (FR-Spec): the MTP head scores only these token ids, every other token
    # gets draft probability 0. The accept/resample rule stays exact for any draft distribution, so
    # the output distribution is unchanged; only drafts outside the set become impossible.
    draft_vocab: torch.Tensor | None = None
    layers: list[Layer] = field(default_factory=list)

    def __post_init__(self) -> None:
        base = self.model.get_decoder()
        config = self.model.config.get_text_config()
        embed = base.get_input_embeddings()
        if type(embed) is not nn.Embedding:
            raise AtlasError(f"unsupported embedding module {type(embed).__name__}")
        # Each piece stays on the device it was placed on (atlas.decode.placement); a layer's static
        # caches, masks and RoPE tables live with it, and only the hidden rows cross devices.
        self.embed = embed.weight.detach()
        self._auto = self.kernels == "auto"
        # Why "auto" could not take the one-pass kernel for an fp32 model on CPU, named in what the
        # record keeps: the same machine gave 1.17 plain steps per verify with it and 1.6 without
        # (issue 42), so a record must say which and why
        self._onepass_absent: str | None = None
        if self._auto and self.device.type == "cpu" and self.dtype == torch.float32:
            if onepass.load() is not None:
                self.kernels = "onepass"
            else:
                self._onepass_absent = onepass.absent()
        # DSA families run as dense attention (atlas.decode.mtphead.AllKeys): exact only while
        # no forward sees more than index_topk keys, so a longer one is refused, never approximated.
        self.dense_limit: int | None = getattr(config, "index_topk", None)
        modules = list(base.layers[: config.num_hidden_layers])
        self.layer_devices = [device_of(m, self.device) for m in modules]
        self.layers = [build_layer(m, self.max_len, dev, self.dtype, self.fast, self.max_draft, self.kernels)
                       for m, dev in zip(modules, self.layer_devices)]
        self.head_device = self.model.lm_head.weight.device
        self.norm = self._norm(base.norm if hasattr(base, "norm") else base.norm_f)  # norm_f: Nemotron-H
        self.head = fused([self.model.lm_head], self.head_device, self.kernels)
        self.vocab_size = self.model.lm_head.weight.shape[0]
        self._masks: dict[torch.device, Masks] = {}
        per_layer_rope = hasattr(config, "rope_parameters") and len(config.nested_rope_parameter_keys(config.rope_parameters)) > 0
        types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        self._ropes: dict[tuple[str | None, torch.device], Rope] = {}
        self.stack = [
            (layer, self._rope(getattr(base, "rotary_emb", None), t if per_layer_rope else None, dev), self.masks(dev), dev)
            for layer, t, dev in zip(self.layers, types, self.layer_devices)
        ]
        # The MTP layers (one, or a chain of n): e and h norms folded into the two halves of each
        # projection (split by the loader, so no concat is needed and the family's input order is
        # already settled), the decoder block, and the norm(s) whose output is both the logits input
        # and the hidden recycled for the next draft.
        heads = [self.mtp, *self.mtp.next_layers]
        self.mtp_layers = [self._mtp_pieces(head) for head in heads]
        self.mtp_device = self.mtp_layers[0].device
        self.devices = list(dict.fromkeys([self.device, *self.layer_devices, self.head_device, *(p.device for p in self.mtp_layers)]))
        self._carry: list[torch.Tensor | None] = [None] * len(heads)
        if self._auto:
            self.kernels = (f"auto: one-pass kernel for every row count, {onepass.describe()}" if self.kernels == "onepass"
                            else self._choose_kernels())
        elif self.kernels == "onepass" and self.device.type == "cpu":
            self.kernels = f"onepass, {onepass.describe()}"

    def _linears(self) -> list[Linear]:
        """Every Linear of the model that holds a packed copy, MTP layers included."""
        found: list[Linear] = []
        parts = [self.head, *self.layers, *self.mtp_layers, *(p.block for p in self.mtp_layers)]
        for part in parts:
            for value in ([part] if isinstance(part, Linear) else vars(part).values()):
                if isinstance(value, Linear) and value.packed is not None and value not in found:
                    found.append(value)
        return found

    @torch.inference_mode()
    def _choose_kernels(self) -> str:
        """For each verify row count 2..max_draft+1, time whole passes through oneDNN and through
        torch.mm, interleaved, and keep the faster; the choice is what the record names. Skipped
        (torch.mm throughout) where nothing is packed, and where a recurrent layer's state would be
        advanced by the timing passes; attention caches are only written at slots the next prefill
        overwrites."""
        linears = self._linears()
        if not linears or any(isinstance(layer, RecurrentLayer) for layer in self.layers):
            for linear in linears:
                linear.packed_rows = ()
            return "mm"
        ids = torch.zeros(self.max_draft + 1, dtype=torch.long, device=self.device)
        times: dict[tuple[int, bool], list[float]] = {}
        for _ in range(CALIBRATION_ROUNDS):
            for n in range(2, self.max_draft + 2):
                for packed in (True, False):
                    for linear in linears:
                        linear.packed_rows = ALL_ROWS if packed else ()
                    start = time.perf_counter()
                    self.main(ids[:n], 0)
                    times.setdefault((n, packed), []).append(time.perf_counter() - start)
        rows = faster_rows(times)
        for linear in linears:
            linear.packed_rows = rows
        auto = "auto" if self._onepass_absent is None else f"auto ({self._onepass_absent})"
        return f"{auto}: oneDNN for {describe_rows(rows)}" if rows else f"{auto}: torch.mm for every row count"

    def _mtp_pieces(self, head: MtpHead) -> "MtpPieces":
        device = device_of(head.block, self.device)
        enorm, w_e = self._folded(head.enorm, head.w_e.to(device))
        hnorm, w_h = self._folded(head.hnorm, head.w_h.to(device))
        vocab = None if self.draft_vocab is None else self.draft_vocab.to(device)
        if vocab is not None:
            rows = linear_of(head.head.weight.detach()[vocab].to(device))
            rows.bias = None if head.head.bias is None else nn.Parameter(head.head.bias.detach()[vocab].to(device), requires_grad=False)
            out = fused([rows], device, self.kernels)
        else:
            out = self.head if head.head is self.model.lm_head else fused([head.head], device, self.kernels)
        return MtpPieces(
            device=device, embed=head.embed.to(device), enorm=enorm, w_e=w_e, hnorm=hnorm, w_h=w_h,
            block=build_layer(head.block, self.max_len, device, self.dtype, self.fast, self.max_draft, self.kernels),
            post=[self._norm(m) for m in head.post_norms], head=out,
            rope=self._rope(head.rotary, head.rope_layer_type, device), vocab=vocab,
        )

    def _folded(self, norm: nn.Module, w: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], Linear]:
        """A norm followed by a projection: a plain RMS norm's weight goes into the projection;
        any other norm stays its own module."""
        rms = rms_of(norm)
        if rms is None:
            return norm, Linear(w, None, w.device, self.kernels)
        return (lambda x: unit(x, rms.c)), Linear(w * rms.weight[None, :], None, w.device, self.kernels)

    @staticmethod
    def _norm(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        rms = rms_of(module)
        if rms is None:
            return module
        return lambda x: unit(x, rms.c) * rms.weight

    def _rope(self, rotary: nn.Module | None, layer_type: str | None, device: torch.device) -> Rope:
        if (layer_type, device) in self._ropes:
            return self._ropes[(layer_type, device)]
        if rotary is None:  # attention without position embedding (Nemotron-H): an identity table
            zero = torch.zeros(self.max_len + 1, 1, device=device, dtype=self.dtype)
            table = Rope(torch.ones_like(zero), zero, zero)
        else:
            table = rope_table(rotary, layer_type, self.max_len + 1, device_of(rotary, device), self.dtype)
        self._ropes[(layer_type, device)] = table.to(device)
        return self._ropes[(layer_type, device)]

    def masks(self, device: torch.device) -> "Masks":
        if device not in self._masks:
            self._masks[device] = Masks(self.max_len, device, self.dtype)
        return self._masks[device]

    @staticmethod
    def _step(rope: Rope, start: int, n: int, rope_start: int) -> Step:
        cos = rope.cos[rope_start : rope_start + n, None]
        return Step(start, n, cos, rope.sin_signed[rope_start : rope_start + n, None], rope, rope_start)

    def main(self, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens at positions [start, start+n) -> (post-norm hidden [n, d], logits [n, V])."""
        x = F.embedding(ids, self.embed)
        n = ids.shape[0]
        if self.dense_limit is not None and start + n > self.dense_limit:
            raise AtlasError(beyond_dense(start + n, self.dense_limit))
        steps: dict[int, Step] = {}
        for layer, rope, masks, dev in self.stack:
            if x.device != dev:
                x = x.to(dev)
            st = steps.get(id(rope)) or steps.setdefault(id(rope), self._step(rope, start, n, start))
            x = layer_forward(layer, x, st, masks)
        h = self.norm(x.to(self.head_device))
        return h, self.head(h)

    def draft(self, ids: torch.Tensor, hidden: torch.Tensor, start: int, layer: int = 0, rows: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP layer `layer` over pairs (hidden_j, ids_j) at its slots [start, start+n), RoPE position j+1.

        Returns (the output hidden of the last row, or of every row with `rows`, to feed back for
        the next draft step; the logits of the last row, the draft distribution for the token two
        ahead of hidden's). Layer m > 0 of a chain keeps its slot j at cache index j - m (its first
        pair is at slot m: see `catch_up`), so no cache row is ever read unwritten."""
        p = self.mtp_layers[layer]
        if self.dense_limit is not None and start + ids.shape[0] > self.dense_limit:
            raise AtlasError(beyond_dense(start + ids.shape[0], self.dense_limit))
        e = F.embedding(ids.to(p.device), p.embed)
        x = p.w_h(p.hnorm(hidden.to(p.device)), residual=p.w_e(p.enorm(e)))
        st = self._step(p.rope, start - layer, ids.shape[0], start + 1)
        x = layer_forward(p.block, x, st, self.masks(p.device))
        x = x if rows else x[-1:]
        for norm in p.post:
            x = norm(x)
        logits = p.head(x[-1:])[0]
        if p.vocab is None:
            return x, logits
        return x, logits.new_full((self.vocab_size,), float("-inf")).index_copy_(0, p.vocab, logits)

    def catch_up(self, ids: torch.Tensor, hidden: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write every MTP layer's slots [start, start+n) from verified inputs, and return layer 0's
        last row (output hidden, logits): the next round's first draft.

        Layer 0's slot j takes (main hidden at j, token j+1). A chained layer m > 0 takes, at its
        slot j, (layer m-1's output at slot j-1, token j+1): the trained chain, where layer m at
        sequence position i reads layer m-1's output at i and the token m+1 ahead, numbered so that
        the draft chain's step i writes slot (current + i - 1) whatever layer runs it. Layer m-1's
        output at slot start-1 is the last row of the previous catch-up (kept in `_carry`); at the
        prefill (start 0) there is none, so layer m starts at slot m."""
        if start == 0:
            self._carry = [None] * len(self.mtp_layers)
        out, logits = self.draft(ids, hidden, start, 0, len(self.mtp_layers) > 1)
        last, first = out[-1:], start
        for m in range(1, len(self.mtp_layers)):
            carry, self._carry[m - 1] = self._carry[m - 1], out[-1:]
            if carry is not None and first == start:
                fed = torch.cat([carry.to(out.device), out[:-1]])
            else:
                fed, first = out[:-1], first + 1
            if fed.shape[0] == 0:
                break
            out, _ = self.draft(ids[first - start :], fed, first, m, True)
        return last, logits

    @torch.inference_mode()
    def validate(self, prompt: list[int]) -> float:
        """Largest |difference| between our logits and transformers' own forward, for the main model
        and the MTP layer, over `prompt` (raises AtlasError beyond tolerance)."""
        ids = torch.tensor(prompt, device=self.device)
        out = self.model(ids[None], output_hidden_states=True, use_cache=False)  # no cache: a recurrent-only model has none transformers can size
        hidden, logits = self.main(ids, 0)
        ref_hidden = out.hidden_states[-1][0]
        errors = [(logits - out.logits[0].to(logits.device)).abs().max().item()]
        # Each MTP layer against its own reference, fed the previous layer's reference output
        # one slot back (layer m's first pair is at slot m), as catch_up feeds it.
        fed, ours = ref_hidden[:-1], hidden[:-1]
        for m, head in enumerate([self.mtp, *self.mtp.next_layers]):
            if fed.shape[0] == 0:
                break
            ref_out, ref_logits = head.reference(fed, ids[m + 1 :], torch.arange(m + 1, len(prompt), device=self.device))
            got, mtp_logits = self.draft(ids[m + 1 :], ours, m, m, rows=True)
            ref = ref_logits[-1].to(mtp_logits.device)
            if self.draft_vocab is not None:  # the cut head's scores equal the full head's on its rows
                keep = self.draft_vocab.to(mtp_logits.device)
                mtp_logits, ref = mtp_logits[keep], ref[keep]
            errors.append((mtp_logits - ref).abs().max().item())
            fed, ours = ref_out[:-1], got[:-1]
        tolerance = 1e-3 if self.dtype == torch.float32 else 5e-2
        scale = max(1.0, out.logits.abs().max().item())
        if max(errors) > tolerance * scale:
            raise AtlasError(
                f"the decode loop does not reproduce this architecture (max logit difference main "
                f"{errors[0]:.3g}, MTP {max(errors[1:], default=0.0):.3g}); refusing to measure it"
            )
        return max(errors)


def faster_rows(times: dict[tuple[int, bool], list[float]]) -> frozenset[int]:
    """The row counts whose median pass time through oneDNN (key (n, True)) is below torch.mm's (n, False)."""
    return frozenset(n for n, packed in times if packed and statistics.median(times[(n, True)]) < statistics.median(times[(n, False)]))


def describe_rows(rows: frozenset[int]) -> str:
    return ", ".join(str(n) for n in sorted(rows)) + " rows"


@torch.no_grad()
def build_fused_model(model: nn.Module, mtp: MtpHead | nn.Module, max_len: int, check_prompt: list[int], max_draft: int = 4,
                      kernels: str = "auto", draft_vocab: torch.Tensor | None = None) -> FusedModel:
    """Fast pieces where recognised; if they do not reproduce transformers (or do not fit, e.g. a
    partial RoPE), whole-layer modules; if those do not either, AtlasError.

    The fast pieces hold their own (fused, folded) copy of the projection weights, so on a GPU
    without room for a second copy the module path is used from the start."""
    if not isinstance(mtp, MtpHead):
        mtp = head_from_transformers(mtp)
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    fast = True
    if device.type == "cuda":
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        fast = weight_bytes < 0.8 * torch.cuda.mem_get_info(device)[0]
    if fast:
        try:
            fused = FusedModel(model, mtp, max_len, device, dtype, fast=True, max_draft=max_draft, kernels=kernels,
                               draft_vocab=draft_vocab)
            fused.validate(check_prompt)
            return fused
        except (AtlasError, RuntimeError):
            pass
    fused = FusedModel(model, mtp, max_len, device, dtype, fast=False, max_draft=max_draft, kernels=kernels,
                       draft_vocab=draft_vocab)
    fused.validate(check_prompt)
    return fused
