"""A cut draft vocabulary (FR-Spec, arXiv 2502.14856; EAGLE-3's d2t map): the MTP head scores only
the V_d tokens most frequent in its training data, which makes a draft step cheap where the head's
matmul over the whole vocabulary dominates it.

It stays lossless: drafts are drawn from a distribution that is zero outside the set, and the
accept/resample rule reproduces the target distribution for any draft distribution (at T = 0 a
token outside the set simply can never be drafted). It is an option of a run (`atlas measure run
--draft-vocab N`), recorded in the record's settings, and needs the frequency table a project-made
head ships beside its checkpoint (FILE): a shipped head is always measured as shipped.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlas import AtlasError
from atlas.paths import read_bounded

if TYPE_CHECKING:
    import torch

FILE = "draft_vocab.json"
MAX_TABLE_BYTES = 64 * 2**20  # a count for every id of a 1M-token vocabulary fits in about 16 MiB


def write(folder: Path, counts: Counter[int], source: str) -> dict[str, Any]:
    """Token ids by descending frequency (ties by id), with their counts and where they were counted."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    table = {"what": "token ids by frequency, for a cut draft vocabulary (atlas.decode.draftvocab)", "source": source,
             "tokens_counted": sum(counts.values()), "token_ids": [t for t, _ in ranked], "counts": [c for _, c in ranked]}
    (folder / FILE).write_text(json.dumps(table, separators=(",", ":")) + "\n")
    return table


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a count")


def _parse(path: Path, raw: bytes) -> tuple[list[int], list[int], dict[str, Any]]:
    """Token ids and their counts: whole numbers, at least 1, in descending order (the table ranks
    the ids by frequency, so a table out of order would keep the least frequent ones); one line
    for anything else, JSON's Infinity and NaN and nesting too deep for the parser included."""
    def bad(why: object) -> AtlasError:
        return AtlasError(f"{path}: not a draft vocabulary table ({why})")

    try:
        table = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise bad("nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and non-UTF-8 bytes among them
        raise bad(" ".join(str(exc).split())[:200]) from None
    if not isinstance(table, dict) or not isinstance(table.get("token_ids"), list) or not isinstance(table.get("counts"), list):
        raise bad("token_ids and counts must be lists")
    ids, counts = table["token_ids"], table["counts"]
    if not all(type(v) is int for v in ids + counts):
        raise bad("token ids and counts must be whole numbers")
    if len(ids) != len(counts):
        raise bad(f"{len(ids)} token ids and {len(counts)} counts")
    if any(c < 1 for c in counts):
        raise bad(f"count {min(counts)}: every count is at least 1")
    if any(a < b for a, b in zip(counts, counts[1:])):
        i = next(i for i, (a, b) in enumerate(zip(counts, counts[1:])) if a < b)
        raise bad(f"counts must descend (ids ranked by frequency), and count {i + 2} ({counts[i + 1]}) is above "
                  f"count {i + 1} ({counts[i]})")
    return ids, counts, table


def read(folder: Path, size: int, vocab_size: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """The `size` most frequent token ids (sorted) and what the record says of them: size, the
    share of counted tokens they cover, the table's sha256 and source."""
    import torch

    path = folder / FILE
    if not path.is_file():
        raise AtlasError(f"--draft-vocab needs {FILE} in the checkpoint folder: the token frequencies of its head's "
                         "training data, which only a project-made head ships (a shipped head is measured as shipped)")
    raw = read_bounded(path, MAX_TABLE_BYTES, "a draft vocabulary table")
    ids, counts, table = _parse(path, raw)
    if not 1 <= size <= vocab_size:
        raise AtlasError(f"--draft-vocab {size}: between 1 and the vocabulary size {vocab_size}")
    if len(set(ids)) != len(ids) or any(not 0 <= t < vocab_size for t in ids):
        raise AtlasError(f"{path}: token ids must be distinct and below {vocab_size}, one count each")
    if size > len(ids):
        raise AtlasError(f"--draft-vocab {size}: {path.name} ranks only {len(ids)} tokens")
    info = {"size": size, "coverage": round(sum(counts[:size]) / max(1, sum(counts)), 4),
            "table_sha256": hashlib.sha256(raw).hexdigest(), "source": str(table.get("source", ""))[:400]}
    return torch.tensor(sorted(ids[:size]), dtype=torch.long), info
