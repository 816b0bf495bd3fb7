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
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shlex
import sysconfig
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, model_validator

from atlas import AtlasError, __version__, outdir

if TYPE_CHECKING:  # torch and transformers load lazily: `atlas --help` must stay fast
    import torch
    from transformers import MellumConfig, MellumForCausalLM, PreTrainedTokenizerFast
    from transformers.modeling_layers import MtpModel

# Token ids: 0..255 are the bytes themselves, the specials follow.
PAD_ID, BOS_ID, EOS_ID = 256, 257, 258
VOCAB_SIZE = 259
SPECIAL_TOKENS = {PAD_ID: "<pad>", BOS_ID: "<s>", EOS_ID: "</s>"}

REPO_ID = "mtp-atlas/byte-mtp-8l"
# Chosen so that the run takes roughly 6-10 minutes on the project's 2-core CPU machines (about
# 1.7 s a step on one thread when the machine is quiet).
DEFAULT_STEPS = 320
DEFAULT_SEED = 1234

# Checkpoint names of Mellum's MTP tensors <- names inside transformers' `MtpModel` (layer 0).
_MTP_RENAMES = {
    "layers.0.eh_proj.": "mtp.fc.",
    "layers.0.enorm.": "mtp.pre_fc_norm_embedding.",
    "layers.0.hnorm.": "mtp.pre_fc_norm_hidden.",
    "layers.0.post_norm.": "mtp.norm.",
    "layers.0.mtp_block.": "mtp.layers.0.",
}
# Shared with the main model (its embedding and lm_head): not stored twice.
_MTP_SHARED_PREFIXES = ("embed_tokens.", "shared_head.")

_LICENSES_DIR = Path("/usr/share/common-licenses")
# Test suites are mostly fixtures and odd strings; IDLE and lib2to3 are large and atypical.
_STDLIB_SKIP_PARTS = frozenset({"site-packages", "test", "tests", "idle_test", "idlelib", "lib2to3"})
_HELDOUT_BLOCK = 16 * 1024
_HELDOUT_EVERY = 20  # every 20th block of the stream is held out: 5 %


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


@dataclass(frozen=True)
class CorpusFile:
    name: str  # "stdlib:json/decoder.py" or "licenses:GPL-3": the same on any machine
    size: int
    sha256: str


@dataclass(frozen=True)
class Corpus:
    files: list[CorpusFile]
    train: list[int]  # token stream, documents separated by EOS
    heldout: list[int]

    @property
    def digest(self) -> str:
        listing = "".join(f"{f.name}\t{f.size}\t{f.sha256}\n" for f in self.files)
        return hashlib.sha256(listing.encode()).hexdigest()


# ---- tokenizer ---------------------------------------------------------------------------------


