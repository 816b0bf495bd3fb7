"""The GGUF header reader (atlas.fingerprints.gguf): what it reads from a well-formed header, and a hostile
header for every bound it keeps, each built here byte by byte (tests/gguf_writer.py)."""

from __future__ import annotations

import struct

import pytest
from gguf_writer import ARRAY, STRING, U32, Model, gstr, kv, mtp_model, tensor_info

from atlas.fingerprints.gguf import (
    GGML_TYPES,
    BytesSource,
    GGUFError,
    Limits,
    from_record,
    models,
    read_header,
    to_record,
)


def read(data: bytes, limits: Limits = Limits(), size: int | None = None, name: str = "m-Q4_K_M.gguf"):
    return read_header(BytesSource(data, size), name, limits, first_chunk=64)


def raw(n_tensors: int, n_kv: int, body: bytes = b"", version: int = 3) -> bytes:
    """A header with these counts and body, padded so that only the fault planted in it is one."""
    return struct.pack("<4sIQQ", b"GGUF", version, n_tensors, n_kv) + body + b"\0" * 256


def test_a_combined_file_reads_its_arch_key_mtp_block_and_head_types() -> None:
    h = read(mtp_model(n_layer=2).file())
    assert h.architecture == "glm4moe"
    assert h.kv["glm4moe.nextn_predict_layers"] == 1 and h.kv["glm4moe.block_count"] == 3
    assert h.array_lengths == {"tokenizer.ggml.tokens": 3}
    (m,) = models([h])
    assert (m.layout, m.mtp_layers, m.nextn_declared, m.nextn_key) == ("combined", [2], 1, "glm4moe.nextn_predict_layers")
    assert m.head_types == {"F32": 2, "Q8_0": 2}
    # independent count: 64*64 + 128*64 + 64 + 64 elements; Q8_0 is 34 bytes per 32
    assert m.head_params == 64 * 64 + 128 * 64 + 128
    assert m.head_bytes == (64 * 64 + 128 * 64) // 32 * 34 + 128 * 4
    assert not m.own_embedding and not m.own_lm_head


def test_trunk_only_and_mtp_only_files_and_an_own_head() -> None:
    (trunk,) = models([read(mtp_model(head=False, nextn=None).file(), name="t.gguf")])
    (only,) = models([read(mtp_model(trunk=False, own_head=True, head_type=1).file(), name="o.gguf")])
    assert (trunk.layout, trunk.mtp_layers, trunk.nextn_declared) == ("trunk-only", [], None)
    assert (only.layout, only.mtp_layers, only.head_types) == ("mtp-only", [2], {"F16": 4, "F32": 2})
    assert only.own_embedding and only.own_lm_head and only.head_params == only.total_params


def test_the_parts_of_a_split_file_are_one_model() -> None:
    full = mtp_model(n_layer=2)
    first = Model(arch="glm4moe", kvs=[*full.kvs, ("split.no", 2, 0), ("split.count", 2, 2)], tensors=full.tensors[:4])
    second = Model(arch="glm4moe", kvs=[("split.no", 2, 1), ("split.count", 2, 2)], tensors=full.tensors[4:])
    parts = [read(first.file(), name="x-00001-of-00002.gguf"), read(second.file(), name="x-00002-of-00002.gguf")]
    (m,) = models(parts)
    assert (m.layout, m.mtp_layers, m.parts_missing) == ("combined", [2], 0)
    (alone,) = models(parts[:1])
    assert (alone.layout, alone.parts_missing) == ("trunk-only", 1)


def test_a_record_reads_back_as_the_same_header() -> None:
    h = read(mtp_model(own_head=True).file())
    back = from_record(to_record(h))
    assert (back.tensors, back.kv, back.header_bytes, back.file_size) == (h.tensors, h.kv, h.header_bytes, h.file_size)


