"""Recurrent main-model layers (Gated DeltaNet, Mamba2) over per-position state slots.

A recurrent layer's state after position p depends on every token up to p, so a rejected draft
cannot be undone by overwriting, as an attention cache slot is. The production engines keep one
state per verified position and start the next round from the state after the last accepted one
(vLLM's `num_accepted - 1` slot; see ../shared/research-notes/hybrid-dsa-and-engines.md §1). Here the
slots are addressed by position, like the loop's static KV caches: the state after position p lives
in slot p mod R and the conv input of position p in column p mod C. A forward at `start` reads the
state after start - 1 and writes one state per row, so whatever round comes next (after all k
drafts passed, or none) finds the state it needs already written, and a rejected draft's slots are
simply overwritten later. R = max_draft + 2 states (the one read, k + 1 written) and
C = kernel - 1 + max_draft + 1 conv columns (vLLM widens its conv state the same way).

One path for every call: prefill, the plain baseline's one-token step and the (k+1)-row verify pass
all run the token-by-token recurrence (each step writes straight into its own slot, so keeping every
position's state costs memory but no copies). Plain and speculative decoding therefore compute the
recurrent layers with the same operations, and greedy output is identical token for token;
transformers' chunked kernel (its multi-token path) agrees with it only up to rounding.

Mamba2 time steps are clamped to the config's `time_step_limit` (Nemotron-3 Super ships
[0, inf]; Nemotron-3 Ultra [0, 1e308], read as [0, inf]: see time_step_limit) in every path. transformers 5.24's NemotronHMamba2Mixer clamps them at `time_step_min`
in its chunked scan only (not in its one-token step), which is why its cached decode drifts from
its own full forward; atlas.decode.mtphead sets its limit from the config so the two agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from atlas import AtlasError

PATH = "token-by-token recurrence (atlas.decode.recurrent) for prefill, plain step and verify pass alike; fp32 state"


class StateSlots:
    """The two position-addressed buffers every recurrent mixer keeps: conv inputs and states."""

    def __init__(self, conv_dim: int, kernel: int, state_shape: tuple[int, ...], max_draft: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.kernel, self.max_rows = kernel, max_draft + 1
        self.conv = torch.zeros(kernel - 1 + self.max_rows, conv_dim, device=device, dtype=dtype)
        self.state = torch.zeros(self.max_rows + 1, *state_shape, device=device, dtype=torch.float32)
        self.zero = torch.zeros(state_shape, device=device, dtype=torch.float32)

    def window(self, new: torch.Tensor, start: int) -> torch.Tensor:
        """[kernel - 1 + n, conv_dim]: the conv inputs of the kernel - 1 positions before `start`
        (zeros before position 0), then `new`; `new` is stored at its positions."""
        n, c = new.shape[0], self.conv.shape[0]
        if start > 0 and n > self.max_rows:
            raise AtlasError(f"a {n}-row forward at position {start} exceeds the {self.max_rows} rows the recurrent state slots were built for")
        before = [p % c for p in range(start - self.kernel + 1, start) if p >= 0]
        pad = new.new_zeros(self.kernel - 1 - len(before), new.shape[1])
        out = torch.cat([pad, self.conv[before], new])
        keep = min(n, c)
        self.conv[[p % c for p in range(start + n - keep, start + n)]] = new[n - keep :]
        return out

    def initial(self, start: int) -> torch.Tensor:
        return self.zero if start == 0 else self.state[(start - 1) % self.state.shape[0]]

    def slot(self, position: int) -> torch.Tensor:
        return self.state[position % self.state.shape[0]]

    @property
    def extra_bytes(self) -> int:
        """What the per-position slots cost beyond one state and a kernel - 1 conv window."""
        one_state = self.zero.numel() * self.zero.element_size()
        return (self.state.shape[0] - 1) * one_state + self.max_rows * self.conv.shape[1] * self.conv.element_size()

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.conv, self.state))


def _conv(window: torch.Tensor, conv: nn.Conv1d, n: int) -> torch.Tensor:
    """Depthwise causal conv1d of the window (no padding: the window carries the left context), silu."""
    out = F.conv1d(window.t()[None].to(conv.weight.dtype), conv.weight, conv.bias, groups=conv.weight.shape[0])[0]
    return F.silu(out[:, -n:]).t().to(window.dtype)


class GatedDeltaNet:
    """A Qwen3-Next or Qwen3.5 GatedDeltaNet module's computation over position-addressed slots:
    the same projections, causal conv, L2-normed q/k, decay g = -exp(A_log)·softplus(a + dt_bias),
    β = sigmoid(b), delta rule S ← S·exp(g); S += k ⊗ β(v − Sᵀk); o = Sᵀq/√d_k, gated RMS norm,
    output projection."""

    def __init__(self, mixer: nn.Module, max_draft: int, device: torch.device, dtype: torch.dtype) -> None:
        self.m = mixer
        self.hk, self.hv = mixer.num_k_heads, mixer.num_v_heads
        self.dk, self.dv = mixer.head_k_dim, mixer.head_v_dim
        if self.hv % self.hk:
            raise AtlasError(f"Gated DeltaNet with {self.hv} value heads over {self.hk} key heads (not a multiple)")
        self.slots = StateSlots(mixer.conv_dim, mixer.conv_kernel_size, (self.hv, self.dk, self.dv), max_draft, device, dtype)
        self.neg_a = -mixer.A_log.detach().float().exp()
        self.dt_bias = mixer.dt_bias.detach().float()

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(conv input [n, conv_dim], z [n, hv, dv], b [n, hv], a [n, hv]) for either layout."""
        m, n = self.m, x.shape[0]
        if hasattr(m, "in_proj_qkvz"):  # Qwen3-Next: fused, grouped per key head
            q, k, v, z, b, a = m.fix_query_key_value_ordering(m.in_proj_qkvz(x[None]), m.in_proj_ba(x[None]))
            qkv = torch.cat([t.reshape(n, -1) for t in (q, k, v)], dim=-1)
            return qkv, z[0], b[0], a[0]
        return m.in_proj_qkv(x), m.in_proj_z(x).view(n, self.hv, self.dv), m.in_proj_b(x), m.in_proj_a(x)

    def __call__(self, x: torch.Tensor, start: int) -> torch.Tensor:
        n = x.shape[0]
        qkv, z, b, a = self._project(x)
        mixed = _conv(self.slots.window(qkv, start), self.m.conv1d, n)
        key_dim = self.hk * self.dk
        q, k, v = mixed.float().split([key_dim, key_dim, self.hv * self.dv], dim=-1)
        rep = self.hv // self.hk
        q, k = (t.view(n, self.hk, self.dk).repeat_interleave(rep, dim=1) for t in (q, k))
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * self.dk**-0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        v = v.view(n, self.hv, self.dv)
        beta = b.float().sigmoid()
        decay = (self.neg_a * F.softplus(a.float() + self.dt_bias)).exp()
        out = torch.empty(n, self.hv, self.dv, device=x.device)
        state = self.slots.initial(start)
        for t in range(n):
            slot = self.slots.slot(start + t)
            torch.mul(state, decay[t, :, None, None], out=slot)
            delta = (v[t] - (slot * k[t, :, :, None]).sum(-2)) * beta[t, :, None]
            slot.addcmul_(k[t, :, :, None], delta[:, None, :])
            out[t] = (slot * q[t, :, :, None]).sum(-2)
            state = slot
        y = self.m.norm(out.to(x.dtype).reshape(-1, self.dv), z.reshape(-1, self.dv))
        return self.m.out_proj(y.reshape(n, -1))


