"""--device-map: planning layers over several devices (fake GPU budgets on CPU), explicit plans, and
a placed run end to end through the CLI (on CPU, the one device this machine has)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from atlas import AtlasError
from atlas.cli import cli
from atlas.checkpoints.oracles import write_checkpoint
from atlas.decode.placement import Placement, budgets, parse_plan, plan
from atlas.records.record import read_record

GIB = 2**30


def test_plan_fills_fake_gpus_in_order_with_contiguous_runs() -> None:
    fake = {"cuda:0": 40 * GIB, "cuda:1": 40 * GIB, "cuda:2": 40 * GIB}
    p = plan([5 * GIB] * 20, embed_bytes=3 * GIB, head_bytes=6 * GIB, budgets=fake)
    assert p.embed == "cuda:0" and p.head == p.layers[-1]
    assert p.layers == ["cuda:0"] * 7 + ["cuda:1"] * 8 + ["cuda:2"] * 5
    used = {d: 5 * GIB * p.layers.count(d) for d in fake}
    used["cuda:0"] += 3 * GIB
    used[p.head] += 6 * GIB
    assert all(used[d] <= fake[d] for d in fake)


def test_plan_refuses_what_does_not_fit_and_spills_to_cpu_only_when_given() -> None:
    with pytest.raises(AtlasError, match=r"does not fit .*auto\+cpu"):
        plan([10 * GIB] * 8, GIB, GIB, {"cuda:0": 40 * GIB, "cuda:1": 30 * GIB})
    p = plan([10 * GIB] * 8, GIB, GIB, {"cuda:0": 40 * GIB, "cuda:1": 30 * GIB, "cpu": 100 * GIB})
    assert p.layers == ["cuda:0"] * 3 + ["cuda:1"] * 3 + ["cpu"] * 2 and p.head == "cpu"


def test_explicit_plans() -> None:
    p = parse_plan("cuda:0=0-2,cuda:1=3-5", 6)
    assert p == Placement(embed="cuda:0", layers=["cuda:0"] * 3 + ["cuda:1"] * 3, head="cuda:1")
    assert p.devices() == ["cuda:0", "cuda:1"]
    for bad, message in [("cuda:0=0-2,cuda:1=4-5", "without gaps"), ("cuda:0=0-2", "places 3 layers; the model has 6"),
                         ("cuda:0=0-1,cuda:1=2-3,cuda:0=4-5", "contiguous"), ("gpu0=0-5", "expected auto")]:
        with pytest.raises(AtlasError, match=message):
            parse_plan(bad, 6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_auto_without_gpus_says_so() -> None:
    with pytest.raises(AtlasError, match="no CUDA device"):
        budgets(offload_cpu=False)
    assert list(budgets(offload_cpu=True)) == ["cpu"]


def test_placed_run_records_its_placement(tmp_path: Path) -> None:
    folder = write_checkpoint("deepseek_v3", tmp_path / "ckpt", "oracle", depth=3)
    result = CliRunner().invoke(cli, [
        "measure", "run", "--model", str(folder), "--device-map", "cpu=0-2", "--workloads", "templated",
        "--temperatures", "0", "--draft-tokens", "2", "--max-new-tokens", "8", "--repeats", "1",
        "--prompts-per-workload", "1", "--no-peer", "--out", str(tmp_path / "out"),
    ])
    assert result.exit_code == 0, result.output
    [path] = (tmp_path / "out").glob("*.json")
    record = read_record(path)
    assert record.settings.placement == Placement(embed="cpu", layers=["cpu"] * 3, head="cpu")
    assert all(c.derived.greedy_lossless and c.derived.acceptance_rate == 1.0 for c in record.cells)
    bad = CliRunner().invoke(cli, ["measure", "run", "--model", str(folder), "--device-map", "cpu=0-1", "--no-peer",
                                   "--out", str(tmp_path / "out2")])
    assert bad.exit_code == 1 and "places 2 layers; the model has 3" in bad.output
