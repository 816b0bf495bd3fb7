"""The MTP family table: one row per family the fingerprint rules recognise, with its tensor layout
and wiring, or why it is refused; and the table's answers that need no weights.

Each row says, for one family the fingerprint rules recognise (atlas.fingerprints.rules.WEIGHT_RULES),
where the MTP layer's tensors live, which inputs it takes and in what order, how its norms compute,
whether the inputs are concatenated or added, what its decoder block is, whether embedding and head
are its own or shared, and how k > 1 drafts reuse it. The wiring is the one the family's published
inference code runs (vLLM/SGLang model files, the authors' modeling code; see
../shared/research-notes/mtp-layouts.md). A family whose block or wiring we cannot run correctly is
a row with `refuse` set: the loader names it and says why, instead of guessing.

No torch here: the site, the finder, coverage, the evidence and the export read these words, and
`atlas site build` must not load a tensor library for them. The loader that builds a row's MTP
layer from a checkpoint's tensors is atlas.decode.mtphead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from atlas import AtlasError
from atlas.fingerprints import blockpattern
from atlas.fingerprints.rules import WEIGHT_RULES, Fingerprint, fingerprint

Order = Literal["embedding_first", "hidden_first"]
NormStyle = Literal["rms", "gemma"]

# Nemotron-H MTP sub-layer types the loop runs (vLLM's nemotron_h_mtp runs the same two), in
# transformers' names; atlas.fingerprints.blockpattern reads either spelling into them.
MTP_SUBLAYERS = {"full_attention", "moe"}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config model_type values this row reads
    shipped_family: str  # atlas.fingerprints.rules WeightRule.family of its tensor names
    glue: str = ""  # prefix of the glue tensors; {N} = num_hidden_layers
    block: str = ""  # prefix of the decoder block's tensors
    e_norm: str = ""
    h_norm: str = ""
    proj: str = ""  # [H, 2H] over the concatenation, in `order`
    final_norm: str | None = None  # the norm both the logits and the recycled hidden go through
    final_glue: str | None = None  # prefix of final_norm when not `glue`; {last} = the block's last sub-layer
    # the block pattern (atlas.fingerprints.blockpattern) spelling the MTP block as a chain of sub-layers (Nemotron-H)
    sublayers_from: blockpattern.Which | None = None
    order: Order = "embedding_first"
    norm: NormStyle = "rms"
    combine: Literal["concat"] = "concat"
    # The names a layer-local copy of the head / the embedding has under `glue` in this family's
    # checkpoints. One rule for every row: a copy the checkpoint ships is used; one it lacks (GLM-5
    # ships neither) is bound to the target's lm_head / embedding, and MtpHead.shared says so.
    # None: the family never has such a copy, the target's is always used.
    own_head: str | None = None
    own_embed: str | None = None
    block_type: str = ""  # what the block is (the main model's decoder-layer class builds it)
    reuse: str = "k > 1: the one layer again on its own output hidden and draft (vLLM: layer i mod n)"
    source: str = ""
    refuse: str | None = None
    # A config key bounding the sequence length below which the family's sparse attention selects
    # every key (DSA: index_topk): measured there as dense attention, refused beyond.
    dense_limit: str | None = None
    transformers_type: str | None = None  # the transformers model_type that runs a main model transformers has no class for


FAMILIES: tuple[Family, ...] = (
    Family(
        "MiMo", ("qwen2", "mimo"), "mimo", glue="model.mtp_layers.{m}.", block="model.mtp_layers.{m}.",
        e_norm="token_layernorm.weight", h_norm="hidden_layernorm.weight", proj="input_proj.weight",
        final_norm="final_layernorm.weight", order="hidden_first", block_type="Qwen2 decoder layer (qkv biases)",
        source="XiaomiMiMo/MiMo modeling_mimo.py; vLLM mimo_mtp.py", transformers_type="qwen2",
    ),
    Family(
        "DeepSeek-V3", ("deepseek_v3", "deepseek_v2"), "deepseek_glm", glue="model.layers.{N}.", block="model.layers.{N}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        own_head="shared_head.head.weight", own_embed="embed_tokens.weight",
        block_type="DeepSeek-V3 decoder layer (MLA attention, MoE with shared experts)",
        source="vLLM deepseek_mtp.py; SGLang deepseek_nextn.py; DeepSeek-V3 README_WEIGHTS.md",
    ),
    Family(
        "GLM-4-MoE", ("glm4_moe", "glm4_moe_lite"), "deepseek_glm", glue="model.layers.{N}.", block="model.layers.{N}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        own_head="shared_head.head.weight", own_embed="embed_tokens.weight",
        block_type="GLM-4-MoE decoder layer (GLM-4.7-Flash / glm4_moe_lite: MLA attention)",
        source="vLLM glm4_moe_mtp.py (DeepSeek wiring, post-norm recycled)",
    ),
    Family(
        "Qwen3-Next", ("qwen3_next",), "qwen3_next", glue="mtp.", block="mtp.layers.0.",
        e_norm="pre_fc_norm_embedding.weight", h_norm="pre_fc_norm_hidden.weight", proj="fc.weight", final_norm="norm.weight",
        norm="gemma", block_type="Qwen3-Next full-attention decoder layer (gated attention, MoE with shared expert)",
        source="vLLM qwen3_next_mtp.py; transformers Qwen3NextRMSNorm (x̂·(1+w))",
    ),
    Family(
        "DeepSeek-V3.2", ("deepseek_v32",), "deepseek_glm", glue="model.layers.{N}.", block="model.layers.{N}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        own_head="shared_head.head.weight", own_embed="embed_tokens.weight", dense_limit="index_topk",
        block_type="DeepSeek-V3.2 decoder layer (MLA with a DSA indexer, MoE), run dense-equivalent",
        source="vLLM deepseek_mtp.py (DeepseekV32MTPModel); DeepSeek-V3.2-Exp inference/model.py (topk = min(index_topk, T))",
    ),
    Family(
        "GLM-5", ("glm_moe_dsa",), "deepseek_glm", glue="model.layers.{N}.", block="model.layers.{N}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="shared_head.norm.weight",
        own_head="shared_head.head.weight", own_embed="embed_tokens.weight", dense_limit="index_topk",
        block_type="GLM-5 decoder layer (DeepSeek-V3.2 attention with a DSA indexer, MoE), run dense-equivalent",
        source="vLLM deepseek_mtp.py (DeepseekV32MTPModel); GLM-5.x ships neither shared_head.head nor the layer's "
        "embed_tokens: the target's lm_head and embedding are bound (vLLM PR #34385)",
    ),
    Family(
        "DeepSeek-V4", ("deepseek_v4",), "deepseek_glm",
        refuse="its MTP layer reads the main model's multi-stream hyper-connection residual from before hc_head, which "
        "transformers' DeepseekV4 class does not expose, and its CSA/HCA compressed attention caches have no per-position "
        "rollback in our loop; V4.1 ships DSpark stages instead of an MTP layer",
    ),
    Family(
        "ERNIE-4.5", ("ernie4_5_moe", "ernie4_5"), "ernie",
        refuse="the published implementations disagree: the authors' PaddleFormers code feeds the main model's pre-norm "
        "hidden and puts the MTP output through the main final norm, vLLM's ernie_mtp applies no final norm; our loop "
        "recycles post-norm hiddens, so neither is run until the wiring is settled",
    ),
    Family(
        "LongCat-Flash", ("longcat_flash",), "longcat",
        refuse="its MTP block type (not the main model's shortcut-connected MoE layer) has no transformers class to build it from",
    ),
    Family(
        "Nemotron-H / Nemotron-3", ("nemotron_h",), "nemotron_h", glue="mtp.layers.0.", block="mtp.layers.{i}.",
        e_norm="enorm.weight", h_norm="hnorm.weight", proj="eh_proj.weight", final_norm="final_layernorm.weight",
        final_glue="mtp.layers.{last}.", sublayers_from="mtp",
        block_type="the chain of MTP sub-layers (mtp_hybrid_override_pattern * E, or mtp_layers_block_type attention, moe), "
        "as Nemotron-H main blocks",
        source="vLLM nemotron_h_mtp.py (enorm/hnorm/eh_proj on the first sub-layer, final_layernorm on the last)",
    ),
    Family(
        "Qwen3.5", ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), "qwen3_next", glue="mtp.", block="mtp.layers.0.",
        e_norm="pre_fc_norm_embedding.weight", h_norm="pre_fc_norm_hidden.weight", proj="fc.weight", final_norm="norm.weight",
        norm="gemma", block_type="Qwen3.5 full-attention decoder layer (dense, or MoE for Qwen3.5-MoE)",
        source="vLLM qwen3_5_mtp.py; count from text_config.mtp_num_hidden_layers",
    ),
    Family(
        "MiniMax-M2", ("minimax_m2", "minimax"), "",
        refuse="configs declare num_mtp_modules but the published checkpoints ship no MTP tensors; no layout to load",
    ),
    Family(
        # transformers 5.24 has MiniMaxM3VLConfig but no causal-LM class for it (only for its text
        # config), and its model class ignores mtp.* on load: without this row the refusal was
        # transformers' "Unrecognized configuration class", which names neither family nor reason.
        "MiniMax-M3", ("minimax_m3_vl", "minimax_m3_vl_text"), "",
        refuse="a vision-language model whose MTP module has no checked tensor layout (transformers' MiniMaxM3VL classes "
        "drop mtp.* tensors on load and build no MTP layer; MiniMax answered \"Don't support MTP now\", MiniMax-M3 issue #13), "
        "and whose minimax_m3_sparse attention layers (a lightning indexer choosing key blocks) have no dense-equivalent "
        "regime checked in our loop",
    ),
    Family("Step-3.5", ("step3p5", "step3p7", "step3"), "", refuse="no published MTP tensor layout checked for this family"),
    Family("Bailing hybrid", ("bailing_hybrid", "bailing_moe"), "",
           refuse="no checked MTP tensor layout; its linear-attention main layers are not a kind checked against our "
                  "per-position state slots (Gated DeltaNet, Mamba2)"),
    Family("Inkling", ("inkling", "inkling2"), "", refuse="no published MTP tensor layout checked for this family"),
    Family(
        "Gemma 4 assistant", ("gemma4_assistant",), "",
        refuse="a separate MTP drafter repo (google/gemma-4-*-it-assistant): its 4 layers read the target's KV cache, "
        "while our loop runs only an MTP layer shipped inside the target's own checkpoint, with a cache of its own",
    ),
)


Status = Literal["measurable", "refused", "no row"]


@dataclass(frozen=True)
class Measurability:
    """Whether the atlas's own runner (`atlas measure run`) can measure a model_type, and why."""

    model_type: str
    family: str | None  # the table row, None when no row reads this model_type
    status: Status
    reason: str


