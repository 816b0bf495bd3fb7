"""The fused model's layers over static, position-addressed caches: a standard pre-norm layer as
fused tensors (FastLayer), any other layer as its transformers module (ModuleLayer) or a recurrent
one (atlas.decode.recurrent), with the RoPE tables, causal masks and one forward of each kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from atlas.decode.kernels import Linear, fused, rms_of, unit
from atlas.decode.recurrent import RecurrentLayer, recurrent_forward, recurrent_layer


class SlotCache:
    """A duck-typed transformers Cache for layers run as whole modules: writes keys/values at
    positions [start, start+n) of preallocated buffers and returns [0, start+n)."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.start = 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None:
            self.k = key.new_zeros(*key.shape[:2], self.max_len, key.shape[-1])
            self.v = value.new_zeros(*value.shape[:2], self.max_len, value.shape[-1])
        end = self.start + key.shape[-2]
        self.k[:, :, self.start : end] = key
        self.v[:, :, self.start : end] = value
        return self.k[:, :, :end], self.v[:, :, :end]


@dataclass
class FastLayer:
    """A standard pre-norm layer as fused tensors: RMS norms folded into the matmuls that follow
    them, one qkv matmul, q/k head norms applied together (with the attention scale folded into
    q's norm weight, or into q's rows when there is none), one gate/up matmul."""

    qkv: Linear
    o: Linear
    qk_weight: torch.Tensor | None  # [heads + kv_heads, head_dim]
    head_c: torch.Tensor | None
    c1: torch.Tensor
    c2: torch.Tensor
    mlp_in: Linear | None
    mlp_down: Linear | None
    mlp: nn.Module | None  # a non-dense MLP (e.g. MoE), run as its module on the normed input
    norm2_weight: torch.Tensor | None  # only needed when the MLP is a module
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None
    k_cache: torch.Tensor  # [kv_heads, max_len, head_dim]
    v_cache: torch.Tensor


@dataclass
class ModuleLayer:
    """Fallback: the whole transformers layer, called with a SlotCache and explicit masks."""

    module: nn.Module
    slot: SlotCache
    window: int | None
    always_mask: bool = False  # its attention reads the mask even for one query (DSA layers)


Layer = FastLayer | ModuleLayer | RecurrentLayer


