"""The form a repo ships MTP in, and the head's facts, derived by rule from what the crawl stored
(config, tensor names, GGUF header records, safetensors header records). Pure; no I/O.
atlas.fingerprints calls `derive`.

The forms (research notes field-2026 §2; issue 63), each with the evidence that decides it:

- `in_checkpoint`: the weights hold MTP tensors beside the trunk (a weight-name family, or a GGUF
  file with `blk.N.nextn.*` tensors and trunk blocks: "combined");
- `in_repo_separate`: the repo ships the head as a file of its own beside trunk files that lack it:
  an MTP-only GGUF beside trunk-only GGUF quants, or `mtp*.safetensors` beside the trunk's shards
  (mlx-lm #1543); `mtp_pairs_with` names the trunk files it pairs with;
- `declared_missing`: the config (or a GGUF key) declares MTP layers and the weights read hold
  none, in a repo that is not a conversion (MiniMax M2.5-M3, Qwen3.5-2B-PARO: vLLM then
  random-initialises the head). A quantization config alone does not make a conversion: a lab's own
  FP8 release (MiniMax-M2.7: `quant_method: fp8`) is an original release;
- `stripped`: the same absence in a copy whose format says it is a conversion (GGUF files, MLX's
  `quantization`); the store's view adds the conversions only the Hub's metadata shows (a base
  named by the card or `general.base_model.*`, with a quantization from another author, a relation
  `quantized`, a Hub library gguf / mlx) and judges each by the base it names, read on demand where
  the base is outside the snapshot;
- `mtp_sidecar`: a repo with only the head: a sidecar model type (`qwen3_5_mtp`), every tensor an
  MTP tensor, or MTP-only GGUFs with no trunk file beside them; linked to its base in the store;
- `separate_drafter`: a speculative drafter of its own, not MTP (atlas.fingerprints DRAFTER_RULES:
  Gemma assistants, EAGLE-3, DFlash, a DSpark block drafter with no trunk);
- `block_drafter`: a block drafter in the checkpoint (`dspark_block_size` beside a trunk): not MTP;
- `declared_unread`: declared, and no weights read to check it against;
- `none`: nothing of the above.

The first rule that matches decides, in this order: separate drafter, block drafter, sidecar and
separate file (what the repo *is*), then in the checkpoint, then the absent forms (what its weights
hold).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atlas.fingerprints.gguf import GGUFModel, Header, models
from atlas.fingerprints.safetensors_head import ShardHead, head_size

FORMS = ("in_checkpoint", "in_repo_separate", "declared_missing", "stripped", "mtp_sidecar", "separate_drafter", "block_drafter",
         "declared_unread", "none")

# model_type of a checkpoint that holds only an MTP head for a base in another repo, and the keys
# read with it (FoxlightAI/qwen3-5-0-8b-base-mtp, guru87/Qwen3.5-2B-MTP: `block_size`)
SIDECAR_MODEL_TYPES = ("qwen3_5_mtp",)
SIDECAR_KEYS = ("block_size",)
# a block drafter trained into the checkpoint (DeepSeek-V4-Flash-0731, V4.1): drafts a block of
# `dspark_block_size` tokens from the hidden states of `dspark_target_layer_ids`; not an MTP head
BLOCK_DRAFTER_KEYS = ("dspark_block_size",)
BLOCK_DRAFTER_LAYERS = "dspark_target_layer_ids"
CONTAINERS = ("", "text_config", "language_config")
MAX_EVIDENCE = 300
# general.base_model.0.repo_url of a GGUF converted from a Hub repo, optionally pinned to a commit
GGUF_BASE_URL = re.compile(r"https?://huggingface\.co/([A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}?)"
                           r"(?:/(?:tree|commit|blob)/([0-9a-f]{40}))?/?")


@dataclass
class Inputs:
    """What atlas.fingerprints already read from one repo, handed over as plain values."""

    config: Mapping[str, Any]
    facts: Mapping[str, tuple[Any, str]]
    declared: int | None
    declared_key: str | None
    shipped: int | None
    shipped_evidence: str | None
    names: Sequence[str] | None  # every tensor name read (None: no weights read)
    mtp_names: Sequence[str]  # those the shipped family's rule matched
    drafter: tuple[str, str] | None
    headers: Sequence[Header]
    shard_heads: Sequence[ShardHead] = ()  # safetensors shards' head records (atlas.fingerprints.safetensors_head)
    separate_head: str | None = None  # the safetensors file(s) holding the head on their own (rules.SEPARATE_HEAD_FILE)


Row = tuple[str, str, str | None]


def derive(inp: Inputs) -> list[Row]:
    """Fingerprint rows: the form and its evidence, what marks a conversion, the GGUF facts and the
    head's facts."""
    ggufs = models(list(inp.headers))
    rows: list[Row] = []
    rows += _config_rows(inp.config)
    conversion = _conversion(inp, ggufs)
    if conversion:
        rows.append(("mtp_conversion", "yes", conversion))
    rows += _gguf_rows(ggufs)
    rows += _gguf_base_rows(ggufs, inp.headers)
    form, evidence = _form(inp, ggufs, conversion)
    rows.append(("mtp_form", form, _cut(evidence)))
    pairs = _pairs_with(inp, ggufs) if form == "in_repo_separate" else None
    if pairs:
        rows.append(("mtp_pairs_with", _cut(pairs[0]), pairs[1]))
    if form in ("in_checkpoint", "in_repo_separate", "mtp_sidecar", "separate_drafter"):
        rows += _head_rows(inp, ggufs)
    return rows