def measurability(model_type: str) -> Measurability:
    """The family table's answer for one config model_type (text_config's for a multimodal model)."""
    row = next((f for f in FAMILIES if model_type in f.model_types), None)
    if row is None:
        return Measurability(model_type, None, "no row", "no family-table row: measured only if transformers' own MTP loader "
                             "(MtpModel, num_mtp_layers) loads it, refused by name otherwise")
    if row.refuse:
        return Measurability(model_type, row.name, "refused", row.refuse)
    how = f"MTP layer built from the checkpoint's own tensors ({row.block_type})"
    if row.transformers_type and model_type != row.transformers_type:
        how += f"; main model on transformers' {row.transformers_type} classes, no remote code"
    if row.dense_limit:
        how += f"; only while prompt + new tokens - 1 (the keys attended) <= {row.dense_limit}, where its sparse attention is exactly dense"
    if "{N}" in row.glue or "{m}" in row.glue:
        how += "; n > 1 shipped MTP layers chained (draft i from layer i mod n)"
    return Measurability(model_type, row.name, "measurable", how)


def measurability_table() -> list[Measurability]:
    """One entry per model_type the family table names, in table order."""
    return [measurability(t) for f in FAMILIES for t in f.model_types]


def identify(config: dict, names: list[str]) -> Family | None:
    """The table row for this config (model_type) and tensor layout (fingerprint family); None when
    no row matches. A refused row matches on model_type alone, so it is named whatever it ships; a
    measured family's config that declares MTP layers its tensors do not hold is an AtlasError."""
    fp = fingerprint(config, names)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    model_type = str(text.get("model_type", config.get("model_type", "")))
    rows = [f for f in FAMILIES if model_type in f.model_types]
    for family in rows:
        if family.refuse or family.shipped_family == fp.shipped_family:
            return family
    if rows and fp.declared_num_mtp_layers:
        # e.g. a re-upload that dropped the MTP layer: transformers would build one from nothing
        raise AtlasError(_unmatched(next(f for f in rows if not f.refuse), fp, config, names))
    return None