def linear_of(w: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(w, requires_grad=False)
    return linear


def _fixed_route_mlp(mlp: nn.Module, d: int) -> tuple[nn.Linear, nn.Linear, nn.Linear] | None:
    """The one dense SiLU MLP (gate, up, down) that a mixture-of-experts block computes when its
    router ignores its input, else None.

    A router whose weights are all zero scores every token alike, so every token goes to the same
    experts with the same weights, and Σ_e w_e · MLP_e(x) + shared(x) is one MLP whose hidden units
    are the experts' side by side, each expert's down projection scaled by its weight. That is how
    a project-made MTP block holds a dense MLP in a family that always builds its MTP block as an
    MoE (atlas.checkpoints.smollm): routed per call it cost 2.5 times the dense MLP. The fold is checked
    against the module on random rows."""
    gate, experts = getattr(mlp, "gate", None), getattr(mlp, "experts", None)
    router = getattr(gate, "weight", None)
    if not isinstance(router, torch.Tensor) or router.any() or not all(
            isinstance(getattr(experts, n, None), torch.Tensor) for n in ("gate_up_proj", "down_proj")):
        return None
    if type(getattr(experts, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU"):
        return None
    probe = torch.randn(4, d, dtype=router.dtype, device=router.device)
    routed = gate(probe)
    if not (isinstance(routed, tuple) and len(routed) == 3):  # transformers' (logits, weights, indices)
        return None
    _, weights, index = routed
    if not (torch.equal(index, index[:1].expand_as(index)) and torch.equal(weights, weights[:1].expand_as(weights))):
        return None
    gates, ups, downs = [], [], []
    for e, w in zip(index[0].tolist(), weights[0].tolist()):
        g, u = experts.gate_up_proj[e].detach().chunk(2, dim=0)
        gates.append(g), ups.append(u), downs.append(experts.down_proj[e].detach() * w)
    shared = getattr(mlp, "shared_experts", None)
    if shared is not None:
        if not all(isinstance(getattr(shared, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
            return None
        gates.append(shared.gate_proj.weight.detach()), ups.append(shared.up_proj.weight.detach())
        downs.append(shared.down_proj.weight.detach())
    dense = [linear_of(w) for w in (torch.cat(gates), torch.cat(ups), torch.cat(downs, dim=1))]
    x = torch.randn(3, d, dtype=router.dtype, device=router.device)
    folded = dense[2](F.silu(dense[0](x)) * dense[1](x))
    tol = 1e-5 if router.dtype == torch.float32 else 2e-2
    return tuple(dense) if torch.allclose(folded, mlp(x[None])[0], atol=tol, rtol=tol) else None


def _fast_layer(layer: nn.Module, max_len: int, device: torch.device, dtype: torch.dtype, kernels: str) -> FastLayer | None:
    """Recognise q/k/v/o projections (optional per-head RMS q/k norms), RMS pre-norms and a dense
    SiLU-gated MLP (or an MoE that computes one: _fixed_route_mlp), else a module MLP. None = not
    recognised; RoPE fit is checked by FusedModel.validate."""
    attn = getattr(layer, "self_attn", None)
    if attn is None or not all(isinstance(getattr(attn, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return None
    norm1 = rms_of(getattr(layer, "input_layernorm", None))
    norm2 = rms_of(getattr(layer, "post_attention_layernorm", None))
    head_dim = int(getattr(attn, "head_dim", 0))
    if norm1 is None or norm2 is None or not hasattr(layer, "mlp") or head_dim == 0:
        return None
    heads, kv_heads = attn.q_proj.out_features // head_dim, attn.k_proj.out_features // head_dim
    if heads * head_dim != attn.q_proj.out_features or kv_heads * head_dim != attn.k_proj.out_features or heads % kv_heads:
        return None
    scale = float(getattr(attn, "scaling", head_dim**-0.5))
    has_q, has_k = hasattr(attn, "q_norm"), hasattr(attn, "k_norm")
    q_norm, k_norm = rms_of(getattr(attn, "q_norm", None)), rms_of(getattr(attn, "k_norm", None))
    if has_q != has_k or (has_q and (q_norm is None or k_norm is None or not torch.equal(q_norm.c, k_norm.c))):
        return None
    qk_weight = None
    if q_norm is not None and k_norm is not None:
        qk_weight = torch.cat([(q_norm.weight * scale).expand(heads, head_dim), k_norm.weight.expand(kv_heads, head_dim)])
    qkv = fused([attn.q_proj, attn.k_proj, attn.v_proj], device, kernels, norm1.weight, None if has_q else [scale, 1.0, 1.0])
    mlp = layer.mlp
    dense = all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
    if dense:
        silu = type(getattr(mlp, "act_fn", None)).__name__ in ("SiLUActivation", "SiLU")
        gate_up_down = (mlp.gate_proj, mlp.up_proj, mlp.down_proj) if silu else None
    else:
        gate_up_down = _fixed_route_mlp(mlp, attn.q_proj.in_features)
    return FastLayer(
        qkv=qkv,
        o=fused([attn.o_proj], device, kernels),
        qk_weight=qk_weight,
        head_c=q_norm.c if q_norm else None,
        c1=norm1.c,
        c2=norm2.c,
        mlp_in=fused(list(gate_up_down[:2]), device, kernels, norm2.weight) if gate_up_down else None,
        mlp_down=fused([gate_up_down[2]], device, kernels) if gate_up_down else None,
        mlp=None if gate_up_down else mlp,
        norm2_weight=None if gate_up_down else norm2.weight,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        window=getattr(attn, "sliding_window", None),
        k_cache=torch.zeros(kv_heads, max_len, head_dim, device=device, dtype=dtype),
        v_cache=torch.zeros(kv_heads, max_len, head_dim, device=device, dtype=dtype),
    )


def device_of(module: nn.Module, default: torch.device) -> torch.device:
    tensor = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    return default if tensor is None else tensor.device


def build_layer(layer: nn.Module, max_len: int, device: torch.device, dtype: torch.dtype, fast: bool, max_draft: int,
                 kernels: str) -> Layer:
    recurrent = recurrent_layer(layer, max_draft, device, dtype)
    if recurrent is not None:
        return recurrent
    built = _fast_layer(layer, max_len, device, dtype, kernels) if fast else None
    if built is None:
        attn = getattr(layer, "self_attn", None)
        return ModuleLayer(layer, SlotCache(max_len), getattr(attn, "sliding_window", None), hasattr(attn, "indexer"))
    return built


@dataclass
class Rope:
    """cos/sin for every position, and sin with rotate_half's sign folded in, so that
    rope(x) = x*cos + swap_halves(x)*sin_signed."""

    cos: torch.Tensor
    sin: torch.Tensor
    sin_signed: torch.Tensor
    # A rotary module that returns one tensor per position (DeepSeek-V2's complex freqs_cis), not
    # a (cos, sin) pair: its rows, handed to the layer modules as they are (cos/sin then unused).
    raw: torch.Tensor | None = None

    def to(self, device: torch.device) -> "Rope":
        return Rope(*(None if t is None else t.to(device) for t in (self.cos, self.sin, self.sin_signed, self.raw)))

    def embeddings(self, start: int, n: int) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """What transformers' layer modules take as position_embeddings for positions [start, start+n)."""
        if self.raw is not None:
            return self.raw[start : start + n][None]
        return self.cos[start : start + n][None], self.sin[start : start + n][None]


def rope_table(rotary: nn.Module, layer_type: str | None, max_pos: int, device: torch.device, dtype: torch.dtype) -> Rope:
    positions = torch.arange(max_pos, device=device)[None]
    x = torch.zeros(1, device=device, dtype=dtype)
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    out = rotary(x, position_ids=positions, **kwargs)
    if isinstance(out, torch.Tensor):
        empty = x.new_zeros(max_pos, 0)
        return Rope(empty, empty, empty, raw=out[0])
    cos, sin = out[0][0], out[1][0]
    half = sin.shape[-1] // 2
    return Rope(cos, sin, torch.cat([-sin[:, :half], sin[:, half:]], dim=-1))


@dataclass
class Step:
    """What every layer of one forward shares, sliced once per forward rather than per layer."""

    start: int
    n: int
    cos: torch.Tensor  # [n, 1, head_dim]
    sin_signed: torch.Tensor
    rope: Rope
    rope_start: int


def _fast_forward(L: FastLayer, x: torch.Tensor, st: Step, mask: torch.Tensor | None) -> torch.Tensor:
    n, start = st.n, st.start
    end = start + n
    h, kv, hd = L.heads, L.kv_heads, L.head_dim
    qkv = L.qkv(unit(x, L.c1)).view(n, h + 2 * kv, hd)
    qk = qkv[:, : h + kv]
    if L.qk_weight is not None:
        qk = unit(qk, L.head_c) * L.qk_weight
    # RoPE on q and k together: x*cos + swap_halves(x)*sin_signed == x*cos + rotate_half(x)*sin
    qk = torch.addcmul(qk * st.cos, qk.unflatten(-1, (2, hd // 2)).flip(-2).flatten(-2), st.sin_signed)
    L.k_cache[:, start:end] = qk[:, h:].transpose(0, 1)
    L.v_cache[:, start:end] = qkv[:, h + kv :].transpose(0, 1)
    # Attention by hand (two bmm and a softmax cost less than SDPA's CPU kernel for a few rows);
    # query heads are grouped under their shared kv head, as repeat_kv would pair them.
    g = h // kv
    q = qk[:, :h].transpose(0, 1).reshape(kv, g * n, hd)
    scores = torch.bmm(q, L.k_cache[:, :end].transpose(1, 2))
    if mask is not None:
        scores.view(kv, g, n, end).add_(mask)
    out = torch.bmm(scores.softmax(-1), L.v_cache[:, :end])
    x = L.o(out.view(h, n, hd).transpose(0, 1).reshape(n, h * hd), residual=x)
    y = unit(x, L.c2)
    if L.mlp is not None:
        return x + L.mlp((y * L.norm2_weight)[None])[0]
    gate, up = L.mlp_in(y).chunk(2, dim=-1)
    return L.mlp_down(F.silu(gate).mul_(up), residual=x)


def _module_forward(L: ModuleLayer, x: torch.Tensor, st: Step, mask: torch.Tensor | None) -> torch.Tensor:
    L.slot.start = st.start
    rs = st.rope_start
    y = L.module(
        x[None],
        attention_mask=None if mask is None else mask[None, None],
        position_ids=torch.arange(rs, rs + st.n, device=x.device)[None],
        cache=L.slot,
        position_embeddings=st.rope.embeddings(rs, st.n),
    )
    return (y[0] if isinstance(y, tuple) else y)[0]  # GLM-5's layers also return their top-k selection


def layer_forward(L: Layer, x: torch.Tensor, st: Step, masks: "Masks") -> torch.Tensor:
    if isinstance(L, RecurrentLayer):
        return recurrent_forward(L, x, st.start)
    mask = masks.get(L.window, st.start, st.n, isinstance(L, ModuleLayer) and L.always_mask)
    if isinstance(L, FastLayer):
        return _fast_forward(L, x, st, mask)
    return _module_forward(L, x, st, mask)


class Masks:
    """Precomputed additive causal (optionally sliding-window) masks, sliced per call."""

    def __init__(self, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        i = torch.arange(max_len, device=device)
        self.rel = i[:, None] - i[None, :]  # query slot - key slot
        self.dtype = dtype
        self._tables: dict[int | None, torch.Tensor] = {}

    def get(self, window: int | None, start: int, n: int, always: bool = False) -> torch.Tensor | None:
        # One query at the end of the cache sees every earlier slot unless a window cuts it off.
        if n == 1 and (window is None or start < window) and not always:
            return None
        if window not in self._tables:
            allowed = self.rel >= 0 if window is None else (self.rel >= 0) & (self.rel < window)
            table = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
            self._tables[window] = table.masked_fill_(~allowed, float("-inf"))
        return self._tables[window][start : start + n, : start + n]
