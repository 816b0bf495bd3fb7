"""The real team model's MTP head, trained by this project on the frozen main model (SmolLM2-135M-
Instruct in GLM-4-MoE's layout, atlas.checkpoints.smollm).

The parts, in the order the data flows:
- prompts.py: the instructions the main model answers (a prompt file kept apart from every
  measurement prompt);
- data.py: its answers, generated once and committed as token ids (`atlas real-model-head-data`);
- wraps.py, wrapdata.py: more data, llama-server's answers to prompts that wrap the model's own
  answers (translation, third turns, extraction, long context; `atlas real-model-head-wraps`);
- head.py: the MTP layer as decoding runs it, several drafts deep;
- train.py: the teacher pass, the loss, the loop and the held-out acceptance;
- teachercache.py: the teacher pass kept between runs (outside the clone);
- this module: `make_head` (`atlas real-model-head`) and the ablations, which write the head,
  its recipe (everything the head depends on and every figure measured of it) and the frequency
  table of a cut draft vocabulary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atlas import AtlasError, __version__
from atlas.decode import draftvocab
from atlas.checkpoints import smollm
from atlas.paths import published, sha256_file
from atlas.checkpoints.headtrain import data, teachercache
from atlas.checkpoints.headtrain.head import INITS
from atlas.checkpoints.headtrain.train import HeadSpec, Teacher, Trained, frequencies, subset, train

TARGET = ("KL(p_main(t+s+1 | tokens <= t+s) || q_mtp, step s) at T=1 over a {depth}-step recursive chain of the one MTP "
          "layer, step weights {weights}: the main model's own distribution, self-distilled")


def default_data(out: Path) -> list[Path]:
    """A head folder's training data when none is named: its own answers, or else (a candidate
    beside the committed head) the committed ones."""
    return [out if (out / data.SIDECAR).is_file() else smollm.HEAD_DIR]


def _command(name: str, spec: HeadSpec, out: Path, folders: list[Path]) -> str:
    defaults = HeadSpec()
    changed = [f" --{k.replace('_', '-')} {v}" for k, v in spec.model_dump().items() if v != getattr(defaults, k)]
    default_out = out.resolve() == smollm.HEAD_DIR.resolve()
    named = [f.resolve() for f in folders] != [f.resolve() for f in default_data(out)]
    return (f"atlas {name}" + ("" if default_out else f" --out {published(out)}")
            + "".join(f" --data {published(f)}" for f in folders if named) + "".join(changed))


def _data_entry(folder: Path, side: dict[str, Any]) -> dict[str, Any]:
    return {"file": f"{folder.resolve().name}/{data.DATA_FILE}", "sha256": side["sha256"], "command": side["command"],
            "prompts_sha256": side["prompts_sha256"], "sequences": side["sequences"], "heldout_sequences": side["heldout_sequences"],
            "tokens": side["tokens"], "answer_tokens": side["answer_tokens"], "spec": side["spec"]}


def save(result: Trained, sequences: list[data.Sequence], sides: list[dict[str, Any]], spec: HeadSpec, out: Path,
         command: str, folders: list[Path]) -> dict[str, Any]:
    """head.safetensors, draft_vocab.json and recipe.json (with the head's sha256) under `out`. The
    recipe's "data" is the first data folder, with the training answer tokens of all of them;
    "data_added" the others, in the order they were given."""
    import torch
    from safetensors.torch import save_file

    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in sorted(result.head.tensors(smollm.mtp_prefix()).items())}
    weights = out / smollm.HEAD_FILE
    tmp = weights.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(weights)
    digests = " + ".join(side["sha256"] for side in sides)
    vocab = draftvocab.write(out, frequencies(sequences), f"answer tokens of the head's training sequences (data sha256 {digests})")
    recipe = {
        "what": "MTP head for SmolLM2-135M-Instruct in GLM-4-MoE's layout, trained by MTP Atlas with the main model frozen",
        "kind": smollm.KIND,
        "command": command,
        "atlas_version": __version__,
        "seed": spec.seed,
        "spec": spec.model_dump(),
        "target": TARGET.format(depth=spec.depth, weights=" / ".join(f"{w:.2f}" for w in spec.step_weights)),
        "main_model": {"package": smollm.PACKAGE, "package_version": smollm.PACKAGE_VERSION, "gguf_sha256": smollm.GGUF_SHA256,
                       "quantization": smollm.QUANTIZATION},
        "head_intermediate": spec.head_intermediate,
        "head_dtype": f"bfloat16 (fp32 master weights, {spec.precision} matmuls in training; the figures below are of the rounded weights)",
        "head_sha256": sha256_file(weights),
        "parameters": sum(t.numel() for t in tensors.values()),
        "init": spec.init,
        "eh_proj_init": f"[{result.residual / 4:g} I | {result.residual:g} I]: the main model's residual RMS before its last layer",
        "data": {**_data_entry(folders[0], sides[0]), "training_answer_tokens": result.train_tokens},
        **({"data_added": [_data_entry(f, side) for f, side in zip(folders[1:], sides[1:])]} if len(folders) > 1 else {}),
        "steps": result.steps,
        "seconds": result.seconds,
        "heldout_before": result.before,
        "heldout_after": result.after,
        "curve": result.curve,
        "draft_vocab": {"file": draftvocab.FILE, "tokens_counted": vocab["tokens_counted"], "distinct": len(vocab["token_ids"]),
                        "coverage": {str(n): round(sum(vocab["counts"][:n]) / vocab["tokens_counted"], 4)
                                     for n in (1024, 2048, 4096, 8192, 16384) if n <= len(vocab["counts"])}},
        "versions": data.versions(),
    }
    (out / smollm.RECIPE_FILE).write_text(json.dumps(recipe, indent=1) + "\n")
    return recipe


def load_data(folders: list[Path]) -> tuple[list[data.Sequence], list[dict[str, Any]]]:
    """The sequences of every data folder, in order, and each folder's sidecar."""
    parts = [data.load(f) for f in folders]
    digests = [side["sha256"] for _, side in parts]
    if len(set(digests)) != len(digests):
        raise AtlasError("the same training data is given twice (" + ", ".join(str(f) for f in folders) + ")")
    return [s for seqs, _ in parts for s in seqs], [side for _, side in parts]


def _teacher(llama: Any, folders: list[Path], spec: HeadSpec, log: Callable[[str], None]) -> tuple[Teacher, float]:
    """The teacher pass over the spec's sequences (teachercache: read back when an earlier run made
    it, one pass per data folder, so adding a folder reuses the others' passes) and the seconds it
    took here."""
    if spec.sequence_limit is not None and len(folders) > 1:
        raise AtlasError("--sequence-limit takes one data folder (N sequences evenly spaced over it)")
    start = time.perf_counter()
    parts = []
    for folder in folders:
        sequences, side = data.load(folder)
        facts = {"data_sha256": side["sha256"], "main_gguf_sha256": smollm.GGUF_SHA256, "sequence_limit": spec.sequence_limit}
        parts.append(teachercache.teacher(llama, subset(sequences, spec.sequence_limit), spec, facts, log))
    whole = Teacher([h for p in parts for h in p.hidden], [t for p in parts for t in p.top_ids], [t for p in parts for t in p.top_logp])
    return whole, round(time.perf_counter() - start, 1)


def make_head(spec: HeadSpec, out: Path, log: Callable[[str], None] = print, folders: list[Path] | None = None) -> dict[str, Any]:
    """Train on the committed answers in `folders` (default `out`), in order, and save the head under `out`."""
    folders = folders or default_data(out)
    sequences, sides = load_data(folders)
    llama, _ = smollm.load_original()
    teacher, seconds = _teacher(llama, folders, spec, log)
    result = train(spec, sequences, llama, log, teacher=teacher)
    result.seconds["teacher_pass"] = seconds
    return save(result, subset(sequences, spec.sequence_limit), sides, spec, out, _command("real-model-head", spec, out, folders), folders)


# What an ablation compares: one spec field and the values it takes, all at the spec's budget
# (loss_vocab: the full vocabulary against the spec's cut, 8192 where it names none)
ABLATIONS: dict[str, Callable[[HeadSpec], list[Any]]] = {
    "init": lambda spec: list(INITS),
    "loss_vocab": lambda spec: [None, spec.loss_vocab or 8192],
}


def ablation_file(field: str) -> str:
    return f"ablation-{field}.json"


def ablation(spec: HeadSpec, out: Path, field: str = "init", log: Callable[[str], None] = print,
             folders: list[Path] | None = None) -> dict[str, Any]:
    """Heads that differ only in `field` (ABLATIONS), trained at one equal budget (`spec`, e.g. a
    fraction of an epoch, from the same init and batches) after one shared teacher pass; the
    held-out figures and seconds of each, written to ablation-<field>.json under `out`."""
    if field not in ABLATIONS:
        raise AtlasError(f"no ablation of {field!r}: {', '.join(ABLATIONS)}")
    values = ABLATIONS[field](spec)
    folders = folders or default_data(out)
    sequences, sides = load_data(folders)
    llama, _ = smollm.load_original()
    teacher, seconds = _teacher(llama, folders, spec, log)
    rows: dict[str, Any] = {}
    for value in values:
        log(f"{field} {value}")
        result = train(spec.model_copy(update={field: value}), sequences, llama, log, teacher=teacher)
        rows[str(value)] = {"heldout_after": result.after, "curve": result.curve, "seconds": result.seconds, "steps": result.steps}
    best = max(rows, key=lambda k: (rows[k]["heldout_after"]["t0_conditional"][0], rows[k]["heldout_after"]["t1_expected"][0]))
    table = {"what": f"MTP heads that differ only in {field}, at equal budget (atlas.checkpoints.headtrain.ablation)",
             "command": _command(f"real-model-head --ablation {field.replace('_', '-')}", spec, out, folders),
             "data_sha256": " + ".join(side["sha256"] for side in sides),
             "spec": spec.model_dump(exclude={field}), "teacher_pass_seconds": seconds, "best": best,
             "rule": "highest held-out first-draft T=0 acceptance over the full vocabulary", "variants": rows,
             "versions": data.versions()}
    (out / ablation_file(field)).write_text(json.dumps(table, indent=1) + "\n")
    return table
