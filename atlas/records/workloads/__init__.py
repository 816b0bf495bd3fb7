"""The bundled prompt sets. The default (prompts.json, for the byte-level team model): workloads that
span the entropy of the continuation, from templated records (drafts almost always right) to random
bytes (drafts almost never right). chat.json: instructions for a real chat model (the SmolLM2 team
model), in Spec-Bench / SPEED-Bench categories, each prompt sent as one user turn through the
checkpoint's chat template. A record names the set and the sha256 of its file, which fixes the
random prompts too (they come from its seed)."""

from __future__ import annotations

import hashlib
import random
import string
from importlib import resources
from typing import Any

from pydantic import BaseModel, Field

from atlas import AtlasError


class Generator(BaseModel):
    kind: str
    seed: int
    length: int = Field(gt=0)
    count: int = Field(gt=0)


class Workload(BaseModel):
    name: str
    entropy: str
    prompts: list[str] = []
    generator: Generator | None = None


class PromptSet(BaseModel):
    name: str
    description: str
    workloads: list[Workload]
    # each prompt is one user turn through the checkpoint's chat template (else plain text)
    chat_template: bool = False
    digest: str = ""

    def encode(self, tokenizer: Any, text: str) -> list[int]:
        """Token ids of one prompt as the model is given it."""
        if not self.chat_template:
            return tokenizer.encode(text, add_special_tokens=False)
        if not getattr(tokenizer, "chat_template", None):
            raise AtlasError(f"prompt set {self.name!r} uses the chat template, and this checkpoint's tokenizer has none")
        return chat_ids(tokenizer, text)

    def encode_workloads(self, tokenizer: Any, workloads: list[Workload], per_workload: int, max_tokens: int) -> dict[str, list[list[int]]]:
        """The first `per_workload` prompts of each workload as token ids, each cut to its last
        `max_tokens` tokens."""
        return {w.name: [self.encode(tokenizer, p)[-max_tokens:] for p in w.prompts[:per_workload]] for w in workloads}

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


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """One user turn in the tokenizer's chat template, ready for the assistant's answer."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


# prompt set name -> its file in this package
PROMPT_SETS = {"atlas-entropy-v1": "prompts.json", "atlas-chat-v1": "chat.json"}
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
