"""A tiny GGUF writer for tests: any header, well-formed or hostile, built byte by byte from the
format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md). Little-endian, version 3."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from atlas.fingerprints.gguf import GGML_TYPES

FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
U32, STRING, ARRAY, U64 = 4, 8, 9, 10


def gstr(text: str | bytes, claimed: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if claimed is None else claimed) + raw


def value(vtype: int, v: Any) -> bytes:
    if vtype == STRING:
        return gstr(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    return struct.pack(FORMATS[vtype], v)


def kv(key: str, vtype: int, v: Any) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + value(vtype, v)


def tensor_info(name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return gstr(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape) + struct.pack(
        "<IQ", ggml_type, offset)


def nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    _, block, size = GGML_TYPES[ggml_type]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


@dataclass
class Model:
    """A GGUF file: KVs and tensors (offsets laid out aligned), the data zero-filled."""

    arch: str = "glm4moe"
    kvs: list[tuple[str, int, Any]] = field(default_factory=list)
    tensors: list[tuple[str, tuple[int, ...], int]] = field(default_factory=list)
    version: int = 3

    def header(self) -> tuple[bytes, int]:
        """The header bytes and the data section's length."""
        kvs = [("general.architecture", STRING, self.arch), *self.kvs]
        body = struct.pack("<4sIQQ", b"GGUF", self.version, len(self.tensors), len(kvs))
        body += b"".join(kv(*x) for x in kvs)
        offset = 0
        for name, shape, t in self.tensors:
            body += tensor_info(name, shape, t, offset)
            offset += -(-nbytes(shape, t) // 32) * 32
        return body, offset

    def file(self) -> bytes:
        head, data = self.header()
        return head + b"\0" * (-len(head) % 32) + b"\0" * data


def mtp_model(n_layer: int = 2, trunk: bool = True, head: bool = True, head_type: int = 8,
              own_head: bool = False, arch: str = "glm4moe", nextn: int | None = 1) -> Model:
    """A GLM-4.5-shaped file in miniature: `n_layer` trunk blocks and one MTP block at blk.{n_layer}
    (its attention and the nextn tensors llama.cpp's converter writes)."""
    m = Model(arch=arch)
    m.kvs.append((f"{arch}.block_count", U32, n_layer + (1 if nextn else 0)))
    if nextn is not None:
        m.kvs.append((f"{arch}.nextn_predict_layers", U32, nextn))
    m.kvs.append(("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b", "<s>"])))
    if trunk:
        m.tensors.append(("token_embd.weight", (64, 16), 1))
        for i in range(n_layer):
            m.tensors += [(f"blk.{i}.attn_q.weight", (256, 64), 12 if i else 8), (f"blk.{i}.attn_norm.weight", (64,), 0)]
        m.tensors.append(("output.weight", (256, 16), 14))
    if head:
        n = n_layer
        m.tensors += [(f"blk.{n}.attn_q.weight", (64, 64), head_type), (f"blk.{n}.nextn.eh_proj.weight", (128, 64), head_type),
                      (f"blk.{n}.nextn.enorm.weight", (64,), 0), (f"blk.{n}.nextn.hnorm.weight", (64,), 0)]
        if own_head:
            m.tensors += [(f"blk.{n}.nextn.embed_tokens.weight", (64, 16), 1),
                          (f"blk.{n}.nextn.shared_head_head.weight", (64, 16), 1)]
    return m
