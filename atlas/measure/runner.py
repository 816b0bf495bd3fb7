"""The measurement runner: load a checkpoint and its MTP layer through transformers, run plain and
self-speculative decoding interleaved over the bundled workloads, and write one dated record.

Per workload x temperature x repeat, every prompt runs once plainly and once per draft length, in an
order that rotates between repeats (so drift in a shared machine's speed does not favour one side).
transformers' own `generate` and `generate(use_mtp=True)` run on the same prompts as the peer.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from atlas import AtlasError, __version__
from atlas.fingerprints import fingerprint, parse_config_bytes
from atlas.measure.families import MtpHead, head_from_transformers, identify, load_family, tensor_names
from atlas.measure.placement import Placement, auto_plan, parse_plan, place, place_head
from atlas.measure.loop import (
    Engine,
    RunStats,
    Sampling,
    Stopwatch,
    build_engine,
    generate_plain,
    generate_speculative,
)
from atlas.paths import ROOT
from atlas.measure.records import (
    MIN_GATE_REPEATS,
    SCHEMA_VERSION,
    Cell,
    Hardware,
    PassCosts,
    Record,
    Repeat,
    Settings,
    Software,
    derive,
    gate,
    write_record,
)
from atlas.measure.workloads import load_prompt_set

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MIRROR = ROOT / "data" / "hub-mirror"
# relative to the project root (atlas.paths), where the CLI resolves its defaults
DEFAULT_MODEL_PATH = "data/hub-mirror/mtp-atlas/byte-mtp-8l"
DEFAULT_OUT_PATH = "evidence/measurements"
DEFAULT_MODEL = ROOT / DEFAULT_MODEL_PATH
# Hub downloads: weights from safetensors only, never pickles or code.
ALLOW_PATTERNS = ["*.safetensors", "*.safetensors.index.json", "*.json", "tokenizer*", "*.model", "*.tiktoken", "*.txt"]
MAX_PROMPT_TOKENS = 256
ATLAS_BASELINE = "atlas plain decoder, same model and static cache (MTP prefill counted on the speculative side)"
# Each mode's time is its generate() minus a 1-token generate() in the same mode: that removes the
# main prefill and, for use_mtp, the MTP module's load from disk that transformers repeats per call.
PEER_BASELINE = "transformers plain generate; each mode minus its own 1-token generate (MTP load + main prefill)"


@dataclass
class Options:
    model: str = str(DEFAULT_MODEL)
    revision: str | None = None
    endpoint: str | None = None
    device: str = "auto"
    device_map: str | None = None  # auto, auto+cpu or DEVICE=FIRST-LAST,... (atlas.measure.placement)
    dtype: str = "float32"
    workloads: list[str] | None = None
    temperatures: tuple[float, ...] = (0.0, 1.0)
    draft_tokens: tuple[int, ...] = (1, 2, 3)
    max_new_tokens: int = 128
    repeats: int = 5
    prompts_per_workload: int = 3
    seed: int = 0
    top_k: int | None = None
    top_p: float | None = None
    threads: int | None = None
    peer: bool = True
    ours: bool = True  # False (--engine transformers): only transformers' generate / use_mtp pair is measured
    out: Path = ROOT / DEFAULT_OUT_PATH
    command: str = ""
    quick: bool = False


def quick(options: Options) -> Options:
    """`--quick`: every workload still runs (so greedy losslessness is checked on each), but with
    short horizons, one prompt each and three repeats; about 30-40 s on 2 CPU cores. Its record
    says so, and its gates stay undecided: too few tokens to decide anything."""
    options.quick = True
    options.max_new_tokens = min(options.max_new_tokens, 24)
    options.repeats = min(options.repeats, MIN_GATE_REPEATS)
    options.prompts_per_workload = 1
    return options


# ---- loading -----------------------------------------------------------------------------------


def _digest(folder: Path) -> str:
    """sha256 over the checkpoint's config, weights and tokenizer files (names and bytes, sorted)."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors", ".txt", ".model")):
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()


