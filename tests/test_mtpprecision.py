"""The MTP layer's precision (atlas.fingerprints.precision), on the real mirror configs whose quantization
configs carry exclusion lists, and on weight names laid over real configs. Each expectation is
counted here from the file itself, independently of the rule's code."""

from __future__ import annotations

import html
import json

import pytest
from hub_fixtures import MIRROR, mirror_config

from atlas.fingerprints.rules import fingerprint


def cfg(repo_id: str) -> dict:
    return json.loads(mirror_config(repo_id).read_text())


def sidecar(repo_id: str) -> dict | None:
    path = MIRROR / repo_id / "hf_quant_config.json"
    return json.loads(path.read_text()) if path.exists() else None


def rows(repo_id: str, names: list[str] | None = None) -> dict[str, tuple[str, str | None]]:
    fp = fingerprint(cfg(repo_id), names, "index" if names is not None else None, sidecar(repo_id))
    return {name: (value, path) for name, value, path in fp.rows()}


@pytest.mark.parametrize("repo_id", ["nvidia/DeepSeek-V3.2-NVFP4", "nvidia/DeepSeek-V3-0324-NVFP4", "nvidia/DeepSeek-V3.1-NVFP4"])
def test_an_exclusion_glob_over_the_whole_mtp_layer_keeps_it_unquantized(repo_id: str) -> None:
    """ModelOpt's exclude_modules names model.layers.<num_hidden_layers>* (the MTP layer): not
    quantized, in the config's torch_dtype, with the entry as evidence."""
    config, excluded = cfg(repo_id), sidecar(repo_id)["quantization"]["exclude_modules"]
    mtp = f"model.layers.{config['num_hidden_layers']}"
    [entry] = [e for e in excluded if e.rstrip("*") == mtp]  # counted from the file
    got = rows(repo_id)
    assert got["mtp_quantized"] == ("no", f"hf_quant_config.json:quantization.exclude_modules: {entry}")
    assert got["mtp_dtype"] == (f"{config['torch_dtype']} (config torch_dtype)", "torch_dtype")


def test_glm5_fp8_keeps_only_some_mtp_modules_in_bf16() -> None:
    """GLM-5-FP8's modules_to_not_convert lists the MTP layer's eh_proj and indexer projection (and
    its norms and router, which no layer converts) but not its attention or expert projections:
    partly quantized, the listed ones in bfloat16, the rest fp8 e4m3 in 128x128 blocks."""
    config = cfg("zai-org/GLM-5-FP8")
    listed = config["quantization_config"]["modules_to_not_convert"]
    layer = f"model.layers.{config['num_hidden_layers']}."
    linear = [e for e in listed if e.startswith(layer) and not e.endswith(("norm", ".gate", "bias"))]
    assert sorted(e.removeprefix(layer) for e in linear) == ["eh_proj", "self_attn.indexers_proj"]
    got = rows("zai-org/GLM-5-FP8")
    assert got["mtp_quantized"] == ("partly", f"quantization_config: {len(linear)} module(s) of the MTP layer listed unconverted")
    value, where = got["mtp_dtype"]
    assert value == "bfloat16 (config torch_dtype) for the unconverted modules (eh_proj, indexers_proj); fp8 (e4m3, 128x128 blocks) for the rest"
    assert where == "quantization_config: method; torch_dtype"


def test_a_list_that_names_no_module_of_the_mtp_layer_leaves_it_quantized() -> None:
    """GLM-5-FP8 with the MTP layer's entries taken out of its list: converted like any layer."""
    config = cfg("zai-org/GLM-5-FP8")
    layer = f"model.layers.{config['num_hidden_layers']}."
    q = config["quantization_config"]
    q["modules_to_not_convert"] = [e for e in q["modules_to_not_convert"] if not e.startswith(layer)]
    got = {n: (v, p) for n, v, p in fingerprint(config).rows()}
    assert got["mtp_quantized"][0] == "yes" and got["mtp_dtype"][0] == "fp8 (e4m3, 128x128 blocks)"


