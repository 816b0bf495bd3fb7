"""One series per experiment: the key of a measured cell is everything that changes its figures
besides the workload, temperature and draft length. Two records compare (the changelog's "what
moved", a re-measurement) only when their cells share a key; a record made with another head,
draft vocabulary, kernel choice, revision, engine build (with the patches the atlas applied to it),
weights' precision, thread count, machine or, for an engine's worker threads, OpenMP wait policy
starts a series of its own. The machine is its CPU (or GPU) model with the instruction sets that change kernels:
the same checkpoint's 2-row verify pass cost 1.06 plain steps on an AVX2 EPYC and 1.49 on an AMX
Xeon. Its pass costs, measured with every run of our loop, are shown with the key, not part of it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # records and cells are read here, never built: the record module calls this one
    from atlas.records.record import Cell, Record


OWN = "engine's own"  # kernels and drafting of an external engine (not "-": CSV export guards a leading "-" as a formula)


class ExperimentKey(NamedTuple):
    checkpoint: str  # the revision: a hub commit, or the digest of the model's files
    head: str  # the project-made MTP head's sha256 (provenance), or "as shipped" in the checkpoint
    draft_vocab: str  # a cut draft vocabulary (its table's sha256), or "full"; "engine's own" for another engine's stock drafting
    kernels: str  # our loop's CPU matmul kernels ("mm" before the choice existed); "engine's own" for other engines
    engine: str  # engine and its version, e.g. "atlas 0.1.0" or "vllm 0.32.0", with a patched build's patches and the wait policy its threads saw
    dtype: str  # the weights' precision as run: float32, bfloat16, a GGUF's type (gguf-Q4_1)
    threads: int  # torch threads of the process that timed the run
    machine: str  # CPU or GPU model
    isa: str  # the kernel-changing instruction sets ("unknown" in records stamped before them)

    @property
    def short(self) -> str:
        """Twelve hex characters naming the key, for labels."""
        return hashlib.sha256(repr(tuple(self)).encode()).hexdigest()[:12]

    @property
    def text(self) -> str:
        head = self.head if self.head == "as shipped" else f"head {self.head[:12]}"
        vocab = {"full": "full draft vocabulary", OWN: "engine's own drafting"}.get(self.draft_vocab, f"draft vocabulary {self.draft_vocab[:12]}")
        return (f"{self.checkpoint[:19]}, {head}, {vocab}, kernels {self.kernels}, {self.engine}, {self.dtype}, {self.threads} threads, "
                f"{self.machine} ({self.isa})")


def cut_draft(record: Record, cell: Cell) -> bool:
    """Whether `cell` drafted over the record's cut draft vocabulary: the cells of the engine the
    record measures (our loop, or the engine it ran), never a peer's beside them."""
    return record.settings.draft_vocab is not None and cell.engine == (record.engine_run.name if record.engine_run else "atlas")


def engine_patches(record: Record) -> list[tuple[str, str]]:
    """The patches an engine run's build carried (llama.cpp's nextn-d2t, repack-gemv-rows), as (name,
    sha256); none for our loop."""
    build = record.engine_run.build if record.engine_run is not None else None
    patches = build.get("patches") if isinstance(build, dict) else None  # a record's build is free-form: checked here
    if not isinstance(patches, list):
        return []
    return [(str(p["file"]).removesuffix(".patch"), str(p.get("sha256", ""))) for p in patches
            if isinstance(p, dict) and "file" in p]


def engine_threads(record: Record) -> int:
    """The threads a run decoded with: an engine that runs its own (llama.cpp's --threads) records them
    with its arguments; else the torch threads of the process."""
    threads = record.engine_run.engine_args.get("threads") if record.engine_run is not None else None
    return threads if isinstance(threads, int) and not isinstance(threads, bool) else record.hardware.torch_threads


def engine_wait_policy(record: Record) -> str | None:
    """$OMP_WAIT_POLICY as an external engine's worker threads saw it, where it can change the figures
    (more than one thread): the engine's own record of it, else, for records from before the atlas
    kept it from llama.cpp's binaries, the atlas's own, which they inherited. PASSIVE puts idle
    workers to sleep at each of a graph's barriers: a 2-thread plain step of llama.cpp took 29.6 ms
    under it and 10.4 ms without (docs/engines.md)."""
    e = record.engine_run
    if e is None or engine_threads(record) < 2:
        return None
    if "omp_wait_policy" in e.engine_args:
        policy = e.engine_args["omp_wait_policy"]
        return policy if isinstance(policy, str) else None
    return record.hardware.omp_wait_policy


def _engine(record: Record, cell: Cell) -> str:
    engine = cell.engine_version if cell.engine_version.startswith(cell.engine) else f"{cell.engine} {cell.engine_version}"
    if cell.engine != (record.engine_run.name if record.engine_run else "atlas"):
        return engine  # a peer beside our loop: none of the measured engine's build
    if patches := engine_patches(record):
        digest = hashlib.sha256(repr(patches).encode()).hexdigest()[:8]
        engine += f" + atlas patches {', '.join(name for name, _ in patches)} ({digest})"
    if policy := engine_wait_policy(record):
        engine += f", OpenMP wait {policy}"
    return engine


def experiment_key(record: Record, cell: Cell) -> ExperimentKey:
    """The key of one cell of `record` (ExperimentKey)."""
    settings, hw = record.settings, record.hardware
    head = record.provenance.mtp_head.get("sha256") if record.provenance else None
    kernels = (settings.kernels or "mm") if cell.engine == "atlas" else OWN
    flags = hw.cpu_flags
    return ExperimentKey(
        checkpoint=record.revision,
        head=str(head) if head is not None else "as shipped",
        draft_vocab=settings.draft_vocab.table_sha256 if cut_draft(record, cell) else "full" if cell.engine == "atlas" else OWN,
        kernels=kernels,
        engine=_engine(record, cell),
        dtype=settings.dtype,
        threads=hw.torch_threads,
        machine=hw.gpu or hw.cpu,
        isa="unknown" if flags is None else ", ".join(flags) or "none of AVX2, AVX-512, AMX",
    )


def columns(record: Record, cell: Cell) -> dict[str, object]:
    """What the store's measurement_cells row keeps of a cell's key: each part a reader filters on,
    with the key's short name and its text."""
    key = experiment_key(record, cell)
    vocab = record.settings.draft_vocab if cut_draft(record, cell) else None
    return {"threads": key.threads, "kernels": key.kernels, "dtype": key.dtype, "machine_isa": key.isa,
            "draft_vocab": (f"{vocab.size} tokens (sha256 {vocab.table_sha256[:12]})" if vocab else key.draft_vocab),
            "experiment_key": key.short, "experiment": key.text}
