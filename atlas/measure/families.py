"""The MTP family table, and a loader that builds a checkpoint's MTP layer from its own tensors.

Each row says, for one family the fingerprint rules recognise (atlas.fingerprints.WEIGHT_RULES),
where the MTP layer's tensors live, which inputs it takes and in what order, how its norms compute,
whether the inputs are concatenated or added, what its decoder block is, whether embedding and head
are its own or shared, and how k > 1 drafts reuse it. The wiring is the one the family's published
inference code runs (vLLM/SGLang model files, the authors' modeling code; see
../shared/research-notes/mtp-layouts.md). A family whose block or wiring we cannot run correctly is
a row with `refuse` set: the loader names it and says why, instead of guessing.

The main model always comes from transformers' own class for the config. The MTP decoder block is
built by that same class too: the checkpoint is loaded with one extra main layer, and transformers'
`key_mapping` maps the block's tensors onto it (so its weight conversions, e.g. fused experts,
apply); that layer is then taken out of the main stack and wired by this module's glue.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from atlas import AtlasError, blockpattern
from atlas.fingerprints import WEIGHT_RULES, Fingerprint, fingerprint
from atlas.measure.recurrent import time_step_limit

Order = Literal["embedding_first", "hidden_first"]
NormStyle = Literal["rms", "gemma"]

# Main-model layer kinds the loop can roll back: attention by overwriting its position-addressed
# cache, Gated DeltaNet ("linear_attention") by its per-position state slots (atlas.measure.recurrent).
# Nemotron-H's "linear_attention" is a Mamba2 layer (same slots); its "moe" and "mlp" blocks keep no state.
ROLLBACK_OK = {"full_attention", "sliding_attention", "linear_attention", "moe", "mlp"}
# Nemotron-H MTP sub-layer types the loop runs (vLLM's nemotron_h_mtp runs the same two), in
# transformers' names; atlas.blockpattern reads either spelling into them.
MTP_SUBLAYERS = {"full_attention", "moe"}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config model_type values this row reads
    shipped_family: str  # atlas.fingerprints WeightRule.family of its tensor names
    glue: str = ""  # prefix of the glue tensors; {N} = num_hidden_layers
    block: str = ""  # prefix of the decoder block's tensors
    e_norm: str = ""
    h_norm: str = ""
    proj: str = ""  # [H, 2H] over the concatenation, in `order`
    final_norm: str | None = None  # the norm both the logits and the recycled hidden go through
    final_glue: str | None = None  # prefix of final_norm when not `glue`; {last} = the block's last sub-layer
    # the block pattern (atlas.blockpattern) spelling the MTP block as a chain of sub-layers (Nemotron-H)
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


@dataclass
class MtpHead:
    """What the decode loop needs of one MTP layer, whichever loader built it: the input norms,
    the projection split into the columns that take the embedding and those that take the hidden
    (so no concat is needed and the order is settled here), the block, the post norm(s) whose output
    is both the logits input and the recycled hidden, the head and embedding it uses, the RoPE
    module for its block, and an independent full-sequence forward to validate the loop against."""

    family: str
    enorm: nn.Module
    hnorm: nn.Module
    w_e: torch.Tensor
    w_h: torch.Tensor
    block: nn.Module
    post_norms: list[nn.Module]
    head: nn.Module
    embed: torch.Tensor
    rotary: nn.Module | None  # None: no position embedding (Nemotron-H attention)
    rope_layer_type: str | None
    # (hidden fed [n, d] for pairs j, token ids [n] at j+1, RoPE positions j+1) ->
    # (output hidden [n, d], the one recycled for the next draft; logits [n, V])
    reference: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    # Layers 1..n-1 of a chain of n shipped MTP layers (draft i uses layer i mod n, as vLLM)
    next_layers: list[MtpHead] = field(default_factory=list)
    # Layer-local tensors the checkpoint lacks -> the target's tensor bound in their place
    # (GLM-5: {"model.layers.78.shared_head.head.weight": "lm_head.weight", ...}); empty: none shared
    shared: dict[str, str] = field(default_factory=dict)


class Norm(nn.Module):
    """RMS norm in fp32, plain x̂·w or Gemma/Qwen3-Next style x̂·(1 + w)."""

    def __init__(self, weight: torch.Tensor, eps: float, style: NormStyle) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps, self.style = eps, style

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        w = self.weight.float()
        return (y * (1 + w if self.style == "gemma" else w)).to(x.dtype)


def head_from_transformers(mtp: nn.Module) -> MtpHead:
    """transformers' own MtpModel (the families it loads, e.g. the team model's Mellum) as an
    MtpHead; its forward_layer is the reference."""
    special = [a for a in ("logits_mup_width_multiplier", "unpadded_vocab_size") if getattr(mtp.config, a, None) is not None]
    if special:
        raise AtlasError(f"unsupported MTP head options: {', '.join(special)}")
    if mtp.num_mtp_layers != 1:
        raise AtlasError(f"{mtp.num_mtp_layers} chained MTP layers: only one layer (reused for k > 1) is run")
    layer = mtp.layers[0]
    d = layer.eh_proj.weight.shape[0]
    first, second = layer.eh_proj.weight.detach().split(d, dim=1)
    hidden_first = bool(getattr(mtp.config, "mtp_hidden_states_first", False))
    types = getattr(mtp.config, "layer_types", None)

    def reference(hidden: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = mtp.forward_layer(0, hidden[None], positions[None], None, input_ids=ids[None])
        return out[0], mtp._project_to_logits(out)[0]

    return MtpHead(
        family=f"transformers MtpModel ({mtp.config.model_type})",
        enorm=layer.enorm, hnorm=layer.hnorm,
        w_e=second if hidden_first else first, w_h=first if hidden_first else second,
        block=layer.mtp_block,
        post_norms=[m for m in (layer.post_norm, getattr(mtp, "shared_post_norm", None)) if m is not None],
        head=mtp.shared_head, embed=mtp.embed_tokens.weight.detach(), rotary=mtp.rotary_emb,
        rope_layer_type=types[0] if (mtp.has_per_layer_rope and types) else None,
        reference=reference,
    )


# ---- the loader -----------------------------------------------------------------------------------


def tensor_names(folder: Path) -> dict[str, Path]:
    """Every tensor name of a safetensors checkpoint -> the file holding it (single file or sharded)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise AtlasError(f"{index}: no weight_map")
        return {str(k): folder / str(v) for k, v in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise AtlasError(f"{folder}: no safetensors weights (pickled weights are never loaded)")
    names: dict[str, Path] = {}
    for path in files:
        with safe_open(str(path), "pt") as f:
            names.update(dict.fromkeys(f.keys(), path))
    return names


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


class Chain(nn.Module):
    """An MTP block spelled as several main-model sub-layers (Nemotron-H's mtp_hybrid_override_pattern),
    called like one decoder layer; its one attention sub-layer uses the cache it is given."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                cache: object = None, **kwargs: object) -> torch.Tensor:
        for block in self.blocks:
            hidden_states = block(hidden_states, attention_mask=attention_mask, position_ids=position_ids, cache=cache)
        return hidden_states


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


class AllKeys(nn.Module):
    """Stands in for a DSA indexer (same call) in the dense-equivalent regime: with at most
    index_topk keys the indexer's top-k (k = min(index_topk, keys)) selects every key, so its
    scores change nothing and are not computed; its loaded weights are dropped."""

    def forward(self, hidden_states: torch.Tensor, q_resid: torch.Tensor, position_embeddings: object,
                attention_mask: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        b, s, t = hidden_states.shape[0], hidden_states.shape[1], attention_mask.shape[-1]
        return torch.arange(t, device=hidden_states.device, dtype=torch.int32).expand(b, s, t)


def dense_attention(model: nn.Module) -> int:
    """Every DSA indexer in `model` (main layers and the MTP blocks) replaced by AllKeys; returns
    how many. Exact only while no forward sees more than index_topk keys (FusedModel guards it)."""
    count = 0
    for module in model.modules():
        # GLM-5's "shared" layers reuse the previous layer's selection: every key there too
        if (isinstance(getattr(module, "indexer", None), nn.Module) or hasattr(module, "skip_topk")) and not isinstance(module.indexer, AllKeys):
            module.indexer = AllKeys()
            module.skip_topk = False
            count += 1
    return count


def _at(template: str, depth: int, m: int) -> str:
    """A row's tensor prefix for MTP layer m: {N} = num_hidden_layers + m (DeepSeek numbers its MTP
    layers after the main ones), {m} = m."""
    return template.replace("{N}", str(depth + m)).replace("{m}", str(m))


def _config(folder: Path, family: Family):
    """transformers' config for the checkpoint; a model_type transformers has no class for is read
    into the class the row names (MiMo: Qwen2, as vLLM runs it), remote code never run."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = json.loads((folder / "config.json").read_text())
    if raw.get("model_type") in CONFIG_MAPPING or not family.transformers_type:
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)
    kept = {k: v for k, v in raw.items() if k not in ("model_type", "auto_map", "architectures", "transformers_version")}
    return AutoConfig.for_model(family.transformers_type, **kept)


