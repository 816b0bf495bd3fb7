"""The engines `atlas measure run --engine` measures, one package each behind the same interface
(ENGINES): our own loop and transformers' generate pair (ours/), vLLM in its own environment as a
subprocess driver speaking JSON lines (vllm/) and llama.cpp's server from the pinned build
(llamacpp/). The parts every engine shares sit here: what a run is asked (options.py), runs summed
into cells (cells.py), the machine stamp (stamp.py), exact checkpoint rewrites (convert.py) and the
conformance suite (conformance_suite.py)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from atlas.engines.options import Options
    from atlas.records.record import Record


class EngineModule(Protocol):
    """What every engine module holds: `check` refuses, before anything loads, the options that do
    not apply to it; `run` measures and writes one record."""

    def check(self, options: Options) -> None: ...

    def run(self, options: Options, log: Callable[[str], None] = print) -> tuple[Record, Path]: ...


@dataclass(frozen=True)
class Engine:
    """A registered engine: its module, imported only when used (so `atlas --help` loads no torch),
    and its line of `--engine` help."""

    module: str
    help: str

    def load(self) -> EngineModule:
        return cast(EngineModule, importlib.import_module(self.module))


ENGINES = {
    "atlas": Engine("atlas.engines.ours.engine", "our loop (transformers' generate as the peer)"),
    "transformers": Engine("atlas.engines.ours.engine", "only transformers' generate / generate(use_mtp=True)"),
    "vllm": Engine("atlas.engines.vllm.engine", "vLLM in its own environment (`make vllm-env`)"),
    "llamacpp": Engine("atlas.engines.llamacpp.engine",
                       "llama.cpp's llama-server, plain vs draft-mtp, on a GGUF (`make llamacpp real-model-gguf`)"),
}
