"""One repo: download what its fingerprints need at the listed sha (config, quantization sidecar,
weight index or single-file header), from the on-disk cache when an earlier crawl got it."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from atlas import AtlasError
from atlas.store import db as store
from atlas.fingerprints.rules import (
    MAX_CONFIG_BYTES, MAX_INDEX_BYTES, SEPARATE_HEAD_FILE, fingerprint, header_tensor_names, parse_config_bytes,
    parse_weight_index,
)
from atlas.fingerprints import safetensors_head
from atlas.fingerprints.gguf import RECORD_PREFIX, from_record
from atlas.hub import redact
from atlas.hub.context import Context, call
from atlas.hub.errors import ErrorKind, RepoProblem
from atlas.hub.headers import HubRangeSource, gguf_files, read_gguf_record, read_shard_head, record_name

# Used with fullmatch: `$` would accept one trailing newline ("org/m\n" as a second repo).
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}")
SHA = re.compile(r"[0-9a-f]{40}")
QUANT_SIDECAR = "hf_quant_config.json"
WEIGHT_INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_SEPARATE_FILES = 4  # safetensors files holding a head of their own (SEPARATE_HEAD_FILE) read per repo

@dataclass
class Listed:
    """What the listing says about one repo (hub metadata for the snapshot)."""

    repo_id: str
    sha: str | None
    siblings: set[str] | None
    row: store.ModelRow
    transient: bool = False  # not fetched for a reason a later crawl may get past (5xx, timeouts)
    gave_up: bool = False  # ...because a bound of the crawl was reached (see Bounds)


@dataclass
class SideError:
    message: str
    permanent: bool  # stored with the (repo_id, sha) when true; else tried again next crawl


@dataclass
class Fetched:
    files: dict[str, str] = field(default_factory=dict)
    weights: tuple[str, list[str]] | None = None
    problems: dict[str, SideError] = field(default_factory=dict)  # side file -> why it was not read


def _get(ctx: Context, repo_id: str, sha: str, filename: str, limit: int) -> bytes:
    """One GET of a file pinned to `sha` (redirects followed by the client), refusing more than
    `limit` bytes: by the announced length before the body is read, or while it streams."""
    url = hf_hub_url(repo_id, filename, revision=sha, endpoint=ctx.endpoint)
    with get_session().stream("GET", url, headers=build_hf_headers(token=ctx.token)) as response:
        if response.status_code >= 400:
            response.read()  # error answers are small; the client's error mapping reads them
            hf_raise_for_status(response)
        announced = response.headers.get("Content-Length", "")
        if announced.isdigit() and len(announced) < 19 and int(announced) > limit:
            raise RepoProblem(ErrorKind.ERROR, f"{filename}: {int(announced):,} bytes, over the {limit:,}-byte limit "
                                       "for this file (not downloaded)", permanent=True)
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > limit:
                raise RepoProblem(ErrorKind.ERROR, f"{filename}: over the {limit:,}-byte limit for this file "
                                           "(download stopped)", permanent=True)
        return bytes(body)


def _cached_path(ctx: Context, repo_id: str, sha: str, filename: str) -> Path:
    return ctx.cache_dir / "atlas-files" / sha / repo_id.replace("/", "--") / filename.replace("/", "--")


def _write_aside(path: Path, data: bytes) -> None:
    """Best effort: a cache that cannot be written only costs a later request. Written aside and
    renamed, so a crawl killed mid-write leaves no half file under the real name."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)


