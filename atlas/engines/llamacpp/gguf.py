"""GGUF files of a GLM-4-MoE checkpoint for llama.cpp, made by llama.cpp's own converter and
quantizer (the pinned build), and what a GGUF file is before a server is started on it.

`make_set` writes, into one folder, the three layouts llama.cpp's loader accepts (combined: trunk
and MTP layer; trunk-only, `--no-mtp`; the MTP-only sidecar, `--mtp`), each at f16 and quantized by
llama-quantize, with manifest.json: every file's layout, type, size and sha256, the exact command
that made it, the source checkpoint's digest and the build. The converter runs through
llamacpp/convert.py (GPT-2-style vocabulary, zero-size shared_experts left out; it says why).
Given a draft vocabulary size, each combined file also gets a copy whose MTP layer drafts over the
head's most frequent training tokens only (draftvocab.py; the patched build runs it). Given an
output type, each quantized combined file also gets an untied copy (`combined-Q4_0-output-Q4_0.gguf`):
the tied output layer written as an output.weight of its own at that type (llamacpp/convert.py
--untie-output says why), every other tensor at the tied file's types.

`inspect` reads a file's header with the crawler's bounded reader (atlas.fingerprints.gguf): architecture, layout and file type, so a
trunk-only file given as combined, or an architecture without an MTP graph, is refused by name.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from atlas import AtlasError
from atlas.engines.llamacpp import draftvocab as llamacpp_draftvocab
from atlas.engines.llamacpp.build import Build
from atlas.fingerprints.gguf import FILE_TYPES, GGML_TYPES, FileSource, models, read_header
from atlas.paths import sha256_file

CONVERT = Path(__file__).with_name("convert.py")
LAYOUTS: dict[str, list[str]] = {"combined": [], "trunk": ["--no-mtp"], "mtp": ["--mtp"]}
# Q4_1: the original SmolLM2 GGUF's type; Q4_0: the 4-bit type llama.cpp repacks for its multi-row
# CPU kernels (a 2-row pass cost 1.28 plain steps against Q4_1's 1.56 at 1 thread on an AVX2 EPYC)
QUANTS = ("Q8_0", "Q4_1", "Q4_0", "Q4_K_M")
# Architectures whose graph in build 11434 has an MTP (nextn) branch: src/models/*.cpp with
# LLM_GRAPH_TYPE_DECODER_MTP, named as src/llama-arch.cpp names them (gemma4's assistant is a
# separate model, not a nextn layer, and is not measured here).
MTP_GRAPHS = frozenset({"bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe", "glm5-next",
                        "hy_v3", "mimo2", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp", "step35"})
COMMAND = "atlas real-model-gguf"
Layout = Literal["combined", "trunk", "mtp"]


class GgufInfo(BaseModel):
    path: str
    architecture: str
    layout: Layout
    file_type: str  # the GGUF's general.file_type by name, e.g. MOSTLY_Q4_1
    tensors: int
    nextn_layers: int
    draft_vocab: int | None = None  # rows of the MTP layer's cut draft head (nextn.d2t), None: the whole vocabulary
    output: str | None = None  # the type of an output.weight of the file's own; None: tied to token_embd
    embedding: str = "none"  # token_embd's type


class GgufFile(BaseModel):
    file: str
    layout: Layout
    type: str  # f16 or the llama-quantize type
    bytes: int
    sha256: str
    command: str
    draft_vocab: int | None = None  # the MTP layer drafts over this many tokens (draftvocab.py); None: all
    output: str | None = None  # an untied copy's output.weight type (llamacpp/convert.py --untie-output); None: as converted


class Manifest(BaseModel):
    source: str  # the checkpoint folder as given
    source_digest: str  # atlas.decode.checkpoint.digest of it
    build: dict[str, object]
    files: list[GgufFile]

    def find(self, layout: str, kind: str, draft_vocab: int | None = None, output: str | None = None) -> GgufFile:
        for f in self.files:
            if (f.layout == layout and f.type.lower() == kind.lower() and f.draft_vocab == draft_vocab
                    and (f.output or "").lower() == (output or "").lower()):
                return f
        cut = f" drafting over {draft_vocab} tokens" if draft_vocab else ""
        untied = f" with its output layer untied at {output}" if output else ""
        raise AtlasError(f"the GGUF set has no {layout} file at {kind}{cut}{untied} (it has: "
                         f"{', '.join(sorted({f.file for f in self.files}))}); `atlas real-model-gguf --draft-vocab N` makes "
                         "the cut ones, `--untie-output TYPE` the untied ones")


_LAYOUTS: dict[str, Layout] = {"combined": "combined", "mtp-only": "mtp", "trunk-only": "trunk", "no blocks": "trunk"}


def inspect(path: Path) -> GgufInfo:
    """Architecture, layout and type of a GGUF file, from its header by the crawler's own bounded
    reader (AtlasError naming the file if it is no GGUF or a hostile one)."""
    try:
        header = read_header(FileSource(path), path.name)
    except OSError as exc:
        raise AtlasError(f"{path}: not a readable GGUF file ({exc.strerror or exc})") from None
    [model] = models([header])
    file_type = header.kv.get("general.file_type")
    type_name = (FILE_TYPES.get(file_type, f"file_type {file_type}") if isinstance(file_type, int) and not isinstance(file_type, bool)
                 else "unknown")
    d2t = [t.shape[0] for t in header.tensors if t.name.endswith(".nextn.d2t")]
    types = {t.name: GGML_TYPES[t.ggml_type][0] if t.ggml_type in GGML_TYPES else f"type {t.ggml_type}" for t in header.tensors
             if t.name in ("output.weight", "token_embd.weight")}
    return GgufInfo(path=str(path), architecture=model.architecture or "unknown", layout=_LAYOUTS[model.layout],
                    file_type=type_name, tensors=len(header.tensors), nextn_layers=model.nextn_declared or 0,
                    draft_vocab=d2t[0] if d2t else None, output=types.get("output.weight"),
                    embedding=types.get("token_embd.weight", "none"))


def require_combined(path: Path) -> GgufInfo:
    """A GGUF the engine can run plain and draft-mtp from: one file with the trunk and the MTP layer,
    of an architecture whose graph in the pinned build has an MTP branch."""
    if not path.is_file():
        raise AtlasError(f"{path}: no such GGUF file")
    info = inspect(path)
    if info.layout == "trunk":
        raise AtlasError(f"{path}: a trunk-only GGUF ({info.architecture}, no nextn/MTP layer) was given where a combined file "
                         "(trunk + MTP layer) is needed; convert without --no-mtp")
    if info.layout == "mtp":
        raise AtlasError(f"{path}: an MTP-only sidecar GGUF was given where a combined file (trunk + MTP layer) is needed")
    if info.architecture not in MTP_GRAPHS:
        raise AtlasError(f"{path}: llama.cpp build 11434 has no MTP graph for architecture {info.architecture!r} "
                         f"(it has one for {', '.join(sorted(MTP_GRAPHS))})")
    return info


def _checked(args: list[str], env: dict[str, str] | None = None) -> None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800)
    except (OSError, subprocess.SubprocessError) as exc:
        raise AtlasError(f"cannot run {Path(args[0]).name}: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-8:]
        raise AtlasError(f"{shlex.join(args[:3])} ... failed ({done.returncode}):\n    " + "\n    ".join(tail))


def _convert(source: Path, checkpoint: Path, layout: str, out: Path, untie: bool = False) -> str:
    flags = ["--untie-output"] if untie else []
    args = [sys.executable, str(CONVERT), str(source), str(checkpoint), *flags, "--", "--outtype", "f16", "--outfile", str(out),
            *LAYOUTS[layout]]
    _checked(args, env={**os.environ, "PYTHONPATH": ""})  # the pinned source's gguf-py, not the environment's
    return shlex.join(["python", "atlas/engines/llamacpp/convert.py", "<llama.cpp source>", str(checkpoint), *args[4:]])


def convert_ids(source: Path, checkpoint: Path, out: Path) -> None:
    """A conformance oracle as one combined f32 GGUF, its vocabulary written as token ids
    (llamacpp/convert.py --id-vocabulary says why)."""
    if not (source / "convert_hf_to_gguf.py").is_file():
        raise AtlasError(f"{source}: not the llama.cpp source (no convert_hf_to_gguf.py); `make llamacpp` unpacks it")
    _checked([sys.executable, str(CONVERT), str(source), str(checkpoint), "--id-vocabulary", "--", "--outtype", "f32",
              "--outfile", str(out)], env={**os.environ, "PYTHONPATH": ""})


def make_set(checkpoint: Path, out: Path, build: Build, source: Path, quants: tuple[str, ...] = QUANTS,
             layouts: tuple[str, ...] = tuple(LAYOUTS), log: Callable[[str], None] = print,
             draft_vocab: int | None = None, untie_output: str | None = None) -> Manifest:
    """Write every layout at f16 and at each of `quants` into `out` (replaced whole, only if this
    command wrote it: atlas.outdir) and return the manifest written with them. With `untie_output`
    (a llama-quantize type), each quantized combined file also gets an untied copy, its output layer
    an output.weight of that type; with `draft_vocab`, each combined file (untied too) also gets a
    copy drafting over that many tokens (draftvocab.py)."""
    from atlas.decode import draftvocab
    from atlas.decode.checkpoint import digest
    from atlas.outdir import replace

    if not (source / "convert_hf_to_gguf.py").is_file():
        raise AtlasError(f"{source}: not the llama.cpp source (no convert_hf_to_gguf.py); `make llamacpp` unpacks it")
    quantize = build.binary("llama-quantize")
    wanted = {f"{layout}-{kind}.gguf" for layout in layouts for kind in ("f16", *quants)}
    if untie_output is not None:
        untie_output = untie_output.upper()
        if untie_output not in {name for name, _, _ in GGML_TYPES.values()}:
            raise AtlasError(f"--untie-output {untie_output}: not a ggml type (e.g. Q4_0, IQ4_NL, Q8_0)")
    untied = [untied_name(q, untie_output) for q in quants] if untie_output else []
    if untied:
        if "combined" not in layouts or not quants:
            raise AtlasError("an untied output layer is made for the quantized combined files; add combined and a quantization")
        if not json.loads((checkpoint / "config.json").read_text()).get("tie_word_embeddings", False):
            raise AtlasError(f"{checkpoint}: its output layer is not tied to the token embedding; there is nothing to untie")
    wanted |= set(untied)
    cut_ids: list[int] = []
    if draft_vocab is not None:
        if "combined" not in layouts:
            raise AtlasError("a cut draft vocabulary is made for the combined files; add combined to the layouts")
        config = json.loads((checkpoint / "config.json").read_text())
        ids, _ = draftvocab.read(checkpoint, draft_vocab, int(config["vocab_size"]))
        cut_ids = ids.tolist()
        wanted |= {f"combined-{kind}-draft{draft_vocab}.gguf" for kind in ("f16", *quants)}
        wanted |= {name.replace(".gguf", f"-draft{draft_vocab}.gguf") for name in untied}
    current = up_to_date(out, digest(checkpoint), build, wanted)
    if current is not None:
        log(f"  {out} is up to date (same checkpoint, build and files, every sha256 checked)")
        return current

    def write(folder: Path) -> Manifest:
        files = []
        for layout in layouts:
            f16 = folder / f"{layout}-f16.gguf"
            command = _convert(source, checkpoint, layout, f16)
            files.append(GgufFile(file=f16.name, layout=layout, type="f16", bytes=f16.stat().st_size, sha256=sha256_file(f16),
                                  command=command))
            log(f"  {f16.name}: {files[-1].bytes / 2**20:.0f} MiB, sha256 {files[-1].sha256[:12]}…")
            for q in quants:
                target = folder / f"{layout}-{q}.gguf"
                args = [str(quantize), str(f16), str(target), q]
                _checked(args)
                files.append(GgufFile(file=target.name, layout=layout, type=q, bytes=target.stat().st_size,
                                      sha256=sha256_file(target), command=shlex.join(["llama-quantize", f16.name, target.name, q])))
                log(f"  {target.name}: {files[-1].bytes / 2**20:.0f} MiB, sha256 {files[-1].sha256[:12]}…")
        if untie_output:
            files += _untied(source, checkpoint, folder, quantize, quants, untie_output, log)
        for entry in [f for f in files if f.layout == "combined"] if cut_ids else []:  # after every layout: each once
            target = folder / entry.file.replace(".gguf", f"-draft{draft_vocab}.gguf")
            cut = llamacpp_draftvocab.write(folder / entry.file, target, cut_ids)
            files.append(GgufFile(file=target.name, layout="combined", type=entry.type, bytes=target.stat().st_size,
                                  sha256=sha256_file(target), draft_vocab=draft_vocab, output=entry.output,
                                  command=(f"atlas real-model-gguf --draft-vocab {draft_vocab}: {entry.file} with blk.{cut['layer']}"
                                           f".nextn.draft_head (rows of {cut['rows_from']}) and .d2t for the {draft_vocab} most "
                                           f"frequent tokens of {draftvocab.FILE} (atlas.engines.llamacpp.draftvocab)")))
            log(f"  {target.name}: {files[-1].bytes / 2**20:.0f} MiB, sha256 {files[-1].sha256[:12]}…")
        manifest = Manifest(source=str(checkpoint), source_digest=digest(checkpoint), build=build.record(), files=files)
        (folder / "manifest.json").write_text(manifest.model_dump_json(indent=1) + "\n")
        return manifest

    return replace(out, COMMAND, write)


def untied_name(quant: str, output: str) -> str:
    """The file name of a quantized combined file's untied copy."""
    return f"combined-{quant}-output-{output}.gguf"


