"""The bundled prompt sets. The default (prompts.json, for the byte-level team model): workloads that
span the entropy of the continuation, from templated records (drafts almost always right) to random
bytes (drafts almost never right). chat.json: instructions for a real chat model (the SmolLM2 team
model), in Spec-Bench / SPEED-Bench categories, each prompt sent as one user turn through the
checkpoint's chat template. categories.json: 16 prompts in each of the ten categories that move
acceptance most (code, math, extraction / RAG, summarisation, translation, creative writing,
multi-turn chat, long context, reasoning, QA), for a gate and figures per category over prompts
as the sampling unit. A record names the set and the sha256 of its file, which fixes the random
prompts too (they come from its seed).

`--prompt-set` also takes a file of the same shape. Its sha256 identifies it in the record, on the
run pages and in the export; a bundled name stands for one file only (BUNDLED_DIGESTS), so an
edited set cannot pass under it. The file is read and checked whole before any model loads, and
every fault in it (size, encoding, JSON, shape, names, empty or oversized prompts) is one line."""

from __future__ import annotations

import hashlib
import json
import random
import string
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from atlas import AtlasError
from atlas.paths import read_bounded
from atlas.records.fields import MAX_LIST, MAX_NAME_CHARS, MAX_PROMPTS, MAX_TEXT_CHARS

MAX_FILE_BYTES = 4 * 2**20  # a prompt-set file; the bundled ones are a few KiB
MAX_PROMPT_CHARS = 65_536  # one prompt: the run keeps only its last 256 tokens anyway
# A set's and a workload's name: it lands in records, pages, file names and charts, so letters,
# digits and _ . + - only, starting with a letter or digit, at most a record's name length.
SetName = Annotated[str, StringConstraints(pattern=rf"^[A-Za-z0-9][A-Za-z0-9_.+\-]{{0,{MAX_NAME_CHARS - 1}}}$")]
Prompt = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PROMPT_CHARS)]
# a conversation: user, assistant, ..., user (the model answers the last turn)
Conversation = Annotated[list[Prompt], Field(min_length=1, max_length=64)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Generator(_Strict):
    kind: str
    seed: int
    length: int = Field(gt=0, le=MAX_PROMPT_CHARS)
    count: int = Field(gt=0, le=MAX_PROMPTS)


class Workload(_Strict):
    name: SetName
    entropy: str = Field(max_length=MAX_TEXT_CHARS)
    # a prompt is one user turn, or a conversation (the model answers its last turn)
    prompts: list[Prompt | Conversation] = Field(default=[], max_length=MAX_PROMPTS)
    generator: Generator | None = None
    # the longest prompt the workload is measured with, where it needs more than the run's cut
    # (a long-context category); None: the run's cut (options.MAX_PROMPT_TOKENS)
    max_prompt_tokens: int | None = Field(default=None, gt=0, le=1_000_000)

    @property
    def texts(self) -> list[str]:
        """Every text the workload sends: each prompt, each turn of a conversation."""
        return [t for p in self.prompts for t in ([p] if isinstance(p, str) else p)]

    @model_validator(mode="after")
    def _prompts(self) -> "Workload":
        if self.generator is not None and self.prompts:
            raise ValueError("has both prompts and a generator")
        if self.generator is None and not self.prompts:
            raise ValueError("has no prompts")
        if any(not p.strip() for p in self.texts):
            raise ValueError("has an empty prompt (only white space)")
        for p in self.prompts:
            if isinstance(p, list) and len(p) % 2 == 0:
                raise ValueError(f"workload {self.name!r}: a conversation alternates user and assistant turns and ends with "
                                 f"the user's, so it has an odd number of turns, not {len(p)}")
        return self


class PromptSet(_Strict):
    name: SetName
    description: str = Field(max_length=MAX_TEXT_CHARS)
    workloads: list[Workload] = Field(min_length=1, max_length=MAX_LIST)
    # each prompt is one user turn through the checkpoint's chat template (else plain text)
    chat_template: bool = False
    digest: str = ""

    @model_validator(mode="after")
    def _unique(self) -> "PromptSet":
        names = [w.name for w in self.workloads]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"names workload {twice[0]!r} more than once")
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