@pytest.mark.parametrize("repo_id", ["deepseek-ai/DeepSeek-V3", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8"])
def test_a_quantized_config_without_list_or_names_is_unknown(repo_id: str) -> None:
    """fp8 with no exclusion list and no weight names read: which modules the method covers the
    config does not say, so unknown, never a default dtype."""
    got = rows(repo_id)
    assert got["mtp_quantized"][0] == "unknown" and got["mtp_dtype"][0] == "unknown"


@pytest.mark.parametrize("repo_id", ["MiniMaxAI/MiniMax-M2.7", "nvidia/MiniMax-M2.5-NVFP4", "_unattributed/Qwen3.5-9B-MLX-8bit-from-leo-kreisman"])
def test_an_unknown_layout_or_method_stays_unknown(repo_id: str) -> None:
    """MiniMax declares num_mtp_modules with no published tensor prefix; the MLX 8-bit config has a
    quantization block whose method the rules do not read."""
    got = rows(repo_id)
    assert got["mtp_quantized"][0] == "unknown" and got["mtp_dtype"] == ("unknown", got["mtp_dtype"][1])


def test_an_unquantized_config_is_in_its_torch_dtype() -> None:
    config = cfg("Qwen/Qwen3.5-27B")
    got = rows("Qwen/Qwen3.5-27B")
    dtype = config["text_config"]["dtype"]  # transformers 5 spelling, under text_config
    assert got["mtp_quantized"] == ("no", "no quantization config") and got["mtp_dtype"][0] == f"{dtype} (config torch_dtype)"


def test_models_without_mtp_get_no_precision_claim() -> None:
    assert "mtp_quantized" not in rows("Qwen/Qwen3-30B-A3B-FP8")  # quantized, but no MTP layer


def _deepseek_names(depth: int, scaled: set[str]) -> list[str]:
    """A DeepSeek-V3 weight index (its real depth's MTP layer), fp8 scales on the modules in `scaled`."""
    modules = ["eh_proj", "self_attn.q_a_proj", "mlp.experts.0.down_proj", "enorm", "shared_head.norm"]
    names = ["model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_a_proj.weight",
             "model.layers.0.self_attn.q_a_proj.weight_scale_inv"]
    for m in modules:
        names.append(f"model.layers.{depth}.{m}.weight")
        if m in scaled:
            names.append(f"model.layers.{depth}.{m}.weight_scale_inv")
    return names


@pytest.mark.parametrize(("scaled", "verdict"), [
    ({"eh_proj", "self_attn.q_a_proj", "mlp.experts.0.down_proj"}, "yes"),
    ({"self_attn.q_a_proj", "mlp.experts.0.down_proj"}, "partly"),
    (set(), "no"),
])
def test_the_weight_index_decides_from_the_scale_tensors(scaled: set[str], verdict: str) -> None:
    """DeepSeek-V3's real config (fp8, no list: unknown from the config alone) with a weight index:
    scale tensors under model.layers.61.* say which MTP modules are fp8."""
    depth = cfg("deepseek-ai/DeepSeek-V3")["num_hidden_layers"]
    got = rows("deepseek-ai/DeepSeek-V3", _deepseek_names(depth, scaled))
    assert got["mtp_quantized"][0] == verdict
    q = cfg("deepseek-ai/DeepSeek-V3")["quantization_config"]
    fp8 = f"fp8 ({q['fmt']}, {q['weight_block_size'][0]}x{q['weight_block_size'][1]} blocks)"
    assert got["mtp_dtype"][0] == {"yes": fp8, "partly": f"bfloat16 (config torch_dtype) for the unconverted modules; {fp8} for the rest",
                                   "no": "bfloat16 (config torch_dtype)"}[verdict]
    if verdict == "partly":
        assert f"model.layers.{depth}.eh_proj" in got["mtp_quantized"][1]


# ---- stored by the crawl, shown on the model pages --------------------------------------------


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory):
    from site_helpers import crawl_mirror

    db = tmp_path_factory.mktemp("precision") / "atlas.duckdb"
    crawl_mirror(db)
    return db


def _models(db, root):
    from atlas.store import db as store
    from atlas.site.parts import models_json as modelpages
    from atlas.evidence import servable as servable_matrix

    with store.connect(db, read_only=True) as con:
        return {m.repo_id: m for m in modelpages.collect(con, servable_matrix.load(root / "evidence" / "servable.toml"), root).models}


def test_the_crawl_stores_the_precision_and_the_model_page_shows_it_as_a_present_claim(crawled) -> None:
    from site_helpers import REPO

    from atlas.site.pages import modelpage

    models = _models(crawled, REPO)
    glm, nvfp4 = models["zai-org/GLM-5-FP8"], models["nvidia/DeepSeek-V3.2-NVFP4"]
    assert (glm.current.mtp_quantized, nvfp4.current.mtp_quantized) == ("partly", "no")
    assert (glm.current.mtp_dtype, glm.current.mtp_quantized_evidence) == (rows("zai-org/GLM-5-FP8")["mtp_dtype"][0],
                                                                            rows("zai-org/GLM-5-FP8")["mtp_quantized"][1])
    levels = html.unescape(str(modelpage._levels(nvfp4, [], None, "2026-12-01")))  # the text as rendered
    [row] = [line for line in levels.splitlines() if line.startswith("| MTP precision (shipped) |")]
    assert "| not quantized; dtype: bfloat16 (config torch_dtype) |" in row
    assert "<code>hf_quant_config.json:quantization.exclude_modules: model.layers.61*</code>" in row
    assert "measured" not in row  # a present claim, from the snapshot's files
    unknown = str(modelpage._levels(models["deepseek-ai/DeepSeek-V3"], [], None, "2026-12-01"))
    assert "| MTP precision (shipped) | unknown |" in unknown


def test_a_store_fingerprinted_before_the_rule_reads_unknown_not_a_default(crawled, tmp_path) -> None:
    import shutil

    import duckdb
    from site_helpers import REPO

    from atlas.site.pages import modelpage

    old = tmp_path / "old.duckdb"
    shutil.copy(crawled, old)
    con = duckdb.connect(str(old))
    con.execute("DELETE FROM fingerprints WHERE name IN ('mtp_quantized', 'mtp_dtype')")
    con.close()
    glm = _models(old, REPO)["zai-org/GLM-5-FP8"]
    assert glm.current.mtp_quantized is None
    assert "unknown (not read for this snapshot" in str(modelpage._levels(glm, [], None, "2026-12-01"))


@pytest.mark.parametrize("quant", [
    "junk", {"quant_method": 7}, {"quant_method": "fp8", "modules_to_not_convert": "model.layers.78"},
    {"quant_method": "fp8", "modules_to_not_convert": [None, 5, "model.layers.78.eh_proj"]},
    {"quant_method": "compressed-tensors", "ignore": ["re:[", "re:model\\.layers\\.78\\..*"], "config_groups": {"g": {"weights": {"type": "float", "num_bits": 8}}}},
    {"quant_method": "fp8", "fmt": ["e4m3"], "weight_block_size": ["a", "b"], "modules_to_not_convert": ["x" * 100_000]},
])
def test_a_hostile_quantization_config_gets_a_claim_not_a_crash(quant: object) -> None:
    config = cfg("zai-org/GLM-5-FP8")
    config["quantization_config"] = quant
    config["torch_dtype"] = "<b>bf16</b>"
    got = {n: (v, p) for n, v, p in fingerprint(config).rows()}
    assert got["mtp_quantized"][0] in ("no", "partly", "yes", "unknown")
    if not isinstance(quant, dict) or not isinstance(quant.get("quant_method"), str):
        assert got["mtp_quantized"][0] == "unknown"  # a quantization config the rules cannot read: never "no"
    assert "<b>" not in got["mtp_dtype"][0] and all(len(v) <= 300 and len(p or "") <= 300 for v, p in got.values() if v)
