"""The bundled prompt set: workloads that span the entropy of the continuation, from templated
records (drafts almost always right) to random bytes (drafts almost never right). A record names the
set and the sha256 of prompts.json, which fixes the random prompts too (they come from its seed)."""

from __future__ import annotations

import hashlib
import random
import string
from importlib import resources

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
    digest: str = ""

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


def load_prompt_set() -> PromptSet:
    raw = resources.files(__package__).joinpath("prompts.json").read_bytes()
    prompt_set = PromptSet.model_validate_json(raw)
    prompt_set.digest = hashlib.sha256(raw).hexdigest()
    for workload in prompt_set.workloads:
        if workload.generator is not None:
            workload.prompts = _printable(workload.generator)
        if not workload.prompts:
            raise AtlasError(f"workload {workload.name!r} has no prompts")
    return prompt_set
