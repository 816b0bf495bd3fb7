"""Training an MTP head on a frozen real main model by self-distillation (the SmolLM2 team model).

Data: the main model's own answers to the instructions in headtrain_prompts.json, written with its
chat template: one greedy answer and `samples` answers sampled at T = 1 per prompt. Each sequence
goes once through the frozen main model, which gives the post-norm final hidden state at every
position (what the MTP layer is fed) and, through the tied head, the main model's distribution at
every position.

Target: the main model's own next-next token distribution. The MTP layer at pair j sees
(h_j, token j+1) and is trained to minimise KL(p_main(· | tokens ≤ j+1) ‖ q_mtp) at T = 1, p being
the main model's distribution at position j+1. That is the law a draft is accepted against
(acceptance at T = 1 is Σ min(p, q)), not the one sampled token.

The head is transformers' own `MtpModel` on the main model in GLM-4-MoE's layout, called as
`MTPCandidateGenerator` calls it (teammodel.joint_forward's wiring), so what is trained is what runs.
Only the MTP layer's own tensors train; the router, the placeholder expert and everything shared
with the main model stay fixed (atlas.measure.smollm explains the one-expert block).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from atlas import AtlasError, __version__
from atlas.measure import smollm
from atlas.measure.workloads import chat_ids
from atlas.paths import ROOT

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase
    from transformers.modeling_layers import MtpModel

PROMPTS = ROOT / "atlas" / "measure" / "headtrain_prompts.json"
TARGET = "KL(p_main(t+2 | tokens <= t+1) || q_mtp) at T=1: the main model's next-next token distribution, self-distilled"
# MtpModel's names for the trained tensors -> GLM-4-MoE checkpoint names (the MTP layer is layer N)
_GLUE = {"layers.0.enorm.": "enorm.", "layers.0.hnorm.": "hnorm.", "layers.0.eh_proj.": "eh_proj.",
         "layers.0.post_norm.": "shared_head.norm."}
_FIXED = ("mlp.gate.",)  # the router: zero weights, fixed bias (smollm.fixed_mtp_tensors)


class HeadSpec(BaseModel):
    """Everything that determines the trained head (with the main model, the prompts and torch)."""

    seed: int = 20261201
    steps: int = Field(default=150, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    warmup_steps: int = Field(default=20, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    tokens_per_step: int = Field(default=384, ge=16)
    max_new_tokens: int = Field(default=96, ge=8)
    samples: int = Field(default=1, ge=0)  # T=1 answers per prompt, besides the greedy one
    generate_batch: int = Field(default=40, ge=1)
    heldout_every: int = Field(default=10, ge=2)  # every 10th prompt (both its answers) is held out
    head_intermediate: int = Field(default=1536, ge=8)  # the expert's size (= the main MLP's: initialised from it)
    threads: int = Field(default=1, ge=1)  # part of the spec: the thread count changes float sums
    prompt_limit: int | None = Field(default=None, ge=2)  # tests: the first N prompts only


@dataclass(frozen=True)
class Sequence:
    ids: list[int]
    prompt_len: int
    category: str
    mode: str  # "greedy" or "sampled"
    heldout: bool


def load_prompts(limit: int | None = None) -> tuple[list[tuple[str, str]], str]:
    """(category, text) pairs in file order and the file's sha256."""
    raw = PROMPTS.read_bytes()
    data = json.loads(raw)
    pairs = [(cat, text) for cat, texts in data["categories"].items() for text in texts]
    return pairs[:limit] if limit else pairs, hashlib.sha256(raw).hexdigest()


