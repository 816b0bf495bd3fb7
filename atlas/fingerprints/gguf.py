"""A GGUF file's header (key/values and tensor infos), read from bytes a stranger wrote: pure
parsing, no I/O of its own (the hub layer hands in a `Source` that fetches byte ranges).

The header sits at the start of the file, so a ranged read of its first megabytes says which
architecture the file is, how many MTP ("nextn") layers its key declares and which `blk.N.nextn.*`
tensors it holds, at what ggml type, without downloading weights.

Every count, string length, array length and the header's total size is checked against `Limits`
(and against the bytes the file can still hold) before anything is allocated or looped over; a
truncated, lying or huge header is one GGUFError naming the file and what is wrong, never a
traceback, a hang or memory in proportion to a number the file claims.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from atlas import AtlasError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 1 used 32-bit counts and is gone from the Hub since 2023

# value type id -> (name, fixed size in bytes; 0 for string and array)
VALUE_TYPES: dict[int, tuple[str, int]] = {
    0: ("uint8", 1), 1: ("int8", 1), 2: ("uint16", 2), 3: ("int16", 2), 4: ("uint32", 4),
    5: ("int32", 4), 6: ("float32", 4), 7: ("bool", 1), 8: ("string", 0), 9: ("array", 0),
    10: ("uint64", 8), 11: ("int64", 8), 12: ("float64", 8),
}
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9

# ggml type id -> (name, elements per block, bytes per block), as ggml.h and gguf-py 0.19.0 give
# them (tests/test_gguf.py checks the table against gguf.GGML_QUANT_SIZES when gguf is installed).
# A type not listed is kept by number: its bytes are unknown, the rest of the file still reads.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
    28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}

# KV keys kept (the rest, tokenizer arrays included, are walked over and dropped). `{arch}` is the
# file's general.architecture.
# general.file_type by number: llama.h's llama_ftype at build 11434 (gguf's LlamaFileType), so a
# file's type is named without the gguf package.
FILE_TYPES = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0", 8:
    "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M",
    13: "MOSTLY_Q3_K_L", 14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17:
    "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21:
    "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS", 24: "MOSTLY_IQ1_S", 25:
    "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S", 29: "MOSTLY_IQ2_M",
    30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0", 37:
    "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0", 41: "MOSTLY_Q2_0",
}
KEPT_KEYS = ("general.architecture", "general.name", "general.file_type", "general.alignment",
             "general.quantization_version", "split.no", "split.count", "split.tensors.count",
             "{arch}.block_count", "{arch}.nextn_predict_layers", "{arch}.embedding_length",
             "{arch}.vocab_size",
             # the model a file was converted from (gguf.md "general.base_model.*"): a GGUF names its
             # base in its own header, so a conversion's base is known without its card
             "general.base_model.count", "general.base_model.0.repo_url", "general.base_model.0.organization",
             "general.base_model.0.name")
MAX_KEPT_STRING = 256  # a kept string value longer than this is not a name: cut


@dataclass(frozen=True)
class Limits:
    """The most a header may claim. Real files: ~25 KVs, ~3,000 tensors (a 160-expert MoE with
    per-expert tensors stays under 100,000), tokenizer arrays of ~260,000 entries and headers of
    a few MiB; each bound sits well above that and far below what would hurt."""

    header_bytes: int = 64 << 20  # all KVs and tensor infos together
    kv_count: int = 65_536
    tensor_count: int = 1 << 20
    key_bytes: int = 65_535  # the GGUF spec's own bound on a key
    string_bytes: int = 16 << 20  # one string value (chat templates run to ~100 kB)
    array_len: int = 1 << 24  # one array's entries (vocabularies run to ~260k)
    array_depth: int = 2  # arrays of arrays (none real beyond one level)
    name_bytes: int = 256  # a tensor name (ggml's GGML_MAX_NAME is 64)
    n_dims: int = 4  # GGML_MAX_DIMS
    dim: int = 1 << 40  # one dimension
    elements: int = 1 << 50  # one tensor's elements
    alignment: int = 1 << 16  # general.alignment (default 32)


DEFAULT_LIMITS = Limits()


class GGUFError(AtlasError):
    """A header that cannot be read as GGUF within the limits; the message names the file."""


class Source(Protocol):
    """Bytes of one file on demand. `size` is the file's length when known (a ranged answer's
    Content-Range says it); `read` returns fewer bytes than asked only at the end of the file."""

    size: int | None

    def read(self, offset: int, n: int) -> bytes: ...


class FileSource:
    """A local GGUF file as a Source: the header reader asks for what it
    needs, bounded there, and the weights are never read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = path.stat().st_size

    def read(self, offset: int, n: int) -> bytes:
        with self.path.open("rb") as f:
            f.seek(offset)
            return f.read(n)