def _untied(source: Path, checkpoint: Path, folder: Path, quantize: Path, quants: tuple[str, ...], output: str,
            log: Callable[[str], None]) -> list[GgufFile]:
    """The untied copies of the quantized combined files in `folder`: converted once more with the
    output layer written apart (f16, deleted after), then quantized with llama-quantize at each type,
    the output layer at `output` and the token embedding at the type the tied file gave it, so that
    only output.weight is new."""
    f16 = folder / "combined-f16-untied.gguf.partial"
    convert = _convert(source, checkpoint, "combined", f16, untie=True)
    files = []
    try:
        for q in quants:
            embedding = inspect(folder / f"combined-{q}.gguf").embedding
            target = folder / untied_name(q, output)
            _checked([str(quantize), "--output-tensor-type", output.lower(), "--token-embedding-type", embedding.lower(),
                      str(f16), str(target), q])
            made = inspect(target)
            if (made.output or "").lower() != output.lower() or made.embedding != embedding:
                raise AtlasError(f"{target.name}: llama-quantize wrote output.weight as {made.output} and token_embd as "
                                 f"{made.embedding}, not {output} and {embedding}")
            files.append(GgufFile(file=target.name, layout="combined", type=q, bytes=target.stat().st_size,
                                  sha256=sha256_file(target), output=output,
                                  command=f"{convert} (f16, not kept), then " + shlex.join(
                                      ["llama-quantize", "--output-tensor-type", output.lower(), "--token-embedding-type",
                                       embedding.lower(), "combined-f16-untied.gguf", target.name, q])))
            log(f"  {target.name}: {files[-1].bytes / 2**20:.0f} MiB, sha256 {files[-1].sha256[:12]}…")
    finally:
        f16.unlink(missing_ok=True)
    return files


