"""The MTP head's size from a safetensors shard header (atlas.fingerprints.safetensors_head): an
independent count on a written file, and a per-file error for each bound a hostile header breaks,
read over HTTP Range requests from the local hub."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from mtp_form_fixtures import GLM_HEAD, GLM_HEAD_BYTES, safetensors_file

from atlas.fingerprints import safetensors_head as sh
from atlas.hub.client import Silence
from atlas.hub.context import Context
from atlas.hub.errors import RepoProblem
from atlas.hub.headers import read_shard_head
from atlas.hub.local.mirror import MirrorRepo
from atlas.hub.local.server import HubServer
from atlas.hub.pacing import Pacer

WANTED = set(GLM_HEAD)


def test_the_head_size_counts_only_the_mtp_tensors_and_says_when_a_shard_is_missing() -> None:
    other = {"model.layers.0.mlp.down_proj.weight": ("F8_E4M3", [64, 256])}
    shards = [sh.ShardHead("b.safetensors", 1000, dict(GLM_HEAD)), sh.ShardHead("a.safetensors", 1000, other)]
    size = sh.head_size(shards, list(GLM_HEAD))
    assert (size.params, size.bytes, size.tensors) == (64 * 128 + 64 * 64 + 3 * 64, GLM_HEAD_BYTES, 5)
    assert size.share == GLM_HEAD_BYTES / 1000 and size.dtypes == "BF16×2, F32×3 (b.safetensors)"
    assert sh.head_size(shards, [*GLM_HEAD, "model.layers.2.not_read.weight"]) is None  # a head tensor in no shard read
    odd = [sh.ShardHead("c.safetensors", None, {"model.layers.2.eh_proj.weight": ("F4_X", [8])})]
    assert sh.head_size(odd, ["model.layers.2.eh_proj.weight"]).bytes is None  # an unknown dtype: bytes unknown


def test_head_shards_are_those_the_index_maps_the_head_to() -> None:
    weight_map = {"a": "s1", "b": "s2", "c": "s2", "d": "s3"}
    assert sh.head_shards(weight_map, ["b", "c", "z"]) == ["s2"]
    index = json.dumps({"metadata": {"total_size": -5}, "weight_map": weight_map}).encode()
    assert sh.parse_index_map(index, "i.json") == (weight_map, None)  # a negative total is no total


@pytest.fixture
def hub(tmp_path: Path):
    good = safetensors_file(GLM_HEAD)
    files = {
        "good.safetensors": good,
        "huge.safetensors": struct.pack("<Q", 2**40) + b"{}",
        "short.safetensors": b"\x05\x00",
        "cut.safetensors": good[:40],
        "notjson.safetensors": struct.pack("<Q", 8) + b"\xff" * 8,
        "badshape.safetensors": _raw({"model.layers.2.enorm.weight": {"dtype": "F32", "shape": [-1]}}),
    }
    repo = MirrorRepo("org/m", files)
    with HubServer({repo.repo_id: repo}) as server:
        pacer = Pacer(server.url, None)
        yield Context(HfApi(endpoint=server.url, token=False), server.url, False, tmp_path, pacer, Silence(pacer)), repo, server


def _raw(header: dict) -> bytes:
    data = json.dumps(header).encode()
    return struct.pack("<Q", len(data)) + data


def test_a_shard_header_reads_in_two_ranges(hub) -> None:
    ctx, repo, server = hub
    record = sh.from_record(read_shard_head(ctx, repo.repo_id, repo.sha, "good.safetensors", WANTED, 123))
    assert record.tensors == dict(GLM_HEAD) and record.total_size == 123
    assert [r["range"] for r in server.cdn_requests][:1] == ["bytes=0-7"]


@pytest.mark.parametrize(("shard", "words"), [
    ("huge.safetensors", "header length 1,099,511,627,776 (a safetensors header holds 2 to 16,777,216 bytes)"),
    ("short.safetensors", "truncated: 2 bytes, a safetensors file starts with 8"),
    ("cut.safetensors", "truncated: the header claims"),
    ("notjson.safetensors", "the header is not JSON"),
    ("badshape.safetensors", "tensor 'model.layers.2.enorm.weight' has no usable dtype and shape"),
])
def test_a_hostile_shard_header_is_that_files_error(hub, shard: str, words: str) -> None:
    ctx, repo, server = hub
    with pytest.raises(RepoProblem) as err:
        read_shard_head(ctx, repo.repo_id, repo.sha, shard, WANTED, None)
    assert str(err.value).startswith(f"{shard}: ") and words in str(err.value) and err.value.permanent
    server.settle()  # the CDN logs a request after answering it
    assert all(int(r["range"].split("-")[1]) < 2**20 for r in server.cdn_requests)  # never read by a claimed size


def test_the_team_models_head_through_the_local_hub_matches_an_independent_count(tmp_path: Path) -> None:
    from hub_fixtures import TEAM_MODEL, copy_mirror, rows, write_watchlist
    from safetensors import safe_open

    from atlas.hub import crawl as crawler
    from atlas.hub.local.mirror import load_mirror

    mirror = copy_mirror(tmp_path / "m", [TEAM_MODEL])
    db = tmp_path / "atlas.duckdb"
    with HubServer(load_mirror(mirror)) as hub:
        crawler.crawl(db, write_watchlist(tmp_path / "w.toml", ["mtp-atlas"]), endpoint=hub.url, token=False,
                      cache_dir=tmp_path / "cache", progress=False)
    params = head = total = 0
    with safe_open(str(mirror / TEAM_MODEL / "model.safetensors"), "np") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            total += t.nbytes
            if name.startswith("mtp."):  # the team model's head (tests/hub_fixtures.py EXPECTED_TEAM)
                params, head = params + t.size, head + t.nbytes
    got = rows(db, "SELECT mtp_head_params, mtp_head_bytes, mtp_head_share, mtp_own_lm_head FROM mtp_fingerprints")
    assert got == [(params, head, round(head / total, 4), "no")]
