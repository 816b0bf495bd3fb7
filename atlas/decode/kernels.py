"""The fused model's CPU arithmetic: RMS norms rewritten as a few cheap ops, and the matmul that
sends each row count down the one-pass kernel (atlas.decode.onepass), torch.mm or oneDNN (the
KERNELS choice; with "auto" FusedModel takes the one-pass kernel where it is built, else times the
other two).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from atlas import AtlasError
from atlas.decode import onepass


@dataclass
class Rms:
    """A plain RMS norm x / sqrt(mean(x²) + eps) · w, rewritten as unit(x, c) · weight with
    unit(x, c) = x / sqrt(Σx² + c), c = d·eps and weight = w·√d: the 1/d moves into constants, so
    a norm is four cheap ops (vector_norm, addcmul, rsqrt, mul) with no scalar operands (on CPU each
    Python scalar costs a conversion, and torch.rms_norm/mean() cost several times more here)."""

    weight: torch.Tensor
    c: torch.Tensor


def unit(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32:  # the families' norms compute in fp32
        return unit(x.float(), c).to(x.dtype)
    r = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x * torch.addcmul(c, r, r).rsqrt_()


def rms_of(module: nn.Module | None) -> Rms | None:
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
    ours = (unit(x.float(), rms.c) * rms.weight).to(w.dtype)
    rms.weight = rms.weight.to(w.dtype)
    return rms if torch.allclose(ours, module(x), atol=tol, rtol=tol) else None


# FusedModel.kernels: "auto" (default) takes "onepass" for an fp32 model on a CPU where the kernel
# is built (a fixed choice, so it cannot move with the load while a run starts), else times whole
# verify passes through oneDNN and torch.mm and sends each row count down the faster one;
# "onepass" sends every row count through atlas.decode.onepass (one weight read per 4 rows, the
# same sums for any row count); "rows" sends every 2+ row count through oneDNN; "mm" keeps
# torch.mm for every row count (the path before any choice, for benchmarks)
KERNELS = ("auto", "onepass", "rows", "mm")
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
    copy doubles the fused weights' memory. With `kernels="onepass"` every row count goes through
    our kernel on W as stored (no second copy). On CUDA F.linear serves every row count.
    """

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, device: torch.device, kernels: str = "rows") -> None:
        self.cpu = device.type == "cpu"
        self.onepass = kernels == "onepass" and self.cpu
        if self.onepass and (w.dtype != torch.float32 or onepass.load() is None):
            raise AtlasError(f"kernels='onepass' needs an fp32 model and the built kernel ({onepass.missing() or w.dtype})")
        self.w = w.t().contiguous() if self.cpu and not self.onepass else w.contiguous()
        self.b = b
        pack = kernels not in ("mm", "onepass") and self.cpu and _packable(w)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), PACKED_ROWS - 1) if pack else None
        self.packed_rows: Container[int] = ALL_ROWS

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if not self.cpu:
            y = F.linear(x, self.w, self.b)
            return y if residual is None else residual + y
        if self.onepass:
            y = onepass.matmul(x, self.w)
            y = y if self.b is None else y.add_(self.b)
            return y if residual is None else y.add_(residual)
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


def fused(linears: list[nn.Linear], device: torch.device, kernels: str, in_scale: torch.Tensor | None = None,
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
