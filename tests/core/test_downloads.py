"""Downloads against the local hub: resume after any interruption, sha256 checked, nothing corrupt left behind."""
from __future__ import annotations

import errno
import hashlib
import random
import threading
from pathlib import Path

import pytest
from huggingface_hub import constants, scan_cache_dir, try_to_load_from_cache

from ggufdesk.core import downloads
from ggufdesk.core.downloads import DownloadCancelled, download, list_gguf
from ggufdesk.core.errors import KnownError
from tests.hubserver import TOKEN, Fault, write_blob

REPO = "org/blobs-GGUF"
SIZE = 1_000_000
CHUNK = 64 << 10
FAST = dict(chunk_size=CHUNK, backoff_s=0.01)


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("served")
    out = {f"blob{i:02d}-Q4_K_M.gguf": write_blob(d / f"b{i}.gguf", SIZE + i * 777, seed=i) for i in range(20)}
    out["config.json"] = d / "config.json"
    out["config.json"].write_text('{"model_type": "llama"}')
    return out


@pytest.fixture
def repo(hub, files):
    hub.add_repo(REPO, files)
    return hub


def gets(hub, name: str) -> list[int]:
    hub.settle()
    return hub.ranges(name)


def blobs_dir() -> Path:
    return Path(constants.HF_HUB_CACHE) / "models--org--blobs-GGUF" / "blobs"


def leftovers() -> list[str]:
    d = blobs_dir()
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_download_lands_verified_in_the_shared_cache(repo, files):
    name = "blob00-Q4_K_M.gguf"
    events = []
    got = download(REPO, name, progress=events.append, **FAST)
    assert got.sha256 == sha(files[name]) == repo.sha256(REPO, name)
    assert got.bytes == SIZE and got.revision == repo.commit(REPO) and not got.from_cache
    # other tools see the same file through huggingface_hub's own cache lookups
    assert try_to_load_from_cache(REPO, name) == str(got.path)
    assert any(f.file_name == name for r in scan_cache_dir(constants.HF_HUB_CACHE).repos for rev in r.revisions for f in rev.files)
    assert [e.phase for e in events][-2:] == ["verify", "done"]
    dones = [e.done for e in events]
    assert dones == sorted(dones) and dones[-1] == SIZE and events[-1].total == SIZE
    # a second call finds it, no download
    n = len(gets(repo, name))
    again = download(REPO, name, **FAST)
    assert again.from_cache and again.path == got.path and len(gets(repo, name)) == n


def test_twenty_downloads_cut_at_random_offsets_all_resume_to_the_right_sha256(repo, files):
    rng = random.Random(1234)
    for i in range(20):
        name = f"blob{i:02d}-Q4_K_M.gguf"
        size = files[name].stat().st_size
        cut = rng.randrange(1, size)
        repo.faults.add(Fault(file=name, drop_at=cut, reset=True, times=None))
        with pytest.raises(KnownError, match="run the download again to resume"):
            download(REPO, name, retries=0, **FAST)  # gives up: as if the app had died there
        repo.faults.clear()
        partial = blobs_dir() / f"{repo.sha256(REPO, name)}.incomplete"
        kept = partial.stat().st_size
        assert kept <= cut and kept % CHUNK == 0  # whole chunks only
        assert partial.read_bytes() == files[name].read_bytes()[:kept]  # a true prefix
        got = download(REPO, name, **FAST)
        assert got.sha256 == sha(files[name]) and got.resumed_from == kept
        assert gets(repo, name)[-1] == kept  # the second request asked for the rest only
        assert not partial.exists()


def test_dropped_connections_are_retried_within_one_call(repo, files):
    name = "blob01-Q4_K_M.gguf"
    repo.faults.add(Fault(file=name, drop_at=300_000, reset=True))  # RST: huggingface_hub gives up, we retry
    repo.faults.add(Fault(file=name, drop_at=700_000, reset=True))
    got = download(REPO, name, **FAST)
    assert got.sha256 == sha(files[name])
    starts = gets(repo, name)  # a reset may also discard bytes already in flight: <= the cut
    assert len(starts) == 3 and starts == sorted(starts) and starts[1] <= 300_000 and starts[2] <= 700_000


def test_stall_times_out_and_resumes(repo, files, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.3)
    name = "blob02-Q4_K_M.gguf"
    repo.faults.add(Fault(file=name, stall_at=200_000, stall_s=1.5))
    got = download(REPO, name, **FAST)
    assert got.sha256 == sha(files[name])
    assert 200_000 // CHUNK * CHUNK in gets(repo, name)  # resumed after the stall, not from zero


def test_corrupt_bytes_are_detected_and_never_left_in_place(repo, files):
    name = "blob03-Q4_K_M.gguf"
    repo.faults.add(Fault(file=name, corrupt_at=(512_345,)))
    with pytest.raises(KnownError, match="checksum"):
        download(REPO, name, **FAST)
    assert leftovers() == []  # no blob, no partial
    assert try_to_load_from_cache(REPO, name) is None
    assert download(REPO, name, **FAST).sha256 == sha(files[name])  # the next try is clean


