"""Every family in the table: measured on tiny real-layout checkpoints at depths other than the real
ones (main model against transformers' forward, MTP layer against an independent statement of the
family's wiring, greedy output identical to plain decoding, oracle acceptance exactly 1 at T = 0 and
the closed-form value at T = 1), or refused by name with the reason."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from atlas import AtlasError
from atlas.decode.mtphead import load_family
from atlas.families.table import FAMILIES
from atlas.decode.generate import Sampling, generate_plain, generate_speculative
from atlas.decode.model import build_fused_model, dense_regime
from atlas.checkpoints.oracles import LAYOUTS, bigram_tables, write_checkpoint
from atlas.decode.checkpoint import load_checkpoint
from atlas.records.theory import bigram_acceptance

CPU = torch.device("cpu")
PROMPT = [5, 9, 33, 2, 7, 100, 4]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def wiring_reference(folder: Path, family: str, block: torch.nn.Module, rotary, hidden, ids, positions,
                     local_copies: bool | None = None) -> torch.Tensor:
    """The family's MTP wiring as its inference code states it, read from the checkpoint by the
    names in atlas.checkpoints.oracles.LAYOUTS (written independently of the family table): each input
    normed by its own norm (x̂·w, or x̂·(1+w) for Gemma-style families), concatenated in the family's
    order, projected, the block under a causal mask, the final norm, then the head (its own copy
    where the checkpoint was written with one: `local_copies`, None as the family ships)."""
    layout = LAYOUTS[family]
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") or config
    main = text.get("hybrid_override_pattern", text.get("layers_block_type"))  # Nemotron-H, either spelling
    mtp = text.get("mtp_hybrid_override_pattern", text.get("mtp_layers_block_type", "x"))
    names = layout.names(len(main) if main is not None else text["num_hidden_layers"], len(mtp), local_copies=local_copies)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        t = {n: f.get_tensor(names[n]) for n in ("e_norm", "h_norm", "proj", "final_norm", "mtp_head", "mtp_embed")}
    shift = 1.0 if layout.gemma_norms else 0.0
    eps = text.get("rms_norm_eps", text.get("layer_norm_epsilon"))

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (w + shift)

    e = norm(t["mtp_embed"][ids], t["e_norm"])
    h = norm(hidden, t["h_norm"])
    x = torch.cat([h, e] if layout.hidden_first else [e, h], dim=-1) @ t["proj"].T
    n = ids.shape[0]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    cos_sin = None if rotary is None else rotary(x[None], position_ids=positions[None])
    y = block(x[None], attention_mask=mask, position_ids=positions[None], position_embeddings=cos_sin)
    y = y[0] if isinstance(y, tuple) else y  # GLM-5's layers also return their top-k selection
    return norm(y[0], t["final_norm"]) @ t["mtp_head"].T


def loaded(tmp_path: Path, family: str, mode: str, depth: int, **kwargs):
    folder = write_checkpoint(family, tmp_path / f"{family}-{mode}-{depth}", mode, depth=depth, **kwargs)
    return folder, load_checkpoint(str(folder), CPU, torch.float32)


# Depths other than the real ones; the hybrids' include a full-attention layer (transformers'
# generate, the reference, cannot decode a cache of recurrent layers only) and every layer kind.
DEPTHS = {"qwen3_next": (4, 6), "qwen3_5": (4, 5), "qwen3_5_moe": (4, 7), "nemotron_h": (3, 5),
          "nemotron_h_ultra": (3, 4), "nemotron_h_lightning": (3, 5)}
CASES = [(f, d) for f in sorted(LAYOUTS) for d in DEPTHS.get(f, (1, 3))]


@pytest.mark.parametrize(("family", "depth"), CASES)
def test_family_at_any_depth_is_faithful_and_lossless(tmp_path: Path, family: str, depth: int) -> None:
    folder, got = loaded(tmp_path, family, "random", depth)
    assert got.family != "transformers MtpModel" and len(got.model.get_decoder().layers) == depth
    engine = build_fused_model(got.model, got.mtp, 96, PROMPT)  # validates main + MTP against transformers / the reference
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        out = got.model(ids[None], output_hidden_states=True)
        hidden = out.hidden_states[-1][0]
        positions = torch.arange(1, len(PROMPT))
        _, ours = got.mtp.reference(hidden[:-1], ids[1:], positions)
        theirs = wiring_reference(folder, family, got.mtp.block, getattr(got.model.get_decoder(), "rotary_emb", None), hidden[:-1], ids[1:], positions)
        _, drafted = engine.draft(ids[1:], hidden[:-1], 0)
    assert (ours - theirs).abs().max() < 1e-4
    assert (drafted - theirs[-1]).abs().max() < 1e-4
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, 24, Sampling(), gen)
    ref = got.model.generate(ids[None], max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert plain.tokens == ref[0, len(PROMPT):].tolist()
    for k in (1, 2, 3, 4):
        assert generate_speculative(engine, PROMPT, 24, k, Sampling(), gen).tokens == plain.tokens


# ---- layer-local head and embedding: used where shipped, the target's bound where absent ----------


def _shared(depth: int, copies: bool) -> dict[str, str]:
    return {} if copies else {f"model.layers.{depth}.shared_head.head.weight": "lm_head.weight",
                              f"model.layers.{depth}.embed_tokens.weight": "model.embed_tokens.weight"}


@pytest.mark.parametrize("family", ["glm_moe_dsa", "deepseek_v3"])
@pytest.mark.parametrize("copies", [False, True], ids=["no-copies", "copies"])
def test_random_checkpoint_with_or_without_layer_local_copies_is_faithful_and_lossless(tmp_path: Path, family: str, copies: bool) -> None:
    """GLM-5 as it ships (no layer-local embed_tokens or shared_head.head) and DeepSeek-V3's layout
    (both, here random and unlike the target's), each family in both layouts: the draft equals the
    wiring stated with the tensors the checkpoint holds (a loader binding the target's where a copy
    is shipped, or the copy where none is, differs), greedy output equals plain decoding, and the
    head says exactly which tensors it shared."""
    depth = 2
    folder = write_checkpoint(family, tmp_path / family, "random", depth=depth, local_copies=copies)
    got = load_checkpoint(str(folder), CPU, torch.float32)
    assert got.mtp.shared == _shared(depth, copies)
    engine = build_fused_model(got.model, got.mtp, 96, PROMPT)
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        hidden = got.model(ids[None], output_hidden_states=True).hidden_states[-1][0]
        positions = torch.arange(1, len(PROMPT))
        theirs = wiring_reference(folder, family, got.mtp.block, got.model.get_decoder().rotary_emb, hidden[:-1], ids[1:], positions, copies)
        other = wiring_reference(folder, family, got.mtp.block, got.model.get_decoder().rotary_emb, hidden[:-1], ids[1:], positions, False)
        _, drafted = engine.draft(ids[1:], hidden[:-1], 0)
    assert (drafted - theirs[-1]).abs().max() < 1e-4
    assert not copies or (drafted - other[-1]).abs().max() > 0.1  # the copies matter: binding the target's would show
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, 20, Sampling(), gen)
    for k in (1, 2, 3):
        assert generate_speculative(engine, PROMPT, 20, k, Sampling(), gen).tokens == plain.tokens


@pytest.mark.parametrize("family", ["glm_moe_dsa", "deepseek_v3"])
@pytest.mark.parametrize("copies", [False, True], ids=["no-copies", "copies"])
def test_oracle_with_or_without_layer_local_copies_accepts_every_draft(tmp_path: Path, family: str, copies: bool) -> None:
    folder = write_checkpoint(family, tmp_path / family, "oracle", depth=2, local_copies=copies)
    got = load_checkpoint(str(folder), CPU, torch.float32)
    assert got.mtp.shared == _shared(2, copies)
    engine = build_fused_model(got.model, got.mtp, 96, PROMPT)
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, 20, Sampling(), gen)
    for k in (1, 2, 3):
        spec = generate_speculative(engine, PROMPT, 20, k, Sampling(), gen)
        assert spec.tokens == plain.tokens
        assert spec.accepted_per_position == spec.drafted_per_position and sum(spec.drafted_per_position) > 0


def test_a_wrong_concat_order_is_caught(tmp_path: Path) -> None:
    """The table row with MiMo's [h; e] order flipped still loads and drafts fluently; only the
    wiring reference shows it is wrong."""
    folder = write_checkpoint("mimo", tmp_path, "random", depth=2)
    row = next(f for f in FAMILIES if f.name == "MiMo")
    model, head = load_family(folder, dataclasses.replace(row, order="embedding_first"), CPU, torch.float32)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        hidden = model(ids[None], output_hidden_states=True).hidden_states[-1][0]
        positions = torch.arange(1, len(PROMPT))
        _, wrong = head.reference(hidden[:-1], ids[1:], positions)
        right = wiring_reference(folder, "mimo", head.block, model.get_decoder().rotary_emb, hidden[:-1], ids[1:], positions)
    assert (wrong - right).abs().max() > 0.1


def _assert_greedy_accepts_every_draft(got) -> None:
    """Greedy speculative decoding of an oracle checkpoint: plain decoding's tokens at every k, and
    every drafted token accepted."""
    engine = build_fused_model(got.model, got.mtp, 96, PROMPT)
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, 20, Sampling(), gen)
    for k in (1, 2, 3, 4):
        spec = generate_speculative(engine, PROMPT, 20, k, Sampling(), gen)
        assert spec.tokens == plain.tokens
        assert spec.accepted_per_position == spec.drafted_per_position and sum(spec.drafted_per_position) > 0


@pytest.mark.parametrize("family", sorted(LAYOUTS))
def test_oracle_greedy_acceptance_is_exactly_one(tmp_path: Path, family: str) -> None:
    _, got = loaded(tmp_path, family, "oracle", DEPTHS.get(family, (2,))[0])
    _assert_greedy_accepts_every_draft(got)


@pytest.mark.parametrize(("family", "k"), [("mimo", 2), ("deepseek_v3", 3), ("deepseek_v2", 2), ("deepseek_v32", 2), ("glm_moe_dsa", 3),
                                           ("qwen3_next", 2), ("qwen3_5", 3), ("qwen3_5_moe", 1), ("nemotron_h", 2),
                                           ("nemotron_h_ultra", 3), ("nemotron_h_lightning", 2)])
def test_oracle_sampled_acceptance_matches_the_closed_form(tmp_path: Path, family: str, k: int) -> None:
    """draft_scale 0.6: the MTP head's law is a flattened copy of the main model's, so at T = 1 the
    expected drafted and accepted counts per position follow exactly from the two [V, V] tables
    (atlas.records.theory.bigram_acceptance); the loop's means must agree within 4.5 standard errors."""
    folder, got = loaded(tmp_path, family, "oracle", DEPTHS.get(family, (2,))[0], draft_scale=0.6)
    assert_sampled_acceptance_is_exact(folder, family, got, k)


def assert_sampled_acceptance_is_exact(folder: Path, family: str, got, k: int) -> None:
    p, q = bigram_tables(folder, family)
    engine = build_fused_model(got.model, got.mtp, 64, PROMPT)
    runs, max_new, s = 150, 12, Sampling(temperature=1.0)
    exact = bigram_acceptance(p, q, p[PROMPT[-1]], max_new, k)
    gen = torch.Generator().manual_seed(1)
    samples = np.array([
        [*r.drafted_per_position, *r.reached_per_position, *r.accepted_per_position, r.verify_passes]
        for r in (generate_speculative(engine, PROMPT, max_new, k, s, gen) for _ in range(runs))
    ], dtype=float)
    want = np.array([*exact.drafted, *exact.reached, *exact.accepted, exact.verify_passes])
    se = samples.std(0, ddof=1) / runs**0.5
    assert np.all(np.abs(samples.mean(0) - want) <= 4.5 * se + 1e-9), (samples.mean(0), want)
    assert 0.3 < sum(exact.accepted) / sum(exact.drafted) < 0.95  # neither trivial nor hopeless


def test_deepseek_with_fewer_kv_heads_than_heads(tmp_path: Path) -> None:
    """MLA has no key/value head count of its own (kv_b_proj expands the latent to every head); a
    config that states a smaller one is measured, not a tensor-size traceback."""
    _, got = loaded(tmp_path, "deepseek_v3", "random", 2, overrides=dict(num_key_value_heads=2))
    engine = build_fused_model(got.model, got.mtp, 64, PROMPT)
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, 12, Sampling(), gen)
    assert generate_speculative(engine, PROMPT, 12, 2, Sampling(), gen).tokens == plain.tokens