def generate_data(model: Any, tokenizer: PreTrainedTokenizerBase, spec: HeadSpec, log: Callable[[str], None]) -> list[Sequence]:
    """The main model's answers, batched (left padding), each cut after its first end-of-turn."""
    import torch

    prompts, _ = load_prompts(spec.prompt_limit)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    encoded = [chat_ids(tokenizer, text) for _, text in prompts]
    modes = ["greedy"] + ["sampled"] * spec.samples
    torch.manual_seed(spec.seed)
    sequences: list[Sequence] = []
    # a batch never mixes greedy and sampled answers
    batches = [[(i, mode) for i in range(s, min(s + spec.generate_batch, len(prompts)))]
               for mode in modes for s in range(0, len(prompts), spec.generate_batch)]
    for batch in batches:
        sampled = batch[0][1] == "sampled"
        width = max(len(encoded[i]) for i, _ in batch)
        ids = torch.full((len(batch), width), pad)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (i, _) in enumerate(batch):
            ids[row, width - len(encoded[i]):] = torch.tensor(encoded[i])
            mask[row, width - len(encoded[i]):] = 1
        kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sampled else {"do_sample": False}
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=spec.max_new_tokens, eos_token_id=eos,
                                 pad_token_id=pad, **kwargs)
        for row, (i, mode) in enumerate(batch):
            answer = out[row, width:].tolist()
            if eos in answer:
                answer = answer[: answer.index(eos) + 1]
            sequences.append(Sequence(encoded[i] + answer, len(encoded[i]), prompts[i][0], mode, i % spec.heldout_every == spec.heldout_every - 1))
        log(f"  answers {len(sequences)}/{len(prompts) * len(modes)}")
    return sequences


def data_digest(sequences: list[Sequence]) -> str:
    h = hashlib.sha256()
    for s in sequences:
        h.update(json.dumps([s.category, s.mode, s.heldout, s.prompt_len, s.ids]).encode() + b"\n")
    return h.hexdigest()


def hidden_states(model: Any, sequences: list[Sequence]) -> list[torch.Tensor]:
    """The frozen main model's post-norm final hidden state at every position, one sequence at a time."""
    import torch

    with torch.inference_mode():
        return [model.model(input_ids=torch.tensor([s.ids])).last_hidden_state[0].clone() for s in sequences]


# ---- the head ----------------------------------------------------------------------------------


def build_head(main: Any) -> MtpModel:
    """transformers' MtpModel on the GLM main model, initialised from the main model: the block is
    a copy of the last main layer (its MLP as expert 0), eh_proj = [I | I] (e and h added), the
    input norms 1, the output norm the main model's final norm; router and placeholder fixed."""
    import torch
    from transformers.modeling_layers import MtpModel

    embed = main.model.embed_tokens.weight.detach().clone()
    mtp = MtpModel(main, num_mtp_layers=1)
    # MtpModel's post_init re-draws the embedding it shares with the main model: put it back
    with torch.no_grad():
        main.model.embed_tokens.weight.copy_(embed)
        layer, last = mtp.layers[0], main.model.layers[-1]
        block = layer.mtp_block
        for name in ("self_attn", "input_layernorm", "post_attention_layernorm"):
            getattr(block, name).load_state_dict(getattr(last, name).state_dict())
        d, i = main.config.hidden_size, main.config.moe_intermediate_size
        if last.mlp.gate_proj.weight.shape[0] != i:
            raise AtlasError(f"head_intermediate {i} differs from the main MLP's {last.mlp.gate_proj.weight.shape[0]}; "
                             "the expert is initialised from it")
        experts = block.mlp.experts
        experts.gate_up_proj.zero_()
        experts.down_proj.zero_()
        experts.gate_up_proj[0] = torch.cat([last.mlp.gate_proj.weight, last.mlp.up_proj.weight])
        experts.down_proj[0] = last.mlp.down_proj.weight
        block.mlp.gate.weight.zero_()
        block.mlp.gate.e_score_correction_bias.copy_(torch.tensor(smollm.ROUTER_BIAS))
        layer.eh_proj.weight.copy_(torch.cat([torch.eye(d), torch.eye(d)], dim=1))
        layer.enorm.weight.fill_(1.0)
        layer.hnorm.weight.fill_(1.0)
        layer.post_norm.weight.copy_(main.model.norm.weight)
    for p in main.parameters():
        p.requires_grad_(False)
    for name, p in mtp.named_parameters():
        p.requires_grad_(name.startswith("layers.0.") and ".mlp.gate." not in name)
    return mtp


