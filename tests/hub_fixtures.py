"""Fixtures and expectations shared by the crawl, store and fingerprint tests (helper CRAWL).

A pytest plugin (tests/conftest.py names it): its fixtures reach every test module; its constants
and helpers are imported where needed, `from hub_fixtures import ...` (pytest puts tests/ on sys.path).
The hub server runs in-process on 127.0.0.1; no test touches the network.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before any huggingface_hub import: no telemetry request, no user cache, never offline mode.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.pop("HF_HUB_OFFLINE", None)

from atlas.hub.local.server import HubServer, load_mirror

ROOT = Path(__file__).resolve().parents[1]
MIRROR = ROOT / "data" / "hub-mirror"
UNATTRIBUTED = MIRROR / "_unattributed"
MIMO = UNATTRIBUTED / "XiaomiMiMo-MiMo-7B-variant-from-jj8127-mimo_kor"
QWEN35_MLX = UNATTRIBUTED / "Qwen3.5-9B-MLX-8bit-from-leo-kreisman"
TEAM_MODEL = "mtp-atlas/byte-mtp-8l"

# Every attributed config of the bundled mirror: (declared_num_mtp_layers, declared_key).
# The values come from SOURCES.tsv's notes column, written when the files were collected.
EXPECTED_DECLARED: dict[str, tuple[int | None, str | None]] = {
    "Flagstone8878/Qwen3.5-18B-REAP-A3B-Coding": (1, "mtp_num_hidden_layers"),
    "MiniMaxAI/MiniMax-M2.7": (3, "num_mtp_modules"),
    "Qwen/Qwen2.5-1.5B": (None, None),
    "Qwen/Qwen2.5-32B": (None, None),
    "Qwen/Qwen2.5-72B": (None, None),
    "Qwen/Qwen2.5-7B": (None, None),
    "Qwen/Qwen2.5-VL-7B-Instruct": (None, None),
    "Qwen/Qwen3-0.6B": (None, None),
    "Qwen/Qwen3-1.7B": (None, None),
    "Qwen/Qwen3-235B-A22B": (None, None),
    "Qwen/Qwen3-235B-A22B-FP8": (None, None),
    "Qwen/Qwen3-30B-A3B": (None, None),
    "Qwen/Qwen3-30B-A3B-FP8": (None, None),
    "Qwen/Qwen3-32B": (None, None),
    "Qwen/Qwen3-32B-FP8": (None, None),
    "Qwen/Qwen3-8B": (None, None),
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": (None, None),
    "Qwen/Qwen3-Next-80B-A3B-Thinking": (None, None),
    "Qwen/Qwen3.5-122B-A10B": (1, "text_config.mtp_num_hidden_layers"),
    "Qwen/Qwen3.5-27B": (1, "text_config.mtp_num_hidden_layers"),
    "Qwen/Qwen3.5-35B-A3B": (1, "text_config.mtp_num_hidden_layers"),
    "Qwen/Qwen3.5-397B-A17B": (1, "text_config.mtp_num_hidden_layers"),
    "Qwen/Qwen3.5-9B": (1, "text_config.mtp_num_hidden_layers"),
    "deepseek-ai/DeepSeek-R1": (1, "num_nextn_predict_layers"),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": (None, None),
    "deepseek-ai/DeepSeek-V3": (1, "num_nextn_predict_layers"),
    "deepseek-ai/DeepSeek-V3.1": (1, "num_nextn_predict_layers"),
    "deepseek-ai/DeepSeek-V3.2": (1, "num_nextn_predict_layers"),
    "meta-llama/Llama-2-70b-hf": (None, None),
    "meta-llama/Llama-2-7b-hf": (None, None),
    "meta-llama/Llama-3.3-70B-Instruct": (None, None),
    "meta-llama/Meta-Llama-3.1-405B": (None, None),
    "meta-llama/Meta-Llama-3.1-70B": (None, None),
    "meta-llama/Meta-Llama-3.1-8B": (None, None),
    "microsoft/phi-4": (None, None),
    "mistralai/Mixtral-8x22B-v0.1": (None, None),
    "mistralai/Mixtral-8x7B-v0.1": (None, None),
    "moonshotai/Kimi-K2-Instruct": (0, "num_nextn_predict_layers"),
    "nvidia/DeepSeek-V3-0324-NVFP4": (1, "num_nextn_predict_layers"),
    "nvidia/DeepSeek-V3.1-NVFP4": (1, "num_nextn_predict_layers"),
    "nvidia/DeepSeek-V3.2-NVFP4": (1, "num_nextn_predict_layers"),
    "nvidia/Llama-3.1-70B-Instruct-FP8": (None, None),
    "nvidia/MiniMax-M2.5-NVFP4": (3, "num_mtp_modules"),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (None, None),
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8": (1, "num_nextn_predict_layers"),
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": (1, "num_nextn_predict_layers"),
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4": (1, "num_nextn_predict_layers"),
    "nvidia/Nemotron-H-56B-Base-8K": (None, None),
    "openai/gpt-oss-120b": (None, None),
    "openai/gpt-oss-20b": (None, None),
    "zai-org/GLM-4.5": (1, "num_nextn_predict_layers"),
    "zai-org/GLM-4.5-Air": (1, "num_nextn_predict_layers"),
    "zai-org/GLM-5-FP8": (1, "num_nextn_predict_layers"),
}
# The team model (helper TEAM) lands in the mirror later; when present it must read like this.
EXPECTED_TEAM = {"declared": (1, "num_nextn_predict_layers"), "shipped": 1, "evidence": "mtp.*"}

DERIVATIVES = {
    "Flagstone8878/Qwen3.5-18B-REAP-A3B-Coding",
    "Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-30B-A3B-FP8", "Qwen/Qwen3-32B-FP8",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "nvidia/DeepSeek-V3-0324-NVFP4",
    "nvidia/DeepSeek-V3.1-NVFP4", "nvidia/DeepSeek-V3.2-NVFP4", "nvidia/Llama-3.1-70B-Instruct-FP8",
    "nvidia/MiniMax-M2.5-NVFP4", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "zai-org/GLM-5-FP8",
}


def team_model_present() -> bool:
    return (MIRROR / TEAM_MODEL / "config.json").exists()


def mirror_config(repo_id: str) -> Path:
    return MIRROR / repo_id / "config.json"


def copy_mirror(dest: Path, repos: list[str] | None = None) -> Path:
    """A private copy of (part of) the bundled mirror that a test may change."""
    dest.mkdir(parents=True, exist_ok=True)
    for repo_id in repos if repos is not None else list(EXPECTED_DECLARED):
        shutil.copytree(MIRROR / repo_id, dest / repo_id)
    shutil.copy(MIRROR / "HUB_METADATA.toml", dest / "HUB_METADATA.toml")
    return dest


# ---- hostile corpora (tests/test_hostile_*.py) -----------------------------------------------------
GOOD = json.loads((MIRROR / "zai-org/GLM-4.5/config.json").read_text())  # a real config to make variants of


def config(**changes) -> bytes:
    """GLM-4.5's real config with `changes` applied, as the bytes a hub would serve."""
    return json.dumps({**GOOD, **changes}).encode()