def time_step_limit(values: object) -> tuple[float, float]:
    """A config's Mamba2 time_step_limit as clamp bounds. A bound past float32's range (Nemotron-3
    Ultra's JSON writes "no upper limit" as 1e308, JSON having no Infinity) is no bound at all for
    the float32 / bfloat16 time steps it clamps, so it becomes +-inf: exact for every value those
    dtypes hold, where torch.clamp would refuse 1e308 as an overflow."""
    if not isinstance(values, (list, tuple)) or len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise AtlasError(f"time_step_limit {values!r} is not a [low, high] pair of numbers")
    top = torch.finfo(torch.float32).max
    low, high = (float(v) if abs(v) <= top else math.copysign(math.inf, v) for v in values)
    if low > high:
        raise AtlasError(f"time_step_limit {values!r}: low above high")
    return low, high


class Mamba2:
    """A Nemotron-H Mamba2 mixer's computation over position-addressed slots: in_proj to
    (gate, xBC, dt), causal conv on xBC, dt = softplus(dt + dt_bias) clamped to the config's
    time_step_limit, per head S ← S·exp(dt·A) + dt·x ⊗ B (head h reads group h // (heads/groups)),
    y = S·C + D·x, gated group RMS norm, output projection. State in fp32."""

    def __init__(self, mixer: nn.Module, max_draft: int, device: torch.device, dtype: torch.dtype) -> None:
        self.m = mixer
        self.h, self.p, self.n = mixer.num_heads, mixer.head_dim, mixer.ssm_state_size
        self.g, self.inner = mixer.n_groups, mixer.intermediate_size
        if self.h % self.g:
            raise AtlasError(f"Mamba2 with {self.h} heads over {self.g} groups (not a multiple)")
        self.slots = StateSlots(mixer.conv_dim, mixer.conv_kernel_size, (self.h, self.p, self.n), max_draft, device, dtype)
        self.a = -mixer.A_log.detach().float().exp()
        self.dt_bias, self.d = mixer.dt_bias.detach().float(), mixer.D.detach().float()
        self.limit = time_step_limit(mixer.config.time_step_limit)

    def __call__(self, x: torch.Tensor, start: int) -> torch.Tensor:
        n, m = x.shape[0], self.m
        gate, xbc, dt = m.in_proj(x).split([self.inner, m.conv_dim, self.h], dim=-1)
        xbc = _conv(self.slots.window(xbc, start), m.conv1d, n)
        xs, b, c = xbc.float().split([self.inner, self.g * self.n, self.g * self.n], dim=-1)
        dt = F.softplus(dt.float() + self.dt_bias).clamp(self.limit[0], self.limit[1])
        decay = (dt * self.a).exp()
        xs = xs.view(n, self.h, self.p)
        rep = self.h // self.g
        b, c = (t.view(n, self.g, self.n).repeat_interleave(rep, dim=1) for t in (b, c))
        dx = dt[:, :, None] * xs
        out = torch.empty(n, self.h, self.p, device=x.device)
        state = self.slots.initial(start)
        for t in range(n):
            slot = self.slots.slot(start + t)
            torch.mul(state, decay[t, :, None, None], out=slot)
            slot.addcmul_(dx[t, :, :, None], b[t, :, None, :])
            out[t] = torch.bmm(slot, c[t, :, :, None])[..., 0]
            state = slot
        y = (out + self.d[:, None] * xs).reshape(n, self.inner)
        return m.out_proj(m.norm(y.to(x.dtype), gate).to(x.dtype))


