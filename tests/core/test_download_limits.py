"""Downloads give up cleanly: no endless re-downloads when the hub lies about a size or every
connection fails, traffic bounded by a small multiple of the file, empty or non-GGUF files refused."""
from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import try_to_load_from_cache

from ggufdesk.core import downloads
from ggufdesk.core.downloads import download, list_gguf
from ggufdesk.core.errors import KnownError
from tests.hubserver import Fault, write_blob

REPO = "org/limits-GGUF"
SIZE = 300_000
FAST = dict(chunk_size=64 << 10, backoff_s=0.001)


@pytest.fixture(autouse=True)
def _no_library_sleeps(monkeypatch):
    """huggingface_hub sleeps 1 s before each of its own retries; the tests need not wait."""
    import types

    import huggingface_hub.file_download as fd

    monkeypatch.setattr(fd, "time", types.SimpleNamespace(sleep=lambda s: None, time=fd.time.time))


@pytest.fixture
def repo(hub, tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    text = tmp_path / "text.gguf"
    text.write_text("<html>this is an error page, not a model</html>" * 10)
    hub.add_repo(REPO, {"m-Q4_K_M.gguf": write_blob(tmp_path / "m.gguf", SIZE, seed=1),
                        "empty-Q2_K.gguf": empty, "page-Q4_0.gguf": text})
    return hub


def sent(hub, name: str) -> tuple[int, int]:
    """(GET requests, body bytes) the hub served for this file."""
    hub.settle()
    rs = [r for r in hub.requests if r.method == "GET" and name in r.path and r.sent]
    return len(rs), sum(r.sent for r in rs)


def test_under_reported_size_stops_after_one_download(repo):
    """A hub reporting 1 KB less made the retry counter reset on every byte: 29 full GETs in 30 s."""
    name = "m-Q4_K_M.gguf"
    repo.faults.add(Fault(file=name, advertised_size=SIZE - 1024, times=None))
    with pytest.raises(KnownError, match="sent more"):
        download(REPO, name, **FAST)
    gets, nbytes = sent(repo, name)
    assert gets == 1 and nbytes <= SIZE
    assert try_to_load_from_cache(REPO, name) is None


def test_no_net_progress_gives_up(repo):
    """Every GET ignores Range and is cut half-way: bytes arrive, but the file never gets further."""
    name = "m-Q4_K_M.gguf"
    repo.faults.add(Fault(file=name, ignore_range=True, times=None))
    repo.faults.add(Fault(file=name, drop_at=SIZE // 2, reset=False, times=None))
    with pytest.raises(KnownError, match="without getting further"):
        download(REPO, name, retries=2, **FAST)
    gets, nbytes = sent(repo, name)
    assert gets <= 5 and nbytes <= 5 * SIZE // 2  # was endless: the library resets its retries on any byte


def test_traffic_budget(repo, monkeypatch):
    name = "m-Q4_K_M.gguf"
    monkeypatch.setattr(downloads, "TRAFFIC_SLACK", 0)
    repo.faults.add(Fault(file=name, ignore_range=True, times=None))
    repo.faults.add(Fault(file=name, drop_at=SIZE - 1000, reset=False, times=None))
    with pytest.raises(KnownError, match="received for a"):
        download(REPO, name, retries=100, **FAST)
    _, nbytes = sent(repo, name)
    # what the client received is capped at 3x; the server may have pushed one socket buffer more
    assert nbytes <= downloads.TRAFFIC_FACTOR * SIZE + (4 << 20)


def test_empty_gguf_is_not_listed_or_downloaded(repo):
    names = {m.first for m in list_gguf(REPO)}
    assert names == {"m-Q4_K_M.gguf", "page-Q4_0.gguf"}  # the page is refused when downloaded
    with pytest.raises(KnownError, match="0 bytes on the hub"):
        download(REPO, "empty-Q2_K.gguf", **FAST)


def test_non_gguf_content_never_enters_the_cache(repo):
    with pytest.raises(KnownError, match="not a GGUF model"):
        download(REPO, "page-Q4_0.gguf", **FAST)
    assert try_to_load_from_cache(REPO, "page-Q4_0.gguf") is None
    blobs = list(Path(downloads._storage(REPO, None), "blobs").iterdir())
    assert not [b for b in blobs if not b.name.endswith(".incomplete")]
