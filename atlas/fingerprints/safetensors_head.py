"""The MTP head's size and dtypes in a safetensors checkpoint, from the header of the shard(s) that
hold it: pure parsing of bytes a stranger wrote, no I/O (atlas.hub reads the bytes by ranges).

A sharded checkpoint's index maps every tensor to its shard and says the checkpoint's total bytes
(`metadata.total_size`); the header of the shard holding the MTP layer gives each of its tensors'
dtype and shape. Together: the head's parameters and bytes, its share of the checkpoint, and its
dtype per file, without downloading weights. Every length and count is bounded before use.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from atlas import AtlasError

RECORD_PREFIX = "safetensors-head:"  # raw_files name: prefix + the shard's file name
# below the format's own 100 MB: the header of a shard of the largest checkpoints (a few thousand
# tensors) is under 2 MB, and a read this size is the most one shard may cost
MAX_HEADER_BYTES = 16 << 20
MAX_SHARDS = 4  # shards read per repo for the head (the head sits in one or two)
MAX_DIMS = 8
MAX_TOTAL = 1 << 60
# bytes per element by safetensors dtype; a dtype not listed is kept by name, its bytes unknown
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
               "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1}


class HeaderError(AtlasError):
    """A shard header that cannot be read within the bounds; the message names the file."""


def parse_index_map(data: bytes, filename: str) -> tuple[dict[str, str], int | None]:
    """The weight map (tensor -> shard file) and metadata.total_size of an index already checked by
    atlas.fingerprints.rules.parse_weight_index (so it is a JSON object with a weight_map)."""
    index = json.loads(data)
    weight_map = {str(k): str(v) for k, v in index["weight_map"].items() if isinstance(v, str)}
    meta = index.get("metadata")
    total = meta.get("total_size") if isinstance(meta, dict) else None
    ok = isinstance(total, int) and not isinstance(total, bool) and 0 < total < MAX_TOTAL
    return weight_map, total if ok else None


def head_shards(weight_map: Mapping[str, str], mtp_names: Sequence[str]) -> list[str]:
    """The shard files holding the MTP tensors (at most MAX_SHARDS, by name)."""
    return sorted({weight_map[n] for n in mtp_names if n in weight_map})[:MAX_SHARDS]


def header_length(first8: bytes, filename: str) -> int:
    if len(first8) < 8:
        raise HeaderError(f"{filename}: truncated: {len(first8)} bytes, a safetensors file starts with 8")
    (n,) = struct.unpack("<Q", first8)
    if not 2 <= n <= MAX_HEADER_BYTES:
        raise HeaderError(f"{filename}: header length {n:,} (a safetensors header holds 2 to {MAX_HEADER_BYTES:,} bytes)")
    return n


def parse_header(data: bytes, filename: str, wanted: set[str]) -> dict[str, tuple[str, list[int]]]:
    """dtype and shape of the `wanted` tensors in one shard's header JSON."""
    try:
        header = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise HeaderError(f"{filename}: the header is not JSON") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{filename}: the header is not a JSON object")
    out: dict[str, tuple[str, list[int]]] = {}
    for name in sorted(wanted & set(header)):
        entry = header[name]
        dtype, shape = (entry.get("dtype"), entry.get("shape")) if isinstance(entry, dict) else (None, None)
        ok_shape = isinstance(shape, list) and len(shape) <= MAX_DIMS and all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_TOTAL for d in shape)
        if not isinstance(dtype, str) or len(dtype) > 16 or not ok_shape:
            raise HeaderError(f"{filename}: tensor {name[:80]!r} has no usable dtype and shape")
        out[name] = (dtype, list(shape))
    return out


def to_record(filename: str, tensors: Mapping[str, tuple[str, list[int]]], total_size: int | None) -> str:
    return json.dumps({"file": filename, "total_size": total_size,
                       "tensors": [[n, d, s] for n, (d, s) in sorted(tensors.items())]}, separators=(",", ":"))


@dataclass
class ShardHead:
    file: str
    total_size: int | None
    tensors: dict[str, tuple[str, list[int]]]


def from_record(text: str) -> ShardHead:
    try:
        d = json.loads(text)
        tensors = {str(n): (str(t), [int(x) for x in s]) for n, t, s in d["tensors"]}
        total = d.get("total_size")
        return ShardHead(str(d["file"]), int(total) if isinstance(total, int) else None, tensors)
    except (ValueError, KeyError, TypeError) as exc:
        raise AtlasError(f"a stored safetensors head record cannot be read ({type(exc).__name__}); run `atlas crawl` again") from None


@dataclass
class HeadSize:
    params: int
    bytes: int | None  # None when a dtype's size is unknown
    share: float | None  # of the checkpoint's total_size
    dtypes: str  # "BF16×5, F8_E4M3×12 (model-00002-of-00002.safetensors)"
    tensors: int


def head_size(shards: Sequence[ShardHead], mtp_names: Sequence[str]) -> HeadSize | None:
    """The head's size over the shards read, counting only the MTP tensors; None when the read
    shards hold none of them or miss some (a shard not read)."""
    wanted = set(mtp_names)
    found = {n: v for s in shards for n, v in s.tensors.items() if n in wanted}
    if not found or len(found) < len(wanted):
        return None
    params = bytes_ = 0
    unknown = False
    for dtype, shape in found.values():
        n = 1
        for d in shape:
            n *= d
        params += n
        if dtype in DTYPE_BYTES:
            bytes_ += n * DTYPE_BYTES[dtype]
        else:
            unknown = True
    total = next((s.total_size for s in shards if s.total_size), None)
    per_file = []
    for s in shards:
        counts: dict[str, int] = {}
        for n, (dtype, _) in s.tensors.items():
            if n in wanted:
                counts[dtype] = counts.get(dtype, 0) + 1
        if counts:
            per_file.append(", ".join(f"{d}×{c}" for d, c in sorted(counts.items())) + f" ({s.file})")
    size = None if unknown else bytes_
    return HeadSize(params, size, size / total if size is not None and total else None, "; ".join(per_file), len(found))
