"""Fingerprint rules, each on a real config from the bundled mirror.

Weight names: the mirror ships one real weight index (MiMo, under _unattributed/). For the other
families the tensor names are the ones documented in research-notes/mtp-layouts.md, laid over
the family's real config (its num_hidden_layers decides the DeepSeek/GLM MTP layer number).
"""

from __future__ import annotations

import copy
import json

import pytest
from hub_fixtures import EXPECTED_DECLARED, MIMO, QWEN35_MLX, mirror_config

from atlas import AtlasError
from atlas.fingerprints.rules import DECLARED_KEY_RULES, RULE_VERSION, WEIGHT_RULES, fingerprint, parse_config_bytes, parse_weight_index


def cfg(repo_id: str) -> dict:
    return json.loads(mirror_config(repo_id).read_text())


def block(prefix: str) -> list[str]:
    """The usual decoder-block tensors under a prefix."""
    return [f"{prefix}.{n}" for n in ("input_layernorm.weight", "self_attn.q_proj.weight", "mlp.down_proj.weight")]


def main_model(layers: int, prefix: str = "model") -> list[str]:
    names = [f"{prefix}.embed_tokens.weight", f"{prefix}.norm.weight", "lm_head.weight"]
    for i in range(layers):
        names += block(f"{prefix}.layers.{i}")
    return names


@pytest.mark.parametrize("repo_id", sorted(EXPECTED_DECLARED))
def test_declared_value_and_key_path_of_every_bundled_config(repo_id: str) -> None:
    fp = fingerprint(cfg(repo_id))
    assert (fp.declared_num_mtp_layers, fp.declared_key) == EXPECTED_DECLARED[repo_id]
    assert fp.rule_version == RULE_VERSION
    assert fp.warnings == []
    assert fp.shipped_mtp_layers is None  # no weight names given: unknown, not zero


def test_value_zero_is_a_declaration_of_no_mtp() -> None:
    fp = fingerprint(cfg("moonshotai/Kimi-K2-Instruct"))
    assert (fp.declared_num_mtp_layers, fp.declared_key) == (0, "num_nextn_predict_layers")


def test_minimax_use_mtp_false_declares_zero() -> None:
    config = cfg("MiniMaxAI/MiniMax-M2.7")
    assert fingerprint(config).facts["use_mtp"] == (True, "use_mtp")
    assert fingerprint(config).facts["mtp_transformer_layers"] == (1, "mtp_transformer_layers")
    config["use_mtp"] = False
    fp = fingerprint(config)
    assert (fp.declared_num_mtp_layers, fp.declared_key) == (0, "use_mtp")


@pytest.mark.parametrize("spelling", ["num_mtp_layers", "mtp_num_layers", "n_mtp_layers"])
def test_code_config_spellings(spelling: str) -> None:
    # DeepSeek-V3's real config with its key respelled as inference code spells it
    config = cfg("deepseek-ai/DeepSeek-V3")
    config[spelling] = config.pop("num_nextn_predict_layers")
    fp = fingerprint(config)
    assert (fp.declared_num_mtp_layers, fp.declared_key) == (1, spelling)


def test_language_config_nesting_records_its_path() -> None:
    config = cfg("Qwen/Qwen3.5-27B")
    config["language_config"] = config.pop("text_config")
    fp = fingerprint(config)
    assert (fp.declared_num_mtp_layers, fp.declared_key) == (1, "language_config.mtp_num_hidden_layers")
    assert fp.facts["num_hidden_layers"] == (64, "language_config.num_hidden_layers")


def test_every_declared_spelling_is_a_rule_row() -> None:
    assert [r.key for r in DECLARED_KEY_RULES] == [
        "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules",
        "num_mtp_layers", "mtp_num_layers", "n_mtp_layers",
    ]
    assert [r.family for r in WEIGHT_RULES] == ["deepseek_glm", "mimo", "ernie", "longcat", "nemotron_h", "qwen3_next"]


