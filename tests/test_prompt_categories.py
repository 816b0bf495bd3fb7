"""The category prompt set (atlas-categories-v1): the ten categories that move acceptance most, 16
project-written prompts each (the count tests/test_gate_level.py justifies), multi-turn prompts
sent as conversations and a long-context category that is not cut to the run's short prompt cap."""

from __future__ import annotations

import pytest

from atlas import AtlasError
from atlas.checkpoints.team_corpus import build_tokenizer
from atlas.engines.options import MAX_PROMPT_TOKENS
from atlas.records.workloads import PromptSet, Workload, load_prompt_set
from test_gate_level import Design

CATEGORIES = ["code", "math", "extraction", "summarise", "translate", "creative", "multiturn", "longcontext", "reasoning", "qa"]
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


def test_ten_categories_of_sixteen_distinct_prompts() -> None:
    s = load_prompt_set("atlas-categories-v1")
    assert s.chat_template and [w.name for w in s.workloads] == CATEGORIES
    every = [str(p) for w in s.workloads for p in w.prompts]
    assert all(len(w.prompts) == Design().prompts == 16 for w in s.workloads)
    assert len(set(every)) == len(every) and all(every)
    turns = {w.name: {len(p) if isinstance(p, list) else 1 for p in w.prompts} for w in s.workloads}
    assert turns["multiturn"] == {3} and all(t == {1} for name, t in turns.items() if name != "multiturn")


def test_conversations_and_long_prompts_reach_the_model_whole() -> None:
    s = load_prompt_set("atlas-categories-v1")
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TEMPLATE
    workloads = s.get(["multiturn", "longcontext", "qa"])
    ids = s.encode_workloads(tokenizer, workloads, 2, MAX_PROMPT_TOKENS)  # byte-level: one token a byte
    first = workloads[0].prompts[0]
    text = tokenizer.decode(s.encode(tokenizer, first))
    assert text.index(first[0]) < text.index(first[1]) < text.index(first[2]) and text.endswith("<|assistant|>")
    assert "<|user|>" + first[0] in text and "<|assistant|>" + first[1] in text
    long = workloads[1]
    assert long.max_prompt_tokens and all(MAX_PROMPT_TOKENS < len(p) <= long.max_prompt_tokens for p in ids["longcontext"])
    assert all(len(p) <= MAX_PROMPT_TOKENS for p in ids["qa"])


def test_a_conversation_must_end_with_the_user_and_needs_the_chat_template() -> None:
    with pytest.raises(ValueError, match="odd number of turns, not 2"):
        Workload(name="w", entropy="e", prompts=[["hi", "hello"]])
    with pytest.raises(ValueError, match="a conversation needs the chat template"):
        PromptSet(name="p", description="d", workloads=[Workload(name="w", entropy="e", prompts=[["hi", "hello", "bye"]])])
    plain = PromptSet(name="p", description="d", workloads=[Workload(name="w", entropy="e", prompts=["hi"])])
    with pytest.raises(AtlasError, match="needs the chat template"):
        plain.encode(build_tokenizer(), ["hi", "hello", "bye"])