def build_mirror(mirror: Path, repos: dict[str, dict[str, bytes]], meta: str = "") -> Path:
    """A mirror folder holding `repos` (repo id -> file name -> bytes) and the given HUB_METADATA.toml."""
    for repo_id, files in repos.items():
        folder = mirror / repo_id
        folder.mkdir(parents=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
    (mirror / "HUB_METADATA.toml").write_text(meta)
    return mirror


def rows(db: Path, sql: str) -> list[tuple]:
    """The rows of `sql` on the store at `db`, opened read-only."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def write_watchlist(path: Path, orgs: list[str], exemplars: list[str] = (), repos: list[str] = ()) -> Path:
    lines = ["orgs = ["] + [f'  {{ author = "{o}" }},' for o in orgs] + ["]"]
    lines.append("exemplars = [" + ", ".join(f'"{e}"' for e in exemplars) + "]")
    lines.append("repos = [" + ", ".join(f'"{r}"' for r in repos) + "]")
    lines += ["[defaults]", 'pipeline_tags = ["text-generation", "image-text-to-text"]', "min_downloads = 0"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def bundled_hub() -> Iterator[HubServer]:
    """The bundled mirror behind a local hub server, started once per session. Tests that
    inject faults or read the request log must use their own server (`make_hub`)."""
    with HubServer(load_mirror(MIRROR), page_size=10) as hub:
        yield hub


@pytest.fixture
def make_hub() -> Iterator:
    """Factory for private hub servers (stopped at test end)."""
    servers: list[HubServer] = []

    def make(mirror: Path, **kwargs) -> HubServer:
        hub = HubServer(load_mirror(mirror), **kwargs).start()
        servers.append(hub)
        return hub

    yield make
    for hub in servers:
        hub.stop()


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Patch every wait of a crawl so nothing really waits: the hub client's backoff
    (huggingface_hub.utils._http.time.sleep, which is time.sleep) and the crawler's own pauses
    (atlas.hub.pacing.wait: rate-limit holds and retries). Returns the list of requested waits."""
    waits: list[float] = []
    monkeypatch.setattr("huggingface_hub.utils._http.time.sleep", waits.append)
    monkeypatch.setattr("atlas.hub.pacing.wait", lambda event, seconds: waits.append(seconds))
    return waits