def resolve(model: str, revision: str | None, endpoint: str | None = None) -> tuple[Path, str, str]:
    """(local folder, model id, revision). A local folder is used as is (its id is org/name when it
    sits in the bundled mirror, else local:<folder name>; its revision is a digest of its files);
    anything else is a hub repo id: `revision` (default main) is resolved to its commit first, and
    the download is pinned to that commit, so the record names exactly the files that were measured
    even if the branch moves meanwhile. `endpoint` defaults to huggingface_hub's ($HF_ENDPOINT)."""
    path = Path(model)
    if path.is_dir():
        resolved = path.resolve()
        model_id = resolved.relative_to(MIRROR).as_posix() if resolved.is_relative_to(MIRROR) else f"local:{resolved.name}"
        return resolved, model_id, _digest(resolved)
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


def load_checkpoint(folder: str, device: torch.device, dtype: torch.dtype) -> Loaded:
    """The main model (transformers' class) and its MTP layer: built from the checkpoint's own
    tensors by the family table when a row matches its config and tensor layout (any depth), else
    through transformers' own MTP loader (e.g. the team model's Mellum); a family row that is
    refused, or a layout neither knows, is an AtlasError naming it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_layers import MtpModel

    path = Path(folder)
    try:
        config = parse_config_bytes((path / "config.json").read_bytes())
    except OSError as exc:
        raise AtlasError(f"{folder}: cannot read config.json: {exc}") from None
    names = list(tensor_names(path))
    family = identify(config, names)
    if family is not None:
        model, head = load_family(path, family, device, dtype)
        via, peer_layers = family.name, 0
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
    return Loaded(model, head, tokenizer, via, peer_layers)


def place_model(loaded: Loaded, spec: str) -> Placement:
    """Plan (auto / auto+cpu / explicit) and move the main model and its MTP layer."""
    n_layers = len(loaded.model.get_decoder().layers)
    if spec in ("auto", "auto+cpu"):
        mtp_bytes = sum(p.numel() * p.element_size() for m in (loaded.mtp.block, *loaded.mtp.post_norms) for p in m.parameters())
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


# ---- the machine -------------------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0


def hardware(device: torch.device, placement: Placement | None = None) -> Hardware:
    cpu, cores = _cpu_name(), os.cpu_count() or 1
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    gpu_mem = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1) if gpu else None
    gpus = [d for d in placement.devices() if d.startswith("cuda")] if placement else [str(device)] if gpu else []
    return Hardware(
        text=(f"GPU: {len(gpus)} x {gpu}" if len(gpus) > 1 else f"GPU: {gpu}") if gpu else f"CPU: {cpu} ({cores} cores)",
        cpu=cpu,
        cpu_cores=cores,
        memory_gib=_memory_gib(),
        gpu=gpu,
        gpu_memory_gib=gpu_mem,
        torch_threads=torch.get_num_threads(),
    )


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _blas() -> str | None:
    """The BLAS torch's CPU matmuls go through, from its build configuration."""
    for line in torch.__config__.show().splitlines():
        if "BLAS_INFO=" in line:
            return line.split("BLAS_INFO=", 1)[1].split(",")[0].strip()
    return None


def software() -> Software:
    import numpy
    import transformers

    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return Software(
        python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__, atlas=__version__,
        atlas_commit=commit, atlas_tree_dirty=None if status is None else bool(status.strip()),
        numpy=numpy.__version__, blas=_blas(), os=platform.platform(),
    )


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---- timing pieces -----------------------------------------------------------------------------


