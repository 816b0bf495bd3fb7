"""MTP fingerprints: pure functions of a stored raw config and its weight names.

The rules are data (the three tables below), so a new key spelling or weight-name family is one
row, and bumping RULE_VERSION lets `atlas crawl --refingerprint` recompute every stored
(repo_id, sha) without touching the network. Nothing here does I/O.

Claim levels stay apart: `declared_*` comes only from the config, `shipped_*` only from tensor
names. A missing key means "not declared" (NULL), never "no MTP".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from atlas import AtlasError
from atlas.fingerprints import blockpattern, form
from atlas.fingerprints.gguf import Header
from atlas.fingerprints.safetensors_head import ShardHead
from atlas.fingerprints.precision import Precision, mtp_precision

# Bump on any change to the tables or the logic below: stored fingerprints carry the version
# that produced them.
RULE_VERSION = "fp-2026.12.05.1"

# Where keys are looked up, in order. "" is the top level; multimodal configs nest the language
# model's hyperparameters (Qwen3.5: text_config.mtp_num_hidden_layers).
CONTAINERS: tuple[str, ...] = ("", "text_config", "language_config")

MAX_CONFIG_BYTES = 8 * 1024 * 1024  # real config.json files are < 100 kB
MAX_INDEX_BYTES = 64 * 1024 * 1024  # the largest real weight maps (~90k tensors) are ~10 MB
MAX_COUNT = 10_000  # larger "layer counts" are junk, not data
MAX_FACT = 2**31 - 1  # integer facts (layers, hidden size, vocabulary, experts) beyond this are junk
MAX_INDEX_DIGITS = 6  # a layer index in a tensor name longer than this is not a layer


@dataclass(frozen=True)
class DeclaredKeyRule:
    """A config key spelling that states how many MTP layers a model declares."""

    key: str
    # A boolean switch that, when present and false, makes the declaration 0 (MiniMax `use_mtp`).
    enabled_by: str | None = None


@dataclass(frozen=True)
class WeightRule:
    """A weight-name family that holds MTP tensors. `pattern` may capture `idx`, the MTP layer
    number; the count is the number of distinct indices (1 when the family is unnumbered)."""

    family: str
    pattern: str
    evidence: str  # shown in the atlas; `{idx}` becomes the matched layer numbers
    # The rule applies only when the config has one of these keys (none: always).
    requires_keys: tuple[str, ...] = ()
    # The block pattern (atlas.fingerprints.blockpattern) whose length is the number of sub-layers per MTP
    # module: each sub-layer has its own mtp.layers.{idx} (Nemotron-H).
    sublayers_from: blockpattern.Which | None = None


@dataclass(frozen=True)
class FactRule:
    """A basic architecture fact recorded as its own fingerprint (first key found wins)."""

    name: str
    keys: tuple[str, ...]
    kind: str  # 'int' | 'ident' | 'ident_list' | 'bool'
    containers: tuple[str, ...] = CONTAINERS


DECLARED_KEY_RULES: tuple[DeclaredKeyRule, ...] = (
    # DeepSeek-V3/V3.x/R1, GLM-4.5/5, MiMo, Nemotron-3, Kimi (0), ERNIE-4.5, LongCat, Step
    DeclaredKeyRule("num_nextn_predict_layers"),
    DeclaredKeyRule("mtp_num_hidden_layers"),  # Qwen3.5/3.6 (under text_config)
    # MiniMax-M2.x (with use_mtp, mtp_transformer_layers)
    DeclaredKeyRule("num_mtp_modules", "use_mtp"),
    # spellings seen in code / inference configs rather than hub checkpoints
    DeclaredKeyRule("num_mtp_layers"),
    DeclaredKeyRule("mtp_num_layers"),
    DeclaredKeyRule("n_mtp_layers"),
)

# Tensor-name prefixes multimodal checkpoints put in front of the language model's names.
_PREFIX = r"^(?P<prefix>(?:model\.)?language_model\.(?:model\.)?)?"

# Order matters: the first rule with a match decides (LongCat `model.mtp.*` before Qwen `mtp.*`,
# Nemotron-H before the generic `mtp.*`).
WEIGHT_RULES: tuple[WeightRule, ...] = (
    WeightRule(
        "deepseek_glm",
        _PREFIX + r"(?:model\.)?layers\.(?P<idx>\d+)\.(?:enorm|hnorm|eh_proj|e_proj|h_proj|hc_head|shared_head)\.",
        "model.layers.{idx}.*",
    ),
    WeightRule("mimo", _PREFIX + r"model\.mtp_layers\.(?P<idx>\d+)\.", "model.mtp_layers.*"),
    WeightRule(
        "ernie",
        _PREFIX + r"model\.mtp_(?:emb_norm|hidden_norm|linear_proj|block)\.(?P<idx>\d+)\.",
        "model.mtp_*",
    ),
    WeightRule("longcat", _PREFIX + r"model\.mtp\.(?:layers\.(?P<idx>\d+)\.)?", "model.mtp.*"),
    WeightRule(
        "nemotron_h",
        _PREFIX + r"mtp\.layers\.(?P<idx>\d+)\.",
        "mtp.layers.*",
        # either spelling of the MTP block: the string (Nemotron-3 Super) or the list (Ultra, 3.5)
        requires_keys=blockpattern.KEYS["mtp"],
        sublayers_from="mtp",
    ),
    WeightRule("qwen3_next", _PREFIX + r"mtp\.(?:layers\.(?P<idx>\d+)\.)?", "mtp.*"),
)

FACT_RULES: tuple[FactRule, ...] = (
    FactRule("model_type", ("model_type",), "ident"),
    FactRule("architectures", ("architectures",), "ident_list"),
    FactRule("num_hidden_layers", ("num_hidden_layers", "n_layers", "num_layers"), "int"),
    FactRule("hidden_size", ("hidden_size", "d_model", "n_embd"), "int"),
    FactRule("vocab_size", ("vocab_size",), "int"),
    FactRule("torch_dtype", ("torch_dtype", "dtype"), "ident"),
    FactRule("num_experts", ("n_routed_experts", "num_experts", "num_local_experts"), "int"),
    FactRule("quant_method", ("quantization_config.quant_method",), "ident"),
    FactRule("use_mtp", ("use_mtp",), "bool"),
    FactRule("mtp_transformer_layers", ("mtp_transformer_layers",), "int"),
)


@dataclass(frozen=True)
class DrafterRule:
    """A config kind that makes a repo a speculative drafter for a model in another repo: a model
    of its own that drafts tokens for a target, never the target's own MTP head (issue 63). Most
    configs say only that they are a drafter, not for which model: the target comes from the card,
    a config key that names it (`target_keys`) or the repo's name (the store's mtp_drafter_links
    view), and is recorded with that evidence."""

    kind: str  # the name recorded as the `mtp_drafter` fingerprint
    method: str  # the drafting method in words (the `drafter_method` fingerprint): what the pages name it
    model_types: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    architecture_pattern: str | None = None  # matched (fullmatch) against each architecture name
    keys: tuple[str, ...] = ()  # config keys (top level or a container) that only this kind's configs carry
    # a pattern every tensor name read must match: the kind is a drafter of its own only where the
    # repo holds nothing else (no trunk); a config key it shares with a model that has one stays that model's
    only_tensors: str | None = None
    target_keys: tuple[str, ...] = ()  # dotted config keys whose value names the target repo
    # the repo-name suffix that, stripped, names the target (google/gemma-4-E2B-it-assistant ->
    # google/gemma-4-E2B-it); lower case, matched without regard to case; '' for no name rule
    name_suffix: str = ""


DRAFTER_RULES: tuple[DrafterRule, ...] = (
    # google/gemma-4-{E2B,E4B,12B,26B-A4B,31B}-it-assistant (transformers 5.24:
    # SinglePositionMultiTokenCandidateGenerator)
    DrafterRule("gemma4_assistant", "Gemma assistant model", ("gemma4_assistant",), ("Gemma4AssistantForCausalLM",),
                name_suffix="-assistant"),
    # google/gemma-4-12B-it-assistant and its kin since 2026 (4 layers, hidden 1024; research notes
    # field-2026 §2): the model_type only, no architecture name has been read for it
    DrafterRule("gemma4_unified_assistant", "Gemma assistant model", ("gemma4_unified_assistant",),
                name_suffix="-assistant"),
    # EAGLE-3 drafters (arXiv 2503.01840): SpecForge and SGLang name the class LlamaForCausalLMEagle3 /
    # Qwen3ForCausalLMEagle3, vLLM Eagle3LlamaForCausalLM; their configs carry `draft_vocab_size` (the
    # cut vocabulary with its draft-to-target map) or `eagle_config`; the speculators format
    # (github.com/vllm-project/speculators) says `speculators_model_type` and names its verifier
    DrafterRule("eagle3", "EAGLE-3 drafter", ("eagle3",), architecture_pattern=r"\w*Eagle3\w*",
                keys=("draft_vocab_size", "eagle_config"),
                target_keys=("speculators_config.verifier.name_or_path",)),
    # DFlash block-diffusion drafters (github.com/z-lab/dflash, z-lab/Qwen3-8B-DFlash-b16): class
    # DFlashDraftModel, a `dflash_config` (mask token, target layer ids); vLLM's DFlashConfig model_type dflash
    DrafterRule("dflash", "DFlash block-diffusion drafter", ("dflash",), ("DFlashDraftModel",), keys=("dflash_config",)),
    # a DSpark block drafter shipped as a repo of its own: the DSpark keys of DeepSeek-V4.1 (vLLM PR
    # #41834) over weights that are only its stages under mtp.* (vllm/config/speculative.py: V4.1's
    # DSpark stages sit under mtp.*); the same keys beside a trunk are a block drafter in the checkpoint
    DrafterRule("dspark", "DSpark block drafter", keys=("dspark_block_size",), only_tensors=r"(?:model\.)?mtp\."),
)
_ARCH_PATTERNS = {r.kind: re.compile(r.architecture_pattern) for r in DRAFTER_RULES if r.architecture_pattern}
_ONLY_TENSORS = {r.kind: re.compile(r.only_tensors) for r in DRAFTER_RULES if r.only_tensors}
MAX_TARGET_CHARS = 200  # a config's target name longer than this is not a repo id

# A safetensors file that holds an MTP head on its own beside the trunk's shards (mlx-lm #1543:
# `mtp.safetensors`, with or without an index of its own): its tensors are the head's, the index's the trunk's
SEPARATE_HEAD_FILE = re.compile(r"(?:.*/)?mtp(?:[-_.][^/]*)?\.safetensors")

# Used with fullmatch: `$` would accept one trailing newline ("deepseek_v3\n", a second family).
_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
_COMPILED = tuple((rule, re.compile(rule.pattern)) for rule in WEIGHT_RULES)


@dataclass
class Fingerprint:
    """Everything the rules say about one (repo_id, sha)."""

    rule_version: str = RULE_VERSION
    declared_num_mtp_layers: int | None = None
    declared_key: str | None = None
    shipped_mtp_layers: int | None = None
    shipped_evidence: str | None = None
    shipped_family: str | None = None
    weight_source: str | None = None
    facts: dict[str, tuple[Any, str]] = field(default_factory=dict)  # name -> (value, key path)
    precision: Precision | None = None  # the MTP layer's (atlas.fingerprints.precision); None: no MTP declared or shipped
    # (kind, key path) when the config makes the repo an MTP drafter for another repo's model
    # (DRAFTER_RULES); its declared count stays what its own config says
    drafter: tuple[str, str] | None = None
    drafter_target: tuple[str, str] | None = None  # (repo id, config key) where the drafter's config names its target
    separate_head: str | None = None  # the file(s) holding the head on their own beside the trunk (SEPARATE_HEAD_FILE)
    warnings: list[str] = field(default_factory=list)
    mtp_names: list[str] = field(default_factory=list)  # the tensor names the shipped family matched
    derived: list[tuple[str, str, str | None]] = field(default_factory=list)  # atlas.fingerprints.form: form, GGUF, head

    def rows(self) -> list[tuple[str, str, str | None]]:
        """(name, value as text, path or evidence) rows for the long `fingerprints` table."""
        out: list[tuple[str, str, str | None]] = []
        if self.declared_num_mtp_layers is not None:
            out.append(("declared_num_mtp_layers", str(self.declared_num_mtp_layers), self.declared_key))
        if self.shipped_mtp_layers is not None:
            out.append(("shipped_mtp_layers", str(self.shipped_mtp_layers), self.shipped_evidence))
            out.append(("shipped_family", self.shipped_family or "none", self.weight_source))
        for name, (value, path) in self.facts.items():
            out.append((name, _as_text(value), path))
        if self.precision is not None:
            out.append(("mtp_quantized", self.precision.quantized, self.precision.quantized_evidence))
            out.append(("mtp_dtype", self.precision.dtype, self.precision.dtype_evidence))
        if self.drafter is not None:
            out.append(("mtp_drafter", *self.drafter))
            out.append(("drafter_method", next(r.method for r in DRAFTER_RULES if r.kind == self.drafter[0]), None))
        if self.drafter_target is not None:
            out.append(("drafter_target_config", *self.drafter_target))
        out += self.derived
        if self.warnings:
            out.append(("warnings", "; ".join(self.warnings), None))
        return out


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


# ---- raw input validation (bytes -> structures); errors are per-repo, never fatal ------------


def parse_config_bytes(data: bytes, filename: str = "config.json") -> dict[str, Any]:
    """Decode a config file, or raise AtlasError saying exactly what is wrong with it."""
    return _parse_json_object(data, filename, MAX_CONFIG_BYTES)


def parse_weight_index(data: bytes, filename: str = "model.safetensors.index.json") -> list[str]:
    """Tensor names of a sharded checkpoint's index (the keys of its `weight_map`)."""
    index = _parse_json_object(data, filename, MAX_INDEX_BYTES)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise AtlasError(f"{filename}: 'weight_map' is {_kind(weight_map)}, expected an object")
    return sorted(str(name) for name in weight_map)


