"""Placing one model across several devices for our own loop (`--device-map`).

The main model is cut into contiguous runs of decoder layers, one run per device, in device order:
the embedding sits with the first layer, and the final norm, the head and the MTP layer (which reads
both the last hidden and the head) sit with the last. Our loop keeps each layer's static KV cache on
that layer's device and moves only the hidden state (one row per token) across a boundary, as
pipeline placement does.

`auto` fills the visible GPUs in order, each up to a share of its free memory (the rest is left for
caches and activations); `auto+cpu` may spill the last layers to CPU memory, which is only done when
asked because it is slow. An explicit plan names the layers: `cuda:0=0-29,cuda:1=30-60`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from atlas import AtlasError
from atlas.records.runcontext import Placement

if TYPE_CHECKING:  # torch only where pieces move: the torch-free Placement lives in runcontext
    import torch
    from torch import nn

    from atlas.decode.mtphead import MtpHead

# Share of a GPU's free memory that weights may take; the rest is for caches and activations.
WEIGHT_SHARE = 0.85


def parse_plan(spec: str, n_layers: int) -> Placement:
    """An explicit plan `DEVICE=A-B,DEVICE=C-D` (inclusive layer ranges covering 0..n_layers-1 in
    order); the embedding goes with layer 0, the head and MTP layer with the last layer."""
    layers: list[str] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(cpu|cuda:\d+)=(\d+)-(\d+)\s*", part)
        if m is None:
            raise AtlasError(f"--device-map {spec!r}: expected auto, auto+cpu or DEVICE=FIRST-LAST,... (e.g. cuda:0=0-29,cuda:1=30-60)")
        device, first, last = m.group(1), int(m.group(2)), int(m.group(3))
        if first != len(layers) or last < first:
            raise AtlasError(f"--device-map {spec!r}: layer ranges must run in order from 0 without gaps ({device} starts at {first}, expected {len(layers)})")
        layers += [device] * (last - first + 1)
    if len(layers) != n_layers:
        raise AtlasError(f"--device-map {spec!r} places {len(layers)} layers; the model has {n_layers}")
    try:
        return Placement(embed=layers[0], layers=layers, head=layers[-1])
    except ValueError as exc:
        raise AtlasError(f"--device-map {spec!r}: {exc}") from None


def plan(layer_bytes: list[int], embed_bytes: int, head_bytes: int, budgets: dict[str, int]) -> Placement:
    """Contiguous runs of layers over `budgets` (device -> bytes weights may use, in order): each
    device takes layers while they fit; the embedding counts against the first device and the head
    plus MTP layer against the device of the last layer. AtlasError when the devices cannot hold it."""
    devices = list(budgets)
    if not devices:
        raise AtlasError("no device to place the model on")
    used = dict.fromkeys(devices, 0)
    used[devices[0]] = embed_bytes
    layers: list[str] = []
    d = 0
    for i, size in enumerate(layer_bytes):
        last = i == len(layer_bytes) - 1
        while used[devices[d]] + size + (head_bytes if last else 0) > budgets[devices[d]]:
            d += 1
            if d == len(devices):
                total = embed_bytes + sum(layer_bytes) + head_bytes
                raise AtlasError(
                    f"the model ({total / 2**30:.1f} GiB of weights) does not fit the devices' budgets "
                    f"({', '.join(f'{k} {v / 2**30:.1f} GiB' for k, v in budgets.items())}); add devices or allow CPU offload (auto+cpu)"
                )
        used[devices[d]] += size
        layers.append(devices[d])
    return Placement(embed=devices[0], layers=layers, head=layers[-1] if layers else devices[0])


def budgets(offload_cpu: bool) -> dict[str, int]:
    """Bytes weights may use on each visible GPU (WEIGHT_SHARE of its free memory), and on CPU
    (half the available RAM) only when offload is asked for."""
    import torch

    out: dict[str, int] = {}
    for i in range(torch.cuda.device_count()):
        free, _ = torch.cuda.mem_get_info(i)
        out[f"cuda:{i}"] = int(free * WEIGHT_SHARE)
    if offload_cpu:
        import os

        out["cpu"] = int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.5)
    if not out:
        raise AtlasError("--device-map auto: torch sees no CUDA device (use auto+cpu to run on CPU memory)")
    return out


def _bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def auto_plan(model: nn.Module, mtp_bytes: int, offload_cpu: bool) -> Placement:
    base = model.get_decoder()
    head = _bytes(base.norm) + _bytes(model.lm_head) + mtp_bytes
    return plan([_bytes(layer) for layer in base.layers], _bytes(base.embed_tokens), head, budgets(offload_cpu))


def _to(value: object, device: torch.device) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return value


def _follow_inputs(module: nn.Module, device: torch.device) -> None:
    """Move a module's tensor inputs to its device before it runs, so transformers' own forward
    (which the loop validates against) works across devices."""

    def hook(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return _to(args, device), {k: _to(v, device) for k, v in kwargs.items()}

    module.register_forward_pre_hook(hook, with_kwargs=True)


def place(model: nn.Module, placement: Placement) -> None:
    """Move the main model's pieces where `placement` says (the MTP layer is moved by the caller,
    to placement.head)."""
    import torch

    base = model.get_decoder()
    if len(base.layers) != len(placement.layers):
        raise AtlasError(f"placement has {len(placement.layers)} layers; the model has {len(base.layers)}")
    pieces: list[tuple[nn.Module, str]] = [(base.embed_tokens, placement.embed), (base.norm, placement.head), (model.lm_head, placement.head)]
    pieces += list(zip(base.layers, placement.layers))
    rotary = getattr(base, "rotary_emb", None)
    if rotary is not None:
        pieces.append((rotary, placement.embed))
    for module, name in pieces:
        device = torch.device(name)
        module.to(device)
        _follow_inputs(module, device)


def place_head(head: MtpHead, device: torch.device) -> MtpHead:
    """The MTP layer moved to `device` (the main head's), its modules taking their inputs there."""
    for module in (head.enorm, head.hnorm, head.block, head.head, *head.post_norms):
        module.to(device)
        _follow_inputs(module, device)
    return dataclasses.replace(head, w_e=head.w_e.to(device), w_h=head.w_h.to(device), embed=head.embed.to(device),
                               next_layers=[place_head(h, device) for h in head.next_layers])
