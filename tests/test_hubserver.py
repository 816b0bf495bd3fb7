"""The local hub's tree listing (what `snapshot_download` reads), through the real client."""

from __future__ import annotations

import hashlib

import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import RemoteEntryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile, RepoFolder

from atlas.hub.server import HubServer, MirrorRepo

WEIGHTS = b"not really weights"


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