class BytesSource:
    """A whole file (or its first bytes, `size` then the whole file's length) held in memory."""

    def __init__(self, data: bytes, size: int | None = None) -> None:
        self.data = data
        self.size = len(data) if size is None else size

    def read(self, offset: int, n: int) -> bytes:
        return self.data[offset:offset + n]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section

    @property
    def type_name(self) -> str:
        known = GGML_TYPES.get(self.ggml_type)
        return known[0] if known else f"type{self.ggml_type}"

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int | None:
        known = GGML_TYPES.get(self.ggml_type)
        return None if known is None else self.elements // known[1] * known[2]


@dataclass
class Header:
    filename: str
    version: int
    kv: dict[str, str | int | float | bool]  # the KEPT_KEYS found, `{arch}` resolved
    tensors: list[TensorInfo]
    header_bytes: int  # where the tensor infos end
    file_size: int | None
    array_lengths: dict[str, int] = field(default_factory=dict)  # every array KV's length, by key

    @property
    def architecture(self) -> str | None:
        arch = self.kv.get("general.architecture")
        return arch if isinstance(arch, str) else None


class _Cursor:
    """Reads forward through a Source in growing chunks, never past `limit` bytes from the start:
    the header's size is bounded however the file is built."""

    def __init__(self, source: Source, filename: str, limit: int, first_chunk: int) -> None:
        self.source, self.filename, self.limit = source, filename, limit
        self.buf = bytearray()
        self.pos = 0
        self.chunk = first_chunk
        self.eof = False

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.filename}: {what}")

    def left_in_file(self) -> int:
        """Bytes the header could still hold from here (the limit, or the file's end if nearer)."""
        size = self.source.size
        end = self.limit if size is None else min(self.limit, size)
        return max(0, end - self.pos)

    def take(self, n: int) -> bytes:
        if self.pos + n > self.limit:
            raise self.fail(f"header runs past {self.limit:,} bytes, the bound on a GGUF header (not read further)")
        while len(self.buf) < self.pos + n:
            if self.eof:
                raise self.fail(f"truncated: the file ends at byte {len(self.buf):,} inside its header")
            want = min(max(self.chunk, self.pos + n - len(self.buf)), self.limit - len(self.buf))
            got = self.source.read(len(self.buf), want)
            if len(got) > want:
                got = got[:want]
            self.buf += got
            self.eof = len(got) < want
            self.chunk = min(self.chunk * 2, 16 << 20)
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def unpack(self, fmt: str) -> int | float | bool:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def u32(self) -> int:
        return int(self.unpack("<I"))

    def u64(self) -> int:
        return int(self.unpack("<Q"))

    def string(self, bound: int, what: str) -> str:
        n = self.u64()
        if n > bound:
            raise self.fail(f"{what} claims {n:,} bytes, over the bound of {bound:,}")
        size = self.source.size
        if size is not None and self.pos + n > size:
            raise self.fail(f"{what} claims {n:,} bytes, more than the file holds from offset {self.pos:,}")
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8 (bad byte at offset {exc.start})") from None


