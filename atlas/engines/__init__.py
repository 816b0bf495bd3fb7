"""The engines `atlas measure run --engine` measures, one module each behind the same interface
(ENGINES): our own loop (atlas_engine), transformers' generate pair (transformers_engine) and vLLM in
its own environment as a subprocess driver speaking JSON lines (vllm_engine, vllm_client,
vllm_driver, convert). The `_engine` suffix is there because vllm_driver.py runs as a script from
this folder: a module named vllm.py or transformers.py here would shadow the real packages in vLLM's
interpreter."""

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
    "atlas": Engine("atlas.engines.atlas_engine", "our loop (transformers' generate as the peer)"),
    "transformers": Engine("atlas.engines.transformers_engine", "only transformers' generate / generate(use_mtp=True)"),
    "vllm": Engine("atlas.engines.vllm_engine", "vLLM in its own environment (`make vllm-env`)"),
}
