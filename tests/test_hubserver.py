"""The local hub answers like the real one, checked through the real huggingface_hub client (and on
the wire where the client hides it): tree listing, listing `expand`, 401/403/404 with their error
codes, the 307 resolve-cache hop, the 302 to a CDN host (Range kept, Authorization dropped),
RateLimit headers per bucket and tier, Range/416, and a hostile mirror."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import struct
import tracemalloc
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    BadRequestError,
    DisabledRepoError,
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils import parse_ratelimit_headers

from atlas import AtlasError
from atlas.hub.local.server import HubServer, MirrorRepo, load_mirror

WEIGHTS = b"not really weights"
TOKEN = "hf_localtesttoken"


def safetensors_bytes(header: dict, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def hub_of(*repos: MirrorRepo, **kwargs) -> HubServer:
    return HubServer({r.repo_id: r for r in repos}, **kwargs)


def wire(hub: HubServer, method: str, path: str, headers: dict | None = None) -> http.client.HTTPResponse:
    """One raw request (the path sent as UTF-8 bytes, whatever they are), no redirect followed."""
    host, port = hub.url.removeprefix("http://").split(":")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8"))
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        response.read()
    return response


def test_tree_listing_has_the_hubs_shape() -> None:
    repo = MirrorRepo("org/name", {"config.json": b"{}", "model.safetensors": WEIGHTS, "sub/deeper/vocab.txt": b"a\n"})
    with HubServer({repo.repo_id: repo}) as hub:
        api = HfApi(endpoint=hub.url)
        top = {e.path: e for e in api.list_repo_tree("org/name", revision="main")}
        everything = {e.path for e in api.list_repo_tree("org/name", recursive=True, revision=repo.sha)}
        below = {e.path for e in api.list_repo_tree("org/name", "sub", recursive=True)}
        with pytest.raises(RemoteEntryNotFoundError):
            list(api.list_repo_tree("org/name", "nope"))
        with pytest.raises(RevisionNotFoundError):
            list(api.list_repo_tree("org/name", revision="v9"))
    assert set(top) == {"config.json", "model.safetensors", "sub"} and isinstance(top["sub"], RepoFolder)
    assert everything == set(top) | {"sub/deeper", "sub/deeper/vocab.txt"}
    assert below == {"sub/deeper", "sub/deeper/vocab.txt"}
    config, weights = top["config.json"], top["model.safetensors"]
    assert isinstance(config, RepoFile) and config.lfs is None
    assert config.blob_id == hashlib.sha1(b"blob 2\0{}").hexdigest()  # git's blob id, as on the Hub
    # LFS: git holds a pointer (so the blob id is the pointer's); lfs.sha256 is the content's
    assert isinstance(weights, RepoFile) and weights.lfs is not None and weights.size == len(WEIGHTS)
    assert weights.lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest() and weights.lfs.size == len(WEIGHTS)
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{weights.lfs.sha256}\nsize {len(WEIGHTS)}\n".encode()
    assert weights.lfs.pointer_size == len(pointer)
    assert weights.blob_id == hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()


def test_listing_rejects_expand_values_only_repo_info_accepts() -> None:
    repo = MirrorRepo("org/ft", {"config.json": b"{}"}, {"base_model": "org/base", "base_relation": "finetune"})
    with hub_of(repo) as hub:
        api = HfApi(endpoint=hub.url, token=False)
        with pytest.raises(BadRequestError):
            list(api.list_models(author="org", expand=["sha", "baseModels"]))
        listed = list(api.list_models(author="org", expand=["sha", "cardData", "tags", "disabled"]))
        info = api.model_info("org/ft", expand=["sha", "baseModels"])
    assert [m.id for m in listed] == ["org/ft"] and listed[0].card_data["base_model"] == "org/base"
    assert "base_model:finetune:org/base" in listed[0].tags
    assert info.base_models == {"relation": "finetune", "models": [{"id": "org/base"}]}


def test_missing_private_disabled_and_gated_answer_as_on_the_hub(tmp_path: Path) -> None:
    repos = [
        MirrorRepo("org/open", {"config.json": b"{}"}),
        MirrorRepo("org/private", {"config.json": b"{}"}, {"private": True}),
        MirrorRepo("org/off", {"config.json": b"{}"}, {"disabled": True}),
        MirrorRepo("org/gated", {"config.json": b"{}"}, {"gated": "manual"}),
    ]
    with hub_of(*repos) as hub:
        anon = HfApi(endpoint=hub.url, token=False)
        authed = HfApi(endpoint=hub.url, token=TOKEN)
        # without a token the Hub cannot tell missing from private or disabled: 401 + RepoNotFound
        for repo_id in ("org/absent", "org/private", "org/off"):
            with pytest.raises(RepositoryNotFoundError) as info:
                anon.model_info(repo_id)
            assert not isinstance(info.value, GatedRepoError)
            assert info.value.response.status_code == 401
            assert info.value.response.headers["X-Error-Code"] == "RepoNotFound"
        with pytest.raises(RepositoryNotFoundError) as info:
            authed.model_info("org/absent")
        assert info.value.response.status_code == 404
        with pytest.raises(DisabledRepoError):
            authed.model_info("org/off")
        # a gated repo's info is public; its files are not
        assert anon.model_info("org/gated").gated == "manual"
        with pytest.raises(GatedRepoError) as info:
            hf_hub_download("org/gated", "config.json", endpoint=hub.url, token=False, cache_dir=tmp_path)
        assert info.value.response.status_code == 401
        hub.granted.add("org/gated")
        listed = {m.id: m for m in anon.list_models(author="org", expand=["disabled", "gated"])}
    assert set(listed) == {"org/open", "org/off", "org/gated"}  # private repos are not listed
    assert listed["org/off"].disabled is True and listed["org/gated"].gated == "manual"


def test_small_files_307_to_the_resolve_cache_and_lfs_files_302_to_a_cdn(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    weights = safetensors_bytes(header, b"\0" * 8)
    repo = MirrorRepo("org/m", {"config.json": b'{"a": 1}', "model.safetensors": weights})
    with hub_of(repo) as hub:
        small = wire(hub, "HEAD", "/org/m/resolve/main/config.json")
        large = wire(hub, "HEAD", "/org/m/resolve/main/model.safetensors", {"Authorization": f"Bearer {TOKEN}"})
        path = hf_hub_download("org/m", "config.json", endpoint=hub.url, token=False, cache_dir=tmp_path)
        blob = hf_hub_download("org/m", "model.safetensors", endpoint=hub.url, token=TOKEN, cache_dir=tmp_path)
        meta = HfApi(endpoint=hub.url, token=TOKEN).parse_safetensors_file_metadata("org/m", "model.safetensors")
        with pytest.raises(urllib.error.HTTPError) as leak:  # the CDN refuses a forwarded token
            urllib.request.urlopen(urllib.request.Request(large.headers["Location"], headers={"Authorization": "Bearer x"}))
    assert small.status == 307 and small.headers["Location"].startswith(f"/api/resolve-cache/models/org/m/{repo.sha}/config.json")
    assert small.headers["X-Repo-Commit"] == repo.sha and small.headers["RateLimit"].startswith('"resolvers"')
    assert large.status == 302 and large.headers["Location"].startswith(hub.cdn_url + "/")
    assert large.headers["X-Linked-Size"] == str(len(weights)) and large.headers["X-Linked-Etag"].strip('"') == hashlib.sha256(weights).hexdigest()
    assert Path(path).read_bytes() == b'{"a": 1}' and Path(blob).read_bytes() == weights
    assert list(meta.tensors) == ["w"]
    assert leak.value.code == 400
    hops = [(r["method"], r["path"].split("/")[1], r["status"]) for r in hub.requests if "config.json" in r["path"]]
    assert hops[-2:] == [("HEAD", "org", 307), ("HEAD", "api", 200)] or ("GET", "api", 200) in hops
    served = [r for r in hub.cdn_requests if r["status"] in (200, 206)]
    assert served and not any(r["auth"] for r in served)  # Authorization never reached the CDN host
    assert any(r["range"] == "bytes=0-100000" and r["status"] == 206 for r in served)  # Range kept on the redirect


def test_ratelimit_headers_per_bucket_and_tier() -> None:
    repo = MirrorRepo("org/m", {"config.json": b"{}"})
    with hub_of(repo, limits=None, tier="anonymous", token_tier="pro") as hub:
        api_answer = wire(hub, "GET", "/api/models/org/m")
        file_answer = wire(hub, "HEAD", "/org/m/resolve/main/config.json")
        error_answer = wire(hub, "GET", "/api/models/org/none")
        pro_answer = wire(hub, "GET", "/api/models/org/m", {"Authorization": f"Bearer {TOKEN}"})
    api = parse_ratelimit_headers(api_answer.headers)
    files = parse_ratelimit_headers(file_answer.headers)
    err = parse_ratelimit_headers(error_answer.headers)
    pro = parse_ratelimit_headers(pro_answer.headers)
    assert (api.resource_type, api.remaining, api.limit, api.window_seconds) == ("api", 499, 500, 300)
    assert (files.resource_type, files.limit) == ("resolvers", 3000)
    assert (err.resource_type, err.remaining) == ("api", 498)  # errors count too, and say so
    assert (pro.resource_type, pro.limit) == ("api", 2500)


def test_over_the_quota_is_a_429_the_client_understands() -> None:
    repo = MirrorRepo("org/m", {"config.json": b"{}"})
    with hub_of(repo, limits={"api": 2, "resolvers": 5, "pages": 1}, window_s=60) as hub:
        answers = [wire(hub, "GET", "/api/models/org/m") for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 429]
    info = parse_ratelimit_headers(answers[2].headers)
    assert (info.resource_type, info.remaining, info.limit) == ("api", 0, 2) and 0 < info.reset_in_seconds <= 60
    assert int(answers[2].headers["Retry-After"]) >= 1 and hub.rate_limited == 1


def test_ranges_past_the_end_answer_416() -> None:
    data = bytes(range(100))
    repo = MirrorRepo("org/m", {"model.safetensors": data})
    with hub_of(repo) as hub:
        location = wire(hub, "HEAD", "/org/m/resolve/main/model.safetensors").headers["Location"]
        cdn_path = location.removeprefix(hub.cdn_url)

        def cdn(rng: str) -> tuple[int, bytes, str | None]:
            req = urllib.request.Request(hub.cdn_url + cdn_path, headers={"Range": rng})
            try:
                with urllib.request.urlopen(req) as r:
                    return r.status, r.read(), r.headers.get("Content-Range")
            except urllib.error.HTTPError as e:
                return e.code, b"", e.headers.get("Content-Range")

        assert cdn("bytes=10-19") == (206, data[10:20], "bytes 10-19/100")
        assert cdn("bytes=90-") == (206, data[90:], "bytes 90-99/100")
        assert cdn("bytes=-5") == (206, data[95:], "bytes 95-99/100")
        assert cdn("bytes=0-100000") == (206, data, "bytes 0-99/100")  # the client's 100 kB header read
        assert cdn("bytes=100-200") == (416, b"", "bytes */100")
        assert cdn("bytes=99999999999999999999-") == (200, data, None)  # not a range we read: the file


@pytest.mark.parametrize("path", [
    "/org/m/resolve/main/x%0D%0ASet-Cookie:%20pwned=1",
    "/org/m/resolve/main/%E2%80%AEfdp.exe",
    "/org/m/resolve/main/\u00e9\u4e2d.json",
    "/api/models/org/m%0D%0AX-Injected:%201/revision/main",
])
def test_no_header_injection_from_the_path(path: str) -> None:
    repo = MirrorRepo("org/m", {"config.json": b"{}"})
    with hub_of(repo) as hub:
        answer = wire(hub, "GET", path)
    assert answer.status in (401, 404)  # an answer, never a 500 or a dropped connection
    assert answer.headers.get("Set-Cookie") is None and answer.headers.get("X-Injected") is None
    for value in answer.headers.values():
        assert "\r" not in value and "\n" not in value


def test_symlinks_out_of_the_mirror_are_never_served(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    mirror = tmp_path / "mirror"
    (mirror / "org" / "m").mkdir(parents=True)
    (mirror / "org" / "m" / "config.json").write_text("{}")
    (mirror / "org" / "m" / "leak.json").symlink_to(secret)
    (mirror / "org" / "m" / "alias.json").symlink_to(mirror / "org" / "m" / "config.json")
    (mirror / "org" / "outside").symlink_to(tmp_path, target_is_directory=True)
    repos = load_mirror(mirror)
    assert set(repos) == {"org/m"} and set(repos["org/m"].files) == {"config.json", "alias.json"}


def test_big_files_are_hashed_and_served_in_pieces(tmp_path: Path) -> None:
    shard = tmp_path / "model-00001-of-00002.safetensors"
    with open(shard, "wb") as fh:  # 64 MiB, sparse: no disk used
        fh.truncate(64 * 2**20)
    tracemalloc.start()
    try:
        repo = MirrorRepo("org/big", {shard.name: shard})
        with hub_of(repo) as hub:
            location = wire(hub, "HEAD", f"/org/big/resolve/main/{shard.name}").headers["Location"]
            with urllib.request.urlopen(location) as r:
                total = 0
                while chunk := r.read(1 << 20):
                    total += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == 64 * 2**20 and repo.etags[shard.name] == hashlib.sha256(b"\0" * (64 * 2**20)).hexdigest()
    assert peak < 16 * 2**20  # never the whole 64 MiB at once


def test_one_bad_repo_never_fails_the_listing(tmp_path: Path) -> None:
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"a" * 64 + b"\nsize 123\n"
    huge_shape = safetensors_bytes({"w": {"dtype": "F32", "shape": [2**62, 2**62, 2**62], "data_offsets": [0, 0]}})
    lying_length = struct.pack("<Q", 2**63 + 5) + b"{}"
    repos = [
        MirrorRepo("org/nested", {"config.json": b"[" * 200_000 + b"]" * 200_000}),
        MirrorRepo("org/pointer", {"config.json": b"{}", "model.safetensors": pointer}),
        MirrorRepo("org/shape", {"config.json": b"{}", "model.safetensors": huge_shape}),
        MirrorRepo("org/lying", {"config.json": b"{}", "model.safetensors": lying_length}),
        MirrorRepo("org/typed", {"config.json": b"{\"vision_config\": 1}"}, {
            "downloads": "many", "likes": 2**70, "gated": 5, "last_modified": "yesterday", "created_at": 3,
            "tags": "not-a-list", "base_model": ["a", "b"], "pipeline_tag": 7, "library_name": None,
        }),
        MirrorRepo("org/fine", {"config.json": b"{}"}, {"downloads": 10}),
    ]
    expand = ["sha", "lastModified", "createdAt", "downloads", "likes", "gated", "private", "disabled",
              "pipeline_tag", "library_name", "tags", "cardData", "siblings", "safetensors", "config"]
    with hub_of(*repos) as hub:
        listed = {m.id: m for m in HfApi(endpoint=hub.url, token=False).list_models(author="org", expand=expand)}
    assert set(listed) == {r.repo_id for r in repos}
    assert listed["org/fine"].downloads == 10 and listed["org/typed"].downloads is None
    assert listed["org/typed"].likes is None and listed["org/typed"].last_modified is None
    assert all(listed[r].safetensors is None for r in ("org/pointer", "org/shape", "org/lying"))


def test_malformed_metadata_toml_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "org" / "m").mkdir(parents=True)
    (tmp_path / "HUB_METADATA.toml").write_text('["org/m"]\ndownloads = = 3\n')
    with pytest.raises(AtlasError) as info:
        load_mirror(tmp_path)
    assert "HUB_METADATA.toml" in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "HUB_METADATA.toml").write_text('"org/m" = 3\n')
    with pytest.raises(AtlasError, match="not a table"):
        load_mirror(tmp_path)