def load_family(folder: Path, family: Family, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, MtpHead]:
    """The main model (transformers' class, `num_hidden_layers` layers) and the MTP layer built from
    the checkpoint's own tensors by `family`'s row. AtlasError naming the family when it is refused
    or when a tensor the row names is missing."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if family.refuse:
        raise AtlasError(f"{family.name}: not measured: {family.refuse}")
    # A vision-language config (Qwen3.5) holds the language model's under text_config; the
    # causal-LM class loads its tensors from model.language_model.* (transformers' own renaming).
    config = _config(folder, family).get_text_config()
    depth = int(config.num_hidden_layers)
    types = list(getattr(config, "layer_types", None) or [])
    # DSA's "indexed_attention" is attention with an indexer: rolled back as attention, in the dense regime
    bad = sorted({t for t in types[:depth] if t not in ROLLBACK_OK | ({"indexed_attention"} if family.dense_limit else set())})
    if bad:
        raise AtlasError(
            f"{family.name}: not measured: main-model layer types {', '.join(bad)} have no rollback in our loop "
            "(it keeps per-position state slots only for Gated DeltaNet and Mamba2 layers)"
        )
    chain = chain_length({k: getattr(config, k, None) for k in CHAIN_KEYS})
    if refusal := chain_refusal(family, chain):
        raise AtlasError(refusal)
    if getattr(config, "kv_lora_rank", None) and config.num_key_value_heads != config.num_attention_heads:
        # MLA expands keys and values to every head from the shared latent (kv_b_proj has a row
        # block per attention head), so a smaller num_key_value_heads has no meaning; transformers
        # 5.24 would still repeat the expanded heads by its ratio and fail on a size mismatch.
        config.num_key_value_heads = config.num_attention_heads
    sub = ["indexed_attention"] if family.dense_limit else mtp_sublayers(json.loads((folder / "config.json").read_text()), family)
    names = tensor_names(folder)
    glues = [_at(family.glue, depth, m) for m in range(chain)]
    final_glues = [(_at(family.final_glue, depth, m) if family.final_glue else g).replace("{last}", str(len(sub) - 1)) for m, g in enumerate(glues)]
    blocks = [_at(family.block, depth, m).replace("{i}", str(i)) for m in range(chain) for i in range(len(sub))]
    wanted = [g + n for g in glues for n in (family.e_norm, family.h_norm, family.proj) if n]
    wanted += [g + family.final_norm for g in final_glues] if family.final_norm else []
    missing = [n for n in wanted if n not in names]
    if missing:
        raise AtlasError(f"{family.name}: the checkpoint lacks MTP tensor(s) {', '.join(missing)}")

    # More main layers, of the types the MTP block's sub-layers are, loaded from the block's
    # tensors. A Qwen-style block is full attention, and MoE exactly when it ships experts.
    moe = any(n.startswith(blocks[0] + "mlp.experts.") for n in names)
    extended = copy.deepcopy(config)
    extended.num_hidden_layers = depth + len(blocks)
    if types:
        extended.layer_types = [*types[:depth], *sub * chain]
    if isinstance(getattr(extended, "mlp_layer_types", None), list):
        extended.mlp_layer_types = [*extended.mlp_layer_types[:depth], *["sparse" if moe else "dense"] * chain]
    if isinstance(getattr(extended, "indexer_types", None), list):  # GLM-5: each MTP layer has its own indexer
        extended.indexer_types = [*extended.indexer_types[:depth], *["full"] * chain]
    if getattr(extended, "mlp_only_layers", None) is not None:
        extended.mlp_only_layers = [i for i in extended.mlp_only_layers if i < depth] + ([] if moe else list(range(depth, depth + chain)))
    mapping = {"^" + b.replace(".", r"\."): f"model.layers.{depth + i}." for i, b in enumerate(blocks) if b != f"model.layers.{depth + i}."}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report lists the glue tensors as unexpected: they are read below
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, config=extended, dtype=dtype, use_safetensors=True, trust_remote_code=False,
            key_mapping=mapping or None, output_loading_info=True,
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise AtlasError(f"transformers cannot load {folder}: {exc}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    unloaded = [k for k in info.get("missing_keys", []) if not k.startswith("lm_head")] + list(info.get("mismatched_keys", []))
    if unloaded:
        raise AtlasError(f"{family.name}: tensors missing or mis-shaped for the main model or MTP block: {', '.join(map(str, unloaded[:5]))}")
    model = model.to(device).eval()
    base = model.get_decoder()
    if family.dense_limit:
        dense_attention(model)
    extra = list(base.layers)[depth:]
    mtp_blocks = [Chain(extra[m * len(sub) : (m + 1) * len(sub)]) if len(sub) > 1 else extra[m] for m in range(chain)]
    base.layers = nn.ModuleList(list(base.layers)[:depth])
    model.config.num_hidden_layers = depth
    if types:
        model.config.layer_types = types[:depth]
    if isinstance(getattr(model.config, "mlp_layer_types", None), list):
        model.config.mlp_layer_types = model.config.mlp_layer_types[:depth]
    limit = getattr(config, "time_step_limit", None)
    for layer in base.layers:
        if limit is not None and hasattr(getattr(layer, "mixer", None), "time_step_limit"):
            # transformers 5.24's NemotronHMamba2Mixer clamps dt at time_step_min in its chunked scan
            # but not in its one-token step (so its cached decode drifts from its full forward); the
            # config's time_step_limit (Nemotron-3 Super: [0, inf]) is the model's, in both paths.
            layer.mixer.time_step_limit = time_step_limit(limit)

    parameter_names = {id(p): n for n, p in model.named_parameters()}  # a tied head answers the embedding's name

    def target_name(parameter: torch.Tensor) -> str:
        """The main model's name for one of its tensors, as the record states what was shared."""
        return parameter_names[id(parameter)]

    def tensor(name: str) -> torch.Tensor:
        with safe_open(str(names[name]), "pt", device="cpu") as f:
            return f.get_tensor(name).to(device=device, dtype=dtype)

    eps = float(getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_epsilon", 1e-6))
    d = int(config.hidden_size)
    rotary = getattr(base, "rotary_emb", None)  # None: attention without position embedding (Nemotron-H)
    per_layer_rope = hasattr(config, "rope_parameters") and len(config.nested_rope_parameter_keys(config.rope_parameters)) > 0
    rope_type = "full_attention" if per_layer_rope else None

    def head_of(glue: str, final_glue: str, mtp_block: nn.Module) -> MtpHead:
        proj = tensor(glue + family.proj)
        if tuple(proj.shape) != (d, 2 * d):
            raise AtlasError(f"{family.name}: {glue + family.proj} is {list(proj.shape)}, expected [{d}, {2 * d}]")
        first, second = proj.split(d, dim=1)
        w_e, w_h = (second, first) if family.order == "hidden_first" else (first, second)
        enorm, hnorm = Norm(tensor(glue + family.e_norm), eps, family.norm), Norm(tensor(glue + family.h_norm), eps, family.norm)
        post = [Norm(tensor(final_glue + family.final_norm), eps, family.norm)] if family.final_norm else []
        head: nn.Module = model.lm_head
        embed = base.get_input_embeddings().weight.detach()
        shared: dict[str, str] = {}
        if family.own_head and glue + family.own_head in names:
            head = nn.Linear(d, int(config.vocab_size), bias=False, device=device, dtype=dtype)
            head.weight = nn.Parameter(tensor(glue + family.own_head), requires_grad=False)
        elif family.own_head:
            shared[glue + family.own_head] = target_name(model.lm_head.weight)
        if family.own_embed and glue + family.own_embed in names:
            embed = tensor(glue + family.own_embed)
        elif family.own_embed:
            shared[glue + family.own_embed] = target_name(base.get_input_embeddings().weight)

        def reference(hidden: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """The family's published wiring, module by module over the whole sequence (no cache):
            norms on each input, one projection over the concatenation in the family's order, the block
            under a causal mask, the final norm, the head."""
            e = F.embedding(ids.to(embed.device), embed)
            hidden = hidden.to(embed.device)
            pair = [hnorm(hidden), enorm(e)] if family.order == "hidden_first" else [enorm(e), hnorm(hidden)]
            x = F.linear(torch.cat(pair, dim=-1), proj)[None]
            n = ids.shape[0]
            mask = torch.full((n, n), float("-inf"), device=x.device, dtype=x.dtype).triu(1)[None, None]
            kwargs = {"layer_type": rope_type} if rope_type else {}
            cos_sin = None if rotary is None else rotary(x, position_ids=positions[None], **kwargs)
            y = mtp_block(x, attention_mask=mask, position_ids=positions[None], position_embeddings=cos_sin)
            y = (y[0] if isinstance(y, tuple) else y)[0]
            for norm in post:
                y = norm(y)
            return y, head(y)

        return MtpHead(
            family=family.name, enorm=enorm, hnorm=hnorm, w_e=w_e, w_h=w_h, block=mtp_block, post_norms=post, head=head,
            embed=embed, rotary=rotary, rope_layer_type=rope_type, reference=reference, shared=shared,
        )

    first, *rest = (head_of(g, f, b) for g, f, b in zip(glues, final_glues, mtp_blocks))
    first.next_layers = rest
    return model, first
