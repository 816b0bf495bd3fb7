"""The one-pass CPU matmul (onepass.cpp): y = x Wᵀ reading W once for up to 4 rows, with every
row's sums independent of how many rows share the pass.

Why our own kernel: on an AVX2-only CPU neither of torch's paths reads a weight once for a few rows.
MKL's sgemm grew almost linearly with the rows (a 2-row verify cost 1.6-1.7 plain steps on the
project's AMD EPYC), and oneDNN's blocked path cost 2.0. This kernel dots each weight row with up
to 4 activation rows while it is in registers, so 2 rows cost about one weight read. Each row's
sums run in a fixed order, so a projection gives a row the same bits in a 1-row step as in a
verify pass (the attention's bmm does not, so whole passes still differ in the last bits).

A native build, so it lives in a cache outside the clone (~/.cache/mtp-atlas/onepass/, keyed by the
source, torch's version and the flags), made once by `make kernels` (about 40 s); `load()` never
builds, so a run without it says so and falls back to torch's kernels. x86 with AVX2 and FMA only.

Software prefetch (ask for each weight cache line 4 KiB ahead) changes no result, only the time:
it made a 2-core Intel Xeon's passes a fifth faster, and a different prefetch had made an AMD
EPYC's slower. So the build times both on the machine it is made on and keeps the faster in
`choice.json` beside the library: fixed from then on, so it cannot move with the load while runs
start, and every record names it (`describe()`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import statistics
import sys
import time
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

from atlas import AtlasError
from atlas.paths import CACHE

SOURCE = Path(__file__).with_name("onepass.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-ffp-contract=off"]


def build_dir() -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
    return CACHE / "onepass" / key


def unsupported() -> str | None:
    """Why this machine cannot run the kernel, or None."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"the CPU lacks AVX2 and FMA (torch reports {torch.backends.cpu.get_cpu_capability()})"
    return None


CHOICE_FILE = "choice.json"
# Calibration: 1- and 2-row passes over weights larger than a server's last-level cache (as a
# model's are), each variant timed in turn, so a moment of load falls on both
CALIBRATION_BYTES = 512 << 20
CALIBRATION_ROUNDS = 9


def _library(where: Path) -> Path | None:
    found = sorted(where.glob("atlas_onepass*.so"))
    return found[0] if found else None


def _import(library: Path) -> ModuleType | None:
    spec = importlib.util.spec_from_file_location("atlas_onepass", library)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def load() -> ModuleType | None:
    """The built kernel, or None where it is not built or the CPU cannot run it (never builds)."""
    where = build_dir()
    library = _library(where)
    if unsupported() or library is None or _choice(where) is None:
        return None
    return _import(library)


def _choice(where: Path) -> bool | None:
    """The build's prefetch choice, or None where its file is absent or not one the build writes."""
    try:
        found = json.loads((where / CHOICE_FILE).read_text()).get("prefetch")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, bool) else None


def _write_choice(where: Path, module: ModuleType) -> None:
    partial = where / (CHOICE_FILE + ".partial")
    partial.write_text(json.dumps(calibrate(module), indent=1) + "\n")
    partial.replace(where / CHOICE_FILE)


@cache
def prefetch() -> bool:
    """Whether this machine's build chose software prefetch (load() must not be None)."""
    return bool(_choice(build_dir()))


def describe() -> str:
    """The build's choice, in the words a record keeps (the distance as the kernel states it)."""
    module = load()
    assert module is not None
    return f"software prefetch {module.PREFETCH_FLOATS * 4 // 1024} KiB ahead" if prefetch() else "no software prefetch"


def calibrate(module: ModuleType) -> dict[str, object]:
    """Time 1- and 2-row passes with and without prefetch (the same results either way) and
    choose the smaller sum of their medians."""
    k = 576
    weights = [torch.full((8192, k), 0.5) for _ in range(CALIBRATION_BYTES // (8192 * k * 4))]
    xs = {m: torch.full((m, k), 0.25) for m in (1, 2)}
    times: dict[tuple[bool, int], list[float]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the records' setting: one stream per core
    try:
        for _ in range(CALIBRATION_ROUNDS):
            for pf in (False, True):
                for m, x in xs.items():
                    start = time.perf_counter()
                    for w in weights:
                        module.onepass_mm(x, w, pf)
                    times.setdefault((pf, m), []).append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    ms = {f"{'prefetch' if pf else 'none'}, {m} row{'s' if m > 1 else ''}": round(statistics.median(t) * 1e3, 2)
          for (pf, m), t in times.items()}
    cost = {pf: sum(statistics.median(times[(pf, m)]) for m in xs) for pf in (False, True)}
    return {"prefetch": cost[True] < cost[False], "median_ms": ms, "weights_mib": CALIBRATION_BYTES >> 20, "threads": 1}


def missing() -> str | None:
    """Why load() gives None (the tests' skip reason, the benchmarks' note), or None when it loads."""
    if (reason := unsupported()) is not None:
        return reason
    if load() is None:
        return f"the one-pass kernel is not built (make kernels; looked in {build_dir()})"
    return None


def absent() -> str | None:
    """Why load() gives None, in the few words a record keeps (no local paths), or None."""
    if unsupported() is not None:
        return "one-pass kernel unsupported: no AVX2 and FMA"
    return None if load() is not None else "one-pass kernel not built"


def build() -> Path:
    """Compile onepass.cpp into build_dir() (a no-op when it is there): AtlasError on failure."""
    if (reason := unsupported()) is not None:
        raise AtlasError(f"cannot build the one-pass kernel here: {reason}")
    where = build_dir()
    if (library := _library(where)) is not None:
        if _choice(where) is None:  # its choice lost or damaged: timed again, the library kept
            module = _import(library)
            if module is None:
                raise AtlasError(f"the one-pass kernel in {where} does not import; remove that folder and build again")
            _write_choice(where, module)
            load.cache_clear()
            prefetch.cache_clear()
        return library
    from torch.utils.cpp_extension import load as compile_extension

    staging = where.with_name(where.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    try:
        compile_extension("atlas_onepass", [str(SOURCE)], extra_cflags=FLAGS, build_directory=str(staging), verbose=False)
    except (RuntimeError, OSError, ImportError) as exc:  # cpp_extension raises RuntimeError for a failed compile
        raise AtlasError(f"the one-pass kernel did not build ({str(exc).splitlines()[-1] if str(exc) else exc}); "
                         f"its build folder is {staging}") from None
    library = _library(staging)
    module = _import(library) if library is not None else None
    if module is None:
        raise AtlasError(f"the one-pass kernel built but does not import; its build folder is {staging}")
    _write_choice(staging, module)
    staging.rename(where)  # whole or absent: a half-built folder is never taken for a build
    load.cache_clear()
    prefetch.cache_clear()
    library = _library(where)
    assert library is not None
    return library


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x Wᵀ through the kernel (x [M, K] fp32 contiguous, W [N, K]); load() must not be None."""
    module = load()
    assert module is not None
    return module.onepass_mm(x.contiguous(), w, prefetch())


if __name__ == "__main__":  # make kernels
    try:
        print(f"one-pass kernel: {build()} ({describe()}; the timings in {build_dir() / CHOICE_FILE})")
    except AtlasError as exc:
        print(f"one-pass kernel not built: {exc}", file=sys.stderr)
        sys.exit(1)
