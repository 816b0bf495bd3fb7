"""What an engine's driver answers for a batch of requests, the same for every engine the
conformance suite and the measurement runs speak to through a driver (vLLM's client, llama.cpp's
conformance driver): each request's tokens and per-step drafts, the batch's wall time, and the
engine's own speculative counters where it keeps them."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Result(BaseModel):
    tokens: list[int]
    decode_seconds: float | None
    per_step_drafted: list[int]
    per_step_accepted: list[int]


class Counters(BaseModel):
    num_drafts: int = Field(ge=0)
    num_draft_tokens: int = Field(ge=0)
    num_accepted_tokens: int = Field(ge=0)
    accepted_per_position: list[int]


class Generated(BaseModel):
    results: list[Result]
    wall_seconds: float
    counters: Counters | None
