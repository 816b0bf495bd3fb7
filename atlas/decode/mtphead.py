"""The MTP family loader: it builds a checkpoint's MTP layer from its own tensors, by the family
table's row (atlas.families.table), as the decode loop's MtpHead.

The main model always comes from transformers' own class for the config. The MTP decoder block is
built by that same class too: the checkpoint is loaded with one extra main layer, and transformers'
`key_mapping` maps the block's tensors onto it (so its weight conversions, e.g. fused experts,
apply); that layer is then taken out of the main stack and wired by this module's glue.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from atlas import AtlasError
from atlas.families.table import CHAIN_KEYS, Family, NormStyle, chain_length, chain_refusal, mtp_sublayers
from atlas.decode.recurrent import time_step_limit

if TYPE_CHECKING:  # transformers loads where a checkpoint does, as in every function here
    from transformers import PretrainedConfig

# Main-model layer kinds the loop can roll back: attention by overwriting its position-addressed
# cache, Gated DeltaNet ("linear_attention") by its per-position state slots (atlas.decode.recurrent).
# Nemotron-H's "linear_attention" is a Mamba2 layer (same slots); its "moe" and "mlp" blocks keep no state.
ROLLBACK_OK = {"full_attention", "sliding_attention", "linear_attention", "moe", "mlp"}


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


def _text_config(folder: Path, family: Family) -> tuple[PretrainedConfig, int, list[str], int]:
    """The main model's config (depth, layer types) and the MTP chain length it declares; AtlasError
    when the family refuses its layer types or its chain."""
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
    return config, depth, types, chain


@dataclass
class _MtpTensors:
    """Where a row puts each MTP layer's tensors in one checkpoint (every named one present)."""

    sub: list[str]  # the layer types of one MTP block's sub-layers
    names: dict[str, Path]  # every tensor of the checkpoint -> its file
    glues: list[str]  # per MTP layer: the prefix of its norms and projection
    final_glues: list[str]  # per MTP layer: the prefix of its final norm
    blocks: list[str]  # per MTP sub-layer, all layers in order: the prefix of its block's tensors


def _mtp_tensors(folder: Path, family: Family, depth: int, chain: int) -> _MtpTensors:
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
    return _MtpTensors(sub, names, glues, final_glues, blocks)


def _load_extended(folder: Path, family: Family, config: PretrainedConfig, depth: int, types: list[str], chain: int, mtp: _MtpTensors,
                   dtype: torch.dtype) -> nn.Module:
    """The main model with the MTP blocks loaded as its last layers."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # More main layers, of the types the MTP block's sub-layers are, loaded from the block's
    # tensors. A Qwen-style block is full attention, and MoE exactly when it ships experts.
    sub, blocks = mtp.sub, mtp.blocks
    moe = any(n.startswith(blocks[0] + "mlp.experts.") for n in mtp.names)
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
    return model


def _split_off_mtp(model: nn.Module, family: Family, config: PretrainedConfig, depth: int, types: list[str], chain: int,
                   sub: list[str]) -> list[nn.Module]:
    """The MTP blocks taken off the end of the loaded main model, which keeps its own `depth` layers."""
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
            # config's time_step_limit (Nemotron-3 Super: [0, inf]) is the model's, in both paths
            # (5.25 reads it itself; the pin allows 5.24).
            layer.mixer.time_step_limit = time_step_limit(limit)
    return mtp_blocks


def load_family(folder: Path, family: Family, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, MtpHead]:
    """The main model (transformers' class, `num_hidden_layers` layers) and the MTP layer built from
    the checkpoint's own tensors by `family`'s row. AtlasError naming the family when it is refused
    or when a tensor the row names is missing."""
    if family.refuse:
        raise AtlasError(f"{family.name}: not measured: {family.refuse}")
    config, depth, types, chain = _text_config(folder, family)
    mtp = _mtp_tensors(folder, family, depth, chain)
    names, glues, final_glues = mtp.names, mtp.glues, mtp.final_glues
    model = _load_extended(folder, family, config, depth, types, chain, mtp, dtype).to(device).eval()
    mtp_blocks = _split_off_mtp(model, family, config, depth, types, chain, mtp.sub)
    base = model.get_decoder()

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
