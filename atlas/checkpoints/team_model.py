"""The team model: a small byte-level `MellumForCausalLM` with one MTP layer, trained here from a seed.

No machine of this project can download a hub checkpoint, so the measure runner needs a model we
make ourselves, and it must be a genuine Hugging Face checkpoint: transformers' own
`generate(use_mtp=True)` has to load its MTP layer from the same files, and the crawler has to
fingerprint it like any hub model. Mellum keeps its MTP tensors under a fixed prefix
(`mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0.*, norm}`, the Qwen3-Next layout),
so a shallow copy still loads; the DeepSeek/GLM classes look for their full-size layer index.

The MTP layer trained here is transformers' own `MtpModel` built on the main model, called exactly
as `MTPCandidateGenerator` calls it at inference (tokens shifted by one, the main model's post-norm
last hidden state, positions t+1), so the wiring cannot drift from what `use_mtp` runs.

Its tokenizer and corpus are atlas.checkpoints.team_corpus; the checkpoint folder it is saved as,
atlas.checkpoints.team_checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, model_validator

from atlas import AtlasError
from atlas.checkpoints.team_corpus import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, Corpus

if TYPE_CHECKING:  # torch and transformers load lazily: `atlas --help` must stay fast
    import torch
    from transformers import MellumConfig, MellumForCausalLM
    from transformers.modeling_layers import MtpModel

REPO_ID = "mtp-atlas/byte-mtp-8l"
# Chosen so that the run takes roughly 6-10 minutes on the project's 2-core CPU machines (about
# 1.7 s a step on one thread when the machine is quiet).
DEFAULT_STEPS = 320
DEFAULT_SEED = 1234


class TeamModelSpec(BaseModel):
    """Everything that determines the trained weights (together with the corpus and torch)."""

    seed: int = DEFAULT_SEED
    steps: int | None = Field(default=DEFAULT_STEPS, ge=1)
    minutes: float | None = Field(default=None, gt=0)
    layers: int = Field(default=8, ge=1, le=64)
    hidden: int = Field(default=192, ge=16)
    heads: int = Field(default=6, ge=1)
    kv_heads: int = Field(default=6, ge=1)
    intermediate: int = Field(default=512, ge=8)
    max_positions: int = Field(default=2048, ge=64)
    seq_len: int = Field(default=512, ge=8)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    warmup_steps: int = Field(default=30, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    mtp_weight: float = Field(default=0.5, ge=0)
    # One thread: on a shared 2-core machine, two OpenMP threads stall whenever another process
    # takes a core (measured 11 s a step against 1.7 s on one thread). The count is part of the
    # spec because it changes the float summation order, hence the weights.
    threads: int = Field(default=1, ge=1)
    corpus_cap_bytes: int = Field(default=6_000_000, ge=10_000)
    eval_windows: int = Field(default=16, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @model_validator(mode="after")
    def _check(self) -> TeamModelSpec:
        if (self.steps is None) == (self.minutes is None):
            raise ValueError("give exactly one of steps or minutes")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if (self.hidden // self.heads) % 2:
            raise ValueError("head size (hidden / heads) must be even for rotary embeddings")
        if self.seq_len + 1 > self.max_positions:
            raise ValueError(f"seq_len ({self.seq_len}) must be below max_positions ({self.max_positions})")
        return self


# ---- model -------------------------------------------------------------------------------------


def build_config(spec: TeamModelSpec) -> MellumConfig:
    from transformers import MellumConfig

    return MellumConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden // spec.heads,
        max_position_embeddings=spec.max_positions,
        sliding_window=None,
        layer_types=["full_attention"] * spec.layers,
        mlp_layer_types=["dense"] * spec.layers,
        num_mtp_layers=1,
        mtp_layer_types=["full_attention"],
        mtp_mlp_layer_types=["dense"],
        # Dense everywhere: declare no experts rather than Mellum's MoE defaults.
        num_experts=0,
        num_experts_per_tok=0,
        moe_intermediate_size=0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings=False,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        architectures=["MellumForCausalLM"],
        dtype="float32",
    )


def build_models(spec: TeamModelSpec) -> tuple[MellumForCausalLM, MtpModel]:
    """The main model and transformers' own MTP module on top of it, initialised from the seed."""
    import torch
    from transformers import MellumForCausalLM
    from transformers.modeling_layers import MtpModel

    torch.manual_seed(spec.seed)
    model = MellumForCausalLM(build_config(spec))
    # MtpModel's post_init re-draws the shared embedding/head it ties to; harmless before training.
    mtp = MtpModel(model, num_mtp_layers=1)
    return model, mtp