@pytest.mark.parametrize(("pattern", "why"), [("*M", "sub-layer letter\\(s\\) 'M'"), ("-E", "sub-layer letter\\(s\\) '-'"),
                                             ("**E", "2 attention sub-layers")])
def test_nemotron_mtp_sub_layers_other_than_attention_and_moe_are_refused_by_name(tmp_path: Path, pattern: str, why: str) -> None:
    folder = write_checkpoint("nemotron_h", tmp_path, "random", depth=3)
    config = json.loads((folder / "config.json").read_text())
    config["mtp_hybrid_override_pattern"] = pattern
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(AtlasError, match=f"Nemotron-H / Nemotron-3: not measured: mtp_hybrid_override_pattern '{re.escape(pattern)}' has {why}"):
        load_checkpoint(str(folder), CPU, torch.float32)


@pytest.mark.parametrize(("listed", "why"), [(["attention", "mamba"], "sub-layer type\\(s\\) 'mamba'"),
                                           (["mlp", "moe"], "sub-layer type\\(s\\) 'mlp'"),
                                           (["attention", "full_attention", "moe"], "2 attention sub-layers")])
def test_list_spelled_mtp_sub_layers_other_than_attention_and_moe_are_refused_by_name(tmp_path: Path, listed: list, why: str) -> None:
    folder = write_checkpoint("nemotron_h_ultra", tmp_path, "random", depth=3)
    config = json.loads((folder / "config.json").read_text())
    config["mtp_layers_block_type"] = listed
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(AtlasError, match=f"Nemotron-H / Nemotron-3: not measured: mtp_layers_block_type {re.escape(repr(listed))} has {why}"):
        load_checkpoint(str(folder), CPU, torch.float32)