def _find(config: Mapping[str, Any], key: str) -> tuple[str, Any] | None:
    for container in CONTAINERS:
        node = config.get(container) if container else config
        if isinstance(node, Mapping) and key in node:
            return (f"{container}.{key}" if container else key), node[key]
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1_000_000 else None


def _config_rows(config: Mapping[str, Any]) -> list[Row]:
    """The sidecar's and the block drafter's own keys, as facts with the key they came from."""
    rows: list[Row] = []
    for key in (*SIDECAR_KEYS, *BLOCK_DRAFTER_KEYS):
        hit = _find(config, key)
        if hit and _int(hit[1]) is not None:
            rows.append((key, str(hit[1]), hit[0]))
    hit = _find(config, BLOCK_DRAFTER_LAYERS)
    if hit and isinstance(hit[1], list) and 0 < len(hit[1]) <= 1000 and all(_int(x) is not None for x in hit[1]):
        rows.append((BLOCK_DRAFTER_LAYERS, ",".join(map(str, hit[1])), hit[0]))
    return rows


def _conversion(inp: Inputs, ggufs: list[GGUFModel]) -> str | None:
    """What in the repo's own files says it is a converted copy: a format that is only ever made
    from another checkpoint (GGUF, MLX's quantization), or None. A quantization config is no such
    evidence (labs release FP8 originals): the store's view weighs it with the base the Hub names."""
    if ggufs:
        return f"GGUF files ({', '.join(m.files[0] for m in ggufs)[:200]})"
    q = inp.config.get("quantization")
    if isinstance(q, Mapping) and ("bits" in q or "group_size" in q):
        return "quantization (MLX: bits / group_size)"
    return None


def _gguf_rows(ggufs: list[GGUFModel]) -> list[Row]:
    if not ggufs:
        return []

    def each(fn: Any) -> str:
        return _cut("; ".join(f"{m.files[0]}: {fn(m)}" for m in ggufs))

    rows: list[Row] = [
        ("gguf_layout", ",".join(sorted({m.layout for m in ggufs})), each(lambda m: m.layout + (
            f" ({m.parts_missing} split parts not read)" if m.parts_missing else ""))),
    ]
    archs = sorted({m.architecture for m in ggufs if m.architecture})
    if archs:
        rows.append(("gguf_architecture", ",".join(archs), each(lambda m: m.architecture)))
    declared = [m for m in ggufs if m.nextn_declared is not None]
    if declared:
        rows.append(("gguf_nextn_predict_layers", str(max(m.nextn_declared or 0 for m in declared)),
                     _cut("; ".join(f"{m.files[0]}: {m.nextn_key} = {m.nextn_declared}" for m in declared))))
    with_head = [m for m in ggufs if m.mtp_layers]
    if with_head:
        rows.append(("gguf_head_types", _cut(" | ".join(
            f"{m.files[0]}: " + ", ".join(f"{t}×{n}" for t, n in m.head_types.items()) for m in with_head)),
            _cut("; ".join(f"{m.files[0]}: blk.{_span(m.mtp_layers)}.*" for m in with_head))))
    return rows