MTP_SEGMENT = re.compile(r"(?:^|\.)mtp(?:[._]|$)")  # a name segment that is, or starts, "mtp" (mtp., mtp_layers., model.mtp.)
SHOWN = 5  # tensor names quoted in a message; the rest counted


def _unmatched(row: Family, fp: Fingerprint, config: dict, names: list[str]) -> str:
    """Why a config that declares MTP layers matched no layout of its family: the tensor names the
    row looked for (and the rule's key condition when the config does not meet it), and every name
    under an mtp prefix, so that a spelling mismatch never reads as "ships nothing"."""
    depth = fp.facts.get("num_hidden_layers", ("N", ""))[0]
    glue = row.glue.replace("{N}", str(depth)).replace("{m}", "0")
    wanted = ", ".join(glue + n for n in (row.e_norm, row.h_norm, row.proj) if n)
    rule = next(r for r in WEIGHT_RULES if r.family == row.shipped_family)
    looked = f"looked for {wanted} ({rule.family} tensor rule: {rule.evidence.replace('{idx}', 'i')})"
    unmet = rule.requires_keys and not any(k in config for k in rule.requires_keys)
    if unmet:
        looked += f", a rule that applies only when the config has {' or '.join(rule.requires_keys)}, and it has neither"
    found = sorted(n for n in names if MTP_SEGMENT.search(n))
    head = f"{row.name}: the config declares {fp.declared_num_mtp_layers} MTP layer(s) ({fp.declared_key}) but"
    if not found:
        return f"{head} the checkpoint ships no MTP tensors in the family's layout: {looked}; no tensor name has an mtp prefix; nothing to measure"
    more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
    read = f"read as the {fp.shipped_family} layout" if fp.shipped_family else "matching no MTP layout"
    return (f"{head} its tensors match no MTP layout of the family: {looked}; found {len(found)} tensor(s) under an mtp prefix "
            f"({', '.join(found[:SHOWN])}{more}), {read}; not measured")