def test_mtp_tensors_the_config_does_not_select_are_named_not_called_missing(tmp_path: Path) -> None:
    """Issue 29: a Nemotron-H checkpoint whose MTP block is under mtp.layers.0/1 but whose config
    spells the block in neither key (here: the list key dropped) is refused naming the tensors
    looked for, the key condition it fails and the mtp tensors it does ship; never "ships no MTP
    tensors"."""
    folder = write_checkpoint("nemotron_h_ultra", tmp_path, "random", depth=3)
    config = json.loads((folder / "config.json").read_text())
    del config["mtp_layers_block_type"]
    (folder / "config.json").write_text(json.dumps(config))
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        mtp = sorted(n for n in f.keys() if n.startswith("mtp."))
    with pytest.raises(AtlasError) as err:
        load_checkpoint(str(folder), CPU, torch.float32)
    message = str(err.value)
    assert "ships no MTP tensors" not in message
    assert "looked for mtp.layers.0.enorm.weight, mtp.layers.0.hnorm.weight, mtp.layers.0.eh_proj.weight" in message
    assert "only when the config has mtp_hybrid_override_pattern or mtp_layers_block_type, and it has neither" in message
    assert f"found {len(mtp)} tensor(s) under an mtp prefix ({', '.join(mtp[:5])} and {len(mtp) - 5} more)" in message


