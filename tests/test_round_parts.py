"""benchmarks/llamacpp_round_parts.py's reading of a server's probe events into a round's parts,
against hand-made event streams with known answers (the perf uprobes themselves need root and a live
server, so the benchmark's run is not a test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import llamacpp_round_parts as parts_of


def stream(*rounds: list[tuple[str, float]]) -> list[tuple[float, str]]:
    """Rounds of (event, seconds after the previous event), each opened by the loop's own event."""
    out, now = [], 0.0
    for r in rounds:
        for name, gap in [("loop", 0.0), *r]:
            now += gap
            out.append((now, name))
    return out


def test_a_k2_round_splits_into_its_drafts_verify_catch_up_and_the_rest() -> None:
    prefill = [("pass", 0.001), ("pass_end", 0.050), ("catchup", 0.001), ("pass", 0.0), ("pass_end", 0.004)]
    k2 = [("draft", 0.001), ("pass", 0.0), ("pass_end", 0.002), ("pass", 0.0), ("pass_end", 0.003),  # two draft steps
          ("pass", 0.001), ("pass_end", 0.025), ("catchup", 0.001), ("pass", 0.0), ("pass_end", 0.0015),
          ("server work", 0.002)]  # an event the reading does not know: only its time counts
    got = parts_of.round_parts(stream(prefill, k2, k2, []))
    # the prompt's round (no pass before the catch-up) is left out, and so is the last, open round
    assert len(got["round"]) == 2
    assert got["draft"][0] == pytest.approx(0.005) and got["verify"][0] == pytest.approx(0.025)
    assert got["catch-up"][0] == pytest.approx(0.0015)
    assert got["round"][0] == pytest.approx(0.0365)  # to the next round's first event
    assert got["outside the passes"][0] == pytest.approx(0.0365 - 0.005 - 0.025 - 0.0015)


def test_a_plain_servers_round_is_its_one_pass() -> None:
    events = stream([("pass", 0.001), ("pass_end", 0.020)], [("pass", 0.002), ("pass_end", 0.021)], [])
    got = parts_of.round_parts(events)
    assert got["verify"] == pytest.approx([0.020, 0.021]) and "draft" not in got
    assert got["outside the passes"] == pytest.approx([0.001, 0.002])
