"""The local hub speaks enough of the protocol for huggingface_hub's own download, listing and range reads."""
from __future__ import annotations

import hashlib

import httpx2
import pytest
from huggingface_hub import HfApi, HfFileSystem, get_paths_info, hf_hub_download, list_repo_tree
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RemoteEntryNotFoundError, RepositoryNotFoundError

from tests.hubserver import TOKEN, Fault, write_blob


@pytest.fixture
def repo(hub, tmp_path, tiny_model):
    blob = write_blob(tmp_path / "blob.gguf", 300_000, seed=1)
    hub.add_repo("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": tiny_model, "sub/blob-Q8_0.gguf": blob,
                                   "README.md": tiny_model.parent / "tiny-target.gguf"})
    return hub


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_hf_hub_download_lands_in_cache_with_hub_layout(repo, tiny_model):
    path = hf_hub_download("org/tiny-GGUF", "tiny-Q4_K_M.gguf")
    assert sha(path) == sha(tiny_model)
    commit = repo.commit("org/tiny-GGUF")
    assert f"snapshots/{commit}/tiny-Q4_K_M.gguf" in path
    # LFS goes through the "CDN" redirect (another origin), which must not get the token
    cdn = [r for r in repo.requests if r.path.startswith("/cdn/")]
    assert cdn and not any(r.auth for r in cdn)


def test_list_repo_tree_and_paths_info(repo):
    files = {f.path: f for f in list_repo_tree("org/tiny-GGUF", recursive=True) if hasattr(f, "size")}
    assert set(files) == {"tiny-Q4_K_M.gguf", "sub/blob-Q8_0.gguf", "README.md"}
    assert files["sub/blob-Q8_0.gguf"].size == 300_000
    assert files["sub/blob-Q8_0.gguf"].lfs.sha256 == repo.sha256("org/tiny-GGUF", "sub/blob-Q8_0.gguf")
    assert files["README.md"].lfs is None
    top = [f.path for f in list_repo_tree("org/tiny-GGUF")]
    assert "sub" in top and "sub/blob-Q8_0.gguf" not in top
    (info,) = get_paths_info("org/tiny-GGUF", ["tiny-Q4_K_M.gguf"])
    assert info.lfs.sha256 == repo.sha256("org/tiny-GGUF", "tiny-Q4_K_M.gguf")
    mi = HfApi().model_info("org/tiny-GGUF", files_metadata=True)
    assert mi.sha == repo.commit("org/tiny-GGUF") and {s.rfilename for s in mi.siblings} == set(files)


def test_hffilesystem_range_read(repo, tmp_path):
    fs = HfFileSystem(skip_instance_cache=True)
    with fs.open("org/tiny-GGUF/sub/blob-Q8_0.gguf", "rb") as f:
        f.seek(1000)
        data = f.read(5000)
    assert data == (tmp_path / "blob.gguf").read_bytes()[1000:6000]
    # a ranged read, not the whole file (fsspec may align or read ahead, so the start can be <= 1000).
    repo.settle()  # a body's record is appended after its last byte: the client can be here first
    ranged = [r for r in repo.requests if r.range_start is not None]
    assert ranged and min(r.range_start for r in ranged) <= 1000, [
        (r.method, r.path, r.range_start) for r in repo.requests]


def test_errors_are_the_hubs_typed_errors(repo, hub, tiny_model):
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download("org/tiny-GGUF", "nope.gguf")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "x.gguf")
    hub.add_repo("org/gated", {"g.gguf": tiny_model}, gated=True)
    with pytest.raises(GatedRepoError):
        hf_hub_download("org/gated", "g.gguf")
    assert sha(hf_hub_download("org/gated", "g.gguf", token=TOKEN)) == sha(tiny_model)


def test_faults_drop_corrupt_and_status(repo, tmp_path):
    repo.faults.add(Fault(file="sub/blob-Q8_0.gguf", drop_at=123_456, reset=True))
    with pytest.raises(httpx2.ReadError):  # a TCP reset is not retried by the library: one call fails
        hf_hub_download("org/tiny-GGUF", "sub/blob-Q8_0.gguf")
    repo.faults.add(Fault(file="sub/blob-Q8_0.gguf", corrupt_at=(10,)))
    path = hf_hub_download("org/tiny-GGUF", "sub/blob-Q8_0.gguf")
    assert sha(path) != repo.sha256("org/tiny-GGUF", "sub/blob-Q8_0.gguf")  # the library does not check
    repo.faults.add(Fault(file="tiny-Q4_K_M.gguf", status=404, times=None))
    with pytest.raises(LocalEntryNotFoundError):  # the library hides the HEAD error behind "not cached"
        hf_hub_download("org/tiny-GGUF", "tiny-Q4_K_M.gguf")
    assert any(r.method == "HEAD" and r.status == 404 for r in repo.requests)