def head_forward(mtp: MtpModel, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """MTP logits for pairs j = 0..L-2 (hidden_j, token j+1) at RoPE positions j+1, as use_mtp feeds them."""
    import torch

    positions = torch.arange(1, ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
    out = mtp.forward_layer(0, hidden[:, :-1], positions, None, input_ids=ids[:, 1:])
    return mtp._project_to_logits(out)


def _batch(sequences: list[Sequence], hiddens: list[torch.Tensor], pick: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L], hidden [B, L, d] and the mask of pairs j whose token j+1 is real [B, L-1]."""
    import torch

    width = max(len(sequences[i].ids) for i in pick)
    d = hiddens[pick[0]].shape[1]
    ids = torch.zeros(len(pick), width, dtype=torch.long)
    hidden = torch.zeros(len(pick), width, d)
    mask = torch.zeros(len(pick), width - 1, dtype=torch.bool)
    for row, i in enumerate(pick):
        n = len(sequences[i].ids)
        ids[row, :n] = torch.tensor(sequences[i].ids)
        hidden[row, :n] = hiddens[i]
        mask[row, : n - 1] = True
    return ids, hidden, mask


def kl_terms(q_logits: torch.Tensor, p_logits: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per row, over the last dim."""
    log_p, log_q = p_logits.float().log_softmax(-1), q_logits.float().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def _batches(train: list[int], sequences: list[Sequence], spec: HeadSpec) -> Iterator[list[int]]:
    """Random sequences until the batch holds tokens_per_step tokens, from a seeded generator."""
    import torch

    generator = torch.Generator().manual_seed(spec.seed + 1)
    while True:
        pick: list[int] = []
        while sum(len(sequences[i].ids) for i in pick) < spec.tokens_per_step:
            pick.append(train[int(torch.randint(len(train), (1,), generator=generator))])
        yield pick


def evaluate(mtp: MtpModel, main: Any, sequences: list[Sequence], hiddens: list[torch.Tensor], which: list[int]) -> dict[str, float]:
    """Over the answer tokens of `which` (pairs whose token j+1 is generated): mean KL, MTP argmax
    = main argmax at j+1 (greedy first-draft acceptance), and E[Σ min(p, q)] (T = 1 acceptance)."""
    import torch

    totals = {"kl": 0.0, "agree": 0.0, "overlap": 0.0}
    count = 0
    with torch.inference_mode():
        for i in which:
            ids, hidden, _ = _batch(sequences, hiddens, [i])
            q = head_forward(mtp, ids, hidden)[0]
            p = main.lm_head(hidden[0, 1:])
            start = sequences[i].prompt_len - 1  # pair j = prompt_len - 1 sees the first answer token
            q, p = q[start:], p[start:]
            if not len(q):
                continue
            totals["kl"] += kl_terms(q, p).sum().item()
            totals["agree"] += (q.argmax(-1) == p.argmax(-1)).sum().item()
            totals["overlap"] += torch.minimum(q.softmax(-1), p.softmax(-1)).sum(-1).sum().item()
            count += len(q)
    return {"kl": totals["kl"] / count, "top1_agreement": totals["agree"] / count, "t1_acceptance": totals["overlap"] / count,
            "positions": count}


@dataclass
class HeadResult:
    mtp: MtpModel
    curve: list[dict[str, float]]
    before: dict[str, float]
    after: dict[str, float]
    seconds: dict[str, float]


def train(spec: HeadSpec, log: Callable[[str], None] = print) -> tuple[HeadResult, list[Sequence], Any]:
    """Generate the data, precompute hidden states, train; deterministic on CPU for a given spec."""
    import torch

    previous = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    torch.set_num_threads(spec.threads)
    torch.use_deterministic_algorithms(True)
    try:
        return _train(spec, log)
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1])