def joint_forward(
    model: MellumForCausalLM, mtp: MtpModel, input_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One teacher-forced pass of both heads, fed the way `MTPCandidateGenerator` feeds them.

    The MTP layer at position i sees the embedding of token i+1 and the main model's final hidden
    state at i (the post-norm one: `hidden_states[-1]` is tied to `last_hidden_state`), with
    rotary position i+1, and predicts token i+2."""
    import torch

    out = model(input_ids=input_ids, output_hidden_states=-1, use_cache=False)
    hidden = out.hidden_states[-1]
    length = input_ids.shape[1]
    positions = torch.arange(1, length, device=input_ids.device).unsqueeze(0).expand(input_ids.shape[0], -1)
    mtp_hidden = mtp.forward_layer(0, hidden[:, :-1], positions, None, input_ids=input_ids[:, 1:])
    return out.logits, mtp._project_to_logits(mtp_hidden)


def _losses(
    main_logits: torch.Tensor, mtp_logits: torch.Tensor, input_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch.nn.functional as F

    main = F.cross_entropy(main_logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten())
    mtp = F.cross_entropy(mtp_logits[:, :-1].flatten(0, 1).float(), input_ids[:, 2:].flatten())
    return main, mtp


def evaluate(model: MellumForCausalLM, mtp: MtpModel, windows: torch.Tensor) -> dict[str, float]:
    """Held-out next-token loss, the MTP head's t+2 loss, and two proxies of its acceptance.

    `mtp_top1_agreement`: the MTP argmax at i equals the main model's argmax at i+1 (both see the
    same tokens), i.e. greedy first-draft acceptance. `mtp_t1_acceptance`: E[sum min(p, q)], the
    acceptance rate of a sampled first draft at temperature 1."""
    import torch

    totals = {"main": 0.0, "mtp": 0.0, "agree": 0.0, "overlap": 0.0}
    count = 0
    was_training = model.training
    model.eval()
    mtp.eval()
    with torch.no_grad():
        for batch in windows.split(4):
            main_logits, mtp_logits = joint_forward(model, mtp, batch)
            main_loss, mtp_loss = _losses(main_logits, mtp_logits, batch)
            n = batch.shape[0]
            totals["main"] += main_loss.item() * n
            totals["mtp"] += mtp_loss.item() * n
            p = main_logits[:, 1:].float().softmax(-1)  # main model's next-next distribution
            q = mtp_logits.float().softmax(-1)
            totals["agree"] += (p.argmax(-1) == q.argmax(-1)).float().mean().item() * n
            totals["overlap"] += torch.minimum(p, q).sum(-1).mean().item() * n
            count += n
    model.train(was_training)
    mtp.train(was_training)
    return {
        "heldout_loss": totals["main"] / count,
        "heldout_mtp_loss": totals["mtp"] / count,
        "mtp_top1_agreement": totals["agree"] / count,
        "mtp_t1_acceptance": totals["overlap"] / count,
    }


def _unique_parameters(*modules: torch.nn.Module) -> list[torch.nn.Parameter]:
    seen: set[int] = set()
    params = []
    for module in modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def _batches(train: torch.Tensor, spec: TeamModelSpec, device: str) -> Iterator[torch.Tensor]:
    """Random windows of the training stream, drawn from a generator seeded apart from the model."""
    import torch

    generator = torch.Generator().manual_seed(spec.seed + 1)
    width = spec.seq_len + 1
    limit = train.numel() - width
    while True:
        starts = torch.randint(0, limit, (spec.batch_size,), generator=generator)
        yield torch.stack([train[s : s + width] for s in starts.tolist()]).to(device)


def _resolve_device(requested: str) -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise AtlasError("--device cuda asked for, but torch sees no CUDA device")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


@dataclass
class TrainResult:
    model: MellumForCausalLM
    mtp: MtpModel
    steps: int
    wall_seconds: float
    device: str
    curve: list[dict[str, float]]
    metrics: dict[str, float]


def train(spec: TeamModelSpec, corpus: Corpus, log: Callable[[str], None] = lambda _: None) -> TrainResult:
    """Joint training: next-token CE + mtp_weight * (t+2 CE through the MTP layer).

    With `steps` the run is deterministic on a CPU (seeded init and batches, fixed thread count,
    deterministic kernels). With `minutes` the step count depends on the machine's speed."""
    import torch

    device = _resolve_device(spec.device)
    previous = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    if device == "cpu":
        torch.set_num_threads(spec.threads)
        torch.use_deterministic_algorithms(True)
    try:
        return _train(spec, corpus, device, log)
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1])