def header_tensor_names(header: Mapping[str, Any]) -> list[str]:
    """Tensor names of a single-file safetensors header (its keys, minus `__metadata__`)."""
    return sorted(str(name) for name in header if name != "__metadata__")


def _parse_json_object(data: bytes, filename: str, limit: int) -> dict[str, Any]:
    if len(data) > limit:
        raise AtlasError(f"{filename}: {len(data):,} bytes, over the {limit:,}-byte limit for this file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AtlasError(f"{filename}: not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AtlasError(f"{filename}: malformed JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise AtlasError(f"{filename}: JSON nested too deeply") from None
    except ValueError:  # Python refuses to convert integers of more than 4300 digits
        raise AtlasError(f"{filename}: a number with too many digits to be a value") from None
    if not isinstance(value, dict):
        raise AtlasError(f"{filename}: JSON {_kind(value)}, expected an object")
    return value


def _kind(value: Any) -> str:
    names = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
    if value is None:
        return "null or missing"
    return names.get(type(value), type(value).__name__)


# ---- the rules ----------------------------------------------------------------------------------


def fingerprint(
    config: Mapping[str, Any],
    weight_names: Sequence[str] | None = None,
    weight_source: str | None = None,
    quant_sidecar: Mapping[str, Any] | None = None,
    gguf_headers: Sequence[Header] = (),
    shard_heads: Sequence[ShardHead] = (),
) -> Fingerprint:
    """Apply every rule to one config (and its tensor names and GGUF headers when known)."""
    fp = Fingerprint()
    _declared(config, fp)
    _facts(config, quant_sidecar, fp)
    fp.drafter = _drafter(config, fp.facts, weight_names)
    fp.drafter_target = _drafter_target(config, fp.drafter)
    if weight_names is not None:
        fp.weight_source = weight_source
        _shipped(config, weight_names, fp)
    _separate_head(config, weight_names, shard_heads, fp)
    # A precision claim for a model with an MTP layer to have one: declared, and not shown absent
    # by the weight names read, or shipped
    if (fp.declared_num_mtp_layers or 0) > 0 and fp.shipped_mtp_layers != 0 or (fp.shipped_mtp_layers or 0) > 0:
        fp.precision = mtp_precision(config, weight_names, quant_sidecar, fp.declared_num_mtp_layers or fp.shipped_mtp_layers,
                                     fp.shipped_family)
    fp.derived = form.derive(form.Inputs(
        config, fp.facts, fp.declared_num_mtp_layers, fp.declared_key, fp.shipped_mtp_layers, fp.shipped_evidence,
        weight_names, fp.mtp_names, fp.drafter, gguf_headers, shard_heads, fp.separate_head))
    return fp


def _separate_head(config: Mapping[str, Any], trunk: Sequence[str] | None, shard_heads: Sequence[ShardHead],
                   fp: Fingerprint) -> None:
    """The head shipped as a file of its own (SEPARATE_HEAD_FILE) that the trunk's tensor names do
    not list: its tensors, read from the file's header, are what the repo ships of the head."""
    listed = set(trunk or ())
    files = [sh for sh in shard_heads if SEPARATE_HEAD_FILE.fullmatch(sh.file) and not listed & set(sh.tensors)]
    names = sorted({n for sh in files for n in sh.tensors})
    if not names or (fp.shipped_mtp_layers or 0) > 0:
        return  # no such file, or the trunk's own names hold the head already
    head = Fingerprint()
    _shipped(config, names, head)
    if not head.shipped_mtp_layers:
        return  # a file so named that holds no MTP tensor is no head
    where = ", ".join(sh.file for sh in files)
    fp.separate_head = where
    fp.shipped_mtp_layers, fp.shipped_family, fp.mtp_names = head.shipped_mtp_layers, head.shipped_family, head.mtp_names
    fp.shipped_evidence = f"{where}: {head.shipped_evidence}"
    fp.weight_source = fp.weight_source or "header"


def _lookup(config: Mapping[str, Any], container: str, dotted: str) -> tuple[bool, Any]:
    node: Any = config.get(container) if container else config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _path(container: str, key: str) -> str:
    return f"{container}.{key}" if container else key


def _declared(config: Mapping[str, Any], fp: Fingerprint) -> None:
    for container in CONTAINERS:
        for rule in DECLARED_KEY_RULES:
            found, value = _lookup(config, container, rule.key)
            if not found:
                continue
            path = _path(container, rule.key)
            count = _count(value)
            if count is None:
                fp.warnings.append(f"{path} is not a count (got {_kind(value)}); ignored")
                continue
            if rule.enabled_by:
                on_found, on = _lookup(config, container, rule.enabled_by)
                if on_found and on is False:
                    fp.declared_num_mtp_layers, fp.declared_key = 0, _path(container, rule.enabled_by)
                    return
            fp.declared_num_mtp_layers, fp.declared_key = count, path
            return


def _drafter(config: Mapping[str, Any], facts: Mapping[str, tuple[Any, str]],
             names: Sequence[str] | None) -> tuple[str, str] | None:
    """The drafter kind the config names (its model_type, one of its architectures, or a key only
    that kind carries) and the key path it was read from; None for every other config."""
    model_type, type_path = facts.get("model_type", (None, ""))
    archs, arch_path = facts.get("architectures", ([], ""))
    for rule in DRAFTER_RULES:
        only = _ONLY_TENSORS.get(rule.kind)
        if only is not None and not (names and all(only.match(n) for n in names)):
            continue
        if model_type in rule.model_types:
            return rule.kind, type_path
        pattern = _ARCH_PATTERNS.get(rule.kind)
        if any(a in rule.architectures or (pattern is not None and pattern.fullmatch(a)) for a in archs):
            return rule.kind, arch_path
        for container in CONTAINERS:
            for key in rule.keys:
                if _lookup(config, container, key)[0]:
                    return rule.kind, _path(container, key)
    return None


def _drafter_target(config: Mapping[str, Any], drafter: tuple[str, str] | None) -> tuple[str, str] | None:
    """The target a drafter's config names (the speculators format's verifier), as written; the
    store's view judges whether it is a Hub repo id."""
    rule = next((r for r in DRAFTER_RULES if drafter and r.kind == drafter[0]), None)
    for key in rule.target_keys if rule else ():
        found, value = _lookup(config, "", key)
        if found and isinstance(value, str) and 0 < len(value) <= MAX_TARGET_CHARS:
            return value, key
    return None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return None
    return value


def _facts(config: Mapping[str, Any], sidecar: Mapping[str, Any] | None, fp: Fingerprint) -> None:
    for rule in FACT_RULES:
        for container in rule.containers:
            hit = next(((k, v) for k in rule.keys for f, v in [_lookup(config, container, k)] if f), None)
            if hit is None:
                continue
            key, raw = hit
            path = _path(container, key)
            value = _coerce(raw, rule.kind)
            if value is None:
                if raw is not None:
                    fp.warnings.append(f"{path} has an unusable value ({_kind(raw)}); ignored")
                continue
            fp.facts[rule.name] = (value, path)
            break
    _pattern_facts(config, fp)
    if "quant_method" not in fp.facts and sidecar is not None:
        # NVIDIA ModelOpt checkpoints keep the method only in hf_quant_config.json.
        found, algo = _lookup(sidecar, "", "quantization.quant_algo")
        value = _coerce(algo, "ident") if found else None
        if isinstance(value, str):
            fp.facts["quant_method"] = (value.lower(), "hf_quant_config.json:quantization.quant_algo")


# fact name for the main stack's and the MTP block's pattern, whichever spelling the config uses
PATTERN_FACTS: dict[blockpattern.Which, str] = {"main": "block_pattern", "mtp": "mtp_block_pattern"}


def _pattern_facts(config: Mapping[str, Any], fp: Fingerprint) -> None:
    """Nemotron-H block patterns as facts in one spelling (letters), each with the key it was read
    from; a config that gives its depth only as the list's length (Nemotron-3 Ultra has no
    num_hidden_layers: transformers derives it from layers_block_type) gets it from there."""
    for which, name in PATTERN_FACTS.items():
        pattern = _pattern(config, which, fp)
        if pattern is None:
            continue
        container = "text_config." if isinstance(config.get("text_config"), Mapping) else ""
        fp.facts[name] = (pattern.letters, container + pattern.key)
        if which == "main" and "num_hidden_layers" not in fp.facts:
            fp.facts["num_hidden_layers"] = (len(pattern.kinds), f"len({container}{pattern.key})")


def _pattern(config: Mapping[str, Any], which: blockpattern.Which, fp: Fingerprint) -> blockpattern.Pattern | None:
    """blockpattern.read, its errors kept as a fingerprint warning (once) instead of raised."""
    try:
        return blockpattern.read(config, which)
    except AtlasError as exc:
        if str(exc) + "; ignored" not in fp.warnings:
            fp.warnings.append(f"{exc}; ignored")
        return None


def _coerce(raw: Any, kind: str) -> Any:
    if kind == "int":
        # the store's typed views hold 32-bit counts: 3e9 layers or experts is not a count
        ok = isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw <= MAX_FACT
        return raw if ok else None
    if kind == "bool":
        return raw if isinstance(raw, bool) else None
    if kind == "ident":
        return raw if isinstance(raw, str) and _IDENT.fullmatch(raw) else None
    if kind == "ident_list":
        if isinstance(raw, list) and raw and all(isinstance(x, str) and _IDENT.fullmatch(x) for x in raw):
            return list(raw)
        return None
    raise ValueError(kind)


def _shipped(config: Mapping[str, Any], names: Sequence[str], fp: Fingerprint) -> None:
    for rule, regex in _COMPILED:
        if rule.requires_keys and not any(_lookup(config, "", key)[0] for key in rule.requires_keys):
            continue
        indices: set[int] = set()
        prefixes: set[str] = set()
        roots: set[str] = set()
        matched = False
        for name in names:
            m = regex.match(name)
            if m is None:
                continue
            idx = m.group("idx")
            if idx is not None and len(idx) > MAX_INDEX_DIGITS:
                if not any(w.startswith("tensor names with") for w in fp.warnings):
                    fp.warnings.append(f"tensor names with layer indices of over {MAX_INDEX_DIGITS} digits; ignored")
                continue
            matched = True
            # the MTP layer's root (`model.layers.61.`, `mtp.`): every tensor under it is the head's
            roots.add(name[:m.end("idx") + 1] if idx is not None else name[:m.end()])
            prefixes.add(m.group("prefix") or "")
            if idx is not None:
                indices.add(int(idx))
        if not matched:
            continue
        count = len(indices) or 1
        if rule.sublayers_from:
            pattern = _pattern(config, rule.sublayers_from, fp)
            if pattern is not None:
                count = math.ceil(count / len(pattern.kinds))
        prefix = min(prefixes, key=len)
        fp.shipped_mtp_layers = count
        fp.mtp_names = [n for n in names if n.startswith(tuple(roots))]
        fp.shipped_family = rule.family
        fp.shipped_evidence = prefix + rule.evidence.format(idx=_span(sorted(indices)))
        return
    fp.shipped_mtp_layers = 0
    fp.shipped_family = None
    fp.shipped_evidence = f"no MTP tensors among {len(names)} names"


def _span(indices: list[int]) -> str:
    if not indices:
        return "*"
    if len(indices) == 1:
        return str(indices[0])
    if indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}-{indices[-1]}"
    return "{" + ",".join(map(str, indices)) + "}"
