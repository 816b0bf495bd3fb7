"""A checkpoint to measure: where its files are (a local folder, or a hub repo pinned to one
commit), what identifies them (a digest over the files), how its main model and MTP layer are
loaded, and how they are placed on devices. Every engine measures what this module resolves.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from atlas import AtlasError
from atlas.fingerprints.rules import fingerprint, parse_config_bytes
from atlas.decode.mtphead import MtpHead, head_from_transformers, load_family, tensor_names
from atlas.families.table import Family, identify
from atlas.decode.placement import Placement, auto_plan, parse_plan, place, place_head
from atlas.records.record import PROVENANCE_FILE, read_provenance
from atlas.paths import ROOT

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MIRROR = ROOT / "data" / "hub-mirror"
# relative to the project root (atlas.paths), where the CLI resolves its defaults
DEFAULT_MODEL_PATH = "data/hub-mirror/mtp-atlas/byte-mtp-8l"
DEFAULT_MODEL = ROOT / DEFAULT_MODEL_PATH
# Hub downloads: weights from safetensors only, never pickles or code.
ALLOW_PATTERNS = ["*.safetensors", "*.safetensors.index.json", "*.json", "tokenizer*", "*.model", "*.tiktoken", "*.txt"]


# Keys a JSON file of a checkpoint carries about the tools that wrote it, not the model: a
# `make real-model` after a transformers upgrade rewrote config.json's transformers_version and
# gave the same weights a third revision. `torch_dtype` is transformers 4's name for `dtype`.
TOOL_KEYS = frozenset({"transformers_version", "_commit_hash", "_name_or_path"})
RENAMED_KEYS = {"torch_dtype": "dtype"}
TOKENIZER_TEXT = frozenset({"merges.txt", "vocab.txt"})  # the .txt files a tokenizer reads; other text is notes


def _model_json(data: bytes) -> bytes:
    """A checkpoint JSON file as the model defines it: the tools' keys dropped at every depth, old
    key names renamed, keys sorted, no whitespace (a file that is not JSON: its bytes)."""
    import json

    def clean(value: object) -> object:
        if isinstance(value, dict):
            return {RENAMED_KEYS.get(k, k): clean(v) for k, v in value.items() if k not in TOOL_KEYS}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    try:
        return json.dumps(clean(json.loads(data)), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    except (ValueError, RecursionError):  # not JSON, or nested past what it can hold: its bytes (the reader refuses it)
        return data


def digest(folder: Path) -> str:
    """sha256 over what defines the model: the checkpoint's config, weights and tokenizer files
    (names and contents, sorted), JSON files read as the model defines them (_model_json). Not over
    the project's provenance file (how the checkpoint was made) or notes: the revision names the
    model, not the tools or the story that wrote it (records from schema 4 on; older records keep
    the revision the raw bytes gave). Nor over hidden files: `atlas real-model`'s output marker
    (.atlas-output.json) holds the time it was written, so records made before 2026-12-06 name one
    revision per build of the same files."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                       and (p.suffix in (".json", ".safetensors", ".model") and p.name != PROVENANCE_FILE
                            or p.name in TOKENIZER_TEXT)):
        h.update(path.name.encode() + b"\0")
        if path.suffix == ".json":
            h.update(_model_json(path.read_bytes()))
            continue
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()


