"""File headers by HTTP Range requests through huggingface_hub's client (resolve, then the CDN's
redirect), never the weights: GGUF files (which to read, and each one's key/values and tensor infos)
and the safetensors shards that hold an MTP head (their JSON header).

A GGUF repo often holds a dozen quantizations of one model; their headers differ only in types.
A bounded number of models is read (files naming MTP first: the sidecars), each with all its
split parts, because a split model's MTP block sits in its last part. A header that cannot be read
is that file's error (permanent when the bytes are bad), and the crawl goes on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from atlas.fingerprints import safetensors_head
from atlas.fingerprints.gguf import RECORD_PREFIX, SPLIT_NAME, GGUFError, read_header, to_record
from atlas.hub import redact
from atlas.hub.context import Context, call
from atlas.hub.errors import ErrorKind, RepoProblem

MAX_MODELS = 4  # GGUF models (quantizations) read per repo
MAX_FILES = 16  # files read per repo, split parts included
MTP_NAMED = re.compile(r"(?i)(?:^|[-_./])(?:mtp|nextn)(?:[-_./]|$)")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def gguf_files(siblings: set[str] | None) -> list[str]:
    """The GGUF files of a repo to read the headers of, in order: models whose name says MTP,
    then the rest by name; at most MAX_MODELS models and MAX_FILES files."""
    if not siblings:
        return []
    groups: dict[str, list[str]] = {}
    for name in sorted(siblings):
        if name.lower().endswith(".gguf"):
            groups.setdefault(SPLIT_NAME.sub(".gguf", name), []).append(name)
    order = sorted(groups, key=lambda stem: (not MTP_NAMED.search(stem.rsplit("/", 1)[-1]), stem))
    out: list[str] = []
    for stem in order[:MAX_MODELS]:
        if len(out) + len(groups[stem]) > MAX_FILES:
            break
        out += groups[stem]
    return out


def record_name(filename: str) -> str:
    return RECORD_PREFIX + filename


class HubRangeSource:
    """One file at a pinned sha, read by Range requests; `size` from the first answer's
    Content-Range (the Hub's 206), as atlas.fingerprints.gguf.Source wants it."""

    def __init__(self, ctx: Context, repo_id: str, sha: str, filename: str) -> None:
        self.ctx, self.filename = ctx, filename
        self.url = hf_hub_url(repo_id, filename, revision=sha, endpoint=ctx.endpoint)
        self.size: int | None = None

    def read(self, offset: int, n: int) -> bytes:
        if n <= 0 or (self.size is not None and offset >= self.size):
            return b""
        return call(self.ctx, lambda: self._get(offset, n))

    def _get(self, offset: int, n: int) -> bytes:
        headers = {**build_hf_headers(token=self.ctx.token), "Range": f"bytes={offset}-{offset + n - 1}"}
        with get_session().stream("GET", self.url, headers=headers) as response:
            if response.status_code == 416:  # past the end: the Hub says the size as bytes */N
                response.read()
                self.size = _total(response.headers.get("Content-Range", ""), self.size)
                return b""
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            if response.status_code == 206:
                self.size = _total(response.headers.get("Content-Range", ""), self.size)
                skip = 0
            else:  # a server that ignores Range sends the whole file: keep only the bytes asked for
                length = response.headers.get("Content-Length", "")
                self.size = int(length) if length.isdigit() and len(length) < 19 else self.size
                skip = offset
            return _slice(response.iter_bytes(), skip, n)


def _total(content_range: str, known: int | None) -> int | None:
    m = _CONTENT_RANGE.fullmatch(content_range.strip()) or re.fullmatch(r"bytes \*/(\d+)", content_range.strip())
    if m is None:
        return known
    total = m.groups()[-1]
    return int(total) if total.isdigit() and len(total) < 19 else known


def _slice(chunks: Iterable[bytes], skip: int, n: int) -> bytes:
    """Bytes [skip, skip + n) of a stream, reading no further than that."""
    out = bytearray()
    for chunk in chunks:
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        out += chunk[skip:skip + n - len(out)]
        skip = 0
        if len(out) >= n:
            break
    return bytes(out)


def read_gguf_record(ctx: Context, repo_id: str, sha: str, filename: str) -> str:
    """The header record (atlas.fingerprints.gguf.to_record) of one GGUF file, read by ranges. RepoProblem,
    permanent, for a header that is not GGUF within bounds (the same bytes at the same sha)."""
    try:
        header = read_header(HubRangeSource(ctx, repo_id, sha, filename), filename)
    except GGUFError as exc:
        raise RepoProblem(ErrorKind.ERROR, str(exc), permanent=True) from None
    return redact.text(to_record(header))


def read_shard_head(ctx: Context, repo_id: str, sha: str, shard: str, wanted: set[str], total_size: int | None,
                    whole: bool = False) -> str:
    """The head record (atlas.fingerprints.safetensors_head) of one shard: two ranges, its header's
    length and then the header, bounded (safetensors_head.MAX_HEADER_BYTES). For a `whole`
    single-file checkpoint the total is its data section's length. RepoProblem, permanent, for a
    header that is not one."""
    source = HubRangeSource(ctx, repo_id, sha, shard)
    try:
        n = safetensors_head.header_length(source.read(0, 8), shard)
        if source.size is not None and 8 + n > source.size:  # known from the first answer: ask for nothing more
            raise safetensors_head.HeaderError(f"{shard}: truncated: the header claims {n:,} bytes, the file holds {source.size:,}")
        data = source.read(8, n)
        if len(data) < n:
            raise safetensors_head.HeaderError(f"{shard}: truncated: the header claims {n:,} bytes, the file holds {len(data):,}")
        tensors = safetensors_head.parse_header(data, shard, wanted)
        if whole and source.size is not None:
            total_size = source.size - 8 - n
    except safetensors_head.HeaderError as exc:
        raise RepoProblem(ErrorKind.ERROR, str(exc), permanent=True) from None
    return redact.text(safetensors_head.to_record(shard, tensors, total_size))
