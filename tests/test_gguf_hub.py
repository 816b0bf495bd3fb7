"""GGUF headers read over HTTP Range requests through huggingface_hub's client (atlas.hub.headers),
against the local hub, which answers ranges as the Hub does (206 + Content-Range, 416 past the end;
tests/test_hubserver.py): which files a repo's headers are read from, a header read in several
ranges and never more, and a file that ends inside its header."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_writer import STRING, ARRAY, mtp_model
from huggingface_hub import HfApi

from atlas.fingerprints.gguf import GGUFError, Limits, models, read_header
from atlas.hub.client import Silence
from atlas.hub.context import Context
from atlas.hub.headers import MAX_FILES, MAX_MODELS, HubRangeSource, _slice, gguf_files
from atlas.hub.local.mirror import MirrorRepo
from atlas.hub.local.server import HubServer
from atlas.hub.pacing import Pacer


def test_which_gguf_files_are_read() -> None:
    quants = {f"m-{q}.gguf" for q in ("Q2_K", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")}
    split = {f"big/m-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)}
    chosen = gguf_files(quants | split | {"m-MTP-Q8_0.gguf", "README.md", "config.json"})
    assert chosen[0] == "m-MTP-Q8_0.gguf"  # a file naming MTP first: the sidecars
    assert sorted(split) == chosen[1:4]  # a split model with all its parts
    assert len({c.split("-0000")[0] for c in chosen}) == MAX_MODELS and len(chosen) <= MAX_FILES
    assert gguf_files({"config.json"}) == [] and gguf_files(None) == []


def test_slice_keeps_only_the_bytes_asked_for() -> None:
    chunks = [b"abcd", b"efgh", b"ijkl"]
    assert _slice(iter(chunks), 3, 6) == b"defghi"
    assert _slice(iter(chunks), 20, 4) == b""


@pytest.fixture
def hub_ctx(tmp_path: Path):
    m = mtp_model(own_head=True)
    m.kvs.append(("tokenizer.ggml.merges", ARRAY, (STRING, ["x" * 50] * 100)))  # a header of ~6 kB
    data = m.file()
    repo = MirrorRepo("org/m-GGUF", {"m-Q8_0.gguf": data, "cut.gguf": data[:3000]})
    with HubServer({repo.repo_id: repo}) as hub:
        pacer = Pacer(hub.url, None)
        yield hub, Context(HfApi(endpoint=hub.url, token=False), hub.url, False, tmp_path, pacer, Silence(pacer)), repo, data


def test_a_header_comes_in_ranges_and_nothing_past_it(hub_ctx) -> None:
    hub, ctx, repo, data = hub_ctx
    source = HubRangeSource(ctx, repo.repo_id, repo.sha, "m-Q8_0.gguf")
    header = read_header(source, "m-Q8_0.gguf", first_chunk=1024)
    assert source.size == len(data)  # from the first 206's Content-Range
    (model,) = models([header])
    assert (model.layout, model.own_embedding, model.own_lm_head) == ("combined", True, True)
    hub.settle()  # the CDN logs a request after answering it
    ranges = [r["range"] for r in hub.cdn_requests]
    assert len(ranges) >= 3 and all(r.startswith("bytes=") for r in ranges)
    ends = [int(r.split("-")[1]) for r in ranges]
    assert max(ends) < 2 * header.header_bytes + 1024  # growing ranges: never the weights
    assert source.read(len(data) + 10, 5) == b""  # past the end: asked of no one


def test_a_file_that_ends_in_its_header_is_an_error_naming_it(hub_ctx) -> None:
    hub, ctx, repo, _ = hub_ctx
    with pytest.raises(GGUFError, match=r"^cut\.gguf: truncated: the file ends at byte 3,000 inside its header"):
        read_header(HubRangeSource(ctx, repo.repo_id, repo.sha, "cut.gguf"), "cut.gguf", first_chunk=1024)
    # the bound on a header holds over HTTP too: a 2 kB limit asks for nothing past 2 kB
    with pytest.raises(GGUFError, match="header runs past 2,048 bytes"):
        read_header(HubRangeSource(ctx, repo.repo_id, repo.sha, "m-Q8_0.gguf"), "m-Q8_0.gguf", Limits(header_bytes=2048), 512)
    hub.settle()
    asked = [r for r in hub.cdn_requests if repo.etags["m-Q8_0.gguf"] in r["path"]]  # the CDN serves by content hash
    assert asked and max(int(r["range"].split("-")[1]) for r in asked) < 2048
