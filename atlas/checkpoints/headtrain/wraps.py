"""Training prompts that wrap the main model's own answers (wraps.json): translation, a
conversation's third turn, long context and extraction, the kinds of text the head's first data
(prompts.json) lacked and the measurement categories hold.

Each wrap is built from greedy answers of a committed data folder (data.py), so the set borrows no
text: a sentence of an answer to translate, a prompt and its answer followed by a third turn, an
answer with an extraction request, or several answers as numbered sections with a question about
one. A wrap of a held-out answer is held out, and a long-context wrap holds only held-out answers
or none, so no held-out text is trained on. Every wrap is checked against the measurement prompts
(prompts.overlaps); one that shares a run of words with one is dropped and counted.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atlas import AtlasError
from atlas.checkpoints.headtrain import prompts as prompt_file
from atlas.checkpoints.headtrain.data import Sequence

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FILE = "wraps.json"
KINDS = ("translate", "multiturn", "extraction", "longcontext")
LOOP_RATIO = 0.35  # distinct words per word below which an answer counts as stuck in a loop


@dataclass(frozen=True)
class Source:
    """One greedy answer of the source data: what was asked (None for a second-stage prompt, whose
    request is itself a wrap) and what the model answered."""

    category: str
    request: str | None
    answer: str
    heldout: bool


@dataclass(frozen=True)
class Wrap:
    category: str
    turns: tuple[str, ...]  # user, assistant, user, ...: the model answers the last
    heldout: bool


def digest() -> str:
    return prompt_file.digest(FILE)


def spec() -> dict[str, Any]:
    return json.loads(prompt_file.raw(FILE))


def sources(sequences: list[Sequence], side: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> list[Source]:
    """The greedy answers of a data folder made from prompts.json, each with its request. The data's
    sequences run in prompt order (data.generate), so the first stage's greedy answers pair with
    prompts.expand(); the pairing is checked token for token, and a folder made from another prompt
    file is refused."""
    from atlas.records.workloads import chat_ids

    if side.get("prompts_sha256") != prompt_file.digest():
        raise AtlasError(f"the source data was made from prompts sha256 {str(side.get('prompts_sha256'))[:12]}…, not this "
                         f"package's prompts.json ({prompt_file.digest()[:12]}…): its answers cannot be paired with requests")
    per_prompt = 1 + int(side["spec"]["samples"])
    first = prompt_file.expand()[: side["spec"].get("prompt_limit")]
    out = []
    for n, s in enumerate(sequences[::per_prompt]):
        request = first[n].text if n < len(first) else None
        if request is not None and chat_ids(tokenizer, request) != s.ids[: s.prompt_len]:
            raise AtlasError(f"the source data's sequence {n * per_prompt} does not hold prompts.json's prompt {n}: "
                             "its answers cannot be paired with requests")
        out.append(Source(s.category, request, tokenizer.decode(s.ids[s.prompt_len:], skip_special_tokens=True).strip(), s.heldout))
    return out


def _sentences(text: str, max_words: int) -> str:
    """The leading whole sentences of `text` within `max_words` words (at least the first sentence,
    cut at `max_words` words if it alone is longer)."""
    kept: list[str] = []
    words = 0
    for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
        n = len(sentence.split())
        if kept and words + n > max_words:
            break
        kept.append(sentence if n <= max_words else " ".join(sentence.split()[:max_words]))
        words += min(n, max_words)
    return " ".join(kept)


def _eligible(pool: list[Source], block: dict[str, Any], min_words: int, needs_request: bool) -> list[Source]:
    """Answers of the block's categories, long enough, not stuck in a loop (a loop's repeats are
    easy drafts that would flatter the head), with a request where the wrap quotes it."""
    def varied(words: list[str]) -> bool:
        return len(set(words)) >= LOOP_RATIO * len(words)

    return [s for s in pool if s.category in block["sources"] and len(s.answer.split()) >= min_words
            and varied(s.answer.lower().split()) and (s.request is not None or not needs_request)]


def _pick(rng: random.Random, pool: list[Source], count: int) -> list[Source]:
    if not pool:
        return []
    order = rng.sample(pool, len(pool))
    return [order[i % len(order)] for i in range(count)]


def _singles(kind: str, block: dict[str, Any], picked: list[Source]) -> list[Wrap]:
    out = []
    for i, s in enumerate(picked):
        text = _sentences(s.answer, block["max_words"])
        if kind == "translate":
            langs, how = block["languages"], block["instructions"]
            turns: tuple[str, ...] = (how[(i // len(langs)) % len(how)].format(lang=langs[i % len(langs)], text=text),)
        elif kind == "multiturn":
            assert s.request is not None
            turns = (s.request, text, block["follow_ups"][i % len(block["follow_ups"])])
        else:
            how = block["instructions"]
            turns = (how[i % len(how)].format(text=text, request=s.request),)
        out.append(Wrap(kind, turns, s.heldout))
    return out


def _long(block: dict[str, Any], rng: random.Random, pool: list[Source]) -> list[Wrap]:
    """Numbered sections of answers drawn from held-out answers only or from training answers only,
    in proportion to the two pools, each with a question about one section."""
    k = block["sections"]
    held = [s for s in pool if s.heldout]
    train = [s for s in pool if not s.heldout]
    n_held = round(block["count"] * len(held) / max(1, len(pool)))
    out = []
    for heldout, part, count in ((True, held, n_held), (False, train, block["count"] - n_held)):
        if len(part) < k:
            continue
        for g in range(count):
            group = rng.sample(part, k)
            n = 1 + g % k
            notes = "\n\n".join(f"Section {j + 1}. {_sentences(s.answer, block['max_words'])}" for j, s in enumerate(group))
            question = block["questions"][g % len(block["questions"])].format(n=n, request=group[n - 1].request)
            out.append(Wrap("longcontext", (f"{block['opening']}\n\n{notes}\n\nQuestion: {question}",), heldout))
    return out


def build(pool: list[Source], measured: list[str]) -> tuple[list[Wrap], int]:
    """Every wrap of wraps.json over `pool`, deterministically from the file's seed, and how many
    were dropped for sharing a run of words with a measurement prompt."""
    s = spec()
    rng = random.Random(s["seed"])
    wraps: list[Wrap] = []
    for kind in KINDS:
        block = s[kind]
        eligible = _eligible(pool, block, s["min_words"], needs_request=kind != "translate")
        if kind == "longcontext":
            wraps += _long(block, rng, eligible)
        else:
            wraps += _singles(kind, block, _pick(rng, eligible, block["count"]))
    flagged = {t for t, _ in prompt_file.overlaps(["\n".join(w.turns) for w in wraps], measured)}
    kept = [w for w in wraps if "\n".join(w.turns) not in flagged]
    return kept, len(wraps) - len(kept)