def resolve(model: str, revision: str | None, endpoint: str | None = None) -> tuple[Path, str, str]:
    """(local folder, model id, revision). A local folder is used as is (its id is org/name when it
    sits in the bundled mirror, the one its atlas-provenance.json gives when the project built it,
    else local:<folder name>; its revision is a digest of its files);
    anything else is a hub repo id: `revision` (default main) is resolved to its commit first, and
    the download is pinned to that commit, so the record names exactly the files that were measured
    even if the branch moves meanwhile. `endpoint` defaults to huggingface_hub's ($HF_ENDPOINT)."""
    path = Path(model)
    if path.is_dir():
        resolved = path.resolve()
        model_id = resolved.relative_to(MIRROR).as_posix() if resolved.is_relative_to(MIRROR) else f"local:{resolved.name}"
        provenance = read_provenance(resolved)  # a checkpoint this project built names itself
        model_id = provenance.model_id if provenance else model_id
        return resolved, model_id, digest(resolved)
    if path.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        raise AtlasError(f"{model!r} is neither a checkpoint folder nor a hub repo id (org/name)")
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.utils import httpx

    endpoint = endpoint or constants.ENDPOINT
    try:
        info = HfApi(endpoint=endpoint).model_info(model, revision=revision)
        sha = info.sha or ""
        if not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise AtlasError(f"{endpoint} answered no commit sha for {model} at {revision or 'main'}")
        # Checked on the listing, before any download: pickled weights are never fetched or loaded.
        if not any(s.rfilename.endswith(".safetensors") for s in info.siblings or []):
            raise AtlasError(f"{model} has no safetensors weights at {sha} (pickled weights are never loaded)")
        folder = Path(snapshot_download(model, revision=sha, allow_patterns=ALLOW_PATTERNS, endpoint=endpoint))
    except RevisionNotFoundError:
        raise AtlasError(f"{model} has no revision {revision!r} on {endpoint}") from None
    except GatedRepoError:  # before its parent class: the repo exists, but its files need an accepted licence
        raise AtlasError(
            f"{model} is gated on {endpoint}: accept its conditions on the model page, then log in "
            "(`hf auth login` or HF_TOKEN) with an account that has access"
        ) from None
    except RepositoryNotFoundError:
        raise AtlasError(f"{model} was not found on {endpoint} (or it is private and no token with access was given)") from None
    except (httpx.HTTPError, OSError, ValueError) as exc:  # HTTP and connection errors; ValueError: an id the client refuses
        raise AtlasError(f"cannot download {model} from {endpoint}: {exc}") from None
    return folder, model, sha


@dataclass
class Loaded:
    model: PreTrainedModel
    mtp: MtpHead
    tokenizer: PreTrainedTokenizerBase
    family: str  # the family-table row that built the MTP layer, or transformers' own loader
    transformers_mtp: int  # MTP layers transformers' own use_mtp can run on this checkpoint (0: none)
    transformers_note: str = ""  # why it cannot (when 0), or how its loader was pointed at the MTP layers


def transformers_peer(model: PreTrainedModel, family: Family, device: torch.device) -> tuple[int, str]:
    """(MTP layers transformers' own `generate(use_mtp=True)` runs on a checkpoint the family table
    loaded, a note): 0 and the reason when it cannot. transformers finds MTP tensors through its
    class's `_keys_to_ignore_on_load_unexpected` patterns, which name the released depths only
    (GLM-4-MoE: layers 92 and 46; DeepSeek-V3: 61). A family that keeps its MTP layers after the
    main ones (`model.layers.{N}.`) has them at N..N+n-1 at any depth, so this model instance is
    pointed there; what generate() then runs is transformers' own. A 4-token use_mtp call proves it."""
    from transformers.modeling_layers import MtpModel

    text = model.config.get_text_config()
    n = getattr(text, "num_mtp_layers", None)
    if not isinstance(n, int) or n < 1:
        return 0, f"transformers' {type(text).__name__} has no num_mtp_layers: its use_mtp does not run this family"
    if not getattr(type(model), "_keys_to_ignore_on_load_unexpected", None):
        return 0, f"transformers' {type(model).__name__} registers no MTP tensors for use_mtp"
    note = "transformers' own MTP patterns"
    if "{N}" in family.glue:
        depth = int(text.num_hidden_layers)
        layers = "|".join(str(depth + m) for m in range(n))
        model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.({layers})\..*"]
        where = f"model.layers.{depth}" + (f"..{depth + n - 1}" if n > 1 else "")
        note = f"transformers' MTP loader pointed at {where} (its class names only the released depths)"
    try:
        MtpModel.get_mtp_weights_regex(model)
        with torch.inference_mode():
            model.generate(torch.tensor([[1, 2, 3]], device=device), max_new_tokens=4, do_sample=False, use_mtp=True,
                           eos_token_id=None, pad_token_id=0)
    except Exception as exc:  # whatever transformers raises, the peer is left out and the reason kept
        return 0, f"transformers' use_mtp cannot run it: {type(exc).__name__}: {str(exc)[:200]}"
    return n, note