def _token_windows(spec: TeamModelSpec, corpus: Corpus, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The training stream and the held-out windows the metrics are taken on."""
    import torch

    train_ids = torch.tensor(corpus.train, dtype=torch.long)
    heldout_ids = torch.tensor(corpus.heldout, dtype=torch.long)
    if train_ids.numel() <= spec.seq_len + 1 or heldout_ids.numel() < spec.seq_len + 1:
        raise AtlasError(f"corpus too small for seq_len {spec.seq_len}")
    # Evenly spaced held-out windows: the same ones on every run.
    stride = max(1, (heldout_ids.numel() - spec.seq_len - 1) // spec.eval_windows)
    eval_windows = torch.stack(
        [heldout_ids[i * stride : i * stride + spec.seq_len + 1] for i in range(spec.eval_windows)]
    ).to(device)
    return train_ids, eval_windows


def _optimizer(spec: TeamModelSpec, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    import torch

    # No decay on norm weights: Mellum's RMSNorm multiplies by them, decay would pull them to 0.
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": spec.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=spec.lr,
        betas=(0.9, 0.95),
    )


def _train(spec: TeamModelSpec, corpus: Corpus, device: str, log: Callable[[str], None]) -> TrainResult:
    import torch

    train_ids, eval_windows = _token_windows(spec, corpus, device)
    model, mtp = build_models(spec)
    model.to(device)
    mtp.to(device)
    model.train()
    mtp.train()
    params = _unique_parameters(model, mtp)
    optimizer = _optimizer(spec, params)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else None
    budget = spec.minutes * 60 if spec.minutes is not None else None

    def progress(step: int, elapsed: float) -> float:
        return min(1.0, elapsed / budget) if budget is not None else step / spec.steps

    def lr_at(step: int, elapsed: float) -> float:
        if step < spec.warmup_steps:
            return spec.lr * (step + 1) / spec.warmup_steps
        # Cosine down to a tenth of the peak.
        return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress(step, elapsed))))

    curve: list[dict[str, float]] = []
    bucket = {"main": 0.0, "mtp": 0.0, "n": 0}
    report_every = max(1, (spec.steps or 400) // 20)
    batches = _batches(train_ids, spec, device)
    start = time.perf_counter()
    step = 0
    while True:
        elapsed = time.perf_counter() - start
        if (spec.steps is not None and step >= spec.steps) or (budget is not None and elapsed >= budget):
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, elapsed)
        batch = next(batches)
        if autocast is not None:
            with autocast:
                main_logits, mtp_logits = joint_forward(model, mtp, batch)
        else:
            main_logits, mtp_logits = joint_forward(model, mtp, batch)
        main_loss, mtp_loss = _losses(main_logits, mtp_logits, batch)
        loss = main_loss + spec.mtp_weight * mtp_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        bucket["main"] += main_loss.item()
        bucket["mtp"] += mtp_loss.item()
        bucket["n"] += 1
        if step % report_every == 0:
            point = {
                "step": step,
                "seconds": round(time.perf_counter() - start, 1),
                "lr": round(optimizer.param_groups[0]["lr"], 6),
                "train_loss": round(bucket["main"] / bucket["n"], 4),
                "train_mtp_loss": round(bucket["mtp"] / bucket["n"], 4),
            }
            curve.append(point)
            bucket = {"main": 0.0, "mtp": 0.0, "n": 0}
            log(
                f"step {step}: loss {point['train_loss']:.3f}  mtp {point['train_mtp_loss']:.3f}  "
                f"({point['seconds']:.0f} s)"
            )
    wall = time.perf_counter() - start
    metrics = evaluate(model, mtp, eval_windows)
    model.to("cpu")
    mtp.to("cpu")
    return TrainResult(model=model, mtp=mtp, steps=step, wall_seconds=wall, device=device, curve=curve, metrics=metrics)
