"""The head's training data: the main model's own answers to the training prompts, generated in
batches once (`atlas real-model-head-data`, deliberate and slow) and committed as token ids.

Per prompt, one greedy answer and `samples` answers sampled at T = 1 (no top-k, no top-p), each cut
after its first end-of-turn token (which it keeps: drafting the end of a turn is part of decoding).
The prompts come in two stages (atlas.checkpoints.headtrain.prompts): first every prompt of the file,
then summarise prompts wrapping the passages the first stage wrote. Every `heldout_every`-th prompt
of the first stage is held out with all of its answers, and so is every summary of a passage it
wrote, so no held-out text is trained on.

Stored as one safetensors file of integer arrays (`answers.safetensors`: the tokens as uint16, the
offsets, prompt lengths, categories, modes and held-out flags) and a JSON sidecar with the spec,
the file's sha256 and the command that regenerates it. About 2 bytes per token.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from atlas import AtlasError, __version__
from atlas.checkpoints.headtrain import prompts as prompt_file
from atlas.checkpoints.headtrain.prompts import Prompt
from atlas.records.workloads import chat_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DATA_FILE = "answers.safetensors"
SIDECAR = "answers.json"
MODES = ("greedy", "sampled")


class DataSpec(BaseModel):
    """Everything that fixes the generated answers (with the main model, the prompt file and torch)."""

    seed: int = 20261201
    samples: int = Field(default=1, ge=0, le=16)  # T = 1 answers per prompt, besides the greedy one
    max_new_tokens: int = Field(default=192, ge=8, le=2048)
    batch: int = Field(default=48, ge=1, le=1024)
    threads: int = Field(default=1, ge=1, le=256)  # per worker; part of the spec: the thread count changes float sums
    workers: int = Field(default=2, ge=1, le=64)  # processes (the answers do not depend on it)
    # The weights generation runs with. bfloat16 made it 2.3 times faster on the project's CPU; the
    # answers are still the main model's, and every training target is recomputed in fp32 (train.py).
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    heldout_every: int = Field(default=10, ge=2)
    prompt_limit: int | None = Field(default=None, ge=2)  # tests: the first N first-stage prompts only


@dataclass(frozen=True)
class Sequence:
    ids: list[int]
    prompt_len: int
    category: str
    mode: str
    heldout: bool


def _batch_answers(model: Any, tokenizer: PreTrainedTokenizerBase, rows: list[list[int]], sampled: bool, max_new: int,
                   seed: int) -> list[list[int]]:
    """One batch, left-padded; a sampled batch's draws depend only on its seed."""
    import torch

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sampled else {"do_sample": False}
    torch.manual_seed(seed)
    with torch.inference_mode():
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad,
                             cache_implementation="static", **kwargs)
    out = []
    for i in range(len(rows)):
        answer = gen[i, width:].tolist()
        out.append(answer[: answer.index(eos) + 1] if eos in answer else answer)
    return out


_WORKER: dict[str, Any] = {}


def _worker_init(threads: int, dtype: str) -> None:
    import torch

    from atlas.checkpoints import smollm

    torch.set_num_threads(threads)
    model, _WORKER["tokenizer"] = smollm.load_original()
    _WORKER["model"] = model.to(getattr(torch, dtype))


def _worker_batch(job: tuple[list[list[int]], bool, int, int]) -> list[list[int]]:
    rows, sampled, max_new, seed = job
    return _batch_answers(_WORKER["model"], _WORKER["tokenizer"], rows, sampled, max_new, seed)


def _answers(run: Callable[[list[tuple[list[list[int]], bool, int, int]]], Any], encoded: list[list[int]], sampled: bool,
             spec: DataSpec, seed: int, log: Callable[[str], None]) -> list[list[int]]:
    """One answer per prompt, in the prompts' order. Batches hold prompts of similar length (left
    padding wastes less), each seeded from `seed` and its index, so the answers depend only on the
    spec, the prompts and the model, not on which worker ran which batch."""
    order = sorted(range(len(encoded)), key=lambda i: (len(encoded[i]), i))
    batches = [order[s:s + spec.batch] for s in range(0, len(order), spec.batch)]
    jobs = [([encoded[i] for i in rows], sampled, spec.max_new_tokens, seed * 1000 + b) for b, rows in enumerate(batches)]
    out: list[list[int]] = [[] for _ in encoded]
    done = 0
    for rows, answers in zip(batches, run(jobs)):
        for i, answer in zip(rows, answers):
            out[i] = answer
        done += len(rows)
        log(f"  {'sampled' if sampled else 'greedy'}: {done}/{len(order)} answers")
    return out


