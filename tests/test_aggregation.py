"""How the runner combines runs into a record: counts summed over several prompts, each repeat's
speed-up paired with its own baseline, the greedy-identity flag over every prompt, and the stamp
and settings checked against the facts they claim (each with at least 2 prompts and 2 repeats)."""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

import pytest
import torch

from atlas.engines import stamp
from atlas.engines.cells import RepeatCounts, seed_for
from atlas.decode.checkpoint import load_checkpoint
from atlas.engines.ours.engine import run
from atlas.records.gating import derive
from atlas.decode.generate import RunStats, Sampling, generate_speculative
from atlas.decode.model import build_fused_model
from atlas.engines.options import MAX_PROMPT_TOKENS, Options
from atlas.checkpoints.oracles import write_checkpoint
from atlas.records.record import Repeat
from atlas.records.workloads import load_prompt_set

CPU = torch.device("cpu")


def stats(tokens: list[int], seconds: float, drafted: list[int], accepted: list[int], passes: int, reached: list[int]) -> RunStats:
    return RunStats(tokens, seconds, drafted, accepted, passes, reached)


def test_repeat_counts_sum_every_prompt_and_any_difference_clears_the_identity_flag() -> None:
    acc = RepeatCounts()
    acc.add(stats([1, 2, 3, 4], 0.5, [3, 2], [2, 1], 3, [3, 2]), stats([1, 2, 9, 4], 0.8, [], [], 3, []))
    acc.add(stats([5, 6, 7], 0.25, [2, 1], [1, 0], 2, [2, 1]), stats([5, 6, 7], 0.5, [], [], 2, []))
    r = acc.repeat(greedy=True)
    assert (r.drafted_per_position, r.accepted_per_position, r.reached_per_position) == ([5, 3], [3, 1], [5, 3])
    assert (r.tokens, r.verify_passes, r.seconds, r.baseline_seconds) == (5, 5, 0.75, 1.3)
    assert r.identical_to_baseline is False  # the first prompt differed, the last did not


def test_each_repeat_is_paired_with_its_own_baseline() -> None:
    def rep(seconds: float, baseline: float) -> Repeat:
        return Repeat(tokens=35, seconds=seconds, baseline_seconds=baseline, drafted_per_position=[20],
                      reached_per_position=[20], accepted_per_position=[15], verify_passes=20, identical_to_baseline=True)

    pairs = [(0.1, 0.4), (0.2, 0.1), (0.4, 0.5)]
    d = derive([rep(s, b) for s, b in pairs], 0.0, 1, None)
    own = [b / s for s, b in pairs]
    assert d.speedup == pytest.approx(statistics.median(own))
    assert (d.speedup_slowest_repeat, d.speedup_fastest_repeat) == pytest.approx((min(own), max(own)))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_the_stamp_says_what_the_tree_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """atlas_commit and atlas_tree_dirty against a repository the test controls: clean, then a
    tracked file edited."""
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "one")
    monkeypatch.setattr(stamp, "ROOT", tmp_path)
    clean = stamp.software()
    assert clean.atlas_commit == git(tmp_path, "rev-parse", "HEAD").strip() and clean.atlas_tree_dirty is False
    (tmp_path / "a.txt").write_text("two\n")
    assert stamp.software().atlas_tree_dirty is True


def test_a_run_over_two_prompts_and_two_repeats_records_what_happened(tmp_path: Path) -> None:
    """Every cell's per-repeat counts equal an independent rerun of each prompt with the seed that
    run used, summed; each headline speed-up is the median of its repeats' own pairs; the settings
    and the stamp say what was asked and what the tree is."""
    folder = write_checkpoint("mimo", tmp_path / "ckpt", "oracle", depth=2, noise=0.6, draft_scale=0.7)
    options = Options(model=str(folder), device="cpu", workloads=["templated"], temperatures=(0.0, 1.0), draft_tokens=(2,),
                      max_new_tokens=12, repeats=2, prompts_per_workload=2, seed=3, top_k=50, top_p=0.9, peer=False,
                      out=tmp_path / "out", command="test")
    record, _ = run(options, log=lambda _: None)
    assert (record.settings.top_k, record.settings.top_p) == (50, 0.9)
    assert (record.settings.repeats, record.settings.prompts_per_workload, record.settings.temperatures) == (2, 2, [0.0, 1.0])
    status = subprocess.run(["git", "-C", str(stamp.ROOT), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, check=True).stdout
    assert record.software.atlas_tree_dirty == bool(status.strip())

    loaded = load_checkpoint(str(folder), CPU, torch.float32)
    workload = load_prompt_set().get(["templated"])[0]
    prompts = [loaded.tokenizer.encode(p, add_special_tokens=False)[-MAX_PROMPT_TOKENS:] for p in workload.prompts[:2]]
    fused = build_fused_model(loaded.model, loaded.mtp, max(map(len, prompts)) + 16, prompts[0][:64])
    assert len(record.cells) == 2
    for cell in record.cells:
        s = Sampling(cell.temperature, 50, 0.9)
        assert len(cell.repeats) == 2
        for r, got in enumerate(cell.repeats):
            runs = [generate_speculative(fused, p, 12, 2, s, torch.Generator().manual_seed(seed_for(3, cell.temperature, "templated", i, r, 2)))
                    for i, p in enumerate(prompts)]
            assert got.drafted_per_position == [sum(x.drafted_per_position[j] for x in runs) for j in range(2)]
            assert got.accepted_per_position == [sum(x.accepted_per_position[j] for x in runs) for j in range(2)]
            assert got.reached_per_position == [sum(x.reached_per_position[j] for x in runs) for j in range(2)]
            assert (got.verify_passes, got.tokens) == (sum(x.verify_passes for x in runs), sum(len(x.tokens) - 1 for x in runs))
        own = [x.baseline_seconds / x.seconds for x in cell.repeats]
        assert cell.derived.speedup == pytest.approx(statistics.median(own))
        assert (cell.derived.speedup_slowest_repeat, cell.derived.speedup_fastest_repeat) == pytest.approx((min(own), max(own)))
    # drafts right often but not always, and prompts that differ: counts a slip would change
    assert all(0 < c.derived.acceptance_rate < 1 for c in record.cells), [c.derived.acceptance_rate for c in record.cells]


def test_every_planted_bug_still_has_its_spot() -> None:
    """benchmarks/mutants.py patches each mutant's text in its module, which must occur exactly once:
    a refactor that moves the code would otherwise leave the mutant unrunnable (an error, not a catch)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("mutants", Path(__file__).resolve().parents[1] / "benchmarks" / "mutants.py")
    mutants = importlib.util.module_from_spec(spec)
    sys.modules["mutants"] = mutants  # its dataclasses look their module up there
    spec.loader.exec_module(mutants)
    for m in mutants.MUTANTS:
        source = Path(importlib.util.find_spec(m.module).origin).read_text()
        assert source.count(m.old) == 1, (m.name, m.module, source.count(m.old))
        assert m.old != m.new, m.name