def test_mimo_real_weight_index_ships_one_layer() -> None:
    names = parse_weight_index((MIMO / "model.safetensors.index.json").read_bytes())
    fp = fingerprint(json.loads((MIMO / "config.json").read_text()), names, "index")
    assert (fp.declared_num_mtp_layers, fp.shipped_mtp_layers) == (1, 1)
    assert (fp.shipped_family, fp.shipped_evidence, fp.weight_source) == ("mimo", "model.mtp_layers.*", "index")


def test_mimo_without_its_mtp_tensors_is_key_with_stripped_weights() -> None:
    names = [n for n in parse_weight_index((MIMO / "model.safetensors.index.json").read_bytes()) if "mtp" not in n]
    fp = fingerprint(json.loads((MIMO / "config.json").read_text()), names, "index")
    assert (fp.declared_num_mtp_layers, fp.shipped_mtp_layers, fp.shipped_family) == (1, 0, None)
    assert fp.shipped_evidence == f"no MTP tensors among {len(names)} names"


def test_qwen35_mlx_derivative_keeps_key_but_strips_mtp() -> None:
    # the real MLX config; its weight map goes from language_model.model.norm to vision_tower.*
    config = json.loads((QWEN35_MLX / "config.json").read_text())
    names = main_model(32, "language_model.model") + ["vision_tower.blocks.0.attn.qkv.weight"]
    fp = fingerprint(config, names, "index")
    assert (fp.declared_num_mtp_layers, fp.declared_key) == (1, "text_config.mtp_num_hidden_layers")
    assert fp.shipped_mtp_layers == 0


def test_qwen3_next_absent_key_with_shipped_mtp() -> None:
    names = main_model(48) + [
        "mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight", *block("mtp.layers.0"),
    ]
    fp = fingerprint(cfg("Qwen/Qwen3-Next-80B-A3B-Thinking"), names, "index")
    assert (fp.declared_num_mtp_layers, fp.declared_key) == (None, None)
    assert (fp.shipped_mtp_layers, fp.shipped_family, fp.shipped_evidence) == (1, "qwen3_next", "mtp.*")


@pytest.mark.parametrize("prefix", ["model.language_model.", "language_model."])
def test_qwen35_mtp_under_multimodal_prefixes(prefix: str) -> None:
    names = main_model(64, "model.language_model") + [f"{prefix}mtp.fc.weight", *block(f"{prefix}mtp.layers.0")]
    fp = fingerprint(cfg("Qwen/Qwen3.5-27B"), names, "index")
    assert (fp.shipped_mtp_layers, fp.shipped_evidence) == (1, f"{prefix}mtp.*")