class PassTimer:
    """Times single forwards: a 1-row main step, a (k+1)-row verify pass per k, and a 1-row MTP draft
    step, at `position` (mid-generation, so attention spans a typical cache). Each is timed in the
    company it keeps in the loops (a plain step after a plain step; a verify pass right after its k
    draft steps, which have pushed some main-model weights out of the CPU caches), round-robin, and
    again before every workload so the samples see the same machine load as the runs; the record
    keeps their medians. Cache contents do not affect timing, so overwritten slots need no restoring."""

    def __init__(self, engine: Engine, ks: list[int], position: int) -> None:
        self.engine, self.ks, self.position = engine, ks, position
        self.ids = torch.zeros(max(ks) + 1, dtype=torch.long, device=engine.device)
        self.hidden = torch.zeros(1, engine.embed.shape[1], dtype=engine.dtype, device=engine.device)
        self.samples: dict[str, list[float]] = {}
        self.watch = Stopwatch(engine.device, engine.devices)

    def _time(self, name: str, fn: Callable[[], object]) -> None:
        self.watch.start()
        fn()
        self.samples.setdefault(name, []).append(self.watch.stop())

    def sample(self, reps: int) -> PassCosts:
        """Time `reps` rounds; returns their medians (the repeat they precede records them)."""
        e, p = self.engine, self.position
        before = {name: len(times) for name, times in self.samples.items()}
        with torch.inference_mode():
            for _ in range(reps):
                e.main(self.ids[:1], p)
                self._time("plain", lambda: e.main(self.ids[:1], p))
                for k in self.ks:
                    for i in range(k):
                        self._time("draft", lambda i=i: e.draft(self.ids[:1], self.hidden, p + i))
                    self._time(f"verify{k}", lambda k=k: e.main(self.ids[: k + 1], p))
        return self._costs({name: times[before.get(name, 0):] for name, times in self.samples.items()})

    def costs(self) -> PassCosts:
        """Medians over every sample of the run."""
        return self._costs(self.samples)

    def _costs(self, samples: dict[str, list[float]]) -> PassCosts:
        med = {name: statistics.median(times) for name, times in samples.items()}
        return PassCosts(plain=med["plain"], verify={k: med[f"verify{k}"] for k in self.ks}, draft=med["draft"])


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") & (2**63 - 1)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


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


# ---- the run -----------------------------------------------------------------------------------


@dataclass
class _Acc:
    """Raw counts of one cell within one repeat, summed over prompts."""

    tokens: int = 0
    seconds: float = 0.0
    baseline_seconds: float = 0.0
    drafted: list[int] | None = None
    accepted: list[int] | None = None
    reached: list[int] | None = None
    passes: int = 0
    identical: bool = True
    costs: PassCosts | None = None  # timed just before this repeat

    def add(self, spec: RunStats, plain: RunStats, drafted: list[int] | None = None, accepted: list[int] | None = None) -> None:
        """`drafted`/`accepted` given: counts derived from an engine that reports no per-round
        detail (transformers' use_mtp), which then has no reached counts either."""
        if drafted is None:
            reached = spec.reached_per_position
            self.reached = reached if self.reached is None else [a + b for a, b in zip(self.reached, reached)]
        drafted = spec.drafted_per_position if drafted is None else drafted
        accepted = spec.accepted_per_position if accepted is None else accepted
        self.tokens += len(spec.tokens) - 1  # the decode phase's tokens (the first comes from the prefill)
        self.seconds += spec.seconds
        self.baseline_seconds += plain.seconds
        self.drafted = drafted if self.drafted is None else [a + b for a, b in zip(self.drafted, drafted)]
        self.accepted = accepted if self.accepted is None else [a + b for a, b in zip(self.accepted, accepted)]
        self.passes += spec.verify_passes
        self.identical &= spec.tokens == plain.tokens

    def repeat(self, greedy: bool) -> Repeat:
        return Repeat(
            tokens=self.tokens,
            seconds=self.seconds,
            baseline_seconds=self.baseline_seconds,
            drafted_per_position=self.drafted or [],
            accepted_per_position=self.accepted or [],
            verify_passes=self.passes,
            identical_to_baseline=self.identical if greedy else None,
            reached_per_position=self.reached,
            pass_costs=self.costs,
        )


def _cell(engine: str, version: str, baseline: str, workload: str, t: float, k: int, repeats: list[Repeat], costs: PassCosts | None,
          quick: bool) -> Cell:
    derived = derive(repeats, t, k, costs)
    enabled, reason = gate(derived, len(repeats), quick)
    return Cell(engine=engine, engine_version=version, baseline=baseline, workload=workload, temperature=t, draft_tokens=k,
                repeats=repeats, derived=derived, gate_enabled=enabled, gate_reason=reason)