def _train(spec: HeadSpec, log: Callable[[str], None]) -> tuple[HeadResult, list[Sequence], Any]:
    import torch

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    llama, tokenizer = smollm.load_original()
    main = smollm.build_glm_main(llama, spec.head_intermediate)
    seconds["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    log("self-distillation data: the main model's answers")
    sequences = generate_data(main, tokenizer, spec, log)
    seconds["generate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hiddens = hidden_states(main, sequences)
    seconds["hidden_states"] = time.perf_counter() - t0
    train_ids = [i for i, s in enumerate(sequences) if not s.heldout]
    heldout_ids = [i for i, s in enumerate(sequences) if s.heldout]
    if not train_ids or not heldout_ids:
        raise AtlasError("too few prompts for a training and a held-out part")

    torch.manual_seed(spec.seed)
    mtp = build_head(main)
    mtp.eval()  # no dropout anywhere; eval() only fixes that
    before = evaluate(mtp, main, sequences, hiddens, heldout_ids)
    log(f"before training (held-out answers): KL {before['kl']:.3f}, top-1 {before['top1_agreement']:.3f}, "
        f"T=1 acceptance {before['t1_acceptance']:.3f}")
    params = [p for p in mtp.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=spec.weight_decay)

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return spec.lr * (step + 1) / spec.warmup_steps
        return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / spec.steps)))

    curve: list[dict[str, float]] = []
    every = max(1, spec.steps // 30)
    bucket, n_bucket = 0.0, 0
    batches = _batches(train_ids, sequences, spec)
    t0 = time.perf_counter()
    for step in range(spec.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        ids, hidden, mask = _batch(sequences, hiddens, next(batches))
        q = head_forward(mtp, ids, hidden)[mask]
        with torch.no_grad():
            p = main.lm_head(hidden[:, 1:][mask])
        loss = kl_terms(q, p).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        bucket += loss.item()
        n_bucket += 1
        if (step + 1) % every == 0 or step + 1 == spec.steps:
            point = {"step": step + 1, "seconds": round(time.perf_counter() - t0, 1), "lr": round(lr_at(step), 7),
                     "train_kl": round(bucket / n_bucket, 4)}
            curve.append(point)
            bucket, n_bucket = 0.0, 0
            log(f"step {point['step']}: KL {point['train_kl']:.3f} ({point['seconds']:.0f} s)")
    seconds["train"] = time.perf_counter() - t0
    round_to_stored(mtp)
    after = evaluate(mtp, main, sequences, hiddens, heldout_ids)
    log(f"after training (held-out answers, stored bf16 weights): KL {after['kl']:.3f}, top-1 {after['top1_agreement']:.3f}, "
        f"T=1 acceptance {after['t1_acceptance']:.3f}")
    return HeadResult(mtp, curve, before, after, {k: round(v, 1) for k, v in seconds.items()}), sequences, main


def round_to_stored(mtp: MtpModel) -> None:
    """Round the trained tensors to bfloat16 (how they are committed), in place, so the figures
    recorded are those of the stored head."""
    import torch

    with torch.no_grad():
        for p in mtp.parameters():
            if p.requires_grad:
                p.copy_(p.to(torch.bfloat16).to(p.dtype))


def head_tensors(mtp: MtpModel, layers: int = smollm.MAIN_LAYERS) -> dict[str, torch.Tensor]:
    """The trained tensors under GLM-4-MoE checkpoint names (model.layers.N.*), bfloat16; expert 0
    unfused into gate/up/down as the Hub layout keeps experts. Expert 1 must still be zero."""
    import torch

    prefix = smollm.mtp_prefix(layers)
    out: dict[str, torch.Tensor] = {}
    for key, tensor in mtp.state_dict().items():
        if not key.startswith("layers.0."):
            continue  # embedding, head, rotary: the main model's
        glue = next((g for g in _GLUE if key.startswith(g)), None)
        if glue is not None:
            out[prefix + _GLUE[glue] + key[len(glue):]] = tensor
            continue
        name = key.removeprefix("layers.0.mtp_block.")
        if name.startswith(_FIXED):
            continue
        if name.startswith("mlp.experts.") and tensor[1].any():
            raise AtlasError(f"the placeholder expert 1 was trained ({name}): it must stay zero")
        if name == "mlp.experts.gate_up_proj":
            gate, up = tensor[0].chunk(2, dim=0)
            out[prefix + "mlp.experts.0.gate_proj.weight"], out[prefix + "mlp.experts.0.up_proj.weight"] = gate, up
        elif name == "mlp.experts.down_proj":
            out[prefix + "mlp.experts.0.down_proj.weight"] = tensor[0]
        else:
            out[prefix + name] = tensor
    return {k: v.detach().to(torch.bfloat16).contiguous().clone() for k, v in sorted(out.items())}


def save_head(result: HeadResult, sequences: list[Sequence], spec: HeadSpec, out: Path, command: str) -> dict[str, Any]:
    """head.safetensors + recipe.json (with the head's sha256) under `out`; returns the recipe."""
    import torch
    import transformers
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = head_tensors(result.mtp)
    weights = out / smollm.HEAD_FILE
    save_file(tensors, str(weights), metadata={"format": "pt"})
    _, prompts_sha = load_prompts()
    recipe = {
        "what": "MTP head for SmolLM2-135M-Instruct in GLM-4-MoE's layout, trained by MTP Atlas with the main model frozen",
        "kind": smollm.KIND,
        "command": command,
        "atlas_version": __version__,
        "seed": spec.seed,
        "spec": spec.model_dump(),
        "target": TARGET,
        "main_model": {"package": smollm.PACKAGE, "package_version": smollm.PACKAGE_VERSION, "gguf_sha256": smollm.GGUF_SHA256,
                       "quantization": smollm.QUANTIZATION},
        "head_intermediate": spec.head_intermediate,
        "head_dtype": "bfloat16 (trained in fp32; the figures below are of the rounded weights)",
        "head_sha256": smollm.sha256_file(weights),
        "parameters": sum(t.numel() for t in tensors.values()),
        "init": "block = copy of main layer 29 (its MLP as expert 0), eh_proj = [I | I], enorm = hnorm = 1, "
                "shared_head.norm = the main final norm",
        "data": {
            "prompts": "atlas/measure/headtrain_prompts.json",
            "prompts_sha256": prompts_sha,
            "digest": data_digest(sequences),
            "sequences": len(sequences),
            "heldout_sequences": sum(s.heldout for s in sequences),
            "tokens": sum(len(s.ids) for s in sequences),
            "answer_tokens": sum(len(s.ids) - s.prompt_len for s in sequences),
            "rule": f"answers: 1 greedy + {spec.samples} sampled at T=1 per prompt, up to {spec.max_new_tokens} tokens, "
                    f"cut after the first end-of-turn; every {spec.heldout_every}th prompt held out",
        },
        "steps": spec.steps,
        "seconds": result.seconds,
        "heldout_before": {k: round(v, 4) for k, v in result.before.items()},
        "heldout_after": {k: round(v, 4) for k, v in result.after.items()},
        "curve": result.curve,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
    }
    (out / smollm.RECIPE_FILE).write_text(json.dumps(recipe, indent=1) + "\n")
    return recipe


def make_head(spec: HeadSpec, out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    where = out.resolve()
    shown = where.relative_to(ROOT).as_posix() if where.is_relative_to(ROOT) else where.as_posix()
    command = f"atlas real-model-head --out {shown} --seed {spec.seed} --steps {spec.steps}"
    result, sequences, _ = train(spec, log)
    return save_head(result, sequences, spec, out, command)
