"""transformers' own MTP decoding as an engine: `generate` and `generate(use_mtp=True)` on the same
prompts as our loop (the peer beside it, or alone with `--engine transformers`)."""

from __future__ import annotations


import torch
from transformers.generation.streamers import BaseStreamer

from atlas import AtlasError
from atlas.decode.generate import RoundCounts, RunStats, Sampling, Stopwatch

PEER_BASELINE = "transformers plain generate; decode phase timed from its first new token (after the main prefill and use_mtp's MTP load)"


class _DecodePhase(BaseStreamer):
    """Starts a stopwatch when generate() hands over its first new token. Everything before is
    the main prefill and, for use_mtp, building the MTP module from the checkpoint (transformers
    repeats it per call); the MTP layer's own prompt prefill comes after, in the timed part, as in
    our loop. Timing the phase directly replaces subtracting a separately timed 1-token call,
    whose noise on a busy machine could exceed a short run's whole decode time."""

    def __init__(self, watch: Stopwatch) -> None:
        self.watch = watch
        self.puts: list[int] = []  # tokens per put; the first put is the prompt

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.numel())
        if len(self.puts) == 2:
            self.watch.start()

    def end(self) -> None:
        pass


def round_counts(emitted: list[int], k: int) -> RoundCounts:
    """The rounds of verify passes that emitted `emitted` tokens each (accepted drafts + 1), kept as
    our loop keeps them: a pass drafts only what could still be emitted, min(k, tokens left - 1), so
    a final pass with one token left drafts nothing (counting it as a draft would read as a
    rejection that never happened)."""
    counts = RoundCounts(k)
    left = sum(emitted)
    for e in emitted:
        d = min(k, left - 1)
        if not 0 <= e - 1 <= d:
            raise AtlasError(f"transformers' verify pass emitted {e} token(s) where it could draft {d}: not a speculative round")
        counts.observe(d, e - 1)
        left -= e
    return counts


class Peer:
    """transformers' own generate, plain and with use_mtp=True (drafting `draft_tokens` per round:
    the checkpoint's MTP layer count); counts main-model forwards with a hook, and reads each
    verify pass's emitted tokens from the streamer, so its rounds are counted like ours."""

    def __init__(self, model: torch.nn.Module, device: torch.device, draft_tokens: int = 1) -> None:
        self.model = model
        self.device = device
        self.k = draft_tokens
        self.forwards = 0
        model.register_forward_hook(self._count)
        self.version = __import__("transformers").__version__

    def _count(self, *args: object) -> None:
        self.forwards += 1

    def run(self, prompt: list[int], max_new: int, s: Sampling, use_mtp: bool, seed: int) -> RunStats:
        ids = torch.tensor([prompt], device=self.device)
        kwargs: dict[str, object] = {"do_sample": False}
        if not s.greedy:
            kwargs = {"do_sample": True, "temperature": s.temperature, "top_k": s.top_k or 0, "top_p": s.top_p or 1.0}
        torch.manual_seed(seed)
        self.forwards = 0
        watch = Stopwatch(self.device)
        phase = _DecodePhase(watch)
        with torch.inference_mode():
            # eos_token_id=None: exactly max_new tokens, like our loops (pad_token_id only quiets a warning)
            out = self.model.generate(
                ids, max_new_tokens=max_new, min_new_tokens=max_new, use_mtp=use_mtp, eos_token_id=None, pad_token_id=0,
                streamer=phase, **kwargs,
            )
        seconds = watch.stop()
        if len(phase.puts) < 2 or phase.puts[1] != 1:
            raise AtlasError(f"transformers' generate emitted {phase.puts[1:2] or 'no'} token(s) with its prefill, not one: "
                             "its decode phase cannot be timed like ours")
        # The first forward is the prefill; each later one verifies the MTP draft(s) of one round,
        # whose output the streamer receives in one put.
        tokens, passes = out[0, len(prompt):].tolist(), self.forwards - 1
        if not use_mtp:
            return RunStats(tokens, seconds, [], [], passes)
        emitted = phase.puts[2:]
        if len(emitted) != passes or sum(emitted) != len(tokens) - 1:
            raise AtlasError(f"transformers' use_mtp streamed {len(emitted)} rounds of {sum(emitted)} tokens over {passes} verify "
                             f"passes and {len(tokens) - 1} decode tokens: its rounds cannot be counted like ours")
        return round_counts(emitted, self.k).stats(tokens, seconds)