def _measure_workload(
    engine: Engine, peer: Peer | None, prompts: list[list[int]], s: Sampling, ks: list[int], mtp_k: int, name: str, options: Options,
    timer: PassTimer, pass_reps: int,
) -> tuple[dict[int, list[Repeat]], list[Repeat]]:
    """Raw counts of one workload at one temperature: per repeat, the pass costs timed afresh (so
    each repeat's efficiency uses costs measured next to it), then every prompt once plainly and
    once per k (in an order rotated each repeat), then the transformers pair, alternating which
    goes first."""
    ours: dict[int, list[Repeat]] = {k: [] for k in ks} if options.ours else {}
    theirs: list[Repeat] = []
    prefill = [{m: peer.prefill_seconds(p, s, m) for m in (False, True)} for p in prompts] if peer else []
    n = options.max_new_tokens
    for r in range(options.repeats):
        costs = timer.sample(pass_reps) if options.ours else None
        acc = {k: _Acc(costs=costs) for k in ks}
        peer_acc = _Acc()
        for i, prompt in enumerate(prompts):
            order: list[int | None] = [None, *ks] if options.ours else []  # None = the plain run
            shift = r % max(1, len(order))
            runs: dict[int | None, RunStats] = {}
            for k in order[shift:] + order[:shift]:
                gen = _generator(engine.device, _seed(options.seed, s.temperature, name, i, r, k))
                runs[k] = generate_plain(engine, prompt, n, s, gen) if k is None else generate_speculative(engine, prompt, n, k, s, gen)
            for k in ks if options.ours else []:
                acc[k].add(runs[k], runs[None])
            if peer:
                pair = [False, True] if r % 2 == 0 else [True, False]
                got = {m: peer.run(prompt, n, s, m, _seed(options.seed, s.temperature, name, i, r, "peer", m), prefill[i][m]) for m in pair}
                spec = got[True]
                # each verify pass of transformers' loop checks num_mtp_layers drafts and emits accepted + 1
                peer_acc.add(spec, got[False], [spec.verify_passes * mtp_k], [len(spec.tokens) - 1 - spec.verify_passes])
        for k in ks if options.ours else []:
            ours[k].append(acc[k].repeat(s.greedy))
        if peer:
            theirs.append(peer_acc.repeat(s.greedy))
    return ours, theirs


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


