"""llama.cpp as the conformance suite's engine (`atlas conformance run --engine llamacpp`): the same
checks as for vLLM (atlas.engines.conformance_suite), on the GLM-4-MoE oracle and random checkpoints
converted to GGUF at f32 by the pinned source's converter, served by the pinned llama-server.

The driver speaks the suite's driver protocol (hello, load, generate). Each `load` converts the
checkpoint once (cached per folder for the suite's run) and restarts one llama-server, plain or
draft-mtp at k; each `generate` streams one request at a time and reads its verify rounds from the
stream (llamacpp_server), so the suite gets the per-step drafted and accepted counts it tests.

llama.cpp has two draft rules (--spec-draft-sampling), checked as the suite checks vLLM's two:
- greedy (its default): the head's argmax is drafted at every temperature and accepted when the
  target's own sample equals it, the suite's greedy rule;
- probabilistic: the draft is sampled from the head's top 10 candidates at the request's
  temperature, renormalised (common/speculative.cpp, spec_retune: top-k 10, then temperature), and
  verified by rejection; the T > 0 acceptance it must show is that of drafts from that law
  (`draft_law`), not from the head's whole law.
Both draft the argmax at T = 0, so both get the T = 0 checks.

With `draft_vocab` N the driver serves each GGUF's copy whose MTP layer drafts over the token ids
0..N-1 only (the build's nextn-d2t patch, llamacpp_draftvocab), and gives the suite the head's law
as the cut makes it (`head_law`: zero outside the set, renormalised): every expectation then follows
from that law, including the T = 0 acceptance, which falls below 1 wherever the oracle's argmax lies
outside the set. The record names the cut and the build's patches.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atlas import AtlasError
from atlas.engines.llamacpp.build import Build, repack_setting
from atlas.engines.llamacpp.engine import request, server_args
from atlas.engines.llamacpp.server import Server
from atlas.engines.options import Options
from atlas.engines.generated import Generated, Result

DRAFT_TOP_K = 10  # spec_retune's top_k for draft-mtp at T > 0 (build 11434)
THREADS = 1


def draft_law(q: np.ndarray, temperature: float = 1.0, top_k: int = DRAFT_TOP_K) -> np.ndarray:
    """The law llama.cpp's draft-mtp samples a draft from, row by row: the head's law at the
    request's temperature, cut to its top_k most likely tokens and renormalised (ties at the cut
    broken by the lower token id, as a stable sort of the logits would)."""
    if temperature <= 0:
        raise AtlasError("at T = 0 draft-mtp drafts the argmax; there is no draft law to sample")
    logits = np.log(np.clip(q, 1e-300, None)) / temperature
    order = np.argsort(-logits, axis=1, kind="stable")[:, :top_k]
    out = np.zeros_like(q)
    rows = np.arange(q.shape[0])[:, None]
    kept = np.exp(logits[rows, order] - logits[rows, order[:, :1]])
    out[rows, order] = kept / kept.sum(axis=1, keepdims=True)
    return out


@dataclass
class Hello:
    """What the suite's record names about the engine (the fields it reads of vLLM's hello)."""

    package: str
    version: str
    device: str = "cpu"
    gpus: list[str] = field(default_factory=list)
    triton: bool | None = None


class LlamacppDriver:
    """The suite's driver protocol over llama-server. `source` is the pinned llama.cpp source (its
    converter); GGUFs are written under a temporary folder the driver owns."""

    greedy_at_zero = True  # draft-mtp drafts the argmax at T = 0 under either rule

    def __init__(self, build: Build, source: Path, draft_vocab: int | None = None) -> None:
        self.build, self.source, self.draft_vocab = build, source, draft_vocab
        self.repack = repack_setting("auto")[0]
        self._tmp = tempfile.TemporaryDirectory(prefix="atlas-llamacpp-conformance-")
        self._ggufs: dict[Path, Path] = {}
        self._server: Server | None = None
        self._k = 0

    def __enter__(self) -> LlamacppDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._tmp.cleanup()

    def hello(self) -> Hello:
        return Hello(package="llama.cpp", version=f"b{self.build.version}")

    def patch(self, name: str) -> dict[str, Any]:
        """A patch the build carries, as the record names it (applied when the build was made, not now)."""
        for p in self.build.info.patches:
            if p.file == name:
                return {"name": p.file.removesuffix(".patch"), "sha256": p.sha256, "replaces": f"llama.cpp b{self.build.version} source",
                        "file": f"engines/patches/{p.file}"}
        raise AtlasError(f"the llama.cpp build carries no {name} (it carries: "
                         f"{', '.join(p.file for p in self.build.info.patches) or 'none'})")

    def head_law(self, q: np.ndarray) -> np.ndarray:
        """The head's law as the served file drafts from it: over the cut set only, where there is one."""
        if self.draft_vocab is None:
            return q
        cut = np.zeros_like(q)
        cut[:, :self.draft_vocab] = q[:, :self.draft_vocab]
        return cut / cut.sum(axis=1, keepdims=True)

    def draft_law(self, q: np.ndarray, temperature: float) -> np.ndarray:
        """The law probabilistic drafts come from (the greedy rule's acceptance needs only the argmax)."""
        return draft_law(q, temperature)

    def gguf(self, folder: Path, dtype: str) -> Path:
        from atlas.engines.llamacpp.gguf import convert_ids

        if dtype != "float32":
            raise AtlasError(f"--dtype {dtype}: llama.cpp's conformance runs the oracles at f32, so that their laws hold exactly")
        if folder not in self._ggufs:
            out = Path(self._tmp.name) / f"{folder.name}-f32.gguf"
            convert_ids(self.source, folder, out)
            if self.draft_vocab is not None:
                from atlas.engines.llamacpp import draftvocab as llamacpp_draftvocab

                cut = out.with_name(f"{folder.name}-f32-draft{self.draft_vocab}.gguf")
                llamacpp_draftvocab.write(out, cut, list(range(self.draft_vocab)))
                out = cut
            self._ggufs[folder] = out
        return self._ggufs[folder]

    def load(self, *, model: str, draft_tokens: int, dtype: str, seed: int, max_model_len: int, speculative: dict[str, Any],
             **_: Any) -> None:
        """Serve `model` (a checkpoint folder) plain (k = 0) or with draft-mtp at k under the draft
        rule the suite names (speculative["draft_sample_method"]: greedy or probabilistic); the
        suite's vLLM-only options (enforce_eager) have no llama.cpp counterpart."""
        gguf = self.gguf(Path(model), dtype)
        if self._server is not None:
            self._server.close()
        self._k = draft_tokens
        sampling = speculative.get("draft_sample_method", "greedy")
        self._server = Server(self.build.binary("llama-server"), gguf,
                              server_args(THREADS, 1, max_model_len, self.repack, draft_tokens, sampling))

    def generate(self, *, requests: list[dict[str, Any]], max_tokens: int, temperature: float) -> Generated:
        if self._server is None:
            raise AtlasError("generate before load")
        start = time.perf_counter()
        results = []
        for r in requests:
            done = self._server.complete(request(r["prompt"], max_tokens, temperature, r["seed"], Options()), k=self._k)
            steps = done.rounds if self._k else []
            results.append(Result(tokens=done.tokens, decode_seconds=done.seconds, per_step_drafted=[d for d, _ in steps],
                                  per_step_accepted=[a for _, a in steps]))
        return Generated(results=results, wall_seconds=time.perf_counter() - start, counters=None)
