"""Recurrent main models (Gated DeltaNet, Mamba2) in our loop: the state after the last accepted
position is the one the next round starts from, whatever the previous rounds accepted, and the
loop's logits equal transformers' full-sequence forward of the same checkpoint. Also the reference
itself: transformers 5.24's Nemotron-H cached step and full forward disagree, and a float64
recomputation says which computes the config's model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from atlas import AtlasError
from atlas.decode.checkpoint import load_checkpoint
from atlas.decode.generate import Sampling, generate_plain, generate_speculative
from atlas.decode.model import build_fused_model
from atlas.checkpoints.oracles import write_checkpoint
from atlas.decode.recurrent import Mamba2, RecurrentLayer, state_bytes, time_step_limit

CPU = torch.device("cpu")
PROMPT = [5, 9, 33, 2, 7, 100, 4]
HYBRIDS = [("qwen3_next", 4), ("qwen3_5", 4), ("nemotron_h", 3)]
# MTP noise that leaves drafts right often but not always (Nemotron-H's MoE scales its branch by
# routed_scaling_factor 5 through squared-ReLU experts, so a far smaller one does)
NOISE = {"qwen3_next": 0.8, "qwen3_5": 0.8, "nemotron_h": 0.01}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def fused(tmp_path: Path, family: str, depth: int, mode: str = "random", **kwargs):
    folder = write_checkpoint(family, tmp_path / family, mode, depth=depth, **kwargs)
    got = load_checkpoint(str(folder), CPU, torch.float32)
    return got, build_fused_model(got.model, got.mtp, 96, PROMPT, max_draft=4)


def schedule(k: int) -> list[int]:
    """Accepted drafts per round: all, then none (the stale-state case after an accepting step),
    then one (a rejection right after an accepted draft), then all again, then none."""
    return [k, 0, min(1, k - 1) if k > 1 else 0, k, 0, k]


@pytest.mark.parametrize(("family", "depth"), HYBRIDS)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_each_round_starts_from_the_state_after_the_last_accepted_position(tmp_path: Path, family: str, depth: int, k: int) -> None:
    """Verify passes with scripted drafts (the first `a` right, the rest wrong) against the full
    forward of the accepted sequence: every row up to the first wrong draft, in this round and in
    the rounds after it, carries the full forward's logits."""
    got, model = fused(tmp_path, family, depth)
    gen = torch.Generator().manual_seed(0)
    n_new = sum(a + 1 for a in schedule(k)) + k + 2
    ref = generate_plain(model, PROMPT, n_new, Sampling(), gen).tokens
    sequence = torch.tensor(PROMPT + ref)
    with torch.inference_mode():
        full = got.model(sequence[None]).logits[0]
        model.main(torch.tensor(PROMPT), 0)
    scale = max(1.0, float(full.abs().max()))
    pos, emitted = len(PROMPT), 0  # slot of the current token ref[emitted]
    vocab = full.shape[-1]
    for a in schedule(k):
        right = ref[emitted + 1 : emitted + 1 + a]
        wrong = [(t + 1) % vocab for t in ref[emitted + 1 + a : emitted + 1 + k]]
        with torch.inference_mode():
            _, logits = model.main(torch.tensor([ref[emitted], *right, *wrong]), pos)
        assert (logits[: a + 1] - full[pos : pos + a + 1]).abs().max() < 1e-4 * scale, (a, pos)
        assert logits[: a + 1].argmax(-1).tolist() == ref[emitted + 1 : emitted + a + 2]
        pos, emitted = pos + a + 1, emitted + a + 1


@pytest.mark.parametrize(("family", "depth"), HYBRIDS)
def test_greedy_identical_when_drafts_are_often_but_not_always_right(tmp_path: Path, family: str, depth: int) -> None:
    """An oracle with a noisy MTP layer: drafts pass and fail in every pattern (rejections right
    after accepted drafts, zero-accept rounds after full ones); greedy output is still plain
    decoding's, token for token, at k = 1..4."""
    _, model = fused(tmp_path, family, depth, mode="oracle", noise=NOISE[family])
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(model, PROMPT, 40, Sampling(), gen)
    partial = 0
    for k in (1, 2, 3, 4):
        spec = generate_speculative(model, PROMPT, 40, k, Sampling(), gen)
        assert spec.tokens == plain.tokens, k
        assert 0 < sum(spec.accepted_per_position) < sum(spec.drafted_per_position), k
        partial += spec.accepted_per_position[0] > spec.accepted_per_position[-1]
    assert partial  # some rounds accepted a prefix and rejected the rest


