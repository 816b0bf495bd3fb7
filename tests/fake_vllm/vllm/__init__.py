"""A stand-in for the `vllm` package, for testing atlas's driver protocol and record mapping
without the engine (tests/test_engines.py puts this folder on the driver's PYTHONPATH).

It implements only what atlas's driver calls: LLM(...) with a speculative_config, generate() with
per-request detailed spec-decode metrics and engine timestamps, get_metrics() counters, and
SamplingParams. Output tokens follow a fixed chain t -> (7 t + 3) mod 50; step s of a request
accepts s mod (k + 1) drafts. FAKE_VLLM_MISCOUNT=1 makes the accepted counter drift from the
per-request arrays (the driver must refuse such counts); a model folder without config.json fails
to load, as in vLLM.

Two behaviours of the real engine are kept because atlas's driver must get them right:
- the config's eos_token_id: without ignore_eos the output stops there; while fewer than
  min_tokens are out, that token is masked, so the chain takes the next token, (t + 1) mod 50, in
  its place (vLLM's min-tokens processor: the law without EOS);
- at T > 0 with drafts, the per-token temperature comes through utils.cpu_triton_utils'
  _expand_kernel_impl (resolved when the LLM is built); where it is not the requested one, the
  chain goes astray, (7 t + 4) mod 50."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

__version__ = "0.0.0+fake"


@dataclass
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    seed: int | None = None
    top_k: int | None = None
    top_p: float | None = None


@dataclass
class _Metric:
    name: str
    value: int = 0
    values: list[int] = field(default_factory=list)


class LLM:
    def __init__(self, model: str, speculative_config: dict | None = None, **kwargs: object) -> None:
        if not (Path(model) / "config.json").is_file():
            raise FileNotFoundError(f"{model}: no config.json")
        self.k = int((speculative_config or {}).get("num_speculative_tokens", 0))
        method = (speculative_config or {}).get("draft_sample_method", "greedy") if self.k else None
        spec = SimpleNamespace(draft_sample_method=method) if self.k else None
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(speculative_config=spec))
        self.counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * self.k}
        self.eos = json.loads((Path(model) / "config.json").read_text()).get("eos_token_id")
        from vllm.utils import cpu_triton_utils

        self.expand = cpu_triton_utils._expand_kernel_impl

    def _temperatures(self, params: list[SamplingParams]) -> list[float]:
        """Each request's temperature as the rejection sampler sees it per token (one token each here)."""
        out = torch.full((len(params),), float("nan"))
        self.expand(out, torch.tensor([p.temperature for p in params]), torch.arange(1, len(params) + 1), -1, 1)
        return out.tolist()

    def generate(self, prompts: list[dict], params: list[SamplingParams], use_tqdm: bool = False) -> list:
        outs = []
        seen = self._temperatures(params) if self.k and any(p.temperature > 0 for p in params) else [p.temperature for p in params]
        for prompt, p, temperature in zip(prompts, params, seen):
            tokens, t = [], prompt["prompt_token_ids"][-1]
            while len(tokens) < p.max_tokens:
                t = (7 * t + (3 if math.isclose(temperature, p.temperature, rel_tol=1e-6) else 4)) % 50
                if t == self.eos and len(tokens) < p.min_tokens:
                    t = (t + 1) % 50
                tokens.append(t)
                if t == self.eos and not p.ignore_eos:
                    break
            drafted, accepted, emitted, step = [], [], 0, 0
            while self.k and emitted < p.max_tokens - 1:
                a = step % (self.k + 1)
                drafted.append(self.k)
                accepted.append(a)
                emitted += a + 1
                step += 1
                self.counts["drafts"] += 1
                self.counts["draft_tokens"] += self.k
                self.counts["accepted"] += a
                for i in range(a):
                    self.counts["per_pos"][i] += 1
            spec = SimpleNamespace(per_step_drafted=drafted, per_step_accepted=accepted) if self.k else None
            seconds = 0.001 * p.max_tokens / (1 + 0.5 * self.k)
            outs.append(SimpleNamespace(
                outputs=[SimpleNamespace(token_ids=tokens, spec_decode_metrics=spec)],
                metrics=SimpleNamespace(first_token_ts=10.0, last_token_ts=10.0 + seconds),
            ))
        return outs

    def get_metrics(self) -> list[_Metric]:
        drift = int(os.environ.get("FAKE_VLLM_MISCOUNT", "0"))
        return [
            _Metric("vllm:spec_decode_num_drafts", self.counts["drafts"]),
            _Metric("vllm:spec_decode_num_draft_tokens", self.counts["draft_tokens"]),
            _Metric("vllm:spec_decode_num_accepted_tokens", self.counts["accepted"] + drift * self.counts["drafts"]),
            _Metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=list(self.counts["per_pos"])),
            _Metric("vllm:prompt_tokens", 5),
        ]
