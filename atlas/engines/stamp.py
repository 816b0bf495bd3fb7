"""The stamp every record carries: the machine it ran on (hardware), the software stack and the
state of the atlas tree (software), the load average around the run, and the command line.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from atlas import __version__
from atlas.hub import redact
from atlas.decode.placement import Placement
from atlas.records.runcontext import Hardware, Software
from atlas.paths import ROOT, published


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# CPU flags that change which kernels oneDNN / the BLAS pick for a matmul, and so the pass costs.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """KERNEL_FLAGS the CPU has, from /proc/cpuinfo's first flags line (empty where unreadable)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith(("flags", "Features"))), "")
    have = set(line.split(":", 1)[-1].split())
    return [f for f in KERNEL_FLAGS if f in have]


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0


def hardware(device: torch.device, placement: Placement | None = None) -> Hardware:
    cpu, cores = cpu_name(), os.cpu_count() or 1
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    gpu_mem = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1) if gpu else None
    gpus = [d for d in placement.devices() if d.startswith("cuda")] if placement else [str(device)] if gpu else []
    return Hardware(
        text=(f"GPU: {len(gpus)} x {gpu}" if len(gpus) > 1 else f"GPU: {gpu}") if gpu else f"CPU: {cpu} ({cores} cores)",
        cpu=cpu,
        cpu_cores=cores,
        memory_gib=_memory_gib(),
        gpu=gpu,
        gpu_memory_gib=gpu_mem,
        torch_threads=torch.get_num_threads(),
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
        cpu_flags=cpu_flags(),
    )


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _blas() -> str | None:
    """The BLAS torch's CPU matmuls go through, from its build configuration."""
    for line in torch.__config__.show().splitlines():
        if "BLAS_INFO=" in line:
            return line.split("BLAS_INFO=", 1)[1].split(",")[0].strip()
    return None


def software() -> Software:
    import numpy
    import transformers

    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return Software(
        python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__, atlas=__version__,
        atlas_commit=commit, atlas_tree_dirty=None if status is None else bool(status.strip()),
        numpy=numpy.__version__, blas=_blas(), os=platform.platform(),
    )


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def command_line() -> str:
    """The command as the record keeps it, which evidence and export publish: without the user
    info of a URL (`--endpoint https://user:password@host`) or a registered token, and with each
    absolute path (`--out /home/me/runs`, `--model=/data/ckpt`) as paths.published gives it:
    relative to the repository, else the name alone, never the runner's own folders."""
    return redact.text(shlex.join(["atlas", *(_published_arg(a) for a in sys.argv[1:])]))


def _published_arg(arg: str) -> str:
    option, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    return option + eq + published(value) if value.startswith("/") else arg