def load_checkpoint(folder: str, device: torch.device, dtype: torch.dtype, peer: bool = True) -> Loaded:
    """The main model (transformers' class) and its MTP layer: built from the checkpoint's own
    tensors by the family table when a row matches its config and tensor layout (any depth), else
    through transformers' own MTP loader (e.g. the team model's Mellum); a family row that is
    refused, or a layout neither knows, is an AtlasError naming it. `peer`: probe whether transformers'
    own use_mtp runs a family-table checkpoint (transformers_peer: one MTP load and a 4-token call);
    off when no peer will run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_layers import MtpModel

    path = Path(folder)
    try:
        config = parse_config_bytes((path / "config.json").read_bytes())
    except OSError as exc:
        raise AtlasError(f"{folder}: cannot read config.json: {exc}") from None
    names = list(tensor_names(path))
    family = identify(config, names)
    note = ""
    if family is not None:
        model, head = load_family(path, family, device, dtype)
        via = family.name
        peer_layers, note = transformers_peer(model, family, device) if peer else (0, "not probed: no transformers peer asked for")
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_safetensors=True, trust_remote_code=False)
        except (OSError, ValueError, KeyError) as exc:
            raise AtlasError(f"transformers cannot load {folder}: {exc}") from None
        peer_layers = int(getattr(model.config.get_text_config(), "num_mtp_layers", None) or 0)
        if not peer_layers:
            shipped = fingerprint(config, names).shipped_family
            what = f"its MTP tensors ({shipped} layout, model_type {config.get('model_type')!r}) match no family-table row" if shipped else "the checkpoint has no MTP layer we know"
            raise AtlasError(f"{folder}: {what}, and transformers declares no MTP layer it can load (num_mtp_layers); refusing to guess")
        model = model.to(device).eval()
        try:
            head = head_from_transformers(MtpModel.from_pretrained(model, device_map={"": device}).eval())
        except (RuntimeError, ValueError, OSError, KeyError) as exc:
            raise AtlasError(f"{folder}: transformers cannot load the MTP layer: {exc}") from None
        via = "transformers MtpModel"
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:
        raise AtlasError(f"{folder}: cannot load the tokenizer: {exc}") from None
    return Loaded(model, head, tokenizer, via, peer_layers, note)


def place_model(loaded: Loaded, spec: str) -> Placement:
    """Plan (auto / auto+cpu / explicit) and move the main model and its MTP layer."""
    n_layers = len(loaded.model.get_decoder().layers)
    if spec in ("auto", "auto+cpu"):
        heads = [loaded.mtp, *loaded.mtp.next_layers]
        mtp_bytes = sum(p.numel() * p.element_size() for h in heads for m in (h.block, *h.post_norms) for p in m.parameters())
        placement = auto_plan(loaded.model, mtp_bytes, offload_cpu=spec == "auto+cpu")
    else:
        placement = parse_plan(spec, n_layers)
    for name in placement.devices():
        if name != "cpu":
            pick_device(name)  # a GPU that torch does not see is an AtlasError here
    place(loaded.model, placement)
    loaded.model.eval()
    loaded.mtp = place_head(loaded.mtp, torch.device(placement.head))
    return placement



def pick_device(name: str) -> torch.device:
    """auto (CUDA when torch sees one), cpu, cuda or cuda:N; anything else is an AtlasError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise AtlasError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise AtlasError(f"--device {name} asked for, but torch sees no CUDA device")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise AtlasError(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s) (cuda:0..)")
    return torch.device(name)