def up_to_date(out: Path, source_digest: str, build: Build, wanted: set[str]) -> Manifest | None:
    """The manifest in `out` when it lists exactly `wanted`, made from this checkpoint by this build,
    and every file still has its sha256; else None (the set is made again)."""
    if not (out / "manifest.json").is_file():
        return None
    try:
        manifest = read_manifest(out)
    except AtlasError:
        return None
    if manifest.source_digest != source_digest or manifest.build.get("version") != build.version:
        return None
    if {f.file for f in manifest.files} != wanted or len(manifest.files) != len(wanted):
        return None
    if any(not (out / f.file).is_file() or sha256_file(out / f.file) != f.sha256 for f in manifest.files):
        return None
    return manifest


def read_manifest(folder: Path) -> Manifest:
    path = folder / "manifest.json"
    if not path.is_file():
        raise AtlasError(f"{folder}: no GGUF set there (manifest.json missing); make one with `make real-model-gguf`")
    try:
        return Manifest.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise AtlasError(f"{path}: not a valid GGUF manifest ({exc})") from None


def source_of(build: Build) -> Path:
    """The llama.cpp source the build was made from (its CMakeCache's source folder)."""
    try:
        for line in (build.dir / "build" / "CMakeCache.txt").read_text().splitlines():
            if line.startswith("CMAKE_HOME_DIRECTORY:"):
                return Path(line.split("=", 1)[1])
    except OSError:
        pass
    raise AtlasError(f"{build.dir}: its CMakeCache.txt names no source folder; rerun `make llamacpp`")
