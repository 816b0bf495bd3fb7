"""The teacher pass, kept between training runs.

The frozen main model's pass over the committed answers gives every run the same hiddens and
targets, and it is the slowest part of a short run: 23 minutes over the committed data in fp32 on
the project's 2-core AMD EPYC (AVX2; bf16 there is slower still). A run whose data, main model,
top-k, precision, thread count and torch are those of an earlier run reads that run's pass back.

Kept outside the clone (~/.cache/mtp-atlas/headtrain-teacher/<key>.safetensors, about 1.8 GB for the
committed data), written whole or not at all; a file that does not read back as the key it is
named by is computed again, never trusted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from atlas.checkpoints.headtrain.data import Sequence
from atlas.checkpoints.headtrain.train import HeadSpec, Teacher, teacher_pass
from atlas.paths import CACHE

FOLDER = CACHE / "headtrain-teacher"


def key(facts: dict[str, Any]) -> str:
    """The cache key of everything the pass depends on besides the code (data sha256, main model
    sha256, top-k, precision, threads, torch version, sequence limit)."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def _offsets(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor([len(p) for p in parts]).cumsum(0).tolist()], dtype=torch.int64)


def save(path: Path, teacher: Teacher, facts: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    tensors = {"hidden": torch.cat(teacher.hidden), "hidden_offsets": _offsets(teacher.hidden),
               "top_ids": torch.cat(teacher.top_ids), "top_logp": torch.cat(teacher.top_logp),
               "top_offsets": _offsets(teacher.top_ids)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    save_file(tensors, str(tmp), metadata={"facts": json.dumps(facts, sort_keys=True)})
    tmp.replace(path)


def load(path: Path, facts: dict[str, Any], sequences: int) -> Teacher | None:
    """The stored pass, or None where it is absent or is not the pass of `facts` over `sequences` sequences."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            if json.loads((f.metadata() or {}).get("facts", "null")) != json.loads(json.dumps(facts, sort_keys=True)):
                return None
            t = {name: f.get_tensor(name) for name in ("hidden", "hidden_offsets", "top_ids", "top_logp", "top_offsets")}
    except (SafetensorError, OSError, ValueError):
        return None
    ho, to = t["hidden_offsets"].tolist(), t["top_offsets"].tolist()
    if len(ho) != sequences + 1 or len(to) != sequences + 1 or ho[-1] != len(t["hidden"]) or to[-1] != len(t["top_ids"]):
        return None
    return Teacher([t["hidden"][a:b] for a, b in zip(ho, ho[1:])], [t["top_ids"][a:b] for a, b in zip(to, to[1:])],
                   [t["top_logp"][a:b] for a, b in zip(to, to[1:])])


def teacher(main: Any, sequences: list[Sequence], spec: HeadSpec, facts: dict[str, Any], log: Callable[[str], None],
            folder: Path = FOLDER) -> Teacher:
    """The teacher pass over `sequences` at the spec's top-k, precision and threads: read back where
    an earlier run with the same `facts` (data and main model) stored it, else computed and stored."""
    facts = {**facts, "top_k": spec.target_top_k, "precision": spec.precision, "threads": spec.threads,
             "torch": torch.__version__, "sequences": len(sequences)}
    path = folder / f"{key(facts)}.safetensors"
    if (found := load(path, facts, len(sequences))) is not None:
        log(f"  teacher pass read back from {path}")
        return found
    previous = torch.get_num_threads()
    torch.set_num_threads(spec.threads)  # the thread count changes float sums: it is part of the key
    try:
        out = teacher_pass(main, sequences, spec.target_top_k, log, precision=spec.precision)
    finally:
        torch.set_num_threads(previous)
    save(path, out, facts)
    return out