@pytest.mark.parametrize(("family", "depth"), HYBRIDS)
def test_plain_decode_logits_equal_transformers_full_forward(tmp_path: Path, family: str, depth: int) -> None:
    """The plain baseline's own logits, every step, against transformers' full-sequence forward of
    the sequence it emitted (the config's time_step_limit applied to transformers' Mamba2 mixers,
    as the loader does). Plain and speculative decoding share the recurrent layers' code, so an
    error in it that both make alike (a dt floor on every decode step) keeps greedy output
    identical; only a reference outside our loop shows it. Half the Mamba2 heads are slow (dt
    around 1e-4, as trained models have), so a floor at time_step_min would change them."""
    folder = write_checkpoint(family, tmp_path / family, "random", depth=depth)
    got = load_checkpoint(str(folder), CPU, torch.float32)
    slowed = 0
    for layer in got.model.get_decoder().layers:
        mixer = getattr(layer, "mixer", None)
        if hasattr(mixer, "time_step_limit"):
            mixer.dt_bias.data[: mixer.num_heads // 2] = -9.0
            slowed += 1
    assert slowed == sum(c == "M" for c in getattr(got.model.config, "hybrid_override_pattern", ""))  # every Mamba2 layer
    model = build_fused_model(got.model, got.mtp, 96, PROMPT, max_draft=4)
    rows: list[torch.Tensor] = []
    main = model.main

    def recorded(ids: torch.Tensor, pos: int):
        hidden, logits = main(ids, pos)
        rows.append(logits[-1].clone())  # the row the plain loop picks its next token from
        return hidden, logits

    model.main = recorded
    plain = generate_plain(model, PROMPT, 24, Sampling(), torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = got.model(torch.tensor([PROMPT + plain.tokens[:-1]])).logits[0, len(PROMPT) - 1 :]
    assert len(rows) == len(full) == 24
    scale = max(1.0, float(full.abs().max()))
    assert (torch.stack(rows) - full).abs().max() < 1e-4 * scale


def test_state_slots_cost_what_their_shapes_say(tmp_path: Path) -> None:
    """The memory figure the record carries, recomputed from the config: per recurrent layer,
    max_draft + 2 fp32 states and kernel - 1 + max_draft + 1 conv columns; the extra over one state
    and a kernel - 1 window is max_draft + 1 of each."""
    got, model = fused(tmp_path, "qwen3_next", 4)
    c = got.model.config
    layers = sum(t == "linear_attention" for t in c.layer_types)
    state = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    kernel, rows = c.linear_conv_kernel_dim, 4 + 1
    total, extra = state_bytes(model.layers)
    assert sum(isinstance(layer, RecurrentLayer) for layer in model.layers) == layers == 3
    assert total == layers * ((rows + 1) * state + (kernel - 1 + rows) * conv_dim * 4)
    assert extra == layers * rows * (state + conv_dim * 4)


# ---- the Nemotron-H reference ---------------------------------------------------------------------


def mamba2_float64(mixer, x: torch.Tensor, dt_min: float, floored: int | None = None) -> torch.Tensor:
    """The Mamba2 mixer's recurrence token by token in float64, written from the equations (not from
    either transformers path): conv, dt = max(softplus(dt + bias), dt_min) for the first `floored`
    tokens (all by default), S ← S·exp(dt·A) + dt·x⊗B, y = S·C + D·x, gated group RMS norm, out_proj."""
    p = lambda t: t.detach().double()  # noqa: E731 - local shorthand
    x = x.double()
    inner, conv_dim, heads, groups, n, hd = mixer.intermediate_size, mixer.conv_dim, mixer.num_heads, mixer.n_groups, mixer.ssm_state_size, mixer.head_dim
    gate, xbc, dt = (x @ p(mixer.in_proj.weight).T).split([inner, conv_dim, heads], -1)
    kernel = mixer.conv_kernel_size
    padded = torch.cat([torch.zeros(kernel - 1, conv_dim, dtype=x.dtype), xbc])
    w = p(mixer.conv1d.weight)[:, 0]
    xbc = F.silu(torch.stack([(padded[t : t + kernel].T * w).sum(-1) for t in range(x.shape[0])]) + p(mixer.conv1d.bias))
    xs, b, c = xbc.split([inner, groups * n, groups * n], -1)
    dt = F.softplus(dt + p(mixer.dt_bias))
    dt[:floored] = dt[:floored].clamp(min=dt_min)
    a = -p(mixer.A_log).exp()
    state = torch.zeros(heads, hd, n, dtype=x.dtype)
    ys = []
    for t in range(x.shape[0]):
        bh, ch = (v[t].view(groups, n).repeat_interleave(heads // groups, 0) for v in (b, c))
        xh = xs[t].view(heads, hd)
        state = state * (dt[t] * a).exp()[:, None, None] + dt[t][:, None, None] * xh[:, :, None] * bh[:, None, :]
        ys.append(((state * ch[:, None, :]).sum(-1) + p(mixer.D)[:, None] * xh).reshape(-1))
    y = (torch.stack(ys) * F.silu(gate)).view(-1, groups, inner // groups)
    y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + mixer.norm.variance_epsilon)).view(-1, inner) * p(mixer.norm.weight)
    return y @ p(mixer.out_proj.weight).T


@pytest.mark.parametrize("groups", [1, 2, 8])
def test_transformers_nemotron_step_and_full_forward_differ_by_a_dt_floor_and_float64_names_the_right_one(groups: int) -> None:
    """transformers 5.24's NemotronHMamba2Mixer clamps dt at time_step_min (0.001) in its chunked
    scan (full forward and prefill) but not in its one-token step, so its cached decode drifts from
    its full forward from the first one-token step on, whatever n_groups is (the head/group
    broadcasting agrees between the two paths). float64 recurrences reproduce both exactly: the full
    forward floors every dt, the cached decode floors only the prefill's. Neither is the config's
    model: its time_step_limit ([0, inf] in Nemotron-3 Super, as transformers' own Mamba2 reads it)
    floors nothing, and that is what our loop and the loader's fixed mixer compute. transformers
    5.25 reads the config's limit itself: there both of its paths must be that model, undrifted."""
    from transformers import DynamicCache, NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(0)
    config = NemotronHConfig(vocab_size=64, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=groups, chunk_size=8,
                             hybrid_override_pattern="M", n_routed_experts=4, num_experts_per_tok=2, num_nextn_predict_layers=0)
    mixer = NemotronHForCausalLM(config).eval().model.layers[0].mixer
    for w in (mixer.in_proj.weight, mixer.conv1d.weight, mixer.out_proj.weight):
        w.data = 1.5 * torch.randn_like(w) / w.shape[-1] ** 0.5
    mixer.dt_bias.data[:4] = -9.0  # slow heads, as trained models have: time steps around 1e-4
    x = torch.randn(1, 12, 64)
    with torch.inference_mode():
        dt = F.softplus(mixer.in_proj(x)[0, :, -mixer.num_heads :] + mixer.dt_bias)
    assert (dt < config.time_step_min).any()
    assert tuple(config.time_step_limit) == (0.0, math.inf)
    upstream_fixed = mixer.time_step_limit == tuple(config.time_step_limit)
    assert upstream_fixed or mixer.time_step_limit == (config.time_step_min, math.inf)
    with torch.inference_mode():
        chunked = mixer(x)[0].double()
        cache = DynamicCache(config=config)
        stepped = torch.cat([mixer(x[:, :6], cache=cache)] + [mixer(x[:, t : t + 1], cache=cache) for t in range(6, 12)], 1)[0].double()
        floored, unfloored = mamba2_float64(mixer, x[0], config.time_step_min), mamba2_float64(mixer, x[0], 0.0)
        prefill_floored = mamba2_float64(mixer, x[0], config.time_step_min, floored=6)
        ours = Mamba2(mixer, 4, CPU, torch.float32)(x[0], 0).double()
        mixer.time_step_limit = tuple(config.time_step_limit)  # what atlas.decode.mtphead sets
        fixed = mixer(x)[0].double()
    if upstream_fixed:
        assert (chunked - unfloored).abs().max() < 1e-5 and (stepped - unfloored).abs().max() < 1e-5
    else:
        assert (chunked - stepped)[6:].abs().max() > 1e-3  # the drift
        # full forward: every dt floored; cached decode: floored in the prefill (chunked), not in its steps
        assert (chunked - floored).abs().max() < 1e-5 and (stepped - prefill_floored).abs().max() < 1e-5
    assert (ours - unfloored).abs().max() < 1e-5 and (fixed - unfloored).abs().max() < 1e-5


def test_nemotron_loaded_model_generates_what_our_loop_decodes(tmp_path: Path) -> None:
    """With the loader's fix, transformers' own cached generate agrees with our plain and
    speculative decoding of the same Nemotron-H checkpoint (n_groups 8, Nemotron-3 Super's)."""
    got, model = fused(tmp_path, "nemotron_h", 5)
    gen = torch.Generator().manual_seed(0)
    plain = generate_plain(model, PROMPT, 24, Sampling(), gen)
    with torch.inference_mode():
        out = got.model.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert plain.tokens == out[0, len(PROMPT):].tolist()
    assert generate_speculative(model, PROMPT, 24, 3, Sampling(), gen).tokens == plain.tokens


@pytest.mark.parametrize(("family", "depth"), [("qwen3_next", 5), ("qwen3_5_moe", 6), ("nemotron_h", 4),
                                             ("nemotron_h_ultra", 4), ("nemotron_h_lightning", 3)])
def test_measure_run_on_a_hybrid_oracle(tmp_path: Path, family: str, depth: int) -> None:
    """`atlas measure run --model DIR` end to end on a tiny real-layout hybrid oracle: greedy
    identical to plain decoding, every draft accepted at T = 0, and the record says how the
    recurrent layers ran and what their slots cost."""
    from click.testing import CliRunner

    from atlas.cli import cli
    from atlas.records.record import read_record

    folder = write_checkpoint(family, tmp_path / family, "oracle", depth=depth)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [
        "measure", "run", "--model", str(folder), "--workloads", "templated,code", "--temperatures", "0", "--draft-tokens", "1,4",
        "--max-new-tokens", "16", "--repeats", "2", "--prompts-per-workload", "2", "--no-peer", "--out", str(out), "--device", "cpu",
    ])
    assert result.exit_code == 0, result.output
    [path] = out.glob("*.json")
    record = read_record(path)
    assert {c.draft_tokens for c in record.cells} == {1, 4}
    for cell in record.cells:
        assert cell.derived.greedy_lossless and cell.derived.acceptance_rate == 1.0
    state = record.recurrent_state
    layers = sum(isinstance(layer, RecurrentLayer) for layer in fused(tmp_path / "again", family, depth, mode="oracle")[1].layers)
    assert state is not None and state.layers == layers and state.state_slots == 4 + 2 and "token-by-token" in state.path
    assert 0 < state.extra_slot_bytes < state.state_bytes


@pytest.mark.parametrize("family", ["nemotron_h_ultra", "nemotron_h_lightning"])
def test_quick_measure_run_on_a_list_spelled_nemotron_with_random_weights(tmp_path: Path, family: str) -> None:
    """Issue 29's check as the issue states it: `atlas measure run --quick --no-peer` on a checkpoint
    shrunk from the real Nemotron-3 Ultra / 3.5 Lightning config (block patterns as lists, the MTP
    block's tensors under mtp.layers.0/1), random weights: measured, every cell greedy-lossless, the
    record naming the family and how many Mamba2 layers it ran."""
    from click.testing import CliRunner

    from atlas.cli import cli
    from atlas.records.record import read_record

    folder = write_checkpoint(family, tmp_path / family, "random", depth=4)
    config = json.loads((folder / "config.json").read_text())
    assert "mtp_hybrid_override_pattern" not in config and config["mtp_layers_block_type"] == ["attention", "moe"]
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["measure", "run", "--quick", "--no-peer", "--model", str(folder), "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    [path] = out.glob("*.json")
    record = read_record(path)
    greedy = [cell for cell in record.cells if cell.derived.greedy_lossless is not None]  # None: a T > 0 cell
    assert greedy and all(cell.derived.greedy_lossless is True for cell in greedy)
    assert record.recurrent_state is not None
    assert record.recurrent_state.layers == config["layers_block_type"].count("mamba")


def test_a_time_step_limit_past_float32_is_no_limit() -> None:
    """Nemotron-3 Ultra writes its upper time-step limit as 1e308: read as +inf, which clamps no
    float32 value (torch.clamp refuses 1e308 itself as an overflow)."""
    assert time_step_limit([0.0, 1e308]) == (0.0, math.inf) and time_step_limit([-1e308, 0.5]) == (-math.inf, 0.5)
    assert time_step_limit([0.0, float("inf")]) == (0.0, math.inf) and time_step_limit((0.001, 0.1)) == (0.001, 0.1)
    dt = torch.tensor([0.0, 1e-3, 3.0e38, torch.finfo(torch.float32).max])
    assert torch.equal(dt.clamp(*time_step_limit([0.0, 1e308])), dt)
    with pytest.raises(RuntimeError, match="overflow"):
        dt.clamp(0.0, 1e308)
    for bad in ([0.0], "0,1", [0.0, "inf"], [1.0, 0.5], [True, 1.0]):
        with pytest.raises(AtlasError, match="time_step_limit"):
            time_step_limit(bad)


def test_half_precision_model_keeps_fp32_recurrent_state(tmp_path: Path) -> None:
    """In bf16 the conv windows follow the model's dtype but every recurrent state stays fp32 (as
    Nemotron-H's mamba_ssm_cache_dtype and Qwen3.5's mamba_ssm_dtype ask); an oracle still accepts
    every draft."""
    for family, depth in (("qwen3_5", 4), ("nemotron_h", 3)):
        folder = write_checkpoint(family, tmp_path / family, "oracle", depth=depth)
        got = load_checkpoint(str(folder), CPU, torch.bfloat16)
        model = build_fused_model(got.model, got.mtp, 64, PROMPT, max_draft=2)
        slots = [layer.slots for layer in model.layers if isinstance(layer, RecurrentLayer)]
        assert slots and all(s.state.dtype == torch.float32 and s.conv.dtype == torch.bfloat16 for s in slots)
        spec = generate_speculative(model, PROMPT, 16, 2, Sampling(), torch.Generator().manual_seed(0))
        assert spec.accepted_per_position == spec.drafted_per_position, family
