"""The head's second training data (atlas.checkpoints.headtrain.wraps and wrapdata): wraps of the
main model's own answers, built deterministically, held out with what they wrap, kept apart from
every measurement prompt; their answers through llama-server keep the prompts' order, one seed each;
and a head trains on several data folders, each folder's teacher pass cached apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from atlas import AtlasError
from atlas.checkpoints.headtrain import data, prompts, wrapdata, wraps
from atlas.checkpoints.headtrain.wraps import Source
from atlas.records.workloads import bundled_texts

MEASURED = bundled_texts()


def answer(i: int, words: int = 40) -> str:
    """A varied answer of `words` words in sentences of eight, every word marked as answer `i`'s."""
    return " ".join(f"a{i}w{j}" + ("." if (j + 1) % 8 == 0 else "") for j in range(words))


def quoted_in(text: str, src: list[Source]) -> list[Source]:
    return [s for n, s in enumerate(src) if re.search(rf"\ba{n}w\d", text)]


def pool(n: int = 60) -> list[Source]:
    cats = ["chat", "qa", "writing", "passages", "code", "math", "summarise"]
    return [Source(cats[i % len(cats)], None if cats[i % len(cats)] == "summarise" else f"request number {i}", answer(i),
                   i % 5 == 4) for i in range(n)]


def test_wraps_are_deterministic_cover_every_kind_and_keep_held_out_text_held_out() -> None:
    src = pool()
    kept, dropped = wraps.build(src, MEASURED)
    again, _ = wraps.build(src, MEASURED)
    assert kept == again and dropped == 0
    spec = wraps.spec()
    counts = {k: sum(w.category == k for w in kept) for k in wraps.KINDS}
    assert counts == {k: spec[k]["count"] for k in wraps.KINDS}
    for w in kept:
        quoted = quoted_in("\n".join(w.turns), src)  # every answer a wrap quotes is held out exactly when the wrap is
        assert quoted and all(s.heldout == w.heldout for s in quoted), w
        if w.category == "multiturn":
            assert len(quoted) == 1 and w.turns[0] == quoted[0].request and w.turns[2] in spec["multiturn"]["follow_ups"]
        if w.category == "longcontext":
            assert len(quoted) == spec["longcontext"]["sections"]
        if w.category != "translate":
            assert all(s.request is not None for s in quoted)  # a summarise answer has no request to quote
    assert any(w.heldout for w in kept) and not all(w.heldout for w in kept)


def test_an_answer_stuck_in_a_loop_or_too_short_is_never_wrapped() -> None:
    src = [*pool(30), Source("chat", "loop", " ".join(["all work and no play"] * 20), False),
           Source("qa", "short", "Only five words here, friend.", False)]
    kept, _ = wraps.build(src, MEASURED)
    assert not any("all work and no play" in "\n".join(w.turns) or "Only five words" in "\n".join(w.turns) for w in kept)


def test_a_wrap_that_would_quote_a_measurement_prompt_is_dropped_and_counted() -> None:
    copied = next(t for t in MEASURED if len(t.split()) >= 20)
    src = [Source("passages", "copy", copied, False)] + pool(40)
    kept, dropped = wraps.build(src, MEASURED)
    assert dropped > 0 and not prompts.overlaps(["\n".join(w.turns) for w in kept], MEASURED)


def test_no_instruction_of_the_file_overlaps_a_measurement_prompt() -> None:
    spec = wraps.spec()
    filled = [t.format(lang="French", text="a passage", request="a request", n=1) for kind in ("translate", "extraction")
              for t in spec[kind]["instructions"]]
    filled += spec["multiturn"]["follow_ups"] + [spec["longcontext"]["opening"]]
    filled += [q.format(n=2, request="a request") for q in spec["longcontext"]["questions"]]
    assert prompts.overlaps(filled, MEASURED) == []


def test_sources_refuse_data_made_from_another_prompt_file_or_paired_wrongly() -> None:
    from atlas.checkpoints.team_corpus import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    side = {"prompts_sha256": "0" * 64, "spec": {"samples": 1}}
    with pytest.raises(AtlasError, match="cannot be paired"):
        wraps.sources([], side, tokenizer)
    side = {"prompts_sha256": prompts.digest(), "spec": {"samples": 0}}
    wrong = data.Sequence([1, 2, 3, 4], 2, "chat", "greedy", False)
    with pytest.raises(AtlasError, match="does not hold prompts.json's prompt 0"):
        wraps.sources([wrong], side, tokenizer)


def test_answers_keep_the_prompts_order_and_take_one_seed_each() -> None:
    calls: list[tuple] = []

    def complete(prompt: list[int], t: float, seed: int, n: int) -> list[int]:  # what plain_answers' callable takes
        calls.append((t, seed, n))
        return [prompt[0], seed]

    encoded = [[i, 7] for i in range(10)]
    spec = wrapdata.WrapSpec(parallel=3, max_new_tokens=32)
    got = wrapdata.answer_all(complete, encoded, True, 5, spec, lambda _: None)
    assert [g[0] for g in got] == list(range(10)) and len({g[1] for g in got}) == 10
    assert all(t == 1.0 and n == 32 for t, _, n in calls)
    wrapdata.answer_all(complete, encoded[:1], False, 5, spec, lambda _: None)
    assert calls[-1][0] == 0.0


def test_a_head_trains_on_several_data_folders_and_refuses_the_same_data_twice(tmp_path: Path) -> None:
    from atlas.checkpoints import headtrain
    from test_headtrain import random_sequences

    first, second = tmp_path / "first", tmp_path / "second"
    a, b = random_sequences(6, seed=1), random_sequences(4, seed=2)
    data.save(a, data.DataSpec(), first, "atlas real-model-head-data", 1.0)
    data.save(b, wrapdata.WrapSpec(), second, "atlas real-model-head-wraps", 1.0, {"prompts_sha256": wraps.digest()})
    sequences, sides = headtrain.load_data([first, second])
    assert sequences == a + b and [s["prompts_sha256"] for s in sides] == [prompts.digest(), wraps.digest()]
    with pytest.raises(AtlasError, match="given twice"):
        headtrain.load_data([first, first])
    assert json.loads((second / data.SIDECAR).read_text())["spec"]["parallel"] == 16


def test_the_committed_wrap_data_reads_back_and_names_its_source_and_its_wraps() -> None:
    """data/real-heads/smollm2-135m-mtp-v3: the file's sha256 is its sidecar's, it wraps the first
    data as committed, from this package's wraps.json, and the head beside it trained on both."""
    from atlas.checkpoints import smollm

    folder = smollm.ROOT / "data" / "real-heads" / "smollm2-135m-mtp-v3"
    sequences, side = data.load(folder)
    _, first = data.load(smollm.HEAD_DIR)
    assert side["source"] == {"file": f"{smollm.HEAD_DIR.name}/{data.DATA_FILE}", "sha256": first["sha256"]}
    assert side["prompts_sha256"] == wraps.digest() and side["categories"] == sorted(wraps.KINDS)
    assert len(sequences) == side["sequences"] == 2 * side["wraps"]["kept"]
    assert 0 < sum(s.heldout for s in sequences) == side["heldout_sequences"] < len(sequences) / 5
    _, recipe = smollm.read_head(folder)
    assert recipe["data"]["sha256"] == first["sha256"] and [d["sha256"] for d in recipe["data_added"]] == [side["sha256"]]