def _byte_to_char() -> dict[int, str]:
    """Printable stand-in characters for the 256 bytes (the usual byte-level BPE alphabet): bytes
    that are printable Latin-1 stand for themselves, the rest are shifted above U+0100."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (id = byte value, specials after 255) that loads with no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: b for b, char in _byte_to_char().items()}
    # No merges: every byte stays its own token.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([SPECIAL_TOKENS[i] for i in sorted(SPECIAL_TOKENS)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=SPECIAL_TOKENS[PAD_ID],
        bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    ids = tokenizer.convert_tokens_to_ids([SPECIAL_TOKENS[i] for i in sorted(SPECIAL_TOKENS)])
    if ids != sorted(SPECIAL_TOKENS):
        raise AtlasError(f"tokenizer specials got ids {ids}, expected {sorted(SPECIAL_TOKENS)}")
    return tokenizer


# ---- corpus ------------------------------------------------------------------------------------


def _corpus_sources() -> list[tuple[str, Path]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code: list[Path] = []
    for folder, subfolders, names in os.walk(stdlib):
        subfolders[:] = [d for d in subfolders if d not in _STDLIB_SKIP_PARTS]
        code += [Path(folder, n) for n in names if n.endswith(".py") and Path(folder, n).is_file()]
    code.sort()
    sources = [(f"stdlib:{p.relative_to(stdlib).as_posix()}", p) for p in code]
    if _LICENSES_DIR.is_dir():
        # Symlinks (GPL -> GPL-3) would only duplicate a text.
        prose = sorted(p for p in _LICENSES_DIR.iterdir() if p.is_file() and not p.is_symlink())
        sources += [(f"licenses:{p.name}", p) for p in prose]
    return sources


def load_corpus(cap_bytes: int) -> Corpus:
    """Python's standard library sources plus Debian's licence texts, as byte tokens.

    The file order is a hash of each file's name (not the directory walk, not the alphabet), so a
    byte cap keeps a sample of the whole library and the stream interleaves code and prose."""
    sources = _corpus_sources()
    if not sources:
        raise AtlasError("no training text found (Python standard library sources or /usr/share/common-licenses)")
    sources.sort(key=lambda item: hashlib.sha256(item[0].encode()).hexdigest())
    files: list[CorpusFile] = []
    stream = bytearray()
    doc_ends: list[int] = []
    for name, path in sources:
        if files and len(stream) + path.stat().st_size > cap_bytes:
            continue
        data = path.read_bytes()
        if not data.strip():
            continue
        files.append(CorpusFile(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
        stream += data
        doc_ends.append(len(stream))
    tokens: list[int] = []
    start = 0
    for end in doc_ends:
        tokens.extend(stream[start:end])
        tokens.append(EOS_ID)
        start = end
    train: list[int] = []
    heldout: list[int] = []
    # Small corpora (tests) get smaller blocks so that some text is still held out.
    block_size = heldout_block_size(len(tokens))
    for block_index, block_start in enumerate(range(0, len(tokens), block_size)):
        block = tokens[block_start : block_start + block_size]
        (heldout if block_index % _HELDOUT_EVERY == _HELDOUT_EVERY - 1 else train).extend(block)
    return Corpus(files=files, train=train, heldout=heldout)


def heldout_block_size(n_tokens: int) -> int:
    return max(1, min(_HELDOUT_BLOCK, n_tokens // (_HELDOUT_EVERY * 4)))


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


def _train(spec: TeamModelSpec, corpus: Corpus, device: str, log: Callable[[str], None]) -> TrainResult:
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

    model, mtp = build_models(spec)
    model.to(device)
    mtp.to(device)
    model.train()
    mtp.train()
    params = _unique_parameters(model, mtp)
    # No decay on norm weights: Mellum's RMSNorm multiplies by them, decay would pull them to 0.
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": spec.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=spec.lr,
        betas=(0.9, 0.95),
    )
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


# ---- checkpoint --------------------------------------------------------------------------------


def mtp_state_dict(mtp: MtpModel) -> dict[str, torch.Tensor]:
    """The MTP layer's tensors under Mellum's checkpoint names (`mtp.fc.weight`, ...)."""
    renamed = {}
    for key, tensor in mtp.state_dict().items():
        if key.startswith(_MTP_SHARED_PREFIXES):
            continue
        prefix = next((p for p in _MTP_RENAMES if key.startswith(p)), None)
        if prefix is None:
            raise AtlasError(f"unexpected MTP tensor {key!r}: no Mellum checkpoint name for it")
        renamed[_MTP_RENAMES[prefix] + key[len(prefix) :]] = tensor.detach().contiguous().clone()
    return renamed


def save_checkpoint(result: TrainResult, spec: TeamModelSpec, corpus: Corpus, out: Path, command: str) -> dict[str, Any]:
    """Write the checkpoint folder; returns the training record written as training.json."""
    import torch
    import transformers
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model = result.model
    mtp_tensors = mtp_state_dict(result.mtp)
    # One write: transformers saves the main model's tensors and the MTP layer's together (it drops
    # tied copies and writes metadata {"format": "pt"}, as for any checkpoint).
    model.save_pretrained(out, state_dict={**model.state_dict(), **mtp_tensors})
    weights = out / "model.safetensors"
    if not weights.is_file():
        raise AtlasError(f"save_pretrained wrote no {weights}")

    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(out)
    build_tokenizer().save_pretrained(out)

    n_tokens = len(corpus.train) + len(corpus.heldout)
    n_main = sum(p.numel() for p in model.parameters())
    n_mtp = sum(t.numel() for t in mtp_tensors.values())
    record = {
        "repo_id": REPO_ID,
        "command": command,
        "atlas_version": __version__,
        "spec": spec.model_dump(),
        "steps": result.steps,
        "device": result.device,
        "wall_seconds": round(result.wall_seconds, 1),
        "deterministic": spec.steps is not None and result.device == "cpu",
        "parameters": {"main": n_main, "mtp": n_mtp},
        "loss": {"main": "next-token cross-entropy", "mtp": "t+2 cross-entropy through mtp.*", "mtp_weight": spec.mtp_weight},
        "metrics": {k: round(v, 4) for k, v in result.metrics.items()},
        "curve": result.curve,
        "corpus": {
            "digest": corpus.digest,
            "n_files": len(corpus.files),
            "bytes": sum(f.size for f in corpus.files),
            "train_tokens": len(corpus.train),
            "heldout_tokens": len(corpus.heldout),
            "heldout_rule": f"every {_HELDOUT_EVERY}th block of {heldout_block_size(n_tokens)} tokens",
            "files": [[f.name, f.size] for f in corpus.files],
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "README.md").write_text(_model_card(record))
    return record


def _model_card(record: dict) -> str:
    spec = record["spec"]
    m = record["metrics"]
    params = record["parameters"]
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [mtp, teaching-model, byte-level]
---

# {REPO_ID}

A **teaching model** made by the MTP Atlas project, not a useful language model: a byte-level
`MellumForCausalLM` ({spec['layers']} layers, hidden {spec['hidden']}, {spec['heads']} heads,
{params['main']:,} parameters) with **one multi-token-prediction (MTP) layer** ({params['mtp']:,}
parameters, stored under `mtp.*`, declared by `num_nextn_predict_layers: 1`). It exists so that
self-speculative decoding can be measured on any machine without downloading a checkpoint.

- Trained {record['steps']} steps from seed {spec['seed']} on {record['corpus']['n_files']} files of
  Python's standard library sources and Debian's licence texts ({record['corpus']['bytes']:,} bytes;
  list and digest in `training.json`), loss = next-token CE + {spec['mtp_weight']} × t+2 CE through
  the MTP layer. Rebuild with `make team-model` (`{record['command']}`).
- Held-out next-token loss {m['heldout_loss']:.3f} nats/byte; MTP top-1 agreement with the main
  model's next-next prediction {m['mtp_top1_agreement']:.3f}; expected T=1 acceptance of a sampled
  first draft {m['mtp_t1_acceptance']:.3f}.
- Tokens: ids 0-255 are bytes, then `<pad>`=256, `<s>`=257, `</s>`=258.
- Loads with `AutoModelForCausalLM.from_pretrained(path)`; `generate(..., use_mtp=True)` drafts
  with the MTP layer. No remote code.
"""


