"""Nemotron-H block patterns in either spelling, read into one form. Pure; no I/O.

Nemotron-H configs spell the kind of every layer in one of two ways: a string of letters
(`hybrid_override_pattern`, `mtp_hybrid_override_pattern`: Nemotron-H, Nemotron-3 Nano / Super) or
a list of names (`layers_block_type`, `mtp_layers_block_type`: Nemotron-3 Ultra, Nemotron-3.5).
Both are read here into transformers' layer-type names, the ones its NemotronH classes build.

The tables follow transformers 5.24, not memory: `NemotronHConfig._pattern_to_list`
(models/nemotron_h/configuration_nemotron_h.py) maps the letters, and `remap_legacy_layer_types`
(configuration_utils.py, `_LEGACY_LAYER_TYPE_REMAP`) maps the older list names `mamba` and
`attention` onto the current ones, which a list may also use directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from atlas import AtlasError

# letter -> transformers layer type (NemotronHConfig._pattern_to_list)
LETTERS = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
# list name -> transformers layer type: the legacy names remapped, the current ones kept
NAMES = {"mamba": "linear_attention", "attention": "full_attention",
         **{kind: kind for kind in LETTERS.values()}}
_LETTER_OF = {kind: letter for letter, kind in LETTERS.items()}

Which = Literal["main", "mtp"]
# (string key, list key) for the main stack and for the MTP block
KEYS: dict[Which, tuple[str, str]] = {
    "main": ("hybrid_override_pattern", "layers_block_type"),
    "mtp": ("mtp_hybrid_override_pattern", "mtp_layers_block_type"),
}
MAX_LAYERS = 10_000  # as atlas.fingerprints.rules.MAX_COUNT: a longer "pattern" is junk, not data


@dataclass(frozen=True)
class Pattern:
    """A block pattern read from a config: the layer types in order and the key that spelled them."""

    kinds: tuple[str, ...]  # transformers layer types, e.g. ("full_attention", "moe")
    key: str  # the config key it was read from

    @property
    def letters(self) -> str:
        """The same pattern in the letter spelling ("*E"), one form for both spellings."""
        return "".join(_LETTER_OF[k] for k in self.kinds)


def read(config: Mapping[str, Any], which: Which) -> Pattern | None:
    """The main (`which="main"`) or MTP block pattern of a Nemotron-H config (or its text_config),
    from whichever spelling it carries; None when it carries neither. AtlasError naming the key
    when the value is not a pattern, or when both spellings are present and disagree (transformers
    would silently prefer one; a disagreement is reported, never resolved by guessing)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    found = [p for key in KEYS[which] if key in text for p in [_parse(key, text[key])]]
    if not found:
        return None
    if len(found) == 2 and found[0].kinds != found[1].kinds:
        raise AtlasError(f"{found[0].key} {_short(found[0].letters)} and {found[1].key} {_short(found[1].letters)} spell "
                         "different block patterns")
    return found[-1]  # the list spelling when both agree: it is the one transformers keeps


def _parse(key: str, value: Any) -> Pattern:
    if isinstance(value, str):
        items, table, what = list(value), LETTERS, "letter"
    elif isinstance(value, list):
        items, table, what = value, NAMES, "entry"
    else:
        raise AtlasError(f"{key} is {type(value).__name__}, expected a string of letters or a list of layer names")
    if not items:
        raise AtlasError(f"{key} is empty")
    if len(items) > MAX_LAYERS:
        raise AtlasError(f"{key} has {len(items):,} layers, over the {MAX_LAYERS:,} a real config holds")
    unknown = sorted({_short(x) for x in items if not isinstance(x, str) or x not in table})
    if unknown:
        known = ", ".join(map(repr, table))
        raise AtlasError(f"{key} has unknown {what}(s) {', '.join(unknown[:5])} (known: {known})")
    return Pattern(tuple(table[x] for x in items), key)


SHOWN_CHARS = 60  # a config value quoted in a message: enough to recognise, never a megabyte


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