def _gguf_base_rows(ggufs: list[GGUFModel], headers: Sequence[Header]) -> list[Row]:
    """The base a GGUF names in its header (general.base_model.0.repo_url on the Hub), and the
    commit it names where the URL pins one; the first file's that names one."""
    for m in ggufs:
        h = next((h for h in headers if h.filename == m.files[0]), None)
        url = h.kv.get("general.base_model.0.repo_url") if h is not None else None
        hit = GGUF_BASE_URL.fullmatch(url) if isinstance(url, str) else None
        if hit:
            where = f"{m.files[0]}: general.base_model.0.repo_url"
            return [("gguf_base_model", hit.group(1), where)] + ([("gguf_base_revision", hit.group(2), where)]
                                                                  if hit.group(2) else [])
    return []


def _pairs_with(inp: Inputs, ggufs: list[GGUFModel]) -> tuple[str, str] | None:
    """The trunk files a separate head file pairs with, and where they were read."""
    trunk = [f for m in ggufs if m.layout == "trunk-only" for f in m.files]
    if trunk:
        return ", ".join(trunk), "GGUF headers read (trunk-only)"
    if inp.separate_head and inp.names:
        return "the trunk's shards", f"the {len(inp.names)} tensor names of the weight index"
    return None


def _form(inp: Inputs, ggufs: list[GGUFModel], conversion: str | None) -> tuple[str, str]:
    if inp.drafter is not None:
        return "separate_drafter", f"{inp.drafter[1]} = {inp.drafter[0]}"
    for key in BLOCK_DRAFTER_KEYS:
        hit = _find(inp.config, key)
        if hit and _int(hit[1]):
            return "block_drafter", f"{hit[0]} = {hit[1]}"
    model_type = inp.facts.get("model_type", (None, ""))
    if model_type[0] in SIDECAR_MODEL_TYPES:
        return "mtp_sidecar", f"{model_type[1]} = {model_type[0]}"
    only = [m for m in ggufs if m.layout == "mtp-only"]
    trunk = [m for m in ggufs if m.layout == "trunk-only"]
    if only:
        heads = "; ".join(f"{m.files[0]}: only blk.{_span(m.mtp_layers)}.* (MTP-only GGUF)" for m in only)
        if trunk:  # the head as a file of its own beside quants of the trunk: the repo ships it
            return "in_repo_separate", f"{heads}; beside trunk-only {', '.join(m.files[0] for m in trunk)[:120]}"
        return "mtp_sidecar", heads
    if inp.separate_head:
        if inp.names:
            return "in_repo_separate", (f"{inp.shipped_evidence} ({inp.shipped} layer(s)), a file of its own beside "
                                        f"the {len(inp.names)} trunk tensors of the index")
        return "mtp_sidecar", f"{inp.shipped_evidence}: the only weights read"
    if inp.names and inp.mtp_names and len(inp.mtp_names) == len(inp.names):
        return "mtp_sidecar", f"every one of {len(inp.names)} tensors is an MTP tensor ({inp.shipped_evidence})"
    if (inp.shipped or 0) > 0:
        return "in_checkpoint", f"{inp.shipped_evidence} ({inp.shipped} layer(s))"
    combined = [m for m in ggufs if m.layout == "combined"]
    if combined:
        return "in_checkpoint", "; ".join(f"{m.files[0]}: blk.{_span(m.mtp_layers)}.nextn.* beside the trunk" for m in combined)
    return _absent(inp, ggufs, conversion)