def run(options: Options, log: Callable[[str], None] = print) -> tuple[Record, Path]:
    load_before = load_average()
    device = pick_device(options.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(options.dtype)
    if dtype is None:
        raise AtlasError(f"unknown dtype {options.dtype!r} (float32, bfloat16, float16)")
    # On CPU one thread by default: the matmuls of a small model are too small to share, and on
    # busy shared cores OpenMP threads waiting on each other made a step several times slower.
    torch.set_num_threads(options.threads or (1 if device.type == "cpu" else torch.get_num_threads()))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # use_mtp reloads the MTP weights on every generate() call
    prompt_set = load_prompt_set()
    workloads = prompt_set.get(options.workloads)
    folder, model_id, revision = resolve(options.model, options.revision, options.endpoint)
    placement = None
    if options.device_map:  # loaded in CPU memory, then each piece moved to its device
        log(f"loading {model_id} ({revision[:19]}) for placement {options.device_map} as {options.dtype}")
        loaded = load_checkpoint(str(folder), torch.device("cpu"), dtype)
        placement = place_model(loaded, options.device_map)
        device = torch.device(placement.embed)
        log("placement: " + ", ".join(f"{d}: {placement.layers.count(d)} layers" for d in placement.devices()) + f"; head and MTP on {placement.head}")
    else:
        log(f"loading {model_id} ({revision[:19]}) on {device} as {options.dtype}")
        loaded = load_checkpoint(str(folder), device, dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    log(f"MTP layer built by: {loaded.family}")
    prompts = {
        w.name: [tokenizer.encode(p, add_special_tokens=False)[-MAX_PROMPT_TOKENS:] for p in w.prompts[: options.prompts_per_workload]]
        for w in workloads
    }
    ks = sorted(set(options.draft_tokens))
    longest = max(len(p) for ps in prompts.values() for p in ps)
    engine = build_engine(model, loaded.mtp, longest + options.max_new_tokens + max(ks) + 2, prompts[workloads[0].name][0][:64])
    timer = PassTimer(engine, ks, int(statistics.median(len(p) for ps in prompts.values() for p in ps)) + options.max_new_tokens // 2)
    pass_reps = 10  # pass-cost rounds before every repeat
    if options.peer and not loaded.transformers_mtp:
        log("transformers has no MTP loader for this checkpoint: no transformers use_mtp peer")
    peer = Peer(model, device) if options.peer and loaded.transformers_mtp else None
    if not options.ours and peer is None:
        raise AtlasError(f"--engine transformers: transformers' own use_mtp cannot run {model_id} (no MTP loader for it)")
    if not options.ours:
        log(f"--engine transformers: generate(use_mtp=True) drafts num_mtp_layers = {loaded.transformers_mtp} per pass; --draft-tokens is not used")
    warm = prompts[workloads[0].name][0]
    for t in options.temperatures:  # warm-up: allocator, kernels, caches; not timed
        s = Sampling(t, options.top_k, options.top_p)
        generate_plain(engine, warm, 8, s, _generator(device, 0))
        for k in ks if options.ours else []:
            generate_speculative(engine, warm, 8, k, s, _generator(device, 0))
        if peer:
            peer.run(warm, 4, s, False, 0, 0.0)
            peer.run(warm, 4, s, True, 0, 0.0)
    mtp_k = loaded.transformers_mtp
    raw: list[tuple[str, float, dict[int, list[Repeat]], list[Repeat]]] = []
    for t in options.temperatures:
        s = Sampling(t, options.top_k, options.top_p)
        for w in workloads:
            ours, theirs = _measure_workload(engine, peer, prompts[w.name], s, ks, mtp_k, w.name, options, timer, pass_reps)
            raw.append((w.name, t, ours, theirs))
            log(progress_line(w.name, t, ours, theirs))
    costs = timer.costs() if options.ours else None
    if costs:
        log(f"pass costs: plain {costs.plain * 1e3:.2f} ms, " + ", ".join(f"verify k={k} {v * 1e3:.2f} ms" for k, v in costs.verify.items()) + f", draft {costs.draft * 1e3:.2f} ms")
    cells: list[Cell] = []
    for name, t, ours, theirs in raw:
        cells.extend(_cell("atlas", __version__, ATLAS_BASELINE, name, t, k, ours[k], costs, options.quick) for k in ours)
        if theirs:
            cells.append(_cell("transformers-use_mtp", peer.version, PEER_BASELINE, name, t, mtp_k, theirs, None, options.quick))
    record = Record(
        schema_version=SCHEMA_VERSION,
        run_date=datetime.now(timezone.utc).replace(microsecond=0),
        model_id=model_id,
        revision=revision,
        hardware=hardware(device, placement),
        software=software(),
        command=options.command,
        seed=options.seed,
        prompt_set=prompt_set.name,
        prompt_set_digest=prompt_set.digest,
        settings=Settings(
            device=str(device), dtype=options.dtype, workloads=[w.name for w in workloads], temperatures=list(options.temperatures),
            draft_tokens=ks if options.ours else [mtp_k], max_new_tokens=options.max_new_tokens, repeats=options.repeats,
            prompts_per_workload=options.prompts_per_workload, top_k=options.top_k, top_p=options.top_p, quick=options.quick,
            placement=placement,
        ),
        pass_costs=costs,
        cells=cells,
        load_before=load_before,
        load_after=load_average(),
    )
    path = write_record(record, options.out)
    lossy = [c for c in cells if c.engine == "atlas" and c.derived.greedy_lossless is False]
    # Only fp32 must match bit for bit: in bf16/fp16 a (k+1)-row verify and a 1-row step round
    # differently and near-ties may flip (expected numerics); the record and the gate still say so.
    if lossy and dtype == torch.float32:
        raise AtlasError(
            f"greedy speculative output differed from plain greedy in {len(lossy)} cell(s) "
            f"(e.g. {lossy[0].workload}, k={lossy[0].draft_tokens}); record kept at {path} for inspection"
        )
    return record, path


def progress_line(workload: str, t: float, ours: dict[int, list[Repeat]], theirs: list[Repeat]) -> str:
    """Acceptance and median speed-up per engine, as the run goes (the record has everything)."""
    parts = []
    for label, repeats in [*((f"k={k}", r) for k, r in ours.items()), *([("hf", theirs)] if theirs else [])]:
        drafted = sum(sum(r.drafted_per_position) for r in repeats)
        accepted = sum(sum(r.accepted_per_position) for r in repeats)
        speedup = statistics.median(r.baseline_seconds / r.seconds for r in repeats)
        parts.append(f"{label} acc {accepted / drafted if drafted else 0:.2f} x{speedup:.2f}")
    return f"  {workload:<10} T={t:g}: " + "; ".join(parts)


def command_line() -> str:
    return shlex.join(["atlas", *sys.argv[1:]])