def verify_checkpoint(path: Path) -> list[str]:
    """Problems with a saved checkpoint as transformers sees it (empty when it is sound): the main
    model and its MTP layer load with no missing or unexpected keys, and the MTP weights in
    memory are the file's."""

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from transformers.modeling_layers import MtpModel

    problems: list[str] = []
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        if info.get(kind):
            problems.append(f"main model {kind}: {sorted(info[kind])}")

    with mtp_load_reports() as reports:
        try:
            mtp = MtpModel.from_pretrained(model, device_map={"": torch.device("cpu")})
        except RuntimeError as exc:  # missing MTP weights raise here
            return [*problems, str(exc)]
    problems += [f"MTP load report: {r}" for r in reports]
    stored = load_file(path / "model.safetensors")
    loaded = mtp_state_dict(mtp)
    in_file = {k for k in stored if k.startswith("mtp.")}
    if in_file != set(loaded):
        problems.append(f"mtp.* tensors in the file {sorted(in_file ^ set(loaded))} do not match the MTP layer")
    problems += [f"MTP tensor {k} in memory differs from the file" for k in sorted(in_file & set(loaded))
                 if not torch.equal(stored[k], loaded[k])]
    return problems


@contextmanager
def mtp_load_reports() -> Iterator[list[str]]:
    """The LOAD REPORTs transformers' MTP loader logs while the block runs: it names missing or
    unexpected MTP tensors only in its log, never in a return value."""
    import logging

    reports: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "LOAD REPORT" in record.getMessage():
                reports.append(record.getMessage())

    handler = _Collect(level=logging.WARNING)
    logger = logging.getLogger("transformers.modeling_layers")
    logger.addHandler(handler)
    try:
        yield reports
    finally:
        logger.removeHandler(handler)


def make_team_model(spec: TeamModelSpec, out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train, save, verify; returns the training record."""
    command = reproduce_command(spec, out)
    outdir.check_replaceable(out, "atlas team-model", legacy=_is_team_model)  # before the minutes of training
    corpus = load_corpus(spec.corpus_cap_bytes)
    log(
        f"corpus: {len(corpus.files)} files, {len(corpus.train):,} train / {len(corpus.heldout):,} held-out "
        f"tokens, digest {corpus.digest[:12]}"
    )
    result = train(spec, corpus, log=log)

    def write(staging: Path) -> dict[str, Any]:
        record = save_checkpoint(result, spec, corpus, staging, command)
        problems = verify_checkpoint(staging)
        if problems:
            raise AtlasError("saved checkpoint does not load cleanly: " + "; ".join(problems))
        return record

    # training.json is the folder's manifest: no marker, so the bundled mirror serves only model files
    return outdir.replace(out, "atlas team-model", write, legacy=_is_team_model, mark=False)


def _is_team_model(folder: Path) -> bool:
    """A folder `atlas team-model` wrote: its training.json names the command."""
    try:
        record = json.loads((folder / "training.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and str(record.get("command", "")).startswith("atlas team-model")


# CLI option name for each spec field the `atlas team-model` command exposes.
_CLI_OPTIONS = {
    "device": "--device",
    "layers": "--layers",
    "hidden": "--hidden",
    "heads": "--heads",
    "kv_heads": "--kv-heads",
    "intermediate": "--intermediate",
    "seq_len": "--seq-len",
    "batch_size": "--batch-size",
    "lr": "--lr",
    "mtp_weight": "--mtp-weight",
    "threads": "--threads",
}


def reproduce_command(spec: TeamModelSpec, out: Path) -> str:
    """The `atlas team-model` line that rebuilds this checkpoint: seed and length always spelled
    out, other options only where they differ from the defaults."""
    words = ["atlas", "team-model", "--out", shlex.quote(out.as_posix()), "--seed", str(spec.seed)]
    words += ["--steps", str(spec.steps)] if spec.steps is not None else ["--minutes", str(spec.minutes)]
    defaults = TeamModelSpec()
    for field, option in _CLI_OPTIONS.items():
        value = getattr(spec, field)
        if value != getattr(defaults, field):
            words += [option, str(value)]
    return " ".join(words)