Mixer = GatedDeltaNet | Mamba2


@dataclass
class RecurrentLayer:
    """A main-model layer whose token mixer is recurrent. Qwen-style decoder layers add an MLP
    sub-block after it (post_attention_layernorm, mlp); a Nemotron-H block is norm + mixer only."""

    mixer: Mixer
    norm: nn.Module
    post_norm: nn.Module | None
    mlp: nn.Module | None
    window: int | None = None

    @property
    def slots(self) -> StateSlots:
        return self.mixer.slots


def recurrent_layer(layer: nn.Module, max_draft: int, device: torch.device, dtype: torch.dtype) -> RecurrentLayer | None:
    """The RecurrentLayer for a transformers decoder layer with a Gated DeltaNet or Mamba2 mixer;
    None for any other layer."""
    gdn = getattr(layer, "linear_attn", None)
    if gdn is not None:
        return RecurrentLayer(GatedDeltaNet(gdn, max_draft, device, dtype), layer.input_layernorm, layer.post_attention_layernorm, layer.mlp)
    if getattr(layer, "block_type", None) == "linear_attention" and hasattr(layer, "mixer"):
        return RecurrentLayer(Mamba2(layer.mixer, max_draft, device, dtype), layer.norm, None, None)
    return None


def recurrent_forward(layer: RecurrentLayer, x: torch.Tensor, start: int) -> torch.Tensor:
    """x [n, d] at positions [start, start + n) through the layer, residuals included."""
    x = x + layer.mixer(layer.norm(x.to(layer.norm.weight.dtype)), start)
    if layer.mlp is None:
        return x
    y = layer.mlp(layer.post_norm(x)[None])
    return x + (y[0] if isinstance(y, tuple) else y)[0]


def state_bytes(layers: list[object]) -> tuple[int, int]:
    """(bytes of every recurrent layer's slots, the part the extra per-position slots add)."""
    slots = [layer.slots for layer in layers if isinstance(layer, RecurrentLayer)]
    return sum(s.bytes for s in slots), sum(s.extra_bytes for s in slots)


def summary(layers: list[object]) -> dict[str, object] | None:
    """The record's recurrent_state fields for a fused model's layers; None without recurrent layers."""
    recurrent = [layer for layer in layers if isinstance(layer, RecurrentLayer)]
    if not recurrent:
        return None
    total, extra = state_bytes(layers)
    return {"layers": len(recurrent), "path": PATH, "state_slots": recurrent[0].slots.state.shape[0],
            "state_bytes": total, "extra_slot_bytes": extra}
