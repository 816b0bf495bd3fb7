"""The instructions the real team model answers to make its MTP head's training data (prompts.json).

The file holds hand-written prompts, templates with lists of slot values, and templates whose slots
are seeded numbers or random characters; `expand` turns it into one list, deterministically from the
file and its seed. Summarise prompts come in a second stage: they wrap passages that the main model
itself wrote in the first, so the set needs no borrowed text (`summarise_prompts`).

The measurement prompts (atlas.records.workloads) must never be trained on: `overlaps` finds any
training prompt that shares a run of OVERLAP_WORDS words with one of them, and the tests assert that
there is none.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import string
from dataclasses import dataclass
from importlib import resources
from typing import Any

from atlas import AtlasError

FILE = "prompts.json"
OVERLAP_WORDS = 9  # a shared run this long is a copied prompt, not a shared opening ("Write a Python function that checks whether two")


@dataclass(frozen=True)
class Prompt:
    category: str
    text: str


def raw(name: str = FILE) -> bytes:
    """A JSON file of this package (prompts.json, or wraps.json for wraps.py) as committed."""
    return resources.files(__package__).joinpath(name).read_bytes()


def digest(name: str = FILE) -> str:
    return hashlib.sha256(raw(name)).hexdigest()


def _spec() -> dict[str, Any]:
    return json.loads(raw())


def _random_chars(rng: random.Random) -> str:
    alphabet = string.ascii_letters + string.digits + "#$%&@!?*+="
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(16, 40)))


def _numeric(category: str, block: dict[str, Any], rng: random.Random) -> list[Prompt]:
    """Each template `per_template` times, every slot drawn from its [low, high] range (or random
    characters for "random"); a repeated draw is skipped, so the prompts are distinct."""
    out: list[Prompt] = []
    for entry in block["templates"]:
        seen: set[str] = set()
        for _ in range(50 * block["per_template"]):
            if len(seen) == block["per_template"]:
                break
            slots = {k: _random_chars(rng) if v == "random" else str(rng.randint(v[0], v[1])) for k, v in entry["ranges"].items()}
            text = entry["template"].format(**slots)
            if text not in seen:
                seen.add(text)
                out.append(Prompt(category, text))
    return out


def _templated(category: str, blocks: list[dict[str, Any]]) -> list[Prompt]:
    return [Prompt(category, t.format(x=x)) for b in blocks for x, t in itertools.product(b["slots"], b["templates"])]


def expand() -> list[Prompt]:
    """Every first-stage prompt, in file order: hand-written, templated, numeric, then the passages
    that the summarise stage wraps."""
    spec = _spec()
    rng = random.Random(spec["seed"])
    out = [Prompt(c, t) for c, texts in spec["handwritten"].items() for t in texts]
    for category, blocks in spec["templated"].items():
        out += _templated(category, blocks)
    for category, block in spec["numeric"].items():
        out += _numeric(category, block, rng)
    s = spec["summarise"]
    out += _templated(s["passage_category"], s["passage_prompts"])
    texts = [p.text for p in out]
    if len(set(texts)) != len(texts):
        dup = next(t for t in texts if texts.count(t) > 1)
        raise AtlasError(f"{FILE}: prompt {dup!r} appears twice")
    return out


def passage_category() -> str:
    return str(_spec()["summarise"]["passage_category"])


def summarise_prompts(passages: list[str]) -> list[Prompt]:
    """Second stage: each passage the main model wrote, wrapped in the summarise instructions in turn."""
    instructions = _spec()["summarise"]["instructions"]
    return [Prompt("summarise", instructions[i % len(instructions)].format(p=p.strip())) for i, p in enumerate(passages) if p.strip()]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def overlaps(training: list[str], measured: list[str], n: int = OVERLAP_WORDS) -> list[tuple[str, str]]:
    """(training prompt, measurement prompt) pairs that are equal after case folding or share a run of
    `n` words."""
    def grams(text: str) -> set[tuple[str, ...]]:
        w = _words(text)
        return {tuple(w[i:i + n]) for i in range(max(1, len(w) - n + 1))}

    index: dict[tuple[str, ...], str] = {}
    for m in measured:
        for g in grams(m):
            index.setdefault(g, m)
    out = []
    for t in training:
        hit = next((index[g] for g in grams(t) if g in index), None)
        if hit is not None:
            out.append((t, hit))
    return out