def generate(tokenizer: PreTrainedTokenizerBase, spec: DataSpec, log: Callable[[str], None] = print) -> list[Sequence]:
    """Both stages' answers, greedy and `samples` sampled per prompt, in `spec.workers` processes
    of `spec.threads` threads each (each loads the main model: one thread per process beats
    OpenMP threads that wait on each other on a busy machine)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(spec.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                             initargs=(spec.threads, spec.dtype)) as pool:
        def run(jobs: list[tuple[list[list[int]], bool, int, int]]) -> Any:
            return pool.map(_worker_batch, jobs)

        first = prompt_file.expand()[: spec.prompt_limit]
        held = [i % spec.heldout_every == spec.heldout_every - 1 for i in range(len(first))]
        seqs = _stage(run, tokenizer, first, held, spec, 0, log)
        per_prompt = 1 + spec.samples
        passages = [(s, held[n // per_prompt]) for n, s in enumerate(seqs) if s.category == prompt_file.passage_category()]
        texts = [tokenizer.decode(s.ids[s.prompt_len:], skip_special_tokens=True) for s, _ in passages]
        second = prompt_file.summarise_prompts(texts)
        second_held = [h for (_, h), t in zip(passages, texts) if t.strip()]
        return seqs + _stage(run, tokenizer, second, second_held, spec, 1, log)


def _stage(run: Callable[..., Any], tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], held: list[bool], spec: DataSpec,
           stage: int, log: Callable[[str], None]) -> list[Sequence]:
    """Sequences in prompt order, each prompt's greedy answer then its sampled ones."""
    log(f"stage {stage + 1}: {len(prompts)} prompts x {1 + spec.samples} answers")
    encoded = [chat_ids(tokenizer, p.text) for p in prompts]
    per_mode = [_answers(run, encoded, m > 0, spec, spec.seed + 100 * stage + m, log) for m in range(1 + spec.samples)]
    return [Sequence(encoded[i] + per_mode[m][i], len(encoded[i]), p.category, MODES[min(m, 1)], held[i])
            for i, p in enumerate(prompts) for m in range(1 + spec.samples)]


# ---- the committed file ------------------------------------------------------------------------


def versions() -> dict[str, str]:
    """The software a file of this package's making depends on (the data, a head, an ablation)."""
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def save(sequences: list[Sequence], spec: BaseModel, out: Path, command: str, seconds: float,
         about: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sequences as answers.safetensors and its sidecar; `about` replaces the sidecar's "what"
    and "prompts_sha256" and adds facts (the wraps of wrapdata.py: their source and engine)."""
    import numpy as np
    from safetensors.numpy import save_file

    categories = sorted({s.category for s in sequences})
    tokens = np.array([t for s in sequences for t in s.ids], dtype=np.uint16)
    if tokens.size and int(tokens.max()) != max(t for s in sequences for t in s.ids):
        raise AtlasError("a token id does not fit in 16 bits")
    arrays = {
        "tokens": tokens,
        "offsets": np.cumsum([0] + [len(s.ids) for s in sequences], dtype=np.int64),
        "prompt_len": np.array([s.prompt_len for s in sequences], dtype=np.int32),
        "category": np.array([categories.index(s.category) for s in sequences], dtype=np.uint8),
        "mode": np.array([MODES.index(s.mode) for s in sequences], dtype=np.uint8),
        "heldout": np.array([s.heldout for s in sequences], dtype=np.uint8),
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / DATA_FILE
    tmp = path.with_suffix(".tmp")
    save_file(arrays, str(tmp), metadata={"format": "np"})
    tmp.replace(path)
    side = {
        "what": "the main model's own answers to atlas/checkpoints/headtrain/prompts.json: the MTP head's training data",
        "command": command,
        "atlas_version": __version__,
        "spec": spec.model_dump(),
        "prompts_sha256": prompt_file.digest(),
        "categories": categories,
        "modes": list(MODES),
        "sequences": len(sequences),
        "heldout_sequences": sum(s.heldout for s in sequences),
        "tokens": int(tokens.size),
        "answer_tokens": sum(len(s.ids) - s.prompt_len for s in sequences),
        "answer_tokens_per_category": {c: sum(len(s.ids) - s.prompt_len for s in sequences if s.category == c) for c in categories},
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "seconds": round(seconds, 1),
        "versions": versions(),
        **(about or {}),
    }
    (out / SIDECAR).write_text(json.dumps(side, indent=1) + "\n")
    return side


def load(folder: Path) -> tuple[list[Sequence], dict[str, Any]]:
    """The committed answers, the file's sha256 checked against its sidecar's."""
    from safetensors.numpy import load_file

    path, side_path = folder / DATA_FILE, folder / SIDECAR
    if not path.is_file() or not side_path.is_file():
        raise AtlasError(f"{folder}: no training data ({DATA_FILE} + {SIDECAR}); generate it with `make real-model-head-data`")
    side = json.loads(side_path.read_text())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != side.get("sha256"):
        raise AtlasError(f"{path}: sha256 {digest}, but {SIDECAR} records {side.get('sha256')}")
    a = load_file(str(path))
    tokens, offsets = a["tokens"].astype("int64"), a["offsets"]
    sequences = [
        Sequence(tokens[offsets[i]:offsets[i + 1]].tolist(), int(a["prompt_len"][i]), side["categories"][a["category"][i]],
                 MODES[a["mode"][i]], bool(a["heldout"][i]))
        for i in range(len(a["prompt_len"]))
    ]
    return sequences, side


def make(out: Path, spec: DataSpec, command: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    from atlas.checkpoints import smollm

    t0 = time.perf_counter()
    _, tokenizer = smollm.load_original()
    sequences = generate(tokenizer, spec, log)
    return save(sequences, spec, out, command, time.perf_counter() - t0)