def test_the_gguf_package_agrees_on_types_and_on_a_file_it_wrote(tmp_path) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    for t, (block, size) in gguf.GGML_QUANT_SIZES.items():
        assert GGML_TYPES[t.value][1:] == (block, size), t.name
    w = gguf.GGUFWriter(tmp_path / "w.gguf", "qwen35")
    w.add_block_count(2)
    w.add_uint32("qwen35.nextn_predict_layers", 1)
    w.add_tensor("blk.0.attn_q.weight", np.zeros((8, 32), dtype=np.float16))
    w.add_tensor("blk.1.nextn.eh_proj.weight", np.zeros((8, 64), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    data = (tmp_path / "w.gguf").read_bytes()
    h = read(data)
    ref = gguf.GGUFReader(tmp_path / "w.gguf")
    assert [(t.name, t.tensor_type.value, int(t.n_elements)) for t in ref.tensors] == [
        (t.name, t.ggml_type, t.elements) for t in h.tensors]
    (m,) = models([h])
    assert (m.layout, m.mtp_layers, m.head_types) == ("combined", [1], {"F32": 1})


# ---- hostile headers: one per bound ----------------------------------------------------------------


class Counting(BytesSource):
    """Counts the bytes handed out: a lie about a size must not make the reader fetch by it."""

    def __init__(self, data: bytes, size: int | None = None) -> None:
        super().__init__(data, size)
        self.served = 0

    def read(self, offset: int, n: int) -> bytes:
        out = super().read(offset, n)
        self.served += len(out)
        return out


HOSTILE = {
    "bad magic": (b"GGML" + b"\0" * 40, "no GGUF magic"),
    "version 1": (raw(0, 0, version=1), "GGUF version 1"),
    "big-endian": (struct.pack(">4sIQQ", b"GGUF", 3, 0, 0), "big-endian"),
    "tensor count over the bound": (raw(2**40, 0), "tensor count 1,099,511,627,776 is over the bound"),
    "tensor count the file cannot hold": (raw(1000, 0), "tensor count 1,000 cannot fit"),
    "kv count over the bound": (raw(0, 2**63), "key/value count"),
    "kv count the file cannot hold": (raw(0, 50), "key/value count 50 cannot fit"),
    "key over the key bound": (raw(0, 1, gstr(b"k", claimed=70_000)), "a key claims 70,000 bytes, over the bound"),
    "string longer than the file": (raw(0, 1, gstr("general.name") + struct.pack("<IQ", STRING, 10**6)),
                                    "claims 1,000,000 bytes, more than the file holds"),
    "string over the string bound": (raw(0, 1, gstr("a") + struct.pack("<I", STRING) + gstr(b"", claimed=2**62)),
                                     "over the bound of 16,777,216"),
    "array over the array bound": (raw(0, 1, gstr("a") + struct.pack("<IIQ", ARRAY, 0, 2**30)), "over the bound of 16,777,216"),
    "array the file cannot hold": (raw(0, 1, gstr("a") + struct.pack("<IIQ", ARRAY, 8, 10_000)), "cannot fit"),
    "arrays nested too deep": (raw(0, 1, gstr("a") + struct.pack("<IIQ", ARRAY, ARRAY, 1) + struct.pack("<IQ", ARRAY, 1)
                                   + struct.pack("<IQ", 0, 1) + b"\0"), "nests arrays deeper than 2"),
    "unknown value type": (raw(0, 1, gstr("a") + struct.pack("<I", 99) + b"\0" * 8), "unknown value type 99"),
    "key not utf-8": (raw(0, 1, gstr(b"\xff\xfe") + struct.pack("<I", 0) + b"\0"), "not UTF-8"),
    "key twice": (raw(0, 2, kv("a", U32, 1) + kv("a", U32, 2)), "appears twice"),
    "tensor name over the bound": (raw(1, 0, gstr(b"t", claimed=300) + b"\0" * 40), "a tensor name claims 300 bytes"),
    "five dimensions": (raw(1, 0, gstr("t") + struct.pack("<I", 5) + b"\0" * 60), "claims 5 dimensions"),
    "zero dimensions": (raw(1, 0, gstr("t") + struct.pack("<I", 0) + b"\0" * 60), "claims 0 dimensions"),
    "a zero-length dimension": (raw(1, 0, tensor_info("t", (0,), 0, 0)), "has a dimension of 0"),
    "elements past the bound": (raw(1, 0, tensor_info("t", (2**40, 2**40), 0, 0)), "claims over"),
    "a row that is not whole blocks": (raw(1, 0, tensor_info("t", (33,), 8, 0)), "not whole Q8_0 blocks"),
    "tensor twice": (raw(2, 0, tensor_info("t", (4,), 0, 0) + tensor_info("t", (4,), 0, 32)), "appears twice"),
    "unaligned offset": (raw(1, 0, tensor_info("t", (4,), 0, 7)), "not a multiple of the alignment 32"),
    "overlapping tensors": (raw(2, 0, tensor_info("a", (64,), 0, 0) + tensor_info("b", (64,), 0, 128)), "overlaps"),
    "alignment not a power of two": (raw(0, 1, kv("general.alignment", U32, 24)), "not a power of two"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_header_is_one_error_naming_the_file(case: str) -> None:
    data, words = HOSTILE[case]
    source = Counting(data)
    with pytest.raises(GGUFError) as err:
        read_header(source, "evil/part-Q4.gguf", first_chunk=64)
    assert str(err.value).startswith("evil/part-Q4.gguf: ") and words in str(err.value), str(err.value)
    assert source.served <= max(len(data), 64)  # nothing fetched by a claimed size


def test_tensors_past_the_end_of_the_file_are_a_lie_told() -> None:
    data = mtp_model().file()
    read(data)  # whole: fine
    with pytest.raises(GGUFError, match="its tensors claim .* bytes, the file holds"):
        read(data[:-100], size=len(data) - 100)


def test_every_truncation_of_a_header_is_an_error_never_a_crash() -> None:
    head, _ = mtp_model(own_head=True).header()
    for cut in range(len(head)):
        with pytest.raises(GGUFError, match="truncated|more than the file holds|cannot fit"):
            read(head[:cut], size=None)


def test_a_header_bigger_than_its_bound_stops_at_the_bound() -> None:
    m = mtp_model()
    m.kvs.append(("tokenizer.ggml.merges", ARRAY, (STRING, ["x" * 100] * 200)))  # ~21 kB of header
    source = Counting(m.file())
    with pytest.raises(GGUFError, match="header runs past 4,096 bytes"):
        read_header(source, "big.gguf", Limits(header_bytes=4096), first_chunk=64)
    assert source.served <= 4096


def test_file_type_names_are_llama_cpps():
    """FILE_TYPES (copied from llama.h at build 11434) names each type as gguf's LlamaFileType does."""
    LlamaFileType = pytest.importorskip("gguf", reason="the real extra (make real-model-deps) brings gguf").LlamaFileType
    from atlas.fingerprints.gguf import FILE_TYPES

    known = {t.value: t.name for t in LlamaFileType}
    shared = [n for n in FILE_TYPES if n in known]
    assert len(shared) >= 30 and all(FILE_TYPES[n] == known[n] for n in shared)
