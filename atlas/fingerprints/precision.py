"""The MTP layer's precision as a checkpoint ships it: a present claim read from what the crawl
stores (pure, no I/O), never from a default.

Quantized repos (FP8, NVFP4) often keep the MTP layer unconverted through an exclusion list, and
sometimes do not; a quantized MTP head drops acceptance to about 0 in users' reports. The evidence,
strongest first:

- the weight index: under the MTP layer's prefix, modules with scale tensors (`weight_scale_inv`,
  `weight_scale`, ...) are quantized, and a layer none of whose modules has one is not;
- the quantization config's exclusion lists (`modules_to_not_convert`, `ignore`, ModelOpt's
  `exclude_modules` in config.json or hf_quant_config.json): an entry covering the whole layer
  keeps it unconverted, entries naming some of its modules keep those, and a list naming none of
  it leaves the layer to the method like every other layer.

Unconverted modules are in the config's `torch_dtype` (said with that source); a quantization
config whose method or lists the rules do not read, or an MTP layer whose tensor prefix is not
known, is "unknown".
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Verdict = Literal["no", "partly", "yes", "unknown"]

# Tensor-name suffixes that exist only beside a quantized module's weight (fp8 block and tensor
# scales, NVFP4's two-level scales, GPTQ/AWQ packing, compressed-tensors' packed weights).
SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".qweight", ".scales", ".weight_packed")
# The exclusion lists a quantization config names unconverted modules in, by the spelling of its
# tool: transformers' quantizers (name match or a dotted suffix), compressed-tensors ("re:" regex
# or exact name), NVIDIA ModelOpt (shell globs).
LISTS = ("modules_to_not_convert", "ignore", "exclude_modules")
# Modules a quantizer leaves alone in every layer (norms, MoE routers, their biases): an MTP layer
# whose list entries name only these is converted like the main layers.
NOT_LINEAR = re.compile(r"(norm|\.gate|e_score_correction_bias|\.bias)\Z")
# Methods whose name says what the quantized modules hold; anything else is named as its method.
FORMATS = {"fp8": "fp8", "nvfp4": "nvfp4 (4-bit float, 16-element blocks)", "mxfp4": "mxfp4", "w4a16": "int4"}


DTYPE = re.compile(r"[A-Za-z0-9_.]{1,40}")  # a dtype name; anything else in the key is junk, not a dtype
MAX_EVIDENCE = 300  # list entries are the config's text: an evidence line is cut, never a page of it


@dataclass(frozen=True)
class Precision:
    quantized: Verdict
    quantized_evidence: str
    dtype: str  # "fp8 (e4m3, 128x128 blocks)", "bfloat16 (config torch_dtype)", "... ; rest ...", "unknown"
    dtype_evidence: str

    def __post_init__(self) -> None:
        for name in ("quantized_evidence", "dtype", "dtype_evidence"):
            value = getattr(self, name)
            if len(value) > MAX_EVIDENCE:
                object.__setattr__(self, name, value[: MAX_EVIDENCE - 1] + "…")


def mtp_prefixes(config: Mapping[str, Any], declared: int | None, shipped_family: str | None) -> list[str] | None:
    """Module-name prefixes of the MTP layers (with a trailing dot), None when not known: the
    layout follows the shipped weight family when the names were read, else the declaring config's
    family (DeepSeek/GLM number theirs after the main layers, Qwen3.5/Qwen3-Next and Nemotron-H
    keep them under mtp., MiMo under model.mtp_layers)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    model_type = str(text.get("model_type", config.get("model_type", "")))
    n = declared or 0
    depth = text.get("num_hidden_layers")
    family = shipped_family or (
        "mimo" if model_type == "mimo" else
        "qwen3_next" if "mtp_num_hidden_layers" in text or "mtp_hybrid_override_pattern" in text or model_type == "qwen3_next" else
        "deepseek_glm" if "num_nextn_predict_layers" in text else None
    )
    if family == "deepseek_glm" and isinstance(depth, int) and not isinstance(depth, bool) and n > 0:
        return [f"model.layers.{depth + i}." for i in range(n)]
    if family == "mimo" and n > 0:
        return [f"model.mtp_layers.{i}." for i in range(n)]
    if family in ("qwen3_next", "nemotron_h"):
        return ["mtp."]
    return None


