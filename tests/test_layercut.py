"""The shrinker's depth cut (atlas.checkpoints.layercut) on every real config in the bundled mirror, as
published and as transformers writes it back (every derived per-layer list spelled out, which is
how GLM-5.2-style configs ship mlp_layer_types and indexer_types): transformers' own config class
must accept the cut config, and each list it holds per layer must have the new depth."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from atlas import AtlasError
from atlas.checkpoints.layercut import cut_to_depth, layer_count
from atlas.paths import ROOT

MIRROR = ROOT / "data" / "hub-mirror"
CONFIGS = sorted(MIRROR.glob("**/config.json"))


def _text(path: Path) -> dict:
    config = json.loads(path.read_text())
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def _transformers_dict(text: dict) -> dict | None:
    """The config as transformers' class for its model type holds it (None: a type it lacks)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    kwargs = copy.deepcopy(text)  # transformers edits nested dicts (rope_scaling) it is given
    model_type = kwargs.pop("model_type", None)
    if model_type not in CONFIG_MAPPING:
        return None
    return {"model_type": model_type, **AutoConfig.for_model(model_type, **kwargs).to_dict()}


def _per_layer(config: dict, layers: int) -> dict[str, list | str]:
    """Keys whose value has one entry per layer: found by length against the layer count given,
    counted here apart from the module's rule (so a rule that skipped a key shows up)."""
    return {k: v for k, v in config.items() if isinstance(v, (list, str)) and len(v) == layers
            and k not in ("architectures", "model_type", "torch_dtype", "dtype", "transformers_version")
            and not k.endswith("_token_id")}


def test_the_mirror_has_configs_with_per_layer_lists() -> None:
    """The parametrized test below runs on the real configs, and some carry per-layer lists."""
    assert len(CONFIGS) > 40
    assert sum(bool(_per_layer(_text(p), layer_count(_text(p)))) for p in CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.parent.relative_to(MIRROR)) for p in CONFIGS])
@pytest.mark.parametrize("form", ["published", "as transformers writes it"])
def test_every_mirror_config_is_cut_to_any_depth(path: Path, form: str) -> None:
    text = _text(path)
    if form != "published":
        text = _transformers_dict(text)
        if text is None:
            pytest.skip(f"transformers has no config class for {_text(path)['model_type']!r}")
        text = text["text_config"] if isinstance(text.get("text_config"), dict) else text  # Qwen2.5-VL: nested on writing
    layers = layer_count(text)
    per_layer = _per_layer(text, layers)
    original = copy.deepcopy(text)
    for depth in (1, 2, layers - 1):
        cut = cut_to_depth(text, depth)
        assert layer_count(cut) == depth and set(cut) == set(text)
        for key, value in per_layer.items():
            assert cut[key] == value[:depth], key
        for key in set(text) - set(per_layer) - {"num_hidden_layers"}:
            if not (key.endswith("_layers") and isinstance(text[key], list) and text[key]):
                assert cut[key] == text[key], key
        held = _transformers_dict(cut)  # transformers validates its per-layer lists against the depth
        if held is not None:
            for key in _per_layer(_transformers_dict(text) or {}, layers):
                assert len(held[key]) == depth, key
    assert text == original  # the input is never edited in place


def test_lists_with_the_mtp_layers_and_index_lists_are_cut_by_rule() -> None:
    config = {"num_hidden_layers": 4, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",
              "layer_types": ["a0", "a1", "a2", "a3", "mtp"], "mlp_layer_types": ["d", "d", "s", "s"],
              "mlp_only_layers": [0, 3, 4], "eos_token_id": [1, 2, 3, 4], "hybrid_override_pattern": "M*EM",
              "rope_parameters": {"mrope_section": [1, 2, 3, 4]}}
    cut = cut_to_depth(config, 2)
    assert cut["layer_types"] == ["a0", "a1", "mtp"] and cut["mlp_layer_types"] == ["d", "d"]
    assert cut["mlp_only_layers"] == [0, 2]  # layer 3 gone, the MTP layer (4) renumbered after the new depth
    assert cut["hybrid_override_pattern"] == "M*"
    assert cut["eos_token_id"] == [1, 2, 3, 4] and cut["rope_parameters"] == config["rope_parameters"] and cut["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize(("config", "depth", "why"), [({"num_hidden_layers": 4}, 5, "must be 1..4"), ({"num_hidden_layers": 4}, 0, "must be 1..4"),
                                                      ({"hidden_size": 8}, 1, "no layer count")])
def test_a_cut_that_cannot_be_made_is_refused(config: dict, depth: int, why: str) -> None:
    with pytest.raises(AtlasError, match=why):
        cut_to_depth(config, depth)


def test_an_oracle_checkpoint_from_a_config_carrying_mlp_layer_types_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GLM-5's real config as transformers writes it (mlp_layer_types, layer_types, indexer_types:
    one entry per layer of 78) shrunk into a tiny GLM-5 checkpoint: loaded and decoded, where an
    uncut mlp_layer_types made transformers refuse the config."""
    from atlas.checkpoints import oracles
    from atlas.decode.checkpoint import load_checkpoint
    from atlas.decode.generate import Sampling, generate_plain, generate_speculative
    from atlas.decode.model import build_fused_model

    name = oracles.LAYOUTS["glm_moe_dsa"].mirror
    published = json.loads((MIRROR / str(name) / "config.json").read_text())
    spelled = _transformers_dict(published)
    assert spelled is not None and len(spelled["mlp_layer_types"]) == published["num_hidden_layers"]
    (tmp_path / "data" / "hub-mirror" / str(name)).mkdir(parents=True)
    (tmp_path / "data" / "hub-mirror" / str(name) / "config.json").write_text(json.dumps({**published, **spelled}))
    monkeypatch.setattr(oracles, "ROOT", tmp_path)
    folder = oracles.write_checkpoint("glm_moe_dsa", tmp_path / "ckpt", "oracle", depth=2)
    written = json.loads((folder / "config.json").read_text())
    assert [len(written[k]) for k in ("mlp_layer_types", "layer_types", "indexer_types")] == [2, 2, 2]
    got = load_checkpoint(str(folder), torch.device("cpu"), torch.float32)
    prompt = [5, 9, 33, 2]
    engine = build_fused_model(got.model, got.mtp, 32, prompt)
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, prompt, 8, Sampling(), gen)
    assert generate_speculative(engine, prompt, 8, 2, Sampling(), gen).tokens == plain.tokens
