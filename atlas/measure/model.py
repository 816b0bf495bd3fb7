"""The fused model: a checkpoint's main model and its MTP layer split into pieces over static,
position-addressed KV caches, in the gpt-fast manner (this file is its model.py; the loops that
drive it are in atlas.measure.generate).

The main model is loaded by transformers and its MTP layer by atlas.measure.families (an MtpHead,
from the family table or from transformers' own MtpModel); this module takes their pieces
(embedding, decoder layers, final norm, lm_head, the MTP layer's norms/projection/block) and runs them against
its own static, position-addressed KV caches. Rollback is free: a rejected draft's cache slots are
simply overwritten by the next round, and the attention mask never lets a query see a later slot.
Recurrent layers (Gated DeltaNet, Mamba2) keep position-addressed state slots instead
(atlas.measure.recurrent), so the same holds for them.

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
from collections.abc import Callable, Container
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from atlas import AtlasError
from atlas.measure.families import MtpHead, head_from_transformers
from atlas.measure.recurrent import RecurrentLayer, recurrent_forward, recurrent_layer


@dataclass
class Rms:
    """A plain RMS norm x / sqrt(mean(x²) + eps) · w, rewritten as unit(x, c) · weight with
    unit(x, c) = x / sqrt(Σx² + c), c = d·eps and weight = w·√d: the 1/d moves into constants, so
    a norm is four cheap ops (vector_norm, addcmul, rsqrt, mul) with no scalar operands (on CPU each
    Python scalar costs a conversion, and torch.rms_norm/mean() cost several times more here)."""

    weight: torch.Tensor
    c: torch.Tensor


def _unit(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:  # the families' norms compute in fp32
        return _unit(x.float(), c).to(x.dtype)
    r = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x * torch.addcmul(c, r, r).rsqrt_()


def _rms_of(module: nn.Module | None) -> Rms | None:
    """The Rms equivalent of `module` when it computes the plain RMS norm x̂·w, else None.

    Checked numerically, because families differ silently (e.g. Qwen3-Next's zero-centred x̂·(1+w)).
    """
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(eps, float):
        return None
    w = weight.detach()
    d = w.shape[0]
    rms = Rms(w.float() * d**0.5, torch.tensor(d * eps, dtype=torch.float32, device=w.device))
    x = torch.randn(3, d, dtype=w.dtype, device=w.device)
    tol = 1e-5 if w.dtype == torch.float32 else 2e-2
    ours = (_unit(x.float(), rms.c) * rms.weight).to(w.dtype)
    rms.weight = rms.weight.to(w.dtype)
    return rms if torch.allclose(ours, module(x), atol=tol, rtol=tol) else None


# FusedModel.kernels: "auto" (default) times whole verify passes through both paths when the model
# is built and sends each row count down the faster one; "rows" sends every 2+ row count through
# oneDNN; "mm" keeps torch.mm for every row count (the path before the choice, for benchmarks)
KERNELS = ("auto", "rows", "mm")
# oneDNN's fp32 inner product reads the weight once from 5 rows up, but for 2-4 rows it took a
# path that cost 1.2-1.5 plain steps on an AVX-512 host; padded to 5 rows, 2-5 rows cost 1.0-1.1.
# On an AVX2-only host the same padded path cost 2.0 plain steps at 2 rows where torch.mm cost
# 1.6, and 2.0 at 4 rows where torch.mm cost 3.4: which path wins depends on the CPU, hence "auto"
# (benchmarks/measure.py --pass-costs and benchmarks/matmul_kernels.py show both)
PACKED_ROWS = 5
CALIBRATION_ROUNDS = 7


# Below this a weight stays in the CPU's caches between passes and MKL's path is the faster one for
# every row count (the byte-level team model's 192-wide layers ran slower through oneDNN)
PACKED_MIN_BYTES = 1 << 20


class _AllRows:
    def __contains__(self, n: object) -> bool:
        return True


ALL_ROWS = _AllRows()


def _packable(w: torch.Tensor) -> bool:
    return (w.device.type == "cpu" and w.dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()
            and w.numel() * w.element_size() >= PACKED_MIN_BYTES)


class Linear:
    """y = x Wᵀ (+ b), with W possibly several fused projections and norm weights folded in.

    On CPU the kernel is chosen by row count, because one kernel cannot serve both: a decode step
    (one row) is a GEMV that streams the weight once, which MKL's `torch.mm(x, Wᵀ)` on a
    pre-transposed, contiguous Wᵀ does at memory bandwidth; but for a few rows its sgemm grows
    almost linearly with the rows on the project's AMD CPU, so a verify pass cost 1.5-2.3 plain
    steps. oneDNN's inner product on a weight reordered once into its blocked layout reads the
    weight once for a few rows. So with `kernels="rows"` one row goes through MKL and more rows
    through oneDNN (at least PACKED_ROWS of them, zero-padded); `kernels="mm"` keeps torch.mm for
    every row count (the old path, for side-by-side benchmarks); with "auto" the model sets
    `packed_rows`, the row counts that go through oneDNN, from its own timing. The second stored
    copy doubles the fused weights' memory. On CUDA F.linear serves every row count.
    """

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, device: torch.device, kernels: str = "rows") -> None:
        self.cpu = device.type == "cpu"
        self.w = w.t().contiguous() if self.cpu else w.contiguous()
        self.b = b
        pack = kernels != "mm" and self.cpu and _packable(w)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACKED_ROWS - 1) if pack else None
        self.packed_rows: Container[int] = ALL_ROWS

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not self.cpu:
            y = F.linear(x, self.w, self.b)
            return y if residual is None else residual + y
        n = x.shape[0]
        if self.packed is not None and n > 1 and n in self.packed_rows:
            if n < PACKED_ROWS:
                x = torch.cat([x, x.new_zeros(PACKED_ROWS - n, x.shape[1])])
            y = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.b, "none", [], "")[:n]
            return y if residual is None else y.add_(residual)
        if self.b is None:
            return torch.mm(x, self.w) if residual is None else torch.addmm(residual, x, self.w)
        y = torch.addmm(self.b, x, self.w)
        return y if residual is None else residual + y


def _fused(linears: list[nn.Linear], device: torch.device, kernels: str, in_scale: torch.Tensor | None = None,
           row_scale: list[float] | None = None) -> Linear:
    """Concatenate projections along the output dim; fold a preceding norm's weight into the input
    columns (x̂·w)Wᵀ = x̂(W·diag w)ᵀ, and per-projection constants into the output rows."""
    scales = row_scale or [1.0] * len(linears)
    w = torch.cat([m.weight.detach() * s for m, s in zip(linears, scales)])
    if in_scale is not None:
        w = w * in_scale[None, :]
    biases = [m.bias for m in linears]
    b = None
    if any(x is not None for x in biases):
        b = torch.cat([(x.detach() if x is not None else m.weight.new_zeros(m.out_features)) * s
                       for m, x, s in zip(linears, biases, scales)])
    return Linear(w, b, device, kernels)


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


def _linear_of(w: torch.Tensor) -> nn.Linear:
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
    MoE (atlas.measure.smollm): routed per call it cost 2.5 times the dense MLP. The fold is checked
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
    dense = [_linear_of(w) for w in (torch.cat(gates), torch.cat(ups), torch.cat(downs, dim=1))]
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
    norm1 = _rms_of(getattr(layer, "input_layernorm", None))
    norm2 = _rms_of(getattr(layer, "post_attention_layernorm", None))
    head_dim = int(getattr(attn, "head_dim", 0))
    if norm1 is None or norm2 is None or not hasattr(layer, "mlp") or head_dim == 0:
        return None
    heads, kv_heads = attn.q_proj.out_features // head_dim, attn.k_proj.out_features // head_dim
    if heads * head_dim != attn.q_proj.out_features or kv_heads * head_dim != attn.k_proj.out_features or heads % kv_heads:
        return None
    scale = float(getattr(attn, "scaling", head_dim**-0.5))
    has_q, has_k = hasattr(attn, "q_norm"), hasattr(attn, "k_norm")
    q_norm, k_norm = _rms_of(getattr(attn, "q_norm", None)), _rms_of(getattr(attn, "k_norm", None))
    if has_q != has_k or (has_q and (q_norm is None or k_norm is None or not torch.equal(q_norm.c, k_norm.c))):
        return None
    qk_weight = None
    if q_norm is not None and k_norm is not None:
        qk_weight = torch.cat([(q_norm.weight * scale).expand(heads, head_dim), k_norm.weight.expand(kv_heads, head_dim)])
    qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj], device, kernels, norm1.weight, None if has_q else [scale, 1.0, 1.0])
    mlp = layer.mlp
    dense = all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))
    if dense:
        silu = type(getattr(mlp, "act_fn", None)).__name__ in ("SiLUActivation", "SiLU")
        gate_up_down = (mlp.gate_proj, mlp.up_proj, mlp.down_proj) if silu else None
    else:
        gate_up_down = _fixed_route_mlp(mlp, attn.q_proj.in_features)
    return FastLayer(
        qkv=qkv,
        o=_fused([attn.o_proj], device, kernels),
        qk_weight=qk_weight,
        head_c=q_norm.c if q_norm else None,
        c1=norm1.c,
        c2=norm2.c,
        mlp_in=_fused(list(gate_up_down[:2]), device, kernels, norm2.weight) if gate_up_down else None,
        mlp_down=_fused([gate_up_down[2]], device, kernels) if gate_up_down else None,
        mlp=None if gate_up_down else mlp,
        norm2_weight=None if gate_up_down else norm2.weight,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        window=getattr(attn, "sliding_window", None),
        k_cache=torch.zeros(kv_heads, max_len, head_dim, device=device, dtype=dtype),
        v_cache=torch.zeros(kv_heads, max_len, head_dim, device=device, dtype=dtype),
    )


def _device_of(module: nn.Module, default: torch.device) -> torch.device:
    tensor = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    return default if tensor is None else tensor.device


def _build_layer(layer: nn.Module, max_len: int, device: torch.device, dtype: torch.dtype, fast: bool, max_draft: int,
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


def _rope_table(rotary: nn.Module, layer_type: str | None, max_pos: int, device: torch.device, dtype: torch.dtype) -> Rope:
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
    qkv = L.qkv(_unit(x, L.c1)).view(n, h + 2 * kv, hd)
    qk = qkv[:, : h + kv]
    if L.qk_weight is not None:
        qk = _unit(qk, L.head_c) * L.qk_weight
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
    y = _unit(x, L.c2)
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


def _layer_forward(L: Layer, x: torch.Tensor, st: Step, masks: "Masks") -> torch.Tensor:
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
        # Each piece stays on the device it was placed on (atlas.measure.placement); a layer's static
        # caches, masks and RoPE tables live with it, and only the hidden rows cross devices.
        self.embed = embed.weight.detach()
        # DSA families run as dense attention (atlas.measure.families.AllKeys): exact only while
        # no forward sees more than index_topk keys, so a longer one is refused, never approximated.
        self.dense_limit: int | None = getattr(config, "index_topk", None)
        modules = list(base.layers[: config.num_hidden_layers])
        self.layer_devices = [_device_of(m, self.device) for m in modules]
        self.layers = [_build_layer(m, self.max_len, dev, self.dtype, self.fast, self.max_draft, self.kernels)
                       for m, dev in zip(modules, self.layer_devices)]
        self.head_device = self.model.lm_head.weight.device
        self.norm = self._norm(base.norm if hasattr(base, "norm") else base.norm_f)  # norm_f: Nemotron-H
        self.head = _fused([self.model.lm_head], self.head_device, self.kernels)
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
        if self.kernels == "auto":
            self.kernels = self._choose_kernels()

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
        return f"auto: oneDNN for {describe_rows(rows)}" if rows else "auto: torch.mm for every row count"

    def _mtp_pieces(self, head: MtpHead) -> "MtpPieces":
        device = _device_of(head.block, self.device)
        enorm, w_e = self._folded(head.enorm, head.w_e.to(device))
        hnorm, w_h = self._folded(head.hnorm, head.w_h.to(device))
        vocab = None if self.draft_vocab is None else self.draft_vocab.to(device)
        if vocab is not None:
            rows = _linear_of(head.head.weight.detach()[vocab].to(device))
            rows.bias = None if head.head.bias is None else nn.Parameter(head.head.bias.detach()[vocab].to(device), requires_grad=False)
            out = _fused([rows], device, self.kernels)
        else:
            out = self.head if head.head is self.model.lm_head else _fused([head.head], device, self.kernels)
        return MtpPieces(
            device=device, embed=head.embed.to(device), enorm=enorm, w_e=w_e, hnorm=hnorm, w_h=w_h,
            block=_build_layer(head.block, self.max_len, device, self.dtype, self.fast, self.max_draft, self.kernels),
            post=[self._norm(m) for m in head.post_norms], head=out,
            rope=self._rope(head.rotary, head.rope_layer_type, device), vocab=vocab,
        )

    def _folded(self, norm: nn.Module, w: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], Linear]:
        """A norm followed by a projection: a plain RMS norm's weight goes into the projection;
        any other norm stays its own module."""
        rms = _rms_of(norm)
        if rms is None:
            return norm, Linear(w, None, w.device, self.kernels)
        return (lambda x: _unit(x, rms.c)), Linear(w * rms.weight[None, :], None, w.device, self.kernels)

    @staticmethod
    def _norm(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        rms = _rms_of(module)
        if rms is None:
            return module
        return lambda x: _unit(x, rms.c) * rms.weight

    def _rope(self, rotary: nn.Module | None, layer_type: str | None, device: torch.device) -> Rope:
        if (layer_type, device) in self._ropes:
            return self._ropes[(layer_type, device)]
        if rotary is None:  # attention without position embedding (Nemotron-H): an identity table
            zero = torch.zeros(self.max_len + 1, 1, device=device, dtype=self.dtype)
            table = Rope(torch.ones_like(zero), zero, zero)
        else:
            table = _rope_table(rotary, layer_type, self.max_len + 1, _device_of(rotary, device), self.dtype)
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
            x = _layer_forward(layer, x, st, masks)
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
        x = _layer_forward(p.block, x, st, self.masks(p.device))
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