@pytest.mark.parametrize(
    ("repo_id", "layer"), [("deepseek-ai/DeepSeek-V3", 61), ("zai-org/GLM-4.5", 92), ("zai-org/GLM-5-FP8", 78)]
)
def test_deepseek_glm_extra_layer(repo_id: str, layer: int) -> None:
    config = cfg(repo_id)
    assert config["num_hidden_layers"] == layer
    mtp = [f"model.layers.{layer}.{n}" for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")]
    fp = fingerprint(config, main_model(layer) + mtp + block(f"model.layers.{layer}"), "index")
    assert (fp.shipped_mtp_layers, fp.shipped_family, fp.shipped_evidence) == (1, "deepseek_glm", f"model.layers.{layer}.*")


def test_deepseek_two_mtp_layers_are_counted() -> None:
    names = main_model(61) + [f"model.layers.{i}.eh_proj.weight" for i in (61, 62)]
    fp = fingerprint(cfg("deepseek-ai/DeepSeek-V3"), names, "index")
    assert (fp.shipped_mtp_layers, fp.shipped_evidence) == (2, "model.layers.61-62.*")


def test_deepseek_quantized_derivative_with_stripped_layer_61() -> None:
    fp = fingerprint(cfg("nvidia/DeepSeek-V3-0324-NVFP4"), main_model(61), "index")
    assert (fp.declared_num_mtp_layers, fp.shipped_mtp_layers) == (1, 0)


def test_nemotron_h_counts_modules_not_sublayers() -> None:
    config = cfg("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8")
    assert config["mtp_hybrid_override_pattern"] == "*E"  # two sub-layers per MTP module
    names = ["backbone.embeddings.weight", "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight",
             "mtp.layers.0.eh_proj.weight", "mtp.layers.0.mixer.q_proj.weight",
             "mtp.layers.1.mixer.experts.0.up_proj.weight", "mtp.layers.1.final_layernorm.weight"]
    fp = fingerprint(config, names, "index")
    assert (fp.shipped_mtp_layers, fp.shipped_family, fp.shipped_evidence) == (1, "nemotron_h", "mtp.layers.*")


# Nemotron-3 Ultra and Nemotron-3.5 Lightning spell their block patterns as lists (issue 29)
LIST_SPELLED = ["nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"]
# an MTP block of two sub-layers, each under its own mtp.layers.{i} (vLLM nemotron_h_mtp.py)
NEMOTRON_MTP_NAMES = ["backbone.embeddings.weight", "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight",
                      "mtp.layers.0.eh_proj.weight", "mtp.layers.0.mixer.q_proj.weight",
                      "mtp.layers.1.mixer.experts.0.up_proj.weight", "mtp.layers.1.final_layernorm.weight"]


def as_list_spelling(config: dict) -> dict:
    """A string-spelled Nemotron-H config (Nemotron-3 Super) converted to the list spelling the
    newer configs use: a converted test input, not a shipped config. The names are those the real
    list-spelled configs use (mamba, moe, attention; mlp as transformers' own)."""
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    out = {k: v for k, v in config.items() if k not in ("hybrid_override_pattern", "mtp_hybrid_override_pattern")}
    out["layers_block_type"] = [names[c] for c in config["hybrid_override_pattern"]]
    out["mtp_layers_block_type"] = [names[c] for c in config["mtp_hybrid_override_pattern"]]
    return out


@pytest.mark.parametrize("repo_id", LIST_SPELLED)
def test_list_spelled_nemotron_is_fingerprinted_with_its_mtp_sub_layers(repo_id: str) -> None:
    """The shipped list spelling: MTP tensors under mtp.layers.0/1 are one MTP module of two
    sub-layers of family nemotron_h (not two Qwen-style mtp.* layers), and the block patterns read
    as transformers' own NemotronHConfig reads them (its hybrid_override_pattern properties)."""
    from transformers import NemotronHConfig

    config = cfg(repo_id)
    assert "mtp_hybrid_override_pattern" not in config and "hybrid_override_pattern" not in config
    fp = fingerprint(config, NEMOTRON_MTP_NAMES, "index")
    assert (fp.declared_num_mtp_layers, fp.shipped_mtp_layers, fp.shipped_family, fp.shipped_evidence) == (
        1, 1, "nemotron_h", "mtp.layers.*")
    theirs = NemotronHConfig(**{k: v for k, v in config.items() if k not in ("architectures", "auto_map")})
    assert fp.facts["block_pattern"] == (theirs.hybrid_override_pattern, "layers_block_type")
    assert fp.facts["mtp_block_pattern"] == (theirs.mtp_hybrid_override_pattern, "mtp_layers_block_type") == ("*E", "mtp_layers_block_type")
    depth = len(config["layers_block_type"])
    assert fp.facts["num_hidden_layers"] == ((depth, "len(layers_block_type)") if "num_hidden_layers" not in config
                                             else (config["num_hidden_layers"], "num_hidden_layers"))
    assert fp.facts["num_hidden_layers"][0] == theirs.num_hidden_layers
    assert fp.warnings == []


def test_both_spellings_of_one_config_fingerprint_alike() -> None:
    string = cfg("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8")
    a, b = fingerprint(string, NEMOTRON_MTP_NAMES, "index"), fingerprint(as_list_spelling(string), NEMOTRON_MTP_NAMES, "index")
    assert (a.shipped_mtp_layers, a.shipped_family) == (b.shipped_mtp_layers, b.shipped_family) == (1, "nemotron_h")
    for name in ("block_pattern", "mtp_block_pattern", "num_hidden_layers"):
        assert a.facts[name][0] == b.facts[name][0], name
    assert a.facts["block_pattern"][1] == "hybrid_override_pattern" and b.facts["block_pattern"][1] == "layers_block_type"


def test_three_mtp_sub_layers_are_still_one_module() -> None:
    config = dict(cfg("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"), mtp_layers_block_type=["attention", "moe", "mlp"])
    names = [f"mtp.layers.{i}.norm.weight" for i in range(6)]  # two modules of three sub-layers
    assert fingerprint(config, names, "index").shipped_mtp_layers == 2


@pytest.mark.parametrize(("change", "warning"), [
    ({"mtp_layers_block_type": ["attention", "dense"]}, "mtp_layers_block_type has unknown entry(s) 'dense'"),
    ({"mtp_layers_block_type": "attention"}, "mtp_layers_block_type has unknown letter(s) 'a'"),
    ({"mtp_layers_block_type": []}, "mtp_layers_block_type is empty"),
    ({"mtp_hybrid_override_pattern": "E*"}, "mtp_hybrid_override_pattern 'E*' and mtp_layers_block_type '*E' spell different"),
    ({"layers_block_type": {"0": "mamba"}}, "layers_block_type is dict, expected"),
    ({"layers_block_type": ["mamba", "x" * 100_000]}, "layers_block_type has unknown entry(s) 'xxx"),
    ({"layers_block_type": ["mamba"] * 10_001}, "layers_block_type has 10,001 layers, over the 10,000"),
])
def test_bad_or_disagreeing_block_patterns_are_warnings(change: dict, warning: str) -> None:
    config = dict(cfg("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"), **change)
    fp = fingerprint(config, NEMOTRON_MTP_NAMES, "index")
    assert any(w.startswith(warning) and w.endswith("; ignored") for w in fp.warnings), fp.warnings
    assert all(len(w) < 400 for w in fp.warnings)  # a hostile value is quoted, not copied whole
    assert fp.shipped_family == "nemotron_h"  # the tensors are still named for what they are


def test_ernie_names() -> None:
    # no ERNIE config in the mirror: DeepSeek-V3's real config carries the ERNIE-named tensors
    names = main_model(61) + [f"model.mtp_{p}.0.weight" for p in ("emb_norm", "hidden_norm", "linear_proj")]
    names += block("model.mtp_block.0")
    fp = fingerprint(cfg("deepseek-ai/DeepSeek-V3"), names, "index")
    assert (fp.shipped_mtp_layers, fp.shipped_family, fp.shipped_evidence) == (1, "ernie", "model.mtp_*")


def test_longcat_names() -> None:
    # no LongCat config in the mirror: DeepSeek-V3's real config carries the LongCat-named tensors
    names = main_model(61) + ["model.mtp.embed_tokens.weight", "model.mtp.layers.0.eh_proj.weight",
                              "model.mtp.layers.0.enorm.m.weight", "model.mtp.norm.weight"]
    fp = fingerprint(cfg("deepseek-ai/DeepSeek-V3"), names, "index")
    assert (fp.shipped_mtp_layers, fp.shipped_family, fp.shipped_evidence) == (1, "longcat", "model.mtp.*")


def test_no_weight_names_means_unknown_not_zero() -> None:
    fp = fingerprint(cfg("zai-org/GLM-4.5"))
    assert fp.shipped_mtp_layers is None and fp.shipped_evidence is None
    assert not any(name == "shipped_mtp_layers" for name, _, _ in fp.rows())


# ---- basic facts --------------------------------------------------------------------------------


def facts(config: dict, sidecar: dict | None = None) -> dict:
    return {k: v for k, (v, _) in fingerprint(config, quant_sidecar=sidecar).facts.items()}


def test_facts_deepseek_v3() -> None:
    f = facts(cfg("deepseek-ai/DeepSeek-V3"))
    assert f["model_type"] == "deepseek_v3" and f["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (f["num_hidden_layers"], f["hidden_size"], f["vocab_size"]) == (61, 7168, 129280)
    assert (f["torch_dtype"], f["quant_method"], f["num_experts"]) == ("bfloat16", "fp8", 256)


def test_facts_nested_text_config_paths() -> None:
    fp = fingerprint(cfg("Qwen/Qwen3.5-397B-A17B"))
    assert fp.facts["model_type"] == ("qwen3_5_moe", "model_type")
    assert fp.facts["num_hidden_layers"] == (60, "text_config.num_hidden_layers")
    assert fp.facts["num_experts"] == (512, "text_config.num_experts")
    assert fp.facts["torch_dtype"] == ("bfloat16", "text_config.dtype")


@pytest.mark.parametrize(
    ("repo_id", "experts_key", "experts", "quant"),
    [
        ("mistralai/Mixtral-8x7B-v0.1", "num_local_experts", 8, None),
        ("openai/gpt-oss-20b", "num_local_experts", 32, "mxfp4"),
        ("Qwen/Qwen3-30B-A3B-FP8", "num_experts", 128, "fp8"),
        ("zai-org/GLM-4.5-Air", "n_routed_experts", 128, None),
        ("meta-llama/Meta-Llama-3.1-8B", None, None, None),
    ],
)
def test_facts_experts_and_quantization(repo_id: str, experts_key: str | None, experts: int | None, quant: str | None) -> None:
    fp = fingerprint(cfg(repo_id))
    assert fp.facts.get("num_experts") == ((experts, experts_key) if experts else None)
    assert fp.facts.get("quant_method", (None,))[0] == quant


def test_quant_method_from_modelopt_sidecar() -> None:
    repo = "nvidia/DeepSeek-V3.1-NVFP4"
    sidecar = json.loads((mirror_config(repo).parent / "hf_quant_config.json").read_text())
    assert "quant_method" not in facts(cfg(repo))
    fp = fingerprint(cfg(repo), quant_sidecar=sidecar)
    assert fp.facts["quant_method"] == ("nvfp4", "hf_quant_config.json:quantization.quant_algo")


# ---- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"model_type": "llama",', "malformed JSON"),
        (b"[1, 2, 3]", "JSON an array, expected an object"),
        (b'"just a string"', "JSON a string, expected an object"),
        (b'{"model_type": "caf\xe9"}', "not UTF-8 text"),
        (b" " * (9 * 1024 * 1024) + b"{}", "over the 8,388,608-byte limit"),
    ],
)
def test_bad_config_bytes_give_clear_errors(data: bytes, message: str) -> None:
    with pytest.raises(AtlasError, match=message) as info:
        parse_config_bytes(data)
    assert str(info.value).startswith("config.json: ")


def test_weight_map_not_an_object() -> None:
    with pytest.raises(AtlasError, match="'weight_map' is an array, expected an object"):
        parse_weight_index(b'{"metadata": {}, "weight_map": ["mtp.fc.weight"]}')


def test_hostile_values_are_rejected_with_warnings_not_stored() -> None:
    config = copy.deepcopy(cfg("deepseek-ai/DeepSeek-V3"))
    config["model_type"] = "<script>alert(1)</script>"
    config["architectures"] = ["Deepseek\n# heading"]
    config["num_nextn_predict_layers"] = "1"
    config["<b>odd key</b>"] = "[link](javascript:x)"
    fp = fingerprint(config)
    assert "model_type" not in fp.facts and "architectures" not in fp.facts
    assert fp.declared_num_mtp_layers is None
    assert any("num_nextn_predict_layers is not a count" in w for w in fp.warnings)
    assert any("model_type has an unusable value" in w for w in fp.warnings)


def test_bool_and_negative_counts_are_not_counts() -> None:
    for bad in (True, -1, 1.5, None, [1]):
        config = cfg("deepseek-ai/DeepSeek-V3")
        config["num_nextn_predict_layers"] = bad
        assert fingerprint(config).declared_num_mtp_layers is None
