"""The MTP layer being trained: GLM-4-MoE's MTP layer for a dense main model, written out in plain
torch so that training can run it as decoding does, several drafts deep.

What it computes is exactly what the checkpoint computes once written in GLM's layout (the tests
compare it with our decode loop on the built checkpoint): for the pair (h_j, token j+1), with h_j the
main model's post-norm final hidden at j,

    x = eh_proj([enorm(embed(t_{j+1})); hnorm(h_j)])      (embedding first, as GLM and DeepSeek)
    x = block(x)  at RoPE position j+1                      (one pre-norm decoder layer, dense SiLU MLP)
    h' = shared_head.norm(x);  logits = lm_head(h')         (the main model's head, shared and frozen)

and the draft for position j+2 is drawn from those logits. A second draft runs the same layer on
(h', its own first draft), a third on that output, and so on (our loop and vLLM reuse one layer
for k > 1, recycling the post-norm hidden). `chain` runs that recursion over whole sequences with
teacher forcing: step s of the chain that starts at pair j sees token j+s, sits at cache slot
j+s-1 and RoPE position j+s, and attends, as in decoding, to the first step's keys of every pair
up to j (what the catch-up pass wrote) and to the keys its own chain wrote at steps 2..s (the
drafts of the same round, in the slots after them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

Init = Literal["last_layer", "mlp", "random"]
INITS: tuple[Init, ...] = ("last_layer", "mlp", "random")


class RmsNorm(nn.Module):
    """transformers' Llama/GLM RMS norm: in fp32, x · rsqrt(mean(x²) + eps) · w."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float

    @classmethod
    def of(cls, config: Any, intermediate: int) -> "Shape":
        return cls(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                   intermediate, config.rms_norm_eps, float(config.rope_parameters["rope_theta"]))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class MtpLayer(nn.Module):
    """The trainable tensors (GLM names in `tensors()`), with the main model's embedding and head
    held as frozen buffers."""

    def __init__(self, shape: Shape, embed: torch.Tensor, max_positions: int) -> None:
        super().__init__()
        d, hd = shape.hidden, shape.head_dim
        self.shape = shape
        self.enorm, self.hnorm = RmsNorm(d, shape.eps), RmsNorm(d, shape.eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.input_layernorm, self.post_attention_layernorm = RmsNorm(d, shape.eps), RmsNorm(d, shape.eps)
        self.q_proj = nn.Linear(d, shape.heads * hd, bias=False)
        self.k_proj = nn.Linear(d, shape.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, shape.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(shape.heads * hd, d, bias=False)
        self.gate_proj = nn.Linear(d, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(d, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, d, bias=False)
        self.post_norm = RmsNorm(d, shape.eps)  # shared_head.norm
        self.register_buffer("embed", embed.detach(), persistent=False)  # also the tied lm_head
        inv = 1.0 / (shape.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        freqs = torch.outer(torch.arange(max_positions).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    # ---- initialisation --------------------------------------------------------------------

    def initialise(self, how: Init, last: nn.Module, final_norm: nn.Module, generator: torch.Generator,
                   residual: float = 1.0) -> None:
        """"last_layer": the block is a copy of the main model's last decoder layer; "mlp": its MLP
        (and norms) copied, attention drawn at random; "random": all drawn (normal, std 0.02, as
        transformers initialises). Always enorm = hnorm = 1, the output norm = the main model's final
        norm, and eh_proj = [residual/4 · I | residual · I]: the unit-RMS hidden and embedding enter
        the block's residual stream at `residual`, the RMS the main model's stream has where the
        copied layer reads it (residual_rms). At [I | I] the copied layer's updates, sized for a
        stream of RMS about 30 in SmolLM2, swamp a stream of RMS 1: its first drafts are then worse
        than random ones (measured on SmolLM2: held-out KL 49 nats at [I | I], 14 at this scale)."""
        d = self.shape.hidden
        with torch.no_grad():
            for m in (self.q_proj, self.k_proj, self.v_proj, self.o_proj, self.gate_proj, self.up_proj, self.down_proj):
                m.weight.normal_(0.0, 0.02, generator=generator)
            if how in ("last_layer", "mlp"):
                for ours, theirs in ((self.gate_proj, last.mlp.gate_proj), (self.up_proj, last.mlp.up_proj),
                                     (self.down_proj, last.mlp.down_proj)):
                    ours.weight.copy_(theirs.weight)
                self.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
            if how == "last_layer":
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(self, name).weight.copy_(getattr(last.self_attn, name).weight)
                self.input_layernorm.weight.copy_(last.input_layernorm.weight)
            self.eh_proj.weight.copy_(torch.cat([residual / 4 * torch.eye(d), residual * torch.eye(d)], dim=1))
            self.post_norm.weight.copy_(final_norm.weight)

    # ---- the forward -----------------------------------------------------------------------

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [B, 1, n, hd]
        return x * cos + rotate_half(x) * sin

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return proj(x).view(b, t, n, self.shape.head_dim).transpose(1, 2)  # [B, n, T, hd]

    def chain(self, hidden: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """The post-norm outputs of chain steps 1..steps over right-padded sequences: hidden
        [B, L, d] (the main model's post-norm hiddens), ids [B, L]. Step s returns [B, L - s, d]:
        row j is the chain that starts at pair j, its logits drawing token j + s + 1."""
        s_ = self.shape
        b, length, _ = hidden.shape
        rep = s_.heads // s_.kv_heads
        pos = torch.arange(length, device=ids.device)[None].expand(b, -1)
        emb = self.enorm(F.embedding(ids, self.embed))
        outs: list[torch.Tensor] = []
        keys: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: rotated K and V, [B, kv, L - s, hd]
        prev = hidden
        for s in range(1, steps + 1):
            n = length - s
            x = self.eh_proj(torch.cat([emb[:, s:], self.hnorm(prev[:, :n])], dim=-1))
            y = self.input_layernorm(x)
            q = self._rope(self._heads(y, self.q_proj, s_.heads), pos[:, s:])
            k = self._rope(self._heads(y, self.k_proj, s_.kv_heads), pos[:, s:])
            v = self._heads(y, self.v_proj, s_.kv_heads)
            keys.append((k, v))
            attn = self._attend(q, keys, n, rep)
            x = x + self.o_proj(attn.transpose(1, 2).reshape(b, n, s_.heads * s_.head_dim))
            y = self.post_attention_layernorm(x)
            x = x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
            prev = self.post_norm(x)
            outs.append(prev)
        return outs

    def _attend(self, q: torch.Tensor, keys: list[tuple[torch.Tensor, torch.Tensor]], n: int, rep: int) -> torch.Tensor:
        """Causal attention over the first step's keys of pairs 0..j, plus, from step 2 on, the
        keys of steps 2..s of the query's own chain."""
        scale = self.shape.head_dim ** -0.5
        k1, v1 = (t[:, :, :n].repeat_interleave(rep, dim=1) for t in keys[0])
        scores = torch.matmul(q, k1.transpose(-1, -2)) * scale  # [B, H, n, n]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        own = [(kr[:, :, :n].repeat_interleave(rep, dim=1), vr[:, :, :n].repeat_interleave(rep, dim=1)) for kr, vr in keys[1:]]
        if not own:
            return torch.matmul(scores.softmax(-1), v1)
        chain_scores = torch.stack([(q * kr).sum(-1) * scale for kr, _ in own], dim=-1)  # [B, H, n, s-1]
        p = torch.cat([scores, chain_scores], dim=-1).softmax(-1)
        out = torch.matmul(p[..., :n], v1)
        for i, (_, vr) in enumerate(own):
            out = out + p[..., n + i, None] * vr
        return out

    def logits(self, post: torch.Tensor) -> torch.Tensor:
        return F.linear(post, self.embed)

    # ---- the checkpoint's tensors ----------------------------------------------------------

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """The trained tensors under GLM-4-MoE checkpoint names, the MLP as routed expert 0
        (atlas.checkpoints.smollm holds the fixed router and placeholder expert)."""
        return {prefix + name: getattr(self, attr).weight.detach().clone() for name, attr in GLM_NAMES}

    def load_tensors(self, tensors: dict[str, torch.Tensor], prefix: str) -> None:
        missing = [prefix + name for name, _ in GLM_NAMES if prefix + name not in tensors]
        if missing:
            raise KeyError(f"head tensors missing: {missing[:3]}")
        with torch.no_grad():
            for name, attr in GLM_NAMES:
                getattr(self, attr).weight.copy_(tensors[prefix + name].to(torch.float32))


# checkpoint name (after model.layers.N.) -> attribute of MtpLayer
GLM_NAMES = (
    ("enorm.weight", "enorm"), ("hnorm.weight", "hnorm"), ("eh_proj.weight", "eh_proj"),
    ("input_layernorm.weight", "input_layernorm"), ("post_attention_layernorm.weight", "post_attention_layernorm"),
    ("self_attn.q_proj.weight", "q_proj"), ("self_attn.k_proj.weight", "k_proj"), ("self_attn.v_proj.weight", "v_proj"),
    ("self_attn.o_proj.weight", "o_proj"), ("mlp.experts.0.gate_proj.weight", "gate_proj"),
    ("mlp.experts.0.up_proj.weight", "up_proj"), ("mlp.experts.0.down_proj.weight", "down_proj"),
    ("shared_head.norm.weight", "post_norm"),
)