REFUSED = [f for f in FAMILIES if f.refuse]


@pytest.mark.parametrize("family", REFUSED, ids=[f.name for f in REFUSED])
def test_refused_families_say_which_and_why(tmp_path: Path, family) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": family.model_types[0], "num_nextn_predict_layers": 1}))
    save_file({"mtp.layers.0.input_layernorm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(AtlasError) as err:
        load_checkpoint(str(tmp_path), CPU, torch.float32)
    assert f"{family.name}: not measured: {family.refuse}" in str(err.value)


def test_minimax_m3_is_refused_by_family_name_not_by_transformers(tmp_path: Path) -> None:
    """A MiniMaxM3VLConfig-shaped config (a vision-language wrapper, the language model's type
    under text_config) with mtp.* tensors: refused as MiniMax-M3 with the reason, not with
    transformers' "Unrecognized configuration class" for a config it has no causal-LM class for."""
    config = {"model_type": "minimax_m3_vl", "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
              "text_config": {"model_type": "minimax_m3_vl_text", "num_hidden_layers": 2, "num_mtp_modules": 1}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"mtp.0.enorm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(AtlasError) as err:
        load_checkpoint(str(tmp_path), CPU, torch.float32)
    message = str(err.value)
    assert message.startswith("MiniMax-M3: not measured: a vision-language model whose MTP module has no checked tensor layout")
    assert "minimax_m3_sparse" in message and "Unrecognized" not in message


def test_unknown_layout_is_refused_not_guessed(tmp_path: Path) -> None:
    folder = write_checkpoint("mimo", tmp_path, "random", depth=1)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "llama"  # MiMo's tensors under a model type no row pairs them with
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(AtlasError, match="mimo layout, model_type 'llama'.*match no family-table row"):
        load_checkpoint(str(folder), CPU, torch.float32)


def test_declared_but_not_shipped_is_refused(tmp_path: Path) -> None:
    """A DeepSeek-V3 config whose checkpoint dropped the MTP layer (as some re-uploads do)."""
    folder = write_checkpoint("deepseek_v3", tmp_path, "random", depth=2)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        kept = {n: f.get_tensor(n) for n in f.keys() if not n.startswith("model.layers.2.")}
    save_file(kept, str(folder / "model.safetensors"))
    with pytest.raises(AtlasError, match=r"DeepSeek-V3: the config declares 1 MTP layer\(s\) \(num_nextn_predict_layers\) but the checkpoint ships no MTP tensors"):
        load_checkpoint(str(folder), CPU, torch.float32)


def test_real_configs_from_the_mirror_get_a_row(tmp_path: Path) -> None:
    """Every bundled real config that declares MTP is matched to its row (tensor names as the
    family ships them), measured or refused by name."""
    from atlas.fingerprints.rules import fingerprint
    from atlas.families.table import identify
    from atlas.paths import ROOT

    shipped = {"deepseek_v3": "model.layers.{N}.eh_proj.weight", "glm4_moe": "model.layers.{N}.eh_proj.weight",
               "deepseek_v32": "model.layers.{N}.eh_proj.weight", "glm_moe_dsa": "model.layers.{N}.eh_proj.weight",
               "mimo": "model.mtp_layers.0.input_proj.weight", "qwen3_next": "mtp.fc.weight", "qwen3_5_text": "mtp.fc.weight",
               "qwen3_5_moe_text": "mtp.fc.weight", "nemotron_h": "mtp.layers.0.eh_proj.weight"}
    seen = {}
    for path in sorted((ROOT / "data" / "hub-mirror").glob("*/*/config.json")):
        config = json.loads(path.read_text())
        if not fingerprint(config).declared_num_mtp_layers:
            continue
        text = config.get("text_config") or config
        model_type = text.get("model_type", config.get("model_type"))
        depth = text.get("num_hidden_layers", 0)
        names = [shipped[model_type].replace("{N}", str(depth))] if model_type in shipped else []
        family = identify(config, names)
        seen[path.parent.name] = family.name if family else None
    assert seen["DeepSeek-V3"] == "DeepSeek-V3" and seen["GLM-4.5"] == "GLM-4-MoE"
    assert seen["Qwen3.5-397B-A17B"] == "Qwen3.5" and seen["NVIDIA-Nemotron-3-Super-120B-A12B-FP8"] == "Nemotron-H / Nemotron-3"
    assert seen["NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"] == seen["NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"] == "Nemotron-H / Nemotron-3"
    assert seen["MiniMax-M2.7"] == "MiniMax-M2" and seen["GLM-5-FP8"] == "GLM-5" and seen["DeepSeek-V3.2"] == "DeepSeek-V3.2"
    assert seen["XiaomiMiMo-MiMo-7B-variant-from-jj8127-mimo_kor"] == "MiMo"
    assert seen.pop("byte-mtp-8l") is None  # the team model: transformers' own MTP loader
    assert all(seen.values()), seen


def test_every_fingerprinted_family_has_a_row() -> None:
    from atlas.fingerprints.rules import WEIGHT_RULES

    assert {r.family for r in WEIGHT_RULES} <= {f.shipped_family for f in FAMILIES}


# ---- chained MTP layers ---------------------------------------------------------------------------


def test_chained_mtp_layers_are_faithful_and_lossless(tmp_path: Path) -> None:
    """DeepSeek-V3 with two shipped MTP layers (model.layers.N and N+1): both are loaded, each
    validated against its own reference (build_fused_model), and greedy output equals plain
    decoding and transformers' generate at k = 1..4 (k > 2 reuses layer i mod 2)."""
    _, got = loaded(tmp_path, "deepseek_v3", "random", 2, mtp_layers=2)
    assert len(got.mtp.next_layers) == 1 and got.mtp.next_layers[0].block is not got.mtp.block
    engine = build_fused_model(got.model, got.mtp, 96, PROMPT)
    assert len(engine.mtp_layers) == 2
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, 24, Sampling(), gen)
    ref = got.model.generate(torch.tensor(PROMPT)[None], max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert plain.tokens == ref[0, len(PROMPT):].tolist()
    for k in (1, 2, 3, 4):
        assert generate_speculative(engine, PROMPT, 24, k, Sampling(), gen).tokens == plain.tokens


def test_chained_oracle_acceptance_is_exactly_one_and_sampled_matches_the_closed_form(tmp_path: Path) -> None:
    _, got = loaded(tmp_path, "deepseek_v3", "oracle", 2, mtp_layers=2)
    _assert_greedy_accepts_every_draft(got)
    folder, got = loaded(tmp_path, "deepseek_v3", "oracle", 3, mtp_layers=2, draft_scale=0.6)
    assert_sampled_acceptance_is_exact(folder, "deepseek_v3", got, 3)


def test_the_second_draft_comes_from_the_second_layer(tmp_path: Path) -> None:
    """An oracle chain whose second layer is spoiled (random projection): the first draft is still
    always right, the second is not. Were layer 0 reused for draft 2, both would be always right."""
    folder = write_checkpoint("deepseek_v3", tmp_path, "oracle", depth=2, mtp_layers=2)
    tensors = {}
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    tensors["model.layers.3.eh_proj.weight"] = torch.randn(tensors["model.layers.3.eh_proj.weight"].shape, generator=torch.Generator().manual_seed(5))
    save_file(tensors, str(folder / "model.safetensors"))
    got = load_checkpoint(str(folder), CPU, torch.float32)
    engine = build_fused_model(got.model, got.mtp, 96, PROMPT)
    spec = generate_speculative(engine, PROMPT, 30, 2, Sampling(), torch.Generator().manual_seed(0))
    assert spec.accepted_per_position[0] == spec.drafted_per_position[0] > 0
    assert spec.accepted_per_position[1] < spec.reached_per_position[1]


def test_chained_layers_of_a_family_with_one_glue_are_refused_by_name(tmp_path: Path) -> None:
    folder = write_checkpoint("qwen3_next", tmp_path, "random", depth=4)
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(AtlasError, match="Qwen3-Next: not measured: 2 MTP layers declared, but the family's glue"):
        load_checkpoint(str(folder), CPU, torch.float32)


# ---- MiMo as shipped, DeepSeek-V2, DSA ----------------------------------------------------------


def test_mimo_is_measured_as_it_ships(tmp_path: Path) -> None:
    """model_type "mimo" (MiMoForCausalLM, auto_map to remote code) has no transformers class:
    the main model runs on Qwen2's, remote code never run."""
    folder, got = loaded(tmp_path, "mimo", "random", 2)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "mimo" and "auto_map" in config
    assert type(got.model).__name__ == "Qwen2ForCausalLM" and got.family == "MiMo"


def dsa_pair(tmp_path: Path, family: str, index_topk: int):
    """A random DSA checkpoint, loaded by us and, separately, by transformers' own class with its
    indexer (the MTP tensors ignored, as transformers does)."""
    from transformers import AutoModelForCausalLM

    folder = write_checkpoint(family, tmp_path / family, "random", depth=2, overrides=dict(index_topk=index_topk))
    got = load_checkpoint(str(folder), CPU, torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert any(type(m).__name__.endswith("Indexer") for m in theirs.modules())
    return got, theirs


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_dsa_below_index_topk_agrees_with_transformers_and_its_indexer(tmp_path: Path, family: str) -> None:
    """While prompt + new tokens - 1 <= index_topk the indexer selects every key: our dense loop's
    logits equal transformers' full forward (indexer running), and our greedy output equals its
    cached generate, plain and speculative at k = 1..4."""
    got, theirs = dsa_pair(tmp_path, family, index_topk=len(PROMPT) + 20)
    engine = build_fused_model(got.model, got.mtp, len(PROMPT) + 20, PROMPT)
    ids = torch.tensor(PROMPT)
    with torch.inference_mode():
        _, ours = engine.main(ids, 0)
        assert (ours - theirs(ids[None]).logits[0]).abs().max() < 1e-4
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, 20, Sampling(), gen)
    ref = theirs.generate(ids[None], max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert plain.tokens == ref[0, len(PROMPT):].tolist()
    for k in (1, 2, 3, 4):
        assert generate_speculative(engine, PROMPT, 20, k, Sampling(), gen).tokens == plain.tokens


def test_dsa_exactly_at_index_topk_runs_exact_and_one_key_past_is_refused(tmp_path: Path) -> None:
    """The boundary itself: prompt + new - 1 keys (the last token is never forwarded) equal to
    index_topk runs, plain and at k = 1..3, and equals transformers' generate with its indexer
    running; one token more makes the final forward attend index_topk + 1 keys and is refused, in
    the loop and by the run's up-front check alike."""
    limit = len(PROMPT) + 12
    got, theirs = dsa_pair(tmp_path, "deepseek_v32", index_topk=limit)
    engine = build_fused_model(got.model, got.mtp, limit + 8, PROMPT)
    at = limit - len(PROMPT) + 1  # new tokens with exactly `limit` keys attended
    assert f"{limit} keys <= index_topk = {limit}" in dense_regime("DeepSeek-V3.2", limit, len(PROMPT), at)
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(engine, PROMPT, at, Sampling(), gen)
    ref = theirs.generate(torch.tensor([PROMPT]), max_new_tokens=at, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert plain.tokens == ref[0, len(PROMPT):].tolist()
    for k in (1, 2, 3):
        assert generate_speculative(engine, PROMPT, at, k, Sampling(), gen).tokens == plain.tokens
    past = f"not measured beyond index_topk = {limit} keys \\({limit + 1} asked\\)"
    with pytest.raises(AtlasError, match="DeepSeek-V3.2: DSA sparse attention: " + past):
        dense_regime("DeepSeek-V3.2", limit, len(PROMPT), at + 1)
    with pytest.raises(AtlasError, match=past):
        generate_plain(engine, PROMPT, at + 1, Sampling(), gen)
    for k in (1, 2, 3):
        with pytest.raises(AtlasError, match=past):
            generate_speculative(engine, PROMPT, at + 1, k, Sampling(), gen)


def test_dsa_beyond_index_topk_is_refused_by_name(tmp_path: Path) -> None:
    got, _ = dsa_pair(tmp_path, "deepseek_v32", index_topk=len(PROMPT) + 4)
    engine = build_fused_model(got.model, got.mtp, len(PROMPT) + 20, PROMPT)
    with pytest.raises(AtlasError, match=r"DSA sparse attention: not measured beyond index_topk = 11 keys"):
        generate_plain(engine, PROMPT, 12, Sampling(), torch.Generator().manual_seed(0))