def read_header(source: Source, filename: str, limits: Limits = DEFAULT_LIMITS, first_chunk: int = 1 << 20) -> Header:
    """Parse the header of the GGUF file behind `source`; GGUFError (naming `filename`) for
    anything that is not a header within `limits`."""
    cur = _Cursor(source, filename, limits.header_bytes, first_chunk)
    if cur.take(4) != MAGIC:
        raise cur.fail("not a GGUF file (no GGUF magic at its start)")
    version = cur.u32()
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        hint = " (a big-endian file: not read)" if swapped in VERSIONS else ""
        raise cur.fail(f"GGUF version {version}{hint}; versions {VERSIONS} are read")
    n_tensors, n_kv = cur.u64(), cur.u64()
    _bound(cur, n_tensors, limits.tensor_count, 8 + 4 + 4 + 8, "tensor count")
    _bound(cur, n_kv, limits.kv_count, 8 + 4 + 1, "key/value count")
    kv, lengths = _read_kvs(cur, n_kv, limits)
    tensors = _read_tensors(cur, n_tensors, limits)
    header = Header(filename, version, kv, tensors, cur.pos, source.size, lengths)
    _check_layout(cur, header, limits)
    return header


def _bound(cur: _Cursor, n: int, bound: int, min_item_bytes: int, what: str) -> None:
    """A count is refused when over its bound, or when its smallest possible items could not fit
    in the bytes the header may still hold (a lie told to make the reader loop or allocate)."""
    if n > bound:
        raise cur.fail(f"{what} {n:,} is over the bound of {bound:,}")
    if n * min_item_bytes > cur.left_in_file():
        raise cur.fail(f"{what} {n:,} cannot fit in the {cur.left_in_file():,} bytes the header may still hold")


def _read_kvs(cur: _Cursor, n_kv: int, limits: Limits) -> tuple[dict[str, str | int | float | bool], dict[str, int]]:
    raw: dict[str, str | int | float | bool] = {}
    lengths: dict[str, int] = {}
    seen: set[str] = set()
    for _ in range(n_kv):
        key = cur.string(limits.key_bytes, "a key")
        if key in seen:
            raise cur.fail(f"key {key[:80]!r} appears twice")
        seen.add(key)
        vtype = cur.u32()
        if vtype == ARRAY:
            lengths[key] = _skip_array(cur, limits, 1, key)
            continue
        value = _scalar(cur, vtype, limits, key)
        if isinstance(value, str) and len(value) > MAX_KEPT_STRING:
            value = value[:MAX_KEPT_STRING]
        raw[key] = value
    arch = raw.get("general.architecture")
    wanted = {k.replace("{arch}", arch) if isinstance(arch, str) else k for k in KEPT_KEYS}
    return {k: v for k, v in raw.items() if k in wanted}, lengths


def _scalar(cur: _Cursor, vtype: int, limits: Limits, key: str) -> str | int | float | bool:
    if vtype == STRING:
        return cur.string(limits.string_bytes, f"the value of {key[:80]!r}")
    fmt = _SCALAR_FORMATS.get(vtype)
    if fmt is None:
        raise cur.fail(f"unknown value type {vtype} for key {key[:80]!r}")
    return cur.unpack(fmt)


def _skip_array(cur: _Cursor, limits: Limits, depth: int, key: str) -> int:
    """Walk over one array value (its entries are not kept); its length."""
    if depth > limits.array_depth:
        raise cur.fail(f"key {key[:80]!r} nests arrays deeper than {limits.array_depth}")
    etype, n = cur.u32(), cur.u64()
    if etype not in VALUE_TYPES:
        raise cur.fail(f"unknown array entry type {etype} for key {key[:80]!r}")
    size = VALUE_TYPES[etype][1]
    min_entry = size or (8 if etype == STRING else 12)  # a string's length field; a nested array's type and length
    _bound(cur, n, limits.array_len, min_entry, f"array length of {key[:80]!r}")
    if size:
        cur.take(n * size)
    elif etype == STRING:
        for _ in range(n):
            cur.string(limits.string_bytes, f"an entry of {key[:80]!r}")
    else:
        for _ in range(n):
            _skip_array(cur, limits, depth + 1, key)
    return n