# prompt set name -> its file in this package, and that file's sha256: the name stands for this
# file only (a changed set is a new set, with a name of its own)
PROMPT_SETS = {"atlas-entropy-v1": "prompts.json", "atlas-chat-v1": "chat.json", "atlas-categories-v1": "categories.json"}
BUNDLED_DIGESTS = {
    "atlas-entropy-v1": "8cf2caccd2f50d5358420f7ab87a3649ec21b6aceab92ddca1a87bfb73eccde3",
    "atlas-chat-v1": "8b3d12d199938e68ea2778157aa0a78d1817856db2f6724df3b5ca7923a6277a",
    "atlas-categories-v1": "6cc1e65bbf1ee9a750165b8c34872d0538b5cde4d95138528c6a5519aa67703d",
}
DEFAULT_PROMPT_SET = "atlas-entropy-v1"


def load_prompt_set(name: str | None = None) -> PromptSet:
    """The bundled prompt set `name` (default: atlas-entropy-v1), or the prompt-set file at the path
    `name`; AtlasError (one line) for anything else, naming the known sets."""
    name = name or DEFAULT_PROMPT_SET
    if name in PROMPT_SETS:
        where = f"bundled prompt set {name} ({PROMPT_SETS[name]})"
        raw = resources.files(__package__).joinpath(PROMPT_SETS[name]).read_bytes()
    else:
        where = f"prompt-set file {name}"
        raw = _read_file(Path(name))
    prompt_set = parse_prompt_set(raw, where)
    digest = hashlib.sha256(raw).hexdigest()
    if name in PROMPT_SETS and prompt_set.name != name:
        raise AtlasError(f"{where} names its set {prompt_set.name!r}, expected {name!r}")
    expected = BUNDLED_DIGESTS.get(prompt_set.name)
    if expected is not None and digest != expected:
        raise AtlasError(f"{where}: the set {prompt_set.name} is bundled, and this file's sha256 {digest[:12]} is not "
                         f"its {expected[:12]}: an edited set needs a name of its own (give it as a file)")
    prompt_set.digest = digest
    for workload in prompt_set.workloads:
        if workload.generator is not None:
            workload.prompts = _printable(workload.generator)
    return prompt_set


def bundled_texts() -> list[str]:
    """Every prompt text of every bundled set, every turn of a conversation: what training data
    must never overlap (the head's prompts and wraps are checked against it)."""
    return [t for name in PROMPT_SETS for w in load_prompt_set(name).workloads for t in w.texts]


def _read_file(path: Path) -> bytes:
    known = ", ".join(PROMPT_SETS)
    if not path.is_file():
        raise AtlasError(f"unknown prompt set {str(path)!r}: neither a bundled set ({known}) nor a file")
    return read_bounded(path, MAX_FILE_BYTES, "a prompt set")


def parse_prompt_set(raw: bytes, where: str) -> PromptSet:
    """A prompt set from a file's bytes: strict UTF-8 JSON of the PromptSet shape, or one line."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise AtlasError(f"{where} starts with a UTF-8 byte-order mark: save it as UTF-8 without one")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise AtlasError(f"{where} is not UTF-8 text (byte {exc.start:,} is 0x{raw[exc.start]:02x})") from None
    except json.JSONDecodeError as exc:
        raise AtlasError(f"{where} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise AtlasError(f"{where} is not a prompt set: nested too deeply") from None
    try:
        return PromptSet.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        # a prompt is one text or a conversation: pydantic names the union member tried; the place is enough
        at = ".".join(str(part) for part in first["loc"] if "constrained-str" not in str(part)) or "the file"
        raise AtlasError(f"{where} is not a valid prompt set: {at}: {first['msg']}"[:600]) from None
