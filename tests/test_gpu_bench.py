"""The GPU run's pass-cost table (benchmarks/gpu/pass_costs.py): the exemplar configs cut to one
layer of each kind, and the table's figures computed from the timings it was given."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
import pass_costs


def _config(repo: str) -> dict:
    return json.loads((pass_costs.MIRROR / repo / "config.json").read_text())


def test_few_layers_keeps_one_layer_of_each_kind_at_the_real_widths() -> None:
    ds, kept = pass_costs.few_layers(_config("deepseek-ai/DeepSeek-V3"))
    assert (ds["num_hidden_layers"], ds["first_k_dense_replace"], ds["hidden_size"], ds["n_routed_experts"]) == (2, 1, 7168, 256)
    assert "quantization_config" not in ds and "num_nextn_predict_layers" not in ds and "dense" in kept
    qwen, _ = pass_costs.few_layers(_config("Qwen/Qwen3.5-397B-A17B"))
    assert qwen["layer_types"] == ["linear_attention", "full_attention"] and qwen["num_hidden_layers"] == 2
    assert qwen["model_type"] == "qwen3_5_moe_text" and qwen["hidden_size"] == 4096
    nemo, _ = pass_costs.few_layers(_config("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8"))
    assert sorted(nemo["hybrid_override_pattern"]) == sorted("ME*") and nemo["num_hidden_layers"] == 3
    small, kept = pass_costs.few_layers(_config("deepseek-ai/DeepSeek-V3"), shrink=16)
    assert small["hidden_size"] == 7168 // 16 and "not the exemplar's shapes" in kept


def test_table_rows_are_medians_and_their_ratio() -> None:
    seconds = {1: [0.010, 0.012, 0.011], 2: [0.013, 0.050, 0.012], 4: [0.020, 0.022, 0.021]}
    rows = pass_costs.table_rows("x/y", {8: seconds}, (1, 3))
    assert [(r["draft_tokens"], r["plain_ms"], r["verify_ms"]) for r in rows] == [(1, 11.0, 13.0), (3, 11.0, 21.0)]
    assert [r["verify_over_plain"] for r in rows] == [pytest.approx(13 / 11, abs=1e-4), pytest.approx(21 / 11, abs=1e-4)]


def test_time_passes_feeds_k_plus_one_tokens_and_drops_the_warm_up() -> None:
    config, _ = pass_costs.few_layers(_config("deepseek-ai/DeepSeek-V3"), shrink=64)
    model = pass_costs.build(dict(config), torch.device("cpu"), torch.float32)
    fed: list[int] = []
    model.register_forward_pre_hook(lambda _m, args, kwargs: fed.append(kwargs["input_ids"].shape), with_kwargs=True)
    ticks = iter(range(1000))
    seconds = pass_costs.time_passes(model, 2, 8, (1, 3), 2, torch.device("cpu"), clock=lambda: next(ticks))
    assert fed[0] == (2, 8)  # the prefill
    assert [s[1] for s in fed[1:]] == [1, 2, 4] * 3  # interleaved: plain, k = 1, k = 3; warm-up round first
    assert {n: len(v) for n, v in seconds.items()} == {1: 2, 2: 2, 4: 2} and all(v == [1, 1] for v in seconds.values())
