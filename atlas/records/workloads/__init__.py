"""The bundled prompt sets. The default (prompts.json, for the byte-level team model): workloads that
span the entropy of the continuation, from templated records (drafts almost always right) to random
bytes (drafts almost never right). chat.json: instructions for a real chat model (the SmolLM2 team
model), in Spec-Bench / SPEED-Bench categories, each prompt sent as one user turn through the
checkpoint's chat template. categories.json: 16 prompts in each of the ten categories that move
acceptance most (code, math, extraction / RAG, summarisation, translation, creative writing,
multi-turn chat, long context, reasoning, QA), for a gate and figures per category over prompts
as the sampling unit. A record names the set and the sha256 of its file, which fixes the random
prompts too (they come from its seed)."""

from __future__ import annotations

import hashlib
import random
import string
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field, model_validator

from atlas import AtlasError


class Generator(BaseModel):
    kind: str
    seed: int
    length: int = Field(gt=0)
    count: int = Field(gt=0)


class Workload(BaseModel):
    name: str
    entropy: str
    # a prompt is one user turn, or a conversation: user, assistant, ..., user (the model answers the last)
    prompts: list[str | list[str]] = []
    generator: Generator | None = None
    # the longest prompt the workload is measured with, where it needs more than the run's cut
    # (a long-context category); None: the run's cut (options.MAX_PROMPT_TOKENS)
    max_prompt_tokens: int | None = Field(default=None, gt=0, le=1_000_000)

    @property
    def texts(self) -> list[str]:
        """Every text the workload sends: each prompt, each turn of a conversation."""
        return [t for p in self.prompts for t in ([p] if isinstance(p, str) else p)]

    @model_validator(mode="after")
    def _conversations(self) -> "Workload":
        for p in self.prompts:
            if isinstance(p, list) and len(p) % 2 == 0:
                raise ValueError(f"workload {self.name!r}: a conversation alternates user and assistant turns and ends with "
                                 f"the user's, so it has an odd number of turns, not {len(p)}")
        return self


class PromptSet(BaseModel):
    name: str
    description: str
    workloads: list[Workload]
    # each prompt is one user turn through the checkpoint's chat template (else plain text)
    chat_template: bool = False
    digest: str = ""

    @model_validator(mode="after")
    def _plain_text(self) -> "PromptSet":
        if not self.chat_template and any(isinstance(p, list) for w in self.workloads for p in w.prompts):
            raise ValueError(f"prompt set {self.name!r}: a conversation needs the chat template")
        return self

    def encode(self, tokenizer: Any, text: str | list[str]) -> list[int]:
        """Token ids of one prompt as the model is given it."""
        if not self.chat_template:
            if not isinstance(text, str):
                raise AtlasError(f"prompt set {self.name!r}: a conversation needs the chat template")
            return tokenizer.encode(text, add_special_tokens=False)
        if not getattr(tokenizer, "chat_template", None):
            raise AtlasError(f"prompt set {self.name!r} uses the chat template, and this checkpoint's tokenizer has none")
        return chat_ids(tokenizer, text)

    def encode_workloads(self, tokenizer: Any, workloads: list[Workload], per_workload: int, max_tokens: int) -> dict[str, list[list[int]]]:
        """The first `per_workload` prompts of each workload as token ids, each cut to its last
        `max_tokens` tokens (or the workload's own max_prompt_tokens, a long-context category's)."""
        return {w.name: [self.encode(tokenizer, p)[-(w.max_prompt_tokens or max_tokens):] for p in w.prompts[:per_workload]]
                for w in workloads}

    def get(self, names: list[str] | None) -> list[Workload]:
        if not names:
            return self.workloads
        known = {w.name: w for w in self.workloads}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise AtlasError(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(known)}")
        return [known[n] for n in names]


def _printable(gen: Generator) -> list[str]:
    if gen.kind != "printable-ascii":
        raise AtlasError(f"unknown prompt generator {gen.kind!r}")
    rng = random.Random(gen.seed)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " "
    return ["".join(rng.choice(alphabet) for _ in range(gen.length)) for _ in range(gen.count)]


def chat_ids(tokenizer: Any, text: str | list[str]) -> list[int]:
    """One user turn (or a conversation: user, assistant, ..., user) in the tokenizer's chat
    template, ready for the assistant's answer."""
    turns = [text] if isinstance(text, str) else text
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


# prompt set name -> its file in this package
PROMPT_SETS = {"atlas-entropy-v1": "prompts.json", "atlas-chat-v1": "chat.json", "atlas-categories-v1": "categories.json"}
DEFAULT_PROMPT_SET = "atlas-entropy-v1"


def load_prompt_set(name: str | None = None) -> PromptSet:
    """The bundled prompt set `name` (default: atlas-entropy-v1); AtlasError naming the known ones."""
    name = name or DEFAULT_PROMPT_SET
    if name not in PROMPT_SETS:
        raise AtlasError(f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}")
    raw = resources.files(__package__).joinpath(PROMPT_SETS[name]).read_bytes()
    prompt_set = PromptSet.model_validate_json(raw)
    if prompt_set.name != name:
        raise AtlasError(f"{PROMPT_SETS[name]} names its set {prompt_set.name!r}, expected {name!r}")
    prompt_set.digest = hashlib.sha256(raw).hexdigest()
    for workload in prompt_set.workloads:
        if workload.generator is not None:
            workload.prompts = _printable(workload.generator)
        if not workload.prompts:
            raise AtlasError(f"workload {workload.name!r} has no prompts")
    return prompt_set
