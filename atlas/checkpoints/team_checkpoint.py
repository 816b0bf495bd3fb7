"""The trained team model as a Hub checkpoint folder: its MTP tensors under Mellum's names, the
training record and model card, the check that transformers loads it cleanly, and the
`atlas team-model` command line that rebuilds it.
"""

from __future__ import annotations

import json
import platform
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlas import AtlasError, __version__, outdir
from atlas.checkpoints.team_corpus import BOS_ID, EOS_ID, HELDOUT_EVERY, PAD_ID, Corpus, build_tokenizer, heldout_block_size, load_corpus
from atlas.checkpoints.team_model import REPO_ID, TeamModelSpec, TrainResult, train

if TYPE_CHECKING:  # torch and transformers load lazily: `atlas --help` must stay fast
    import torch
    from transformers.modeling_layers import MtpModel

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
            "heldout_rule": f"every {HELDOUT_EVERY}th block of {heldout_block_size(n_tokens)} tokens",
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