def _read_tensors(cur: _Cursor, n_tensors: int, limits: Limits) -> list[TensorInfo]:
    out: list[TensorInfo] = []
    names: set[str] = set()
    for _ in range(n_tensors):
        name = cur.string(limits.name_bytes, "a tensor name")
        if name in names:
            raise cur.fail(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = cur.u32()
        if not 1 <= n_dims <= limits.n_dims:
            raise cur.fail(f"tensor {name!r} claims {n_dims} dimensions (1 to {limits.n_dims} are possible)")
        shape = tuple(cur.u64() for _ in range(n_dims))
        elements = 1
        for d in shape:
            if not 1 <= d <= limits.dim:
                raise cur.fail(f"tensor {name!r} has a dimension of {d:,} (1 to {limits.dim:,} are read)")
            elements *= d
            if elements > limits.elements:
                raise cur.fail(f"tensor {name!r} claims over {limits.elements:,} elements")
        ggml_type = cur.u32()
        known = GGML_TYPES.get(ggml_type)
        if known is not None and shape[0] % known[1]:
            raise cur.fail(f"tensor {name!r}: a row of {shape[0]} is not whole {known[0]} blocks of {known[1]}")
        out.append(TensorInfo(name, shape, ggml_type, cur.u64()))
    return out


def _check_layout(cur: _Cursor, header: Header, limits: Limits) -> None:
    """Offsets must be aligned, must not overlap, and (the file's size known) must lie inside it."""
    align = header.kv.get("general.alignment", 32)
    if isinstance(align, bool) or not isinstance(align, int) or not 1 <= align <= limits.alignment or align & (align - 1):
        raise cur.fail(f"general.alignment {align!r} is not a power of two up to {limits.alignment:,}")
    data_start = -(-header.header_bytes // align) * align
    end = 0
    for t in sorted(header.tensors, key=lambda t: t.offset):
        if t.offset % align:
            raise cur.fail(f"tensor {t.name!r} starts at {t.offset:,}, not a multiple of the alignment {align}")
        if t.offset < end:
            raise cur.fail(f"tensor {t.name!r} overlaps the tensor before it (offset {t.offset:,} < {end:,})")
        end = t.offset + (t.nbytes or 0)
    if header.file_size is not None and data_start + end > header.file_size:
        raise cur.fail(f"its tensors claim {data_start + end:,} bytes, the file holds {header.file_size:,}")


# ---- what the header says about MTP ---------------------------------------------------------------

BLOCK = re.compile(r"blk\.(\d{1,6})\.")
NEXTN = re.compile(r"blk\.(\d{1,6})\.nextn\.")


def mtp_blocks(names: list[str]) -> set[int]:
    """Blocks holding `blk.N.nextn.*` tensors: llama.cpp's MTP layers sit there, beyond the trunk."""
    return {int(m.group(1)) for n in names if (m := NEXTN.match(n))}


def split_of(header: Header) -> tuple[int, int] | None:
    """(part index, part count) of a split file, from its split.* keys; None for a whole file."""
    no, count = header.kv.get("split.no"), header.kv.get("split.count")
    if isinstance(no, int) and isinstance(count, int) and not isinstance(no, bool) and count > 1:
        return no, count
    return None



# ---- the stored form of a header (the store keeps it as a raw file; refingerprint reads it back) --

RECORD_PREFIX = "gguf-header:"  # raw_files name of a GGUF file's header record: prefix + the file's name
SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf\Z")


def to_record(header: Header) -> str:
    """The header as compact JSON: kept keys, sizes and every tensor's name, type and shape (no
    tokenizer), so rules added later re-derive from the store without the network."""
    return json.dumps({
        "file": header.filename, "version": header.version, "file_size": header.file_size,
        "header_bytes": header.header_bytes, "kv": header.kv, "array_lengths": header.array_lengths,
        "tensors": [[t.name, t.ggml_type, list(t.shape), t.offset] for t in header.tensors],
    }, separators=(",", ":"))


def from_record(text: str) -> Header:
    """A record written by to_record; AtlasError for anything else (a damaged store)."""
    try:
        d = json.loads(text)
        tensors = [TensorInfo(str(n), tuple(int(x) for x in shape), int(t), int(off)) for n, t, shape, off in d["tensors"]]
        kv = {str(k): v for k, v in d["kv"].items() if isinstance(v, (str, int, float, bool))}
        return Header(str(d["file"]), int(d["version"]), kv, tensors, int(d["header_bytes"]),
                      None if d["file_size"] is None else int(d["file_size"]),
                      {str(k): int(v) for k, v in d.get("array_lengths", {}).items()})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise AtlasError(f"a stored GGUF header record cannot be read ({type(exc).__name__}); run `atlas crawl` again") from None


@dataclass
class GGUFModel:
    """What one GGUF model (a file, or the parts of a split file) holds of an MTP head."""

    files: list[str]
    architecture: str | None
    block_count: int | None
    nextn_key: str | None  # `{arch}.nextn_predict_layers` as found
    nextn_declared: int | None
    layout: str  # 'combined' | 'trunk-only' | 'mtp-only' | 'no blocks'
    mtp_layers: list[int]
    head_types: dict[str, int]  # ggml type name -> tensors of the MTP blocks at it
    head_params: int
    head_bytes: int | None
    total_params: int
    total_bytes: int | None
    own_embedding: bool  # blk.N.nextn.embed_tokens: the head's own, not the trunk's
    own_lm_head: bool  # blk.N.nextn.shared_head_head
    parts_missing: int = 0  # parts of a split file not read


def models(headers: list[Header]) -> list[GGUFModel]:
    """Group headers into GGUF models (the parts of a split file together) and say for each what
    it holds: the MTP blocks (any block with a `nextn.` tensor, all its tensors) and the rest."""
    groups: dict[str, list[Header]] = {}
    for h in headers:
        groups.setdefault(SPLIT_NAME.sub(".gguf", h.filename), []).append(h)
    return [_model(sorted(g, key=lambda h: h.filename)) for _, g in sorted(groups.items())]


def _model(parts: list[Header]) -> GGUFModel:
    first = parts[0]
    arch = first.architecture
    tensors = [t for h in parts for t in h.tensors]
    mtp = mtp_blocks([t.name for t in tensors])
    head = [t for t in tensors if (m := BLOCK.match(t.name)) and int(m.group(1)) in mtp]
    trunk_blocks = [t for t in tensors if (m := BLOCK.match(t.name)) and int(m.group(1)) not in mtp]
    layout = ("combined" if head and trunk_blocks else "mtp-only" if head
              else "trunk-only" if trunk_blocks else "no blocks")
    key = f"{arch}.nextn_predict_layers" if arch else None
    declared = first.kv.get(key) if key else None
    count = first.kv.get(f"{arch}.block_count")
    split = split_of(first)
    types: dict[str, int] = {}
    for t in head:
        types[t.type_name] = types.get(t.type_name, 0) + 1
    return GGUFModel(
        files=[h.filename for h in parts], architecture=arch,
        block_count=count if isinstance(count, int) and not isinstance(count, bool) else None,
        nextn_key=key if declared is not None else None,
        nextn_declared=declared if isinstance(declared, int) and not isinstance(declared, bool) else None,
        layout=layout, mtp_layers=sorted(mtp), head_types=dict(sorted(types.items())),
        head_params=sum(t.elements for t in head), head_bytes=_bytes(head),
        total_params=sum(t.elements for t in tensors), total_bytes=_bytes(tensors),
        own_embedding=any(".nextn.embed_tokens." in t.name for t in head),
        own_lm_head=any(".nextn.shared_head_head." in t.name for t in head),
        parts_missing=max(0, split[1] - len(parts)) if split else 0,
    )


def _bytes(tensors: list[TensorInfo]) -> int | None:
    sizes = [t.nbytes for t in tensors]
    return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)