def test_corruption_hidden_in_a_resumed_prefix_is_caught(repo, files):
    name = "blob04-Q4_K_M.gguf"
    partial = blobs_dir() / f"{repo.sha256(REPO, name)}.incomplete"
    partial.parent.mkdir(parents=True)
    data = bytearray(files[name].read_bytes()[:400_000])
    data[1000] ^= 1
    partial.write_bytes(bytes(data))
    with pytest.raises(KnownError, match="checksum"):
        download(REPO, name, **FAST)
    assert leftovers() == []


def test_non_lfs_file_is_checked_against_its_git_oid(repo, files):
    got = download(REPO, "config.json", **FAST)
    assert got.path.read_text() == files["config.json"].read_text()
    repo.add_repo("org/other", {"config.json": files["config.json"]})
    repo.faults.add(Fault(file="config.json", corrupt_at=(3,)))
    with pytest.raises(KnownError, match="checksum"):
        download("org/other", "config.json", **FAST)


def test_not_enough_space_is_refused_before_any_byte(repo, monkeypatch):
    monkeypatch.setattr(downloads, "free_bytes", lambda path: 10_000)
    with pytest.raises(KnownError, match="not enough disk space"):
        download(REPO, "blob05-Q4_K_M.gguf", **FAST)
    assert gets(repo, "blob05-Q4_K_M.gguf") == []