def _quant_config(config: Mapping[str, Any], sidecar: Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """(the quantization settings, where they are): config.json's quantization_config (top level
    or text_config), else hf_quant_config.json's `quantization`."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
    for where, node in (("quantization_config", config.get("quantization_config")),
                        ("text_config.quantization_config", text.get("quantization_config"))):
        if isinstance(node, Mapping):
            return dict(node), where
        if node is not None:  # a quantization config that is no object: quantized how, unknown
            return {}, where
    if sidecar is not None and isinstance(sidecar.get("quantization"), Mapping):
        return dict(sidecar["quantization"]), "hf_quant_config.json:quantization"
    return None, ""


def _method(q: Mapping[str, Any]) -> str | None:
    """What a quantized module holds, from the config; None when the method is not one named."""
    method = q.get("quant_algo") or q.get("quant_method")
    if not isinstance(method, str):
        return None
    low = method.lower()
    if low in ("modelopt", "compressed-tensors"):  # the format is in the tool's own keys
        algo = q.get("quant_algo")
        low = algo.lower() if isinstance(algo, str) else low
        groups = q.get("config_groups")
        if low in ("modelopt", "compressed-tensors") and isinstance(groups, Mapping):
            weights = [g.get("weights") for g in groups.values() if isinstance(g, Mapping)]
            kinds = {(w.get("type"), w.get("num_bits")) for w in weights if isinstance(w, Mapping)}
            if kinds == {("float", 4)}:
                low = "nvfp4"
            elif kinds == {("float", 8)}:
                low = "fp8"
    if low in ("modelopt", "compressed-tensors"):
        return None
    label = FORMATS.get(low, low)
    if low == "fp8":
        fmt, block = q.get("fmt"), q.get("weight_block_size")
        details = [fmt] if isinstance(fmt, str) else []
        if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) for b in block):
            details.append(f"{block[0]}x{block[1]} blocks")
        label += f" ({', '.join(details)})" if details else ""
    return label


def _entry_matches(entry: str, kind: str, module: str) -> bool:
    if kind == "ignore" and entry.startswith("re:"):
        try:
            return re.fullmatch(entry[3:], module) is not None
        except re.error:
            return False
    if kind == "exclude_modules" or any(c in entry for c in "*?["):
        return fnmatch.fnmatchcase(module, entry)
    return module == entry or module.startswith(entry + ".") or module.endswith("." + entry)


def _from_lists(q: Mapping[str, Any], where: str, prefixes: list[str]) -> tuple[Verdict, str, list[str]] | None:
    """(verdict, evidence, modules named) from the exclusion lists; None when there is none."""
    lists = [(k, v) for k in LISTS if isinstance(v := q.get(k), list)]
    if not lists:
        return None
    # A module name no real layer has: an entry matching it under a prefix covers the whole layer.
    probe = "atlas_probe.any_module"
    whole, named = [], []
    for prefix in prefixes:
        for kind, entries in lists:
            for entry in (e for e in entries if isinstance(e, str)):
                if _entry_matches(entry, kind, prefix + probe) or _entry_matches(entry, kind, prefix.rstrip(".")):
                    whole.append((prefix, f"{where}.{kind}: {entry}"))
                elif (entry.startswith(prefix) or (entry.startswith("re:") and prefix.rstrip(".") in entry)) and not NOT_LINEAR.search(entry):
                    named.append(entry)
    covered = {p for p, _ in whole}
    if covered == set(prefixes):
        return "no", "; ".join(dict.fromkeys(e for _, e in whole)), []
    if whole or named:
        return "partly", f"{where}: {len(named)} module(s) of the MTP layer listed unconverted", named
    return "yes", f"{where}: {', '.join(k for k, _ in lists)} name(s) no module of {', '.join(prefixes)}", []


def _from_names(names: Sequence[str], prefixes: list[str]) -> tuple[Verdict, str] | None:
    """(verdict, evidence) from the tensor names under the MTP prefixes; None when none is there."""
    under = [n for n in names if n.startswith(tuple(prefixes))]
    if not under:
        return None
    scaled = sorted({n.rsplit(".", 1)[0] for n in under if n.endswith(SCALE_SUFFIXES)})
    modules = {n.rsplit(".", 1)[0] for n in under if n.endswith(".weight")}
    where = ", ".join(f"{p}*" for p in prefixes)
    if not scaled:
        return "no", f"weight names: no scale tensors among the {len(under)} under {where}"
    plain = sorted(m for m in modules if m not in scaled and not NOT_LINEAR.search(m))
    if plain:
        return "partly", f"weight names: {len(scaled)} module(s) under {where} with scale tensors, {len(plain)} without (e.g. {plain[0]})"
    return "yes", f"weight names: {len(scaled)} module(s) under {where} with scale tensors"


def mtp_precision(config: Mapping[str, Any], names: Sequence[str] | None, sidecar: Mapping[str, Any] | None,
                  declared: int | None, shipped_family: str | None) -> Precision:
    """Whether the MTP layer's tensors are quantized and in what dtype (see the module note)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    torch_dtype = text.get("torch_dtype", text.get("dtype", config.get("torch_dtype", config.get("dtype"))))
    plain = ((f"{torch_dtype} (config torch_dtype)", "torch_dtype") if isinstance(torch_dtype, str) and DTYPE.fullmatch(torch_dtype)
             else ("unknown", "no usable torch_dtype in the config"))
    q, where = _quant_config(config, sidecar)
    if q is None:
        return Precision("no", "no quantization config", *plain)
    method = _method(q)
    if method is None:
        return Precision("unknown", f"{where}: a method the rules do not read", "unknown", f"{where}: method not read")
    prefixes = mtp_prefixes(config, declared, shipped_family)
    if prefixes is None:
        return Precision("unknown", "the MTP layer's tensor prefix is not known for this layout", "unknown", "MTP prefix not known")
    by_names = _from_names(names, prefixes) if names is not None else None
    by_lists = _from_lists(q, where, prefixes)
    verdict, evidence = by_names or (by_lists[:2] if by_lists else (None, ""))
    if verdict is None:
        # no list, no names: the method applies to every module its tool converts; which ones
        # (all linear layers? the MTP layer too?) the config alone does not say
        return Precision("unknown", f"{where}: no exclusion list and no weight names read", "unknown", "not stated")
    if verdict == "no":
        return Precision("no", evidence, *plain)
    if verdict == "yes":
        return Precision("yes", evidence, method, f"{where}: method")
    named = by_lists[2] if by_lists and not by_names else []
    kept = f"{plain[0]} for the unconverted modules" + (f" ({', '.join(m.rsplit('.', 1)[-1] for m in named[:4])}{', ...' if len(named) > 4 else ''})" if named else "")
    return Precision("partly", evidence, f"{kept}; {method} for the rest", f"{where}: method; {plain[1]}")
