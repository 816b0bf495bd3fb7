"""A GGUF whose MTP layer drafts over a cut vocabulary in llama.cpp (the patch the build carries,
atlas/engines/llamacpp/patches/llamacpp-b11434-nextn-d2t.patch).

`write` copies a combined GGUF byte for byte and appends two tensors to its MTP (nextn) layer:
`blk.N.nextn.draft_head.weight`, the rows of the head the MTP graph uses (nextn.shared_head_head,
else output, else the tied token embedding) for the listed tokens, in the file's own type and bytes,
and `blk.N.nextn.d2t`, each row's token id (I64). A quantized row is a whole number of blocks along
the embedding, so the copied rows are the same numbers the full head holds: the patched draft scores
those tokens exactly as the full head does and every other token at -inf. Verification stays over
the whole vocabulary, so outputs are still the model's (the engine's tests check it).

The ids are the checkpoint's draft vocabulary (atlas.decode.draftvocab: the head's most frequent
training tokens), which only a project-made head has: a shipped head is measured as shipped.
"""

from __future__ import annotations

import struct
from pathlib import Path

from atlas import AtlasError
from atlas.fingerprints.gguf import GGML_TYPES, NEXTN, FileSource, Header, TensorInfo, read_header

I64 = 27  # ggml's GGML_TYPE_I64, d2t's type in llama.cpp's DFlash and EAGLE-3 exports
HEADS = ("blk.{n}.nextn.shared_head_head.weight", "output.weight", "token_embd.weight")  # the MTP graph's order


def _info_bytes(t: TensorInfo) -> bytes:
    name = t.name.encode()
    return (struct.pack("<Q", len(name)) + name + struct.pack("<I", len(t.shape)) + struct.pack(f"<{len(t.shape)}Q", *t.shape)
            + struct.pack("<IQ", t.ggml_type, t.offset))


def _aligned(n: int, align: int) -> int:
    return -(-n // align) * align


def _nextn_layer(header: Header) -> int:
    layers = {int(m.group(1)) for t in header.tensors if (m := NEXTN.match(t.name))}
    if len(layers) != 1:
        raise AtlasError(f"{header.filename}: a cut draft vocabulary needs exactly one MTP (nextn) layer; it has "
                         f"{len(layers) or 'none'}")
    return layers.pop()


def write(src: Path, out: Path, ids: list[int]) -> dict[str, object]:
    """Write `src` with its MTP layer's draft cut to `ids` (distinct token ids) to `out`; return what
    the manifest keeps: the layer, the head rows were taken from, their type and the draft size."""

    header = read_header(FileSource(src), src.name)
    layer = _nextn_layer(header)
    by_name = {t.name: t for t in header.tensors}
    draft_name, d2t_name = f"blk.{layer}.nextn.draft_head.weight", f"blk.{layer}.nextn.d2t"
    if draft_name in by_name or d2t_name in by_name:
        raise AtlasError(f"{src}: its MTP layer already drafts over a cut vocabulary ({d2t_name})")
    head = next((by_name[h.format(n=layer)] for h in HEADS if h.format(n=layer) in by_name), None)
    if head is None or len(head.shape) != 2 or head.ggml_type not in GGML_TYPES:
        raise AtlasError(f"{src}: no LM head of a known type for the MTP layer (looked for {', '.join(h.format(n=layer) for h in HEADS)})")
    if unknown := [t.name for t in header.tensors if t.nbytes is None]:
        raise AtlasError(f"{src}: tensors of a type this reader cannot size ({', '.join(unknown[:3])}); not copied")
    n_embd, n_vocab = head.shape
    if not ids or len(set(ids)) != len(ids) or any(not 0 <= i < n_vocab for i in ids):
        raise AtlasError(f"a cut draft vocabulary needs distinct token ids below {n_vocab:,} (got {len(ids):,} ids)")
    row_bytes = (head.nbytes or 0) // n_vocab

    align = int(header.kv.get("general.alignment", 32))  # read_header checked it: a power of two
    infos = b"".join(_info_bytes(t) for t in header.tensors)
    with src.open("rb") as f:
        raw = f.read(header.header_bytes)
        if not raw.endswith(infos):  # the reader's tensor infos must be the file's own bytes
            raise AtlasError(f"{src}: its tensor infos do not read back as written; not copied")
        data_start = _aligned(header.header_bytes, align)
        last = max(t.offset + (t.nbytes or 0) for t in header.tensors)  # a file may end at its last tensor, unpadded
        data_end = _aligned(last, align)
        f.seek(data_start + head.offset)
        table = f.read(n_vocab * row_bytes)  # one read (tens of MB at most); read_header checked the file holds it
        rows = b"".join(table[i * row_bytes:(i + 1) * row_bytes] for i in ids)
        draft = TensorInfo(draft_name, (n_embd, len(ids)), head.ggml_type, data_end)
        d2t = TensorInfo(d2t_name, (len(ids),), I64, _aligned(data_end + len(rows), align))
        n_tensors, = struct.unpack_from("<Q", raw, 8)
        new_header = raw[:8] + struct.pack("<Q", n_tensors + 2) + raw[16:] + _info_bytes(draft) + _info_bytes(d2t)
        tmp = out.with_name(out.name + ".partial")
        try:
            with tmp.open("wb") as w:
                w.write(new_header + b"\0" * (_aligned(len(new_header), align) - len(new_header)))
                f.seek(data_start)
                left = last
                while left:
                    chunk = f.read(min(left, 1 << 24))
                    if not chunk:
                        raise AtlasError(f"{src}: the file ends before its tensors do")
                    w.write(chunk)
                    left -= len(chunk)
                w.write(b"\0" * (data_end - last) + bytes(rows) + b"\0" * (d2t.offset - data_end - len(rows)))
                w.write(struct.pack(f"<{len(ids)}q", *ids))
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
    return {"layer": layer, "rows_from": head.name, "type": GGML_TYPES[head.ggml_type][0], "size": len(ids)}