def download(ctx: Context, repo_id: str, sha: str, filename: str, limit: int) -> bytes:
    """A file at `sha`, from the cache when an earlier crawl got it (or found for good that it
    cannot be had: absent, over the limit), else by one GET."""
    cached = _cached_path(ctx, repo_id, sha, filename)
    failed = cached.with_name(cached.name + ".error")
    try:
        if cached.is_file() and cached.stat().st_size <= limit:
            return cached.read_bytes()
        if failed.is_file():
            known = json.loads(failed.read_text(encoding="utf-8"))
            raise RepoProblem(ErrorKind(known["kind"]), str(known["message"]), permanent=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # unreadable cache entry: a miss
    try:
        data = redact.data(call(ctx, lambda: _get(ctx, repo_id, sha, filename, limit)))
    except RepoProblem as exc:
        if exc.permanent:  # the same answer at the same sha next time: not asked again
            _write_aside(failed, json.dumps({"kind": exc.kind, "message": str(exc)}).encode("utf-8"))
        raise
    _write_aside(cached, data)
    return data


def _header_names(ctx: Context, repo_id: str, sha: str) -> tuple[list[str], dict[str, Any] | None]:
    """Tensor names from a single-file checkpoint's header (one Range request through the CDN
    redirect, cached on disk because the hub client does not cache headers), and the header's
    tensor infos when it was read now (None from the cache)."""
    cached = ctx.cache_dir / "atlas-safetensors-headers" / sha / (repo_id.replace("/", "--") + ".json")
    try:
        names = json.loads(cached.read_text(encoding="utf-8"))
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return names, None
    except (OSError, ValueError):
        pass  # absent, or damaged (e.g. by a disk error): a miss, read the header again
    meta = call(ctx, lambda: ctx.api.parse_safetensors_file_metadata(repo_id, SINGLE_FILE, revision=sha))
    names = [redact.text(n) for n in header_tensor_names(meta.tensors)]
    _write_aside(cached, json.dumps(names).encode("utf-8"))
    return names, meta.tensors


def _cached_record(ctx: Context, repo_id: str, sha: str, filename: str, read: Callable[[], str]) -> str:
    """A header record (a GGUF file's, a safetensors shard's head) read by `read`, cached on disk; a
    failure for good is cached too, by download's rule: it is not asked again at the same sha."""
    cached = ctx.cache_dir / "atlas-header-records" / sha / repo_id.replace("/", "--") / (filename.replace("/", "--") + ".json")
    failed = cached.with_name(cached.name + ".error")
    try:
        if cached.is_file():
            text = cached.read_text(encoding="utf-8")
            json.loads(text)
            return text
        if failed.is_file():
            raise RepoProblem(ErrorKind.ERROR, failed.read_text(encoding="utf-8"), permanent=True)
    except (OSError, ValueError):
        pass  # damaged cache entry: a miss
    try:
        text = read()
    except RepoProblem as exc:
        if exc.permanent:
            _write_aside(failed, str(exc).encode("utf-8"))
        raise
    _write_aside(cached, text.encode("utf-8"))
    return text


def fetch_repo(ctx: Context, item: Listed, settled: set[str] | None = None) -> Fetched:
    """Download what the fingerprints need at the listed sha. Raises RepoProblem when the config
    itself can't be had; problems with side files are recorded and the rest kept. With `settled`
    (the config is stored already), only the side files not in it are asked for."""
    if not REPO_ID.fullmatch(item.repo_id):  # the listing names it so each time: permanent
        raise RepoProblem(ErrorKind.ERROR, f"not a valid Hub repo id: {item.repo_id!r}", permanent=True)
    if item.sha is None or not SHA.fullmatch(item.sha):
        raise RepoProblem(ErrorKind.ERROR, f"the listing gave no commit sha for this repo (got {item.sha!r:.60})")
    sha = item.sha
    out = Fetched()
    siblings = item.siblings
    ggufs = gguf_files(siblings)
    if settled is None and siblings is not None and "config.json" not in siblings and ggufs:
        settled = set()  # a GGUF repo: its headers are what it says, there is no config to read
    if settled is None:
        if siblings is not None and "config.json" not in siblings:
            raise RepoProblem(ErrorKind.MISSING, "no config.json (nor a GGUF file) in this repo")
        data = download(ctx, item.repo_id, sha, "config.json", MAX_CONFIG_BYTES)
        try:
            parse_config_bytes(data)
        except AtlasError as exc:  # the same bytes at the same sha every time: no later crawl can do better
            raise RepoProblem(ErrorKind.ERROR, f"{exc} (a malformed config at this sha; that changes only with the repo)",
                              permanent=True) from None
        out.files["config.json"] = data.decode("utf-8")
        settled = set()

    def wanted(filename: str) -> bool:
        return filename not in settled and (siblings is None or filename in siblings)

    def record(filename: str, exc: RepoProblem | AtlasError) -> None:
        if isinstance(exc, RepoProblem) and exc.kind is ErrorKind.MISSING and siblings is None:
            return  # without a file list, absent is the normal case, not a problem
        permanent = not isinstance(exc, RepoProblem) or exc.permanent  # AtlasError: the bytes are bad
        out.problems[filename] = SideError(str(exc).removeprefix(f"{filename}: "), permanent)

    def side(filename: str, limit: int, parse: Callable[[bytes], Any]) -> Any:
        try:
            raw = download(ctx, item.repo_id, sha, filename, limit)
            return raw, parse(raw)
        except (RepoProblem, AtlasError) as exc:
            record(filename, exc)
            return None

    if wanted(QUANT_SIDECAR):
        got = side(QUANT_SIDECAR, MAX_CONFIG_BYTES, lambda b: parse_config_bytes(b, QUANT_SIDECAR))
        if got is not None:
            out.files[QUANT_SIDECAR] = got[0].decode("utf-8")
    if wanted(WEIGHT_INDEX):
        got = side(WEIGHT_INDEX, MAX_INDEX_BYTES, parse_weight_index)
        if got is not None:
            out.weights = ("index", got[1])
            _shard_heads(ctx, item, out, got[0], record)
    for name in ggufs:
        if record_name(name) not in settled and name not in settled:
            try:
                out.files[record_name(name)] = _cached_record(ctx, item.repo_id, sha, name,
                                                              lambda n=name: read_gguf_record(ctx, item.repo_id, sha, n))
            except RepoProblem as exc:
                record(name, exc)
    if out.weights is None and siblings is not None and wanted(SINGLE_FILE):
        try:
            names, infos = _header_names(ctx, item.repo_id, sha)
            out.weights = ("header", names)
            _shard_heads(ctx, item, out, None, record, infos)
        except RepoProblem as exc:
            record(SINGLE_FILE, exc)
    for name in separate_head_files(siblings):
        key = safetensors_head.RECORD_PREFIX + name
        if key in out.files or key in settled or name in settled:
            continue  # the index maps head tensors to it: read already as a shard that holds them
        try:
            out.files[key] = _cached_record(ctx, item.repo_id, sha, name,
                                            lambda n=name: _read_separate_head(ctx, item.repo_id, sha, n))
        except RepoProblem as exc:
            record(name, exc)
    return out


def separate_head_files(siblings: set[str] | None) -> list[str]:
    """The repo's safetensors files that may hold a head of their own (mtp.safetensors beside the
    trunk's shards, mlx-lm #1543), at most MAX_SEPARATE_FILES, in name order."""
    return sorted(n for n in siblings or () if SEPARATE_HEAD_FILE.fullmatch(n))[:MAX_SEPARATE_FILES]


def _read_separate_head(ctx: Context, repo_id: str, sha: str, filename: str) -> str:
    """The head record of a separate head file with every tensor it holds (its header by two
    ranges, bounded like a shard's): which tensors it holds is the question, so none is left out.
    RepoProblem, permanent, for a header that is not one."""
    source = HubRangeSource(ctx, repo_id, sha, filename)
    try:
        n = safetensors_head.header_length(source.read(0, 8), filename)
        data = source.read(8, n)
        if len(data) < n:
            raise safetensors_head.HeaderError(f"{filename}: truncated: the header claims {n:,} bytes, the file holds {len(data):,}")
        try:
            names = {k for k in json.loads(data.decode("utf-8")) if k != "__metadata__"}
        except (UnicodeDecodeError, ValueError, RecursionError, TypeError):
            names = set()  # parse_header says what is wrong with it
        tensors = safetensors_head.parse_header(data, filename, names)
    except safetensors_head.HeaderError as exc:
        raise RepoProblem(ErrorKind.ERROR, str(exc), permanent=True) from None
    return redact.text(safetensors_head.to_record(filename, tensors, None))


def _shard_heads(ctx: Context, item: Listed, out: Fetched, index_raw: bytes | None,
                 record: Callable[[str, RepoProblem], None], infos: dict[str, Any] | None = None) -> None:
    """Head records of the shards that hold the MTP tensors the rules find among the tensor names
    (their dtypes and shapes: the head's size), for a config read in this call: the shards the
    index maps them to, or the single file (index_raw None), whose header the hub client may have
    read already (`infos`: huggingface_hub's TensorInfo by name; no second request then)."""
    if "config.json" not in out.files or out.weights is None:
        return
    mtp = fingerprint(parse_config_bytes(out.files["config.json"].encode("utf-8")), out.weights[1], "index").mtp_names
    if not mtp:
        return
    if index_raw is None:
        weight_map, total = {n: SINGLE_FILE for n in mtp}, None
    else:
        weight_map, total = safetensors_head.parse_index_map(index_raw, WEIGHT_INDEX)
    wanted = set(mtp)
    for shard in safetensors_head.head_shards(weight_map, mtp):
        if item.siblings is not None and shard not in item.siblings:
            continue  # not in the repo's file list: nothing to read
        def read(s: str = shard) -> str:
            if infos is None:
                return read_shard_head(ctx, item.repo_id, item.sha or "", s, wanted, total, index_raw is None)
            return redact.text(safetensors_head.to_record(
                s, {n: (i.dtype, list(i.shape)) for n, i in infos.items() if n in wanted},
                max((i.data_offsets[1] for i in infos.values()), default=0)))

        try:
            out.files[safetensors_head.RECORD_PREFIX + shard] = _cached_record(ctx, item.repo_id, item.sha or "", shard, read)
        except RepoProblem as exc:
            record(shard, exc)


def side_files_pending(siblings: set[str] | None, settled: set[str], errors: dict[str, str]) -> bool:
    """Whether a stored (repo_id, sha) still lacks a listed side file that a new request could
    bring: one neither stored nor failed for good (a 5xx or timeout last time)."""
    if siblings is None:
        return False  # no file list: a failed side file and an absent one look alike
    done = settled | set(errors)
    if QUANT_SIDECAR in siblings and QUANT_SIDECAR not in done:
        return True
    if any(record_name(f) not in done and f not in done for f in gguf_files(siblings)):
        return True
    if any(safetensors_head.RECORD_PREFIX + f not in done and f not in done for f in separate_head_files(siblings)):
        return True
    if settled & set(store.WEIGHT_SOURCE_FILES.values()):
        return False  # tensor names are stored
    return any(f in siblings and f not in done for f in (WEIGHT_INDEX, SINGLE_FILE))


def fingerprint_stored(files: dict[str, str], weights: tuple[str, list[str]] | None) -> list[tuple[str, str, str | None]]:
    """Fingerprint rows for one (repo_id, sha) from what the store holds (pure). A GGUF repo
    without a config is read from its header records alone."""
    config = parse_config_bytes(files["config.json"].encode("utf-8")) if "config.json" in files else {}
    headers = [from_record(text) for name, text in sorted(files.items()) if name.startswith(RECORD_PREFIX)]
    shards = [safetensors_head.from_record(text) for name, text in sorted(files.items())
              if name.startswith(safetensors_head.RECORD_PREFIX)]
    sidecar = None
    if "hf_quant_config.json" in files:
        try:
            parsed = parse_config_bytes(files["hf_quant_config.json"].encode("utf-8"), QUANT_SIDECAR)
            sidecar = parsed if isinstance(parsed, dict) else None
        except AtlasError:
            sidecar = None  # a bad side file never loses the valid config
    source, names = weights if weights is not None else (None, None)
    return fingerprint(config, names, source, sidecar, headers, shards).rows()


def fingerprintable(files: dict[str, str]) -> bool:
    """Whether the stored files of a (repo_id, sha) are enough to fingerprint it: a config, or
    the header of a GGUF file."""
    return "config.json" in files or any(name.startswith(RECORD_PREFIX) for name in files)
