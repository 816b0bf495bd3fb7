"""A model config cut to fewer main layers, every per-layer setting with it: what the oracle
checkpoints' shrinker (atlas.checkpoints.oracles.shrunk_config) does to a real config.

The rule, over the top-level keys of the (text) config, N = num_hidden_layers, M = its MTP layer
count (num_nextn_predict_layers / mtp_num_hidden_layers / num_mtp_layers, 0 if none):
- a list of length N holds one entry per main layer (layer_types, mlp_layer_types, indexer_types,
  attn_type_list, no_rope_layers, ...): its first `depth` entries are kept;
- a list of length N + M holds the main layers' entries, then the MTP layers' (numbered after the
  main ones, as DeepSeek numbers them): the first `depth` entries and the last M are kept;
- otherwise a list of integers under a key ending in `_layers` names layers by index
  (mlp_only_layers): main indices below `depth` are kept, MTP indices (N .. N + M - 1) are
  renumbered after the new depth;
- Nemotron-H's hybrid_override_pattern, one letter per main layer, is cut like a list (by name:
  a string's length says nothing, "bfloat16" has as many letters as an 8-layer model has layers).
Token ids (`*_token_id`, a list in some configs) and `architectures` are never per-layer lists.
Nested dicts (rope_parameters, quantization_config) are left as they are: no per-layer list
lives there in the configs this project reads.
"""

from __future__ import annotations

import copy
from typing import Any

from atlas import AtlasError

MTP_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")
PATTERN_KEYS = ("hybrid_override_pattern",)


def mtp_count(config: dict[str, Any]) -> int:
    return max((v for k in MTP_COUNT_KEYS if isinstance(v := config.get(k), int)), default=0)


def layer_count(config: dict[str, Any]) -> int:
    """num_hidden_layers; or, where a config states its layers only as a list (transformers writes
    Nemotron-H's as layers_block_type and derives num_hidden_layers from it), that list's length."""
    layers = config.get("num_hidden_layers", len(config.get("layers_block_type") or []) or None)
    if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
        raise AtlasError(f"the config has no layer count to cut (num_hidden_layers = {layers!r}, no layers_block_type)")
    return layers


def _never_per_layer(key: str) -> bool:
    return key == "architectures" or key.endswith(("_token_id", "_token_ids"))


def cut_to_depth(config: dict[str, Any], depth: int) -> dict[str, Any]:
    """A copy of `config` (a text config: its layer count at its top level) with `depth` main
    layers and every per-layer setting cut by the module's rule; the MTP layers' entries kept."""
    layers = layer_count(config)
    if not 1 <= depth <= layers:
        raise AtlasError(f"cannot cut {layers} main layers to {depth}: the new depth must be 1..{layers}")
    mtp = mtp_count(config)
    out = copy.deepcopy(config)
    if "num_hidden_layers" in config:
        out["num_hidden_layers"] = depth
    for key, value in config.items():
        if key in PATTERN_KEYS and isinstance(value, str) and len(value) == layers:
            out[key] = value[:depth]
        if not isinstance(value, list) or _never_per_layer(key):
            continue
        if len(value) == layers:
            out[key] = copy.deepcopy(value[:depth])
        elif mtp and len(value) == layers + mtp:
            out[key] = copy.deepcopy(value[:depth] + value[layers:])
        elif key.endswith("_layers") and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            out[key] = [i if i < depth else i - layers + depth for i in value if i < depth or layers <= i < layers + mtp]
    return out
