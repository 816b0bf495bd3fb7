"""The bundled team model is a genuine Mellum checkpoint whose MTP layer transformers loads and uses,
and `atlas team-model` trains deterministically from its seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, MellumForCausalLM
from transformers.modeling_layers import MtpModel

from atlas.checkpoints import team_checkpoint as teamcheckpoint, team_corpus as teamcorpus, team_model as teammodel
from atlas.cli import cli

CHECKPOINT = Path(__file__).resolve().parents[1] / "data/hub-mirror/mtp-atlas/byte-mtp-8l"
TINY = {
    "layers": 1,
    "hidden": 32,
    "heads": 2,
    "kv_heads": 2,
    "intermediate": 64,
    "seq_len": 32,
    "batch_size": 2,
    "eval_windows": 2,
    "corpus_cap_bytes": 60_000,
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model() -> MellumForCausalLM:
    loaded, info = AutoModelForCausalLM.from_pretrained(CHECKPOINT, output_loading_info=True)
    assert isinstance(loaded, MellumForCausalLM)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return loaded.eval()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(CHECKPOINT)


def test_config_declares_one_mellum_mtp_layer() -> None:
    config = json.loads((CHECKPOINT / "config.json").read_text())
    assert config["model_type"] == "mellum"
    assert config["architectures"] == ["MellumForCausalLM"]
    assert config["num_nextn_predict_layers"] == 1
    assert config["mtp_layer_types"] == ["full_attention"] and config["mtp_mlp_layer_types"] == ["dense"]
    assert set(config["layer_types"]) == {"full_attention"} and set(config["mlp_layer_types"]) == {"dense"}
    assert (config["num_hidden_layers"], config["hidden_size"]) == (8, 192)


def test_mtp_layer_loads_from_the_file_through_transformers(model: MellumForCausalLM) -> None:
    with teamcheckpoint.mtp_load_reports() as reports:
        # The very call `generate(use_mtp=True)` makes; it raises if an MTP weight is missing.
        mtp = MtpModel.from_pretrained(model, device_map={"": torch.device("cpu")})
    assert not reports

    stored = load_file(CHECKPOINT / "model.safetensors")
    layer = mtp.layers[0]
    pairs = {
        "mtp.fc.weight": layer.eh_proj.weight,
        "mtp.pre_fc_norm_embedding.weight": layer.enorm.weight,
        "mtp.pre_fc_norm_hidden.weight": layer.hnorm.weight,
        "mtp.norm.weight": layer.post_norm.weight,
    }
    pairs.update({f"mtp.layers.0.{k}": v for k, v in layer.mtp_block.state_dict().items()})
    assert sorted(pairs) == sorted(k for k in stored if k.startswith("mtp."))
    for key, tensor in pairs.items():
        assert torch.equal(stored[key], tensor), key
    # The MTP layer is one decoder layer of the trunk's size: about 1/8 of the 8-layer trunk.
    block = sum(p.numel() for p in layer.mtp_block.parameters())
    assert block == sum(p.numel() for p in model.model.layers[0].parameters())
    # Embedding and head are the main model's, not copies.
    assert mtp.embed_tokens is model.model.embed_tokens and mtp.shared_head is model.lm_head


def test_generate_use_mtp_equals_plain_greedy(model: MellumForCausalLM, tokenizer) -> None:
    for prompt in ["def read_config(path):\n    ", "Permission is hereby granted, "]:
        inputs = tokenizer(prompt, return_tensors="pt")
        plain = model.generate(**inputs, max_new_tokens=32, do_sample=False)
        drafted = model.generate(**inputs, max_new_tokens=32, do_sample=False, use_mtp=True)
        assert plain.shape[1] > inputs["input_ids"].shape[1]
        assert torch.equal(plain, drafted), tokenizer.decode(drafted[0])


def test_tokenizer_is_bytes_and_round_trips(tokenizer) -> None:
    for text in ["for i in range(3):\n\tprint(i)  # ok", "naïve café — 日本語 ✓ \x00\x7f", ""]:
        ids = tokenizer(text)["input_ids"]
        assert ids == list(text.encode("utf-8"))
        assert tokenizer.decode(ids) == text
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (256, 257, 258)
    generation = json.loads((CHECKPOINT / "generation_config.json").read_text())
    assert (generation["pad_token_id"], generation["bos_token_id"], generation["eos_token_id"]) == (256, 257, 258)


def test_training_record_matches_checkpoint() -> None:
    record = json.loads((CHECKPOINT / "training.json").read_text())
    assert record["repo_id"] == teammodel.REPO_ID
    assert record["steps"] >= 1 and record["spec"]["seed"] == teammodel.DEFAULT_SEED
    assert len(record["corpus"]["digest"]) == 64 and record["corpus"]["n_files"] == len(record["corpus"]["files"])
    for key in ("heldout_loss", "heldout_mtp_loss", "mtp_top1_agreement", "mtp_t1_acceptance"):
        assert key in record["metrics"]


def test_tiny_training_is_deterministic_from_the_seed() -> None:
    corpus = teamcorpus.load_corpus(TINY["corpus_cap_bytes"])

    def weights(seed: int) -> dict[str, torch.Tensor]:
        spec = teammodel.TeamModelSpec(seed=seed, steps=3, **TINY)
        result = teammodel.train(spec, corpus)
        return {**result.model.state_dict(), **teamcheckpoint.mtp_state_dict(result.mtp)}

    first, second, other = weights(7), weights(7), weights(8)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["mtp.fc.weight"], other["mtp.fc.weight"])


def test_joint_training_pass_sees_no_future_token() -> None:
    """The MTP output at i (target: token i+2) may depend on tokens up to i+1 only."""
    model, mtp = teammodel.build_models(teammodel.TeamModelSpec(steps=1, **TINY))
    tokens = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0, 20] = (changed[0, 20] + 1) % 256
    with torch.no_grad():
        main_a, mtp_a = teammodel.joint_forward(model, mtp, tokens)
        main_b, mtp_b = teammodel.joint_forward(model, mtp, changed)
    assert torch.equal(main_a[0, :20], main_b[0, :20]) and not torch.equal(main_a[0, 20], main_b[0, 20])
    assert torch.equal(mtp_a[0, :19], mtp_b[0, :19]) and not torch.equal(mtp_a[0, 19], mtp_b[0, 19])


def test_cli_writes_a_checkpoint_that_transformers_loads(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    args = ["team-model", "--out", str(out), "--steps", "2"]
    for key in ("layers", "hidden", "heads", "kv_heads", "intermediate", "seq_len", "batch_size"):
        args += [f"--{key.replace('_', '-')}", str(TINY[key])]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert teamcheckpoint.verify_checkpoint(out) == []
    record = json.loads((out / "training.json").read_text())
    assert record["steps"] == 2 and record["deterministic"] is True
    assert "held-out loss" in result.output and f"{record['metrics']['heldout_loss']:.3f}" in result.output
    assert_canonical_weights(out / "model.safetensors")
    assert record["command"].startswith(f"atlas team-model --out {out} --seed 1234 --steps 2 --layers 1 ")
    assert AutoTokenizer.from_pretrained(out).decode([104, 105]) == "hi"


def assert_canonical_weights(path: Path) -> None:
    """The weights file is exactly safetensors' serialization of its tensors with metadata
    {"format": "pt"}: the form the committed checkpoint has, which a retrain must reproduce byte for byte."""
    from safetensors.torch import load_file, save

    assert path.read_bytes() == save(load_file(path), metadata={"format": "pt"})


def test_committed_checkpoint_weights_are_canonical() -> None:
    assert_canonical_weights(CHECKPOINT / "model.safetensors")


def test_cli_rejects_bad_options(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(cli, ["team-model", "--out", str(tmp_path), "--hidden", "100", "--heads", "3"])
    assert bad.exit_code == 1 and "multiple of heads" in bad.output
    both = runner.invoke(cli, ["team-model", "--out", str(tmp_path), "--steps", "2", "--minutes", "1"])
    assert both.exit_code == 1 and "not both" in both.output
    assert not (tmp_path / "model.safetensors").exists()