class _FullDisk:
    """A file that accepts ``room`` bytes, then fails like a full disk (a short write, then ENOSPC)."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self.f.write(bytes(data[: self.room]))
        self.room -= n
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_disk_full_mid_download_is_a_clear_error_and_resumable(repo, files, monkeypatch):
    name = "blob06-Q4_K_M.gguf"
    real_init = downloads._Writer.__init__

    def init(self, f, **kw):
        real_init(self, _FullDisk(f, 333_333), **kw)

    monkeypatch.setattr(downloads._Writer, "__init__", init)
    with pytest.raises(KnownError, match="disk filled up"):
        download(REPO, name, **FAST)
    partial = blobs_dir() / f"{repo.sha256(REPO, name)}.incomplete"
    assert leftovers() == [partial.name]  # only the partial, which cannot be mistaken for the model
    assert files[name].read_bytes().startswith(partial.read_bytes())
    assert try_to_load_from_cache(REPO, name) is None
    monkeypatch.setattr(downloads._Writer, "__init__", real_init)  # space freed
    got = download(REPO, name, **FAST)
    assert got.sha256 == sha(files[name]) and got.resumed_from == partial_size_or(got)


def partial_size_or(got) -> int:
    return got.resumed_from  # resumed from whatever the full disk let through (>0)


def test_cancel_from_another_thread_then_resume_continues_from_the_partial(repo, files):
    name = "blob07-Q4_K_M.gguf"
    cancel, started, result = threading.Event(), threading.Event(), {}

    def progress(p):
        if p.phase == "download" and not started.is_set():  # the first event: a chunk is on disk
            started.set()
            assert cancel.wait(10)  # hold the worker here until the main thread has pressed cancel

    def worker():
        try:
            download(REPO, name, progress=progress, cancel=cancel, **FAST)
        except DownloadCancelled as e:
            result["cancelled"] = e

    t = threading.Thread(target=worker)
    t.start()
    assert started.wait(10)
    cancel.set()
    t.join(10)
    assert "cancelled" in result
    partial = blobs_dir() / f"{repo.sha256(REPO, name)}.incomplete"
    kept = partial.stat().st_size
    assert 0 < kept < SIZE
    got = download(REPO, name, **FAST)
    assert got.resumed_from == kept and gets(repo, name)[-1] == kept  # not from zero
    assert got.sha256 == sha(files[name])


def test_missing_file_gated_repo_and_private_repo(repo, files):
    with pytest.raises(KnownError, match="is not in"):
        download(REPO, "nope.gguf")
    with pytest.raises(KnownError, match="was not found"):
        download("org/nothing-here", "x.gguf")
    repo.add_repo("org/gated", {"g-Q8_0.gguf": files["blob08-Q4_K_M.gguf"]}, gated=True)
    with pytest.raises(KnownError, match="gated"):
        download("org/gated", "g-Q8_0.gguf")
    assert download("org/gated", "g-Q8_0.gguf", token=TOKEN, **FAST).sha256 == sha(files["blob08-Q4_K_M.gguf"])
    # the token reaches the hub but never the CDN
    assert not any(r.auth for r in repo.requests if r.path.startswith("/cdn/"))


@pytest.mark.parametrize("bad", ["../evil.gguf", "/etc/passwd", "a/../../b.gguf", "C:\\x.gguf", "a//b.gguf", ""])
def test_names_escaping_the_cache_are_refused(repo, bad):
    with pytest.raises(KnownError, match="escape"):
        download(REPO, bad)
    assert repo.requests == []


def test_revision_pinning_and_unknown_revision(repo, files):
    old = repo.commit(REPO)
    name = "blob09-Q4_K_M.gguf"
    repo.push(REPO, {name: files["blob10-Q4_K_M.gguf"]})
    assert download(REPO, name, revision=old, **FAST).sha256 == sha(files[name])
    new = download(REPO, name, **FAST)
    assert new.sha256 == sha(files["blob10-Q4_K_M.gguf"]) and new.revision == repo.commit(REPO)
    with pytest.raises(KnownError, match="revision 'v9' does not exist"):
        download(REPO, name, revision="v9")


def test_offline_uses_the_cache(repo, files):
    name = "blob11-Q4_K_M.gguf"
    with pytest.raises(KnownError, match="not downloaded"):
        download(REPO, name, offline=True)
    got = download(REPO, name, **FAST)
    off = download(REPO, name, offline=True)
    assert off.path == got.path and off.sha256 == got.sha256 and off.from_cache
    repo.stop()  # the hub goes away: the cached file is still served
    assert download(REPO, name).path == got.path


def test_wrong_size_never_produces_a_usable_file(repo, files):
    name = "blob12-Q4_K_M.gguf"
    repo.faults.add(Fault(file=name, advertised_size=SIZE + 12 * 777 + 10, times=None))
    with pytest.raises(KnownError):
        download(REPO, name, retries=1, **FAST)
    assert try_to_load_from_cache(REPO, name) is None
    assert not any(not n.endswith(".incomplete") for n in leftovers())


def test_list_gguf_groups_splits_and_reads_quants(hub, tmp_path, tiny_model):
    parts = {f"big/Model-Q5_K_S-{i:05d}-of-00003.gguf": write_blob(tmp_path / f"p{i}", 1000 + i, seed=i)
             for i in (1, 2, 3)}
    hub.add_repo("org/mix", {**parts, "Model-IQ2_XXS.gguf": tiny_model, "tiny.gguf": tiny_model,
                             "mmproj-f16.gguf": tiny_model, "README.md": tiny_model})
    models = {m.name: m for m in list_gguf("org/mix")}
    split = models["Model-Q5_K_S"]
    assert split.quant == "Q5_K_S" and len(split.files) == 3 and split.size == 3000 + 6
    assert split.first.endswith("-00001-of-00003.gguf")
    assert models["Model-IQ2_XXS"].quant == "IQ2_XXS"
    assert models["tiny"].quant is None
    assert not any(n.startswith("mmproj") for n in models)  # a vision projector is not a model
    assert all(f.sha256 for m in models.values() for f in m.files)
    probed = {m.name: m for m in list_gguf("org/mix", probe_header=True)}
    assert probed["tiny"].quant == "F32"  # read from the remote header
    with pytest.raises(KnownError, match="was not found"):
        list_gguf("org/none")


def _cut(repo, name: str, at: int) -> int:
    """Leave a partial file of ``name`` cut near ``at`` (as if the app had died there); returns its size."""
    repo.faults.add(Fault(file=name, drop_at=at, reset=True, times=None))
    with pytest.raises(KnownError, match="run the download again to resume"):
        download(REPO, name, retries=0, **FAST)
    repo.faults.clear()
    return (blobs_dir() / f"{repo.sha256(REPO, name)}.incomplete").stat().st_size


def test_a_server_that_ignores_range_restarts_the_file_and_the_hash(repo, files):
    name = "blob13-Q4_K_M.gguf"
    kept = _cut(repo, name, 600_000)
    assert kept > 0
    repo.faults.add(Fault(file=name, ignore_range=True))  # 200 and the whole file, Range or not
    got = download(REPO, name, **FAST)
    assert got.sha256 == sha(files[name]) and got.bytes == files[name].stat().st_size
    repo.settle()
    last = [r for r in repo.requests if r.method == "GET" and r.path.startswith("/cdn/")][-1]
    assert last.status == 200 and last.sent == got.bytes  # the whole file came again, from byte 0
    assert leftovers() == [got.path.resolve().name]


def test_progress_is_reported_from_the_calling_thread(repo):
    threads = set()
    download(REPO, "blob14-Q4_K_M.gguf", progress=lambda p: threads.add(threading.get_ident()), **FAST)
    assert threads == {threading.get_ident()}


def test_a_failed_read_back_of_the_resumed_prefix_falls_back_to_hashing_the_file(repo, files, monkeypatch):
    name = "blob15-Q4_K_M.gguf"
    kept = _cut(repo, name, 500_000)
    real = downloads.os.preadv
    calls = []

    def flaky(fd, buffers, offset):
        calls.append(offset)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(downloads.os, "preadv", flaky)
    got = download(REPO, name, **FAST)
    monkeypatch.setattr(downloads.os, "preadv", real)
    assert calls == [0]  # the hasher tried to read the prefix back, failed, and stopped hashing
    assert got.sha256 == sha(files[name]) and got.resumed_from == kept  # checked by a full pass instead
    assert gets(repo, name)[-1] == kept