def _absent(inp: Inputs, ggufs: list[GGUFModel], conversion: str | None) -> tuple[str, str]:
    """No MTP tensors found: declared ones missing, stripped, unread, or none declared."""
    gguf_declared = [m for m in ggufs if (m.nextn_declared or 0) > 0]
    if (inp.declared or 0) > 0:
        claim = f"{inp.declared_key} = {inp.declared}"
    elif gguf_declared:
        claim = f"{gguf_declared[0].files[0]}: {gguf_declared[0].nextn_key} = {gguf_declared[0].nextn_declared}"
    else:
        return "none", "no MTP key declared and no MTP tensors found"
    trunk = [m for m in ggufs if m.layout == "trunk-only"]
    if inp.names is not None:
        seen = f"none of the {len(inp.names)} tensor names is an MTP tensor"
    elif trunk:
        seen = f"{trunk[0].files[0]} holds no blk.N.nextn.* tensor (trunk-only)"
    else:
        return "declared_unread", f"{claim}; no weight names read"
    if conversion:
        return "stripped", f"{claim}; {seen}; a conversion: {conversion}"
    return "declared_missing", f"{claim}; {seen}"


def _head_rows(inp: Inputs, ggufs: list[GGUFModel]) -> list[Row]:
    """Whether the head has its own embedding and lm_head (or uses the trunk's), from tensor names;
    its size and its share of the file from a GGUF header, where one holds it."""
    rows: list[Row] = []
    with_head = [m for m in ggufs if m.mtp_layers]
    own_embed = [n for n in inp.mtp_names if "embed_tokens" in n]
    own_head = [n for n in inp.mtp_names if "shared_head.head" in n or "lm_head" in n]
    if inp.names is not None and inp.mtp_names:
        rows.append(("mtp_own_embedding", "yes" if own_embed else "no",
                     own_embed[0] if own_embed else f"no embed_tokens among the {len(inp.mtp_names)} MTP tensors"))
        rows.append(("mtp_own_lm_head", "yes" if own_head else "no",
                     own_head[0] if own_head else f"no shared_head.head / lm_head among the {len(inp.mtp_names)} MTP tensors"))
    elif with_head:
        m = with_head[0]
        rows.append(("mtp_own_embedding", "yes" if m.own_embedding else "no", f"{m.files[0]}: blk.N.nextn.embed_tokens"))
        rows.append(("mtp_own_lm_head", "yes" if m.own_lm_head else "no", f"{m.files[0]}: blk.N.nextn.shared_head_head"))
    size = head_size(inp.shard_heads, inp.mtp_names) if inp.shard_heads and inp.mtp_names else None
    if size is not None:
        where = f"{size.tensors} MTP tensors in the safetensors header(s) read"
        rows.append(("mtp_head_params", str(size.params), where))
        if size.bytes is not None:
            rows.append(("mtp_head_bytes", str(size.bytes), where))
        if size.share is not None:
            rows.append(("mtp_head_share", f"{size.share:.4f}", "head bytes / the index's metadata.total_size"))
        rows.append(("mtp_head_dtypes", _cut(size.dtypes), where))
    for m in with_head[:1] if size is None else []:
        where = f"{m.files[0]}: blk.{_span(m.mtp_layers)}.* (GGUF header)"
        rows.append(("mtp_head_params", str(m.head_params), where))
        if m.head_bytes is not None:
            rows.append(("mtp_head_bytes", str(m.head_bytes), where))
        if m.total_bytes and m.head_bytes is not None and m.layout == "combined":
            rows.append(("mtp_head_share", f"{m.head_bytes / m.total_bytes:.4f}", f"{m.files[0]}: head bytes / all tensor bytes"))
    return rows


def _span(indices: Sequence[int]) -> str:
    if len(indices) == 1:
        return str(indices[0])
    if list(indices) == list(range(indices[0], indices[-1] + 1)):
        return f"{{{indices[0]}-{indices[-1]}}}"
    return "{" + ",".join(map(str, indices)) + "}"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_EVIDENCE else text[: MAX_EVIDENCE - 1] + "…"
