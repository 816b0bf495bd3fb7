"""transformers' own MTP decoding as an engine: `generate` and `generate(use_mtp=True)` on the same
prompts as our loop (the peer beside it, or alone with `--engine transformers`)."""

from __future__ import annotations

import statistics

import torch

from atlas import AtlasError
from atlas.measure.generate import RunStats, Sampling, Stopwatch

# Each mode's time is its generate() minus a 1-token generate() in the same mode: that removes the
# main prefill and, for use_mtp, the MTP module's load from disk that transformers repeats per call.
PEER_BASELINE = "transformers plain generate; each mode minus its own 1-token generate (MTP load + main prefill)"


class Peer:
    """transformers' own generate, plain and with use_mtp=True; counts main-model forwards with a
    hook so its verify passes and accepted tokens can be derived like ours."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.forwards = 0
        model.register_forward_hook(self._count)
        self.version = __import__("transformers").__version__

    def _count(self, *args: object) -> None:
        self.forwards += 1

    def prefill_seconds(self, prompt: list[int], s: Sampling, use_mtp: bool) -> float:
        """generate() of one token in the same mode: the share subtracted from that mode's times, so
        that both engines are compared on the decode phase. With use_mtp=True it includes what every
        such call pays before its first token: building the MTP module from the checkpoint's
        safetensors (transformers' MTPCandidateGenerator does it in its constructor, with no way to
        hand it a built one) and the main model's prefill. The MTP layer's own prefill over the
        prompt runs at the first drafting round, which a 1-token call never reaches, so it stays in
        the timed part, as in our loop."""
        return statistics.median(self._generate(prompt, 1, s, use_mtp, 0)[1] for _ in range(3))

    def run(self, prompt: list[int], max_new: int, s: Sampling, use_mtp: bool, seed: int, prefill: float) -> RunStats:
        tokens, seconds = self._generate(prompt, max_new, s, use_mtp, seed)
        if seconds <= prefill:
            # Clamping would store an absurd speed-up; a number that cannot be right is not recorded.
            raise AtlasError(
                f"transformers peer: generate() of {max_new} tokens took {seconds * 1e3:.1f} ms, no more than its "
                f"own one-token estimate ({prefill * 1e3:.1f} ms): timings too noisy; raise --max-new-tokens "
                "or skip the peer with --no-peer"
            )
        # The first forward is the prefill; each later one verifies the MTP draft(s) of one round.
        return RunStats(tokens, seconds - prefill, [], [], self.forwards - 1)

    def _generate(self, prompt: list[int], max_new: int, s: Sampling, use_mtp: bool, seed: int) -> tuple[list[int], float]:
        ids = torch.tensor([prompt], device=self.device)
        kwargs: dict[str, object] = {"do_sample": False}
        if not s.greedy:
            kwargs = {"do_sample": True, "temperature": s.temperature, "top_k": s.top_k or 0, "top_p": s.top_p or 1.0}
        torch.manual_seed(seed)
        self.forwards = 0
        watch = Stopwatch(self.device)
        watch.start()
        with torch.inference_mode():
            # eos_token_id=None: exactly max_new tokens, like our loops (pad_token_id only quiets a warning)
            out = self.model.generate(
                ids, max_new_tokens=max_new, min_new_tokens=max_new, use_mtp=use_mtp, eos_token_id=None, pad_token_id=0, **kwargs
            )
        seconds = watch.stop()
        return out[0, len(prompt):].tolist(), seconds