CHAIN_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


def chain_length(text_config: dict) -> int:
    """How many MTP layers the (language model's) config declares, 1 when it names none."""
    return max((int(v) for k in CHAIN_KEYS if isinstance(v := text_config.get(k), int) and not isinstance(v, bool)), default=1)


def chain_refusal(family: Family, chain: int) -> str | None:
    """Why `chain` declared MTP layers cannot be run by this family's glue, None when they can."""
    if chain > 1 and ("{N}" not in family.glue and "{m}" not in family.glue or family.sublayers_from):
        return (f"{family.name}: not measured: {chain} MTP layers declared, but the family's glue ({family.glue}*) is one "
                "set of tensors, not one per layer; only families with per-layer glue (DeepSeek, GLM, MiMo) are chained")
    return None


def mtp_sublayers(raw: dict, family: Family) -> list[str]:
    """The MTP block's sub-layer types: one full-attention layer, or the family's pattern read
    from config.json in either spelling (types other than those the loop runs refused by name)."""
    if not family.sublayers_from:
        return ["full_attention"]
    try:
        pattern = blockpattern.read(raw, family.sublayers_from)
    except AtlasError as exc:
        raise AtlasError(f"{family.name}: not measured: {exc}") from None
    if pattern is None:
        raise AtlasError(f"{family.name}: config.json spells no MTP block: neither of "
                         f"{' nor '.join(blockpattern.KEYS[family.sublayers_from])}")
    text = raw.get("text_config") or raw
    shown = text[pattern.key]  # as the config spells it: the message names what the user can find there
    spelled = list(shown) if isinstance(shown, str) else shown
    other = sorted({repr(s) for s, kind in zip(spelled, pattern.kinds) if kind not in MTP_SUBLAYERS})
    if other:
        what = "letter" if isinstance(shown, str) else "type"
        raise AtlasError(f"{family.name}: not measured: {pattern.key} {shown!r} has sub-layer {what}(s) {', '.join(other)}; "
                         "the loop runs only attention (* / attention) and MoE (E / moe) MTP sub-layers")
    attention = pattern.kinds.count("full_attention")
    if attention > 1:
        raise AtlasError(f"{family.name}: not measured: {pattern.key} {shown!r} has {attention} attention "
                         "sub-layers; the loop keeps one KV cache per MTP layer")
    return list(pattern.kinds)
