"""Model downloads into the shared Hugging Face cache: resumable across calls, sha256-verified, cancellable.

Built on huggingface_hub's own pieces (its metadata HEAD, ``http_get(..., resume_size=n)``, its cache
layout and locks), not on our own HTTP code. What we add, because ``hf_hub_download`` lacks it: the
partial file survives a failed call, a cancel or a crash (``blobs/<etag>.incomplete``, the name the
library's cache scanner knows) and the next call resumes from it; the content is checked against the
hub's LFS sha256 (git blob sha1 for small non-LFS files) before it enters ``blobs/``, so a corrupt
file never appears under its hash name; free space is checked first; names that would leave the
cache are refused.

Threading: ``download`` runs in the caller's thread (a GUI runs it in a worker) and calls ``progress``
from that thread (marshal to the GUI thread); a helper thread hashes what is written; ``cancel`` is a
``threading.Event`` set from any thread. Cancel takes effect at the next received chunk (``CHUNK``),
or within huggingface_hub's read timeout when the connection is stalled.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, BinaryIO, cast

from ggufdesk.core.errors import KnownError, network_errors
from ggufdesk.core.gguf_meta import split_parts
from ggufdesk.core.quants import quant_from_name

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoFile

log = logging.getLogger("ggufdesk.downloads")

# bytes per write/progress step: small enough to stay in the CPU cache between receive, write and hash
# (measured on the 253 MB starter model: 1 MiB costs ~40% more CPU; huggingface_hub's default is 10 MiB).
# None writes whatever one socket read brings (up to 64 KiB).
CHUNK: int | None = 256 << 10
SPACE_MARGIN = 16 << 20  # keep this much free beyond the file
HASH_BACKLOG = 64 << 20  # received bytes that may wait in memory for the hasher
HASH_BATCH = 1 << 20  # received bytes handed to the hasher at once
# Give up on a file after this much traffic without finishing (x its size, plus a little): a hub that
# under-reports a size or cuts every connection made hf_hub_download-style retry loops pull 7.5 GB in 4 min.
TRAFFIC_FACTOR, TRAFFIC_SLACK = 3, 32 << 20
MIN_GGUF_BYTES = 24  # magic, version and two counts: anything shorter is not a model
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")


class DownloadCancelled(KnownError):
    """The user paused or cancelled; the partial file is kept and the next call resumes from it."""


@dataclass(frozen=True)
class Progress:
    """One progress event: bytes of this file done/total, speed over the last seconds, time left."""

    filename: str
    done: int
    total: int
    speed_bps: float
    eta_s: float | None
    phase: str  # "download" | "verify" | "done"
    resumed_from: int = 0


ProgressFn = Callable[[Progress], None]


@dataclass(frozen=True)
class Downloaded:
    path: Path  # the snapshot path in the HF cache (a symlink to the blob)
    repo: str
    file: str
    revision: str  # the commit hash
    sha256: str
    bytes: int
    resumed_from: int = 0
    from_cache: bool = False

    def as_json(self) -> dict[str, object]:
        return {"path": str(self.path), "sha256": self.sha256, "bytes": self.bytes, "repo": self.repo,
                "file": self.file, "revision": self.revision, "resumed_from": self.resumed_from,
                "from_cache": self.from_cache}


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None  # LFS files only


@dataclass(frozen=True)
class RemoteModel:
    """One usable model in a repo: a single .gguf or all parts of a split set."""

    name: str
    quant: str | None
    files: tuple[RemoteFile, ...] = field(default=())

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def first(self) -> str:
        return self.files[0].path


# ----------------------------------------------------------------------------------- errors


_network_errors = network_errors


def _status(e: BaseException) -> int | None:
    resp = getattr(e, "response", None)
    return getattr(resp, "status_code", None)


def _hub_error(e: BaseException, repo_id: str, filename: str, revision: str | None) -> KnownError:
    """The user-readable form of an error from the hub."""
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RemoteEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if isinstance(e, GatedRepoError):
        return KnownError(f"{repo_id} is a gated model: accept its terms on its Hugging Face page, then log "
                          "in with `hf auth login` (or set HF_TOKEN) and try again")
    if isinstance(e, RepositoryNotFoundError):
        return KnownError(f"repository {repo_id} was not found (if it is private, log in with `hf auth login`)")
    if isinstance(e, RevisionNotFoundError):
        return KnownError(f"revision {revision!r} does not exist in {repo_id}")
    if isinstance(e, RemoteEntryNotFoundError):
        return KnownError(f"{filename} is not in {repo_id} at revision {revision or 'main'}")
    if isinstance(e, OfflineModeIsEnabled):
        return KnownError(f"offline mode is on and {repo_id}/{filename} is not downloaded")
    if isinstance(e, HfHubHTTPError) and _status(e) in (401, 403):
        return KnownError(f"the hub refused access to {repo_id}/{filename} ({_status(e)}): log in with "
                          "`hf auth login` and check you have access")
    if isinstance(e, HfHubHTTPError):
        return KnownError(f"the hub answered {_status(e)} for {repo_id}/{filename}")
    return KnownError(f"could not reach the Hugging Face hub: {e}")


def hub_reachable(timeout: float = 3.0, *, endpoint: str | None = None) -> bool:
    """One quick look at the hub (its front page, `timeout` s): offline, say so at once rather than
    let huggingface_hub retry each request for half a minute. HF_HUB_OFFLINE counts as offline."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        urllib.request.urlopen(endpoint or constants.ENDPOINT, timeout=timeout).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return True


def require_hub(endpoint: str | None = None) -> None:
    """KnownError at once when the hub cannot be reached (a command that needs it, offline)."""
    from huggingface_hub import constants

    if not hub_reachable(endpoint=endpoint):
        where = endpoint or constants.ENDPOINT
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "no network, or it is down"
        raise KnownError(f"could not reach the Hugging Face hub at {where} ({why}); models already "
                         "on this computer: `ggufdesk library`, `ggufdesk plan FILE`")


def check_filename(filename: str) -> str:
    """Refuse names that would land outside the repo's folder (absolute, ``..``, backslashes, drives)."""
    p = PurePosixPath(filename)
    if (not filename or p.is_absolute() or "\\" in filename or re.match(r"^[A-Za-z]:", filename)
            or any(part in ("", ".", "..") for part in filename.split("/")) or "\0" in filename):
        raise KnownError(f"refusing file name {filename!r}: it would escape the download folder")
    return filename


_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|//|@\{")


def check_revision(revision: str | None) -> str | None:
    """A branch, tag, commit or hub ref (refs/pr/1), by git's check-ref-format rules; never a path.

    huggingface_hub writes the revision's commit to `refs/<revision>` in the cache: `../../x` had written
    outside it (issue 34)."""
    if revision is None:
        return None
    parts = revision.split("/")
    if (not revision or len(revision) > 255 or _REF_FORBIDDEN.search(revision) or revision.startswith("/")
            or revision.endswith(("/", ".", ".lock")) or revision == "@"
            or any(not p or p.startswith(".") or p.endswith(".lock") for p in parts)):
        raise KnownError(f"refusing revision {revision!r}: a revision is a branch, tag or commit name "
                         "(such as main, v1.0 or a commit hash)")
    return revision


# ----------------------------------------------------------------------------------- listing


def _tree(repo_id: str, revision: str | None, token: str | bool | None, endpoint: str | None) -> list[RepoFile]:
    """The repo's files (huggingface_hub's RepoFile entries), or a KnownError that says why not."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as e:
        raise KnownError(f"{repo_id!r} is not a repository id (owner/name): {e}") from None
    check_revision(revision)
    require_hub(endpoint)  # offline: one line now, not five retries of each request
    try:
        return [e for e in HfApi(endpoint=endpoint).list_repo_tree(
            repo_id, revision=revision, recursive=True, token=token) if isinstance(e, RepoFile)]
    except Exception as e:
        if isinstance(e, _network_errors()) or e.__class__.__module__.startswith("huggingface_hub"):
            raise _hub_error(e, repo_id, "", revision) from e
        raise


def projector_for(repo_id: str, model_file: str, *, revision: str | None = None, token: str | bool | None = None,
                  endpoint: str | None = None) -> RemoteFile | None:
    """The vision projector (mmproj) in the repo that pairs with model_file (core/projector.py
    pick_projector: named after the model first, then f16, bf16, q8_0, f32), or None for a text model."""
    from ggufdesk.core.projector import is_projector_name, pick_projector

    files = {e.path: e for e in _tree(repo_id, revision, token, endpoint)
             if is_projector_name(e.path) and isinstance(e.size, int) and e.size >= MIN_GGUF_BYTES}
    # a projector in the model's own folder of the repo first (repos holding several models keep them apart)
    folder = model_file.rpartition("/")[0]
    near = [p for p in files if p.rpartition("/")[0] == folder] or list(files)
    chosen = pick_projector(near, model_file)
    if chosen is None:
        return None
    e = files[chosen]
    return RemoteFile(e.path, int(e.size), e.lfs.sha256 if e.lfs else None)


def list_gguf(repo_id: str, *, revision: str | None = None, token: str | bool | None = None,
              endpoint: str | None = None, probe_header: bool = False) -> list[RemoteModel]:
    """The repo's GGUF models, split sets grouped into one, with sizes and quant type.

    The quant comes from the file name; with ``probe_header`` an unclear one is read from the remote
    file's header (a few MB over HTTP range reads).
    """
    from ggufdesk.core.projector import is_projector_name

    entries = _tree(repo_id, revision, token, endpoint)
    groups: dict[str, list[RemoteFile]] = {}
    for e in entries:
        if not e.path.lower().endswith(".gguf") or is_projector_name(e.path):
            continue  # a vision projector (mmproj) is not a model on its own
        if not isinstance(e.size, int) or e.size < MIN_GGUF_BYTES:
            log.info("%s/%s: %s bytes, not a model; left out", repo_id, e.path, e.size)
            continue  # an empty .gguf is never listed or recommended
        sp = split_parts(e.path)
        key = sp[0] if sp else e.path.removesuffix(".gguf").removesuffix(".GGUF")
        groups.setdefault(key, []).append(RemoteFile(e.path, int(e.size), e.lfs.sha256 if e.lfs else None))
    models = []
    for key, files in sorted(groups.items()):
        files.sort(key=lambda f: f.path)
        quant = quant_from_name(files[0].path)
        if quant is None and probe_header:
            quant = _header_quant(repo_id, files[0].path, revision)
        models.append(RemoteModel(name=key.rsplit("/", 1)[-1], quant=quant, files=tuple(files)))
    return models


def _header_quant(repo_id: str, path: str, revision: str | None) -> str | None:
    from ggufdesk.core.gguf_meta import read_gguf

    rev = f"@{revision}" if revision else ""
    try:
        return read_gguf(f"hf://{repo_id}{rev}/{path}").file_type
    except KnownError as e:
        log.info("could not read the header of %s/%s: %s", repo_id, path, e)
        return None


# ----------------------------------------------------------------------------------- writing


class _Writer:
    """The file object handed to ``http_get``: writes inline, hashes in a second thread.

    Each received chunk is written at once with one unbuffered ``write`` (a short write is continued;
    the GIL is released, so no writer thread or extra copy is needed), then handed by reference, in
    batches of ``HASH_BATCH`` bytes, to a hasher thread that feeds sha256 (and the git sha1 for small
    files): hashing overlaps receiving. The hasher first reads back the prefix we resume from, so the
    digests cover the whole file. At most ``backlog`` batches wait for it (memory stays bounded when
    hashing is the slower side). A disk error or a cancel is raised from ``write``, in the
    downloading thread.
    """

    READ_BLOCK = 4 << 20

    def __init__(self, f: IO[bytes], *, have: int, size: int, git: bool, report: Callable[[int], None],
                 cancel: threading.Event | None, backlog: int = 64, max_stalls: int = 5,
                 label: str = "") -> None:
        self.f, self.report, self.cancel = f, report, cancel
        # http_get restarts from byte 0 when a server ignores Range, and resets its own retry count
        # whenever bytes arrive: count the restarts that got no further than the one before
        self.best = self._best_at_restart = have
        self.stalls, self.max_stalls, self.label = 0, max_stalls, label
        self.sha = hashlib.sha256()
        self.git = hashlib.sha1(b"blob %d\0" % size) if git else None
        self.valid = True
        f.seek(have)
        if os.fstat(f.fileno()).st_size != have:
            f.truncate()  # only when needed: on ext4 a truncated file is flushed at close (auto_da_alloc)
        self.pos = have
        self._hashed = 0
        self._abort = False
        self._error: BaseException | None = None
        self._queue: queue.Queue[list[bytes] | None] = queue.Queue(backlog)
        self._batch: list[bytes] = []
        self._batched = 0
        self._fd = os.dup(f.fileno())  # the hasher's own handle for the prefix: pread, no shared position
        self._thread = threading.Thread(target=self._hash_loop, args=(have,), name="download-hasher",
                                        daemon=True)
        self._thread.start()

    def _update(self, data: bytes | memoryview) -> None:
        self.sha.update(data)
        if self.git is not None:
            self.git.update(data)
        self._hashed += len(data)

    def _hash_loop(self, have: int) -> None:
        try:
            buf = bytearray(min(self.READ_BLOCK, have))
            with memoryview(buf) as view:
                while self._hashed < have and not self._abort:
                    n = os.preadv(self._fd, [view[: min(len(buf), have - self._hashed)]], self._hashed)
                    if n <= 0:
                        raise OSError(errno.EIO, f"short read at byte {self._hashed} of the partial file")
                    self._update(view[:n])
        except BaseException as e:  # noqa: BLE001 - reported by close(); the digest is then recomputed
            if self.valid:  # (not when http_get already restarted the file under us)
                self._error = e
            self.valid = False
        finally:
            os.close(self._fd)
        while (batch := self._queue.get()) is not None:
            for data in batch:
                if self.valid and not self._abort:
                    self._update(data)

    def write(self, data: bytes) -> int:
        if self.cancel is not None and self.cancel.is_set():
            raise DownloadCancelled("download paused")
        view = memoryview(data)
        while view:
            written = self.f.write(view)
            if not written:
                raise OSError(errno.EIO, "write returned nothing")
            view = view[written:]
        self.pos += len(data)
        self.best = max(self.best, self.pos)
        self._batch.append(data if isinstance(data, bytes) else bytes(data))
        self._batched += len(data)
        if self._batched >= HASH_BATCH:  # one hand-off per batch, not per socket read
            self._queue.put(self._batch)
            self._batch, self._batched = [], 0
        self.report(len(data))
        return len(data)

    @property
    def hashed(self) -> int:
        """Bytes from the start of the file that the digests cover."""
        return self._hashed

    def close(self, *, abort: bool = False) -> None:
        """Let the hasher catch up with everything written (or drop what is left: ``abort``)."""
        if self._thread.is_alive():
            self._abort = abort
            if self._batch and not abort:
                self._queue.put(self._batch)
            self._batch, self._batched = [], 0
            self._queue.put(None)
            self._thread.join()
        if self._error is not None and not abort:
            log.warning("reading back the partial file failed (%s); hashing it again", self._error)

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.valid = False  # only http_get's restart-from-zero seeks: the hash restarts at the end
        self.pos = self.f.seek(pos, whence)
        return self.pos

    def truncate(self, size: int | None = None) -> int:
        self.valid = False  # the server ignored Range: the hash restarts from the file at the end
        self.stalls = self.stalls + 1 if self.best <= self._best_at_restart else 0
        self._best_at_restart = self.best
        if self.stalls > self.max_stalls:
            raise KnownError(f"downloading {self.label} restarted from the beginning {self.stalls} times without "
                             "getting further (the server ignores resume requests and the connection keeps "
                             "dropping); try again later")
        return self.f.truncate(size)

    def flush(self) -> None:
        pass  # the file is unbuffered


class _Meter:
    """Throttled progress reporting with speed over a sliding window."""

    def __init__(self, filename: str, total: int, done: int, fn: ProgressFn | None) -> None:
        self.filename, self.total, self.done, self.fn = filename, total, done, fn
        self.start = done
        self.samples: list[tuple[float, int]] = [(time.monotonic(), done)]
        self.last = 0.0

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.fn is not None and (now - self.last >= 0.1 or self.done >= self.total):
            self.last = now
            self.samples.append((now, self.done))
            while len(self.samples) > 2 and now - self.samples[0][0] > 3.0:
                self.samples.pop(0)
            self.emit("download")

    def reset(self, done: int) -> None:
        self.done = done
        self.samples = [(time.monotonic(), done)]

    def emit(self, phase: str) -> None:
        if self.fn is None:
            return
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        speed = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
        eta = (self.total - self.done) / speed if speed > 0 else None
        self.fn(Progress(self.filename, self.done, self.total, speed, eta, phase, self.start))


# ----------------------------------------------------------------------------------- the download


def free_bytes(path: Path) -> int:
    """Free space where ``path`` (or its nearest existing parent) lives."""
    for p in [path, *path.parents]:
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return 0


def partial_path(repo_id: str, filename: str, *, revision: str | None = None,
                 cache_dir: str | Path | None = None, endpoint: str | None = None,
                 token: str | bool | None = None) -> Path | None:
    """Where an unfinished download of this file is kept (None if there is none)."""
    meta = _metadata(repo_id, check_filename(filename), check_revision(revision), token, endpoint)
    p = _storage(repo_id, cache_dir) / "blobs" / f"{meta.etag}.incomplete"
    return p if p.exists() else None


def _storage(repo_id: str, cache_dir: str | Path | None) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(cache_dir or constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


@dataclass(frozen=True)
class _Meta:
    """The hub's answer to a HEAD of one file, once it is known to name a commit and an ETag."""

    commit: str
    etag: str  # the blob's name in the cache
    size: int | None
    location: str  # where the bytes are (a CDN URL after a redirect)


def _metadata(repo_id: str, filename: str, revision: str | None, token: str | bool | None,
              endpoint: str | None) -> _Meta:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    meta = get_hf_file_metadata(url, token=token, endpoint=endpoint)
    if not meta.commit_hash or not meta.etag:
        raise KnownError(f"{url} does not look like a Hugging Face hub (no commit or ETag header)")
    return _Meta(meta.commit_hash, meta.etag, meta.size, meta.location)


def _from_cache(repo_id: str, filename: str, revision: str | None, cache_dir: str | Path | None,
                why: BaseException | None = None) -> Downloaded:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=revision)
    if not isinstance(found, str):
        if why is not None:
            raise _hub_error(why, repo_id, filename, revision) from why
        raise KnownError(f"offline: {repo_id}/{filename} is not downloaded")
    path = Path(found)
    commit = path.parents[filename.count("/")].name  # snapshots/<commit>/<filename>
    sha = _verified_sha(path.resolve())
    return Downloaded(path, repo_id, filename, commit, sha, path.stat().st_size, from_cache=True)


def _verified_sha(blob: Path, expected: str | None = None) -> str:
    """sha256 of a blob already in the cache, checked against its hash name once and remembered."""
    from ggufdesk.core import library

    st = blob.stat()
    known = library.verified_sha(blob, st.st_size, st.st_mtime_ns)
    if known:
        return known
    sha = hashlib.sha256()
    with blob.open("rb") as f:
        while block := f.read(1 << 22):
            sha.update(block)
    digest = sha.hexdigest()
    want = expected or (blob.name if _SHA256_RE.match(blob.name) else None)
    if want and want != digest:
        raise KnownError(f"the cached file {blob} is corrupt (sha256 {digest[:12]}…, expected {want[:12]}…); "
                         "delete it and download again")
    library.remember_verified(blob, st.st_size, st.st_mtime_ns, digest)
    return digest


def download(repo_id: str, filename: str, *, revision: str | None = None, token: str | bool | None = None,
             cache_dir: str | Path | None = None, endpoint: str | None = None,
             progress: ProgressFn | None = None, cancel: threading.Event | None = None,
             offline: bool | None = None, retries: int = 5, backoff_s: float = 1.0,
             chunk_size: int | None = CHUNK) -> Downloaded:
    """Download one file into the HF cache (or find it there) and return its verified path.

    Resumes a partial file left by an earlier call; retries with backoff while bytes keep coming;
    raises ``DownloadCancelled`` when ``cancel`` is set and ``KnownError`` for anything the user
    can act on (gated, missing, no space, checksum mismatch, no network).
    """
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError

    check_filename(filename)
    check_revision(revision)
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise KnownError(f"{repo_id!r} is not a repository id (owner/name): {e}") from e
    if offline if offline is not None else constants.is_offline_mode():
        return _from_cache(repo_id, filename, revision, cache_dir)
    try:
        meta = _metadata(repo_id, filename, revision, token, endpoint)
    except HfHubHTTPError as e:
        status = _status(e)
        if status is not None and status < 500 and not isinstance(e, _network_errors()):
            raise _hub_error(e, repo_id, filename, revision) from e
        return _from_cache(repo_id, filename, revision, cache_dir, why=e)
    except _network_errors() as e:
        return _from_cache(repo_id, filename, revision, cache_dir, why=e)
    try:
        return _fetch(repo_id, filename, meta, revision=revision, token=token, cache_dir=cache_dir,
                      endpoint=endpoint, progress=progress, cancel=cancel, retries=retries,
                      backoff_s=backoff_s, chunk_size=chunk_size)
    except OSError as e:  # the cache folder: read-only, not a folder, full before we started
        if isinstance(e, _network_errors()):
            raise _hub_error(e, repo_id, filename, revision) from e
        raise KnownError(f"cannot write {filename} into the Hugging Face cache "
                         f"({e.strerror or e}: {e.filename or _storage(repo_id, cache_dir)})") from e


def _expected_hashes(repo_id: str, filename: str, meta: _Meta, token: str | bool | None,
                     endpoint: str | None) -> tuple[str | None, str | None]:
    """(sha256, git sha1) the content must have: paths-info's LFS sha256, else the ETag."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    sha256 = git = None
    try:
        (info,) = HfApi(endpoint=endpoint).get_paths_info(repo_id, [filename], revision=meta.commit,
                                                          token=token)
        if isinstance(info, RepoFile) and info.lfs:
            sha256 = info.lfs.sha256
        elif isinstance(info, RepoFile) and info.blob_id:
            git = info.blob_id
    except Exception as e:  # noqa: BLE001 - a mirror without paths-info: fall back to the ETag
        log.info("paths-info failed for %s/%s (%s); using the ETag", repo_id, filename, e)
    if sha256 is None and git is None:
        if _SHA256_RE.match(meta.etag):
            sha256 = meta.etag
        elif _SHA1_RE.match(meta.etag):
            git = meta.etag
    return sha256, git


@dataclass(frozen=True)
class _Job:
    """One file's transfer: where its bytes go, what they must hash to, how to fetch and report them."""

    repo_id: str
    filename: str
    commit: str
    size: int
    partial: Path  # blobs/<etag>.incomplete
    blob: Path
    pointer: Path  # snapshots/<commit>/<filename>
    location: str
    headers: dict[str, str]
    sha256: str | None
    git: str | None
    progress: ProgressFn | None
    cancel: threading.Event | None
    retries: int
    backoff_s: float
    chunk_size: int | None

    def kept(self) -> int:
        """Bytes of the partial file on disk now."""
        return self.partial.stat().st_size if self.partial.exists() else 0


def _fetch(repo_id: str, filename: str, meta: _Meta, *, revision: str | None, token: str | bool | None,
           cache_dir: str | Path | None, endpoint: str | None, progress: ProgressFn | None,
           cancel: threading.Event | None, retries: int, backoff_s: float, chunk_size: int | None) -> Downloaded:
    from huggingface_hub import constants
    from huggingface_hub.file_download import (_cache_commit_hash_for_specific_revision,
                                               _create_symlink, _get_pointer_path, hf_hub_url)
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    storage = _storage(repo_id, cache_dir)
    commit, etag, size = meta.commit, meta.etag, meta.size
    if "/" in etag or etag in (".", ".."):
        raise KnownError(f"the hub sent an unusable ETag {etag!r}")
    try:
        pointer = Path(_get_pointer_path(str(storage), commit, os.path.join(*filename.split("/"))))
    except ValueError as e:
        raise KnownError(f"refusing file name {filename!r}: it would escape the download folder") from e
    blob = storage / "blobs" / etag
    partial = blob.with_name(etag + ".incomplete")
    sha256, git = _expected_hashes(repo_id, filename, meta, token, endpoint)
    if (revision or constants.DEFAULT_REVISION) != commit:  # refs/main -> commit, as the library does
        blob.parent.mkdir(parents=True, exist_ok=True)
        _cache_commit_hash_for_specific_revision(str(storage), revision or constants.DEFAULT_REVISION, commit)
    if blob.exists():
        _check_model(blob, filename, remove=False)
        digest = _verified_sha(blob, sha256)
        if not pointer.exists():
            pointer.parent.mkdir(parents=True, exist_ok=True)
            _create_symlink(str(blob), str(pointer), new_blob=False)
        return Downloaded(pointer, repo_id, filename, commit, digest, blob.stat().st_size, from_cache=True)
    if size is None:
        raise KnownError(f"the hub did not report the size of {repo_id}/{filename}")
    if filename.lower().endswith(".gguf") and size < MIN_GGUF_BYTES:
        raise KnownError(f"{repo_id}/{filename} is {size} bytes on the hub: not a GGUF model, not downloaded")
    blob.parent.mkdir(parents=True, exist_ok=True)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    need = max(size - have, 0) + SPACE_MARGIN
    free = free_bytes(blob.parent)
    if free < need:
        raise KnownError(f"not enough disk space for {filename}: it needs {_mb(need)} more, "
                         f"{_mb(free)} free in {blob.parent}")
    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=endpoint)
    location = meta.location or url
    headers = build_hf_headers(token=token)
    if _origin(location) != _origin(url):
        headers.pop("authorization", None)  # a CDN URL is signed; the token stays on the hub
    lock = storage.parent / ".locks" / storage.name / f"{etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    job = _Job(repo_id, filename, commit, size, partial, blob, pointer, location, headers, sha256, git,
               progress, cancel, retries, backoff_s, chunk_size)
    try:
        with WeakFileLock(lock, timeout=5):
            return _transfer(job)
    except TimeoutError as e:  # filelock.Timeout is a TimeoutError
        raise KnownError(f"{filename} is already being downloaded by another task") from e


class _Traffic:
    """The bytes received over all of a file's attempts; stops the transfer past its budget."""

    def __init__(self, job: _Job, meter: _Meter) -> None:
        self.filename, self.size, self.meter = job.filename, job.size, meter
        self.received, self.budget = 0, TRAFFIC_FACTOR * job.size + TRAFFIC_SLACK
        self.writer: _Writer | None = None  # the latest attempt's

    def count(self, n: int) -> None:
        self.received += n
        self.meter.add(n)
        if self.received > self.budget:
            raise KnownError(
                f"stopped downloading {self.filename}: {_mb(self.received)} received for a {_mb(self.size)} "
                f"file without finishing (the hub or the connection keeps failing); "
                f"{_mb(self.writer.pos if self.writer else 0)} kept, run the download again to resume")


def _transfer(job: _Job) -> Downloaded:
    """Receive the file into its partial, retrying with backoff while it gets further; then install it."""
    start = job.kept()
    meter = _Meter(job.filename, job.size, 0, job.progress)
    traffic = _Traffic(job, meter)
    attempt = 0
    best = start  # the furthest the partial file has got: only going beyond it is progress
    while True:
        meter.reset(_refuse_oversize(job))
        err = _attempt(job, traffic)
        if err is None:
            break
        now = job.kept()
        if now > job.size:
            continue  # more bytes than the hub said: refused at the top of the loop
        attempt = 0 if now > best else attempt + 1  # net progress only: a restart from 0 is not
        best = max(best, now)
        _back_off(job, attempt, err, now)
    return _install(job, meter, traffic.writer, start)


def _refuse_oversize(job: _Job) -> int:
    """The partial file's size; a partial longer than the hub's size is deleted and refused."""
    have = job.kept()
    if have > job.size:
        job.partial.unlink()
        raise KnownError(f"the hub says {job.filename} has {_mb(job.size)} ({job.size} bytes) but sent more "
                         f"({have} bytes): its listing and the file disagree; try again later")
    return have


def _attempt(job: _Job, traffic: _Traffic) -> BaseException | None:
    """One request from the partial's end: None when the file is complete, else the error to retry on.

    Raises what no retry can fix: a cancel, a full or read-only disk, a refused or missing file."""
    try:
        if job.cancel is not None and job.cancel.is_set():
            raise DownloadCancelled("download paused")
        _receive(job, traffic)
        return None
    except DownloadCancelled:
        log.info("%s paused at %d of %d bytes", job.filename, job.kept(), job.size)
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise KnownError(f"the disk filled up while downloading {job.filename}: free some space and run "
                             f"the download again to resume ({_mb(job.partial.stat().st_size)} kept in "
                             f"{job.partial})") from e
        if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise KnownError(f"cannot write {job.partial}: {e.strerror}") from e
        return e
    except _network_errors() as e:
        if _status(e) in (401, 403, 404, 410):
            raise _hub_error(e, job.repo_id, job.filename, job.commit) from e
        return e


def _receive(job: _Job, traffic: _Traffic) -> None:
    """huggingface_hub's http_get from the partial's end into it, through a hashing _Writer."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils.tqdm import silent_tqdm

    have = job.kept()
    with job.partial.open("r+b" if job.partial.exists() else "w+b", buffering=0) as f:
        writer = traffic.writer = _Writer(
            f, have=have, size=job.size, git=job.sha256 is None and job.git is not None, report=traffic.count,
            cancel=job.cancel, max_stalls=job.retries, label=job.filename,
            backlog=max(2, HASH_BACKLOG // max(job.chunk_size or 0, HASH_BATCH)))
        # declared an int, but it goes to httpx's iter_bytes where None means "as each read brings"
        constants.DOWNLOAD_CHUNK_SIZE = job.chunk_size  # type: ignore[assignment]
        try:
            # http_get wants a BinaryIO; it only calls the write/seek/tell/truncate/flush _Writer has
            http_get(job.location, cast("BinaryIO", writer), resume_size=have, headers=job.headers,
                     expected_size=job.size, displayed_filename=job.filename, tqdm_class=silent_tqdm)
        except BaseException:
            writer.close(abort=True)  # a cancel must not wait for the hash of a long prefix
            raise
        writer.close()


def _back_off(job: _Job, attempt: int, err: BaseException, now: int) -> None:
    """Wait before the next attempt (doubling, at most 30 s); give up after ``retries`` without progress."""
    if attempt > job.retries:
        raise KnownError(f"downloading {job.filename} failed {attempt} times without getting further ({err}); "
                         f"{_mb(now)} of {_mb(job.size)} kept, run the download again to resume") from err
    wait = min(job.backoff_s * 2 ** max(attempt - 1, 0), 30.0)
    log.warning("%s: %s; retrying from byte %d in %.1fs", job.filename, err, now, wait)
    if job.cancel is None:
        time.sleep(wait)
    elif job.cancel.wait(wait):
        raise DownloadCancelled("download paused")


def _install(job: _Job, meter: _Meter, writer: _Writer | None, start: int) -> Downloaded:
    """Check the complete partial's digest and header, then move it into blobs/ and link its snapshot."""
    from huggingface_hub.file_download import _create_symlink

    from ggufdesk.core import library

    meter.done = job.size
    meter.emit("verify")
    digest, gitsum = _digests(job.partial, writer, job.size)
    expected, got = (job.sha256, digest) if job.sha256 else (job.git, gitsum)
    if expected and got != expected:
        job.partial.unlink(missing_ok=True)
        raise KnownError(f"{job.filename} failed its checksum (got {got[:12]}…, the hub says {expected[:12]}…): "
                         "the corrupt file was deleted; run the download again")
    _check_model(job.partial, job.filename, remove=True)
    os.replace(job.partial, job.blob)  # created by open(): the mode already follows the umask
    st = job.blob.stat()
    library.remember_verified(job.blob, st.st_size, st.st_mtime_ns, digest)
    _create_symlink(str(job.blob), str(job.pointer), new_blob=True)
    meter.emit("done")
    return Downloaded(job.pointer, job.repo_id, job.filename, job.commit, digest, job.size, resumed_from=start)


def _check_model(path: Path, filename: str, *, remove: bool) -> None:
    """A .gguf must start with the GGUF magic and hold at least a header before it enters the cache."""
    if not filename.lower().endswith(".gguf"):
        return
    with path.open("rb") as f:
        head = f.read(4)
        n = os.fstat(f.fileno()).st_size
    if head == b"GGUF" and n >= MIN_GGUF_BYTES:
        return
    if remove:
        path.unlink(missing_ok=True)
    raise KnownError(f"{filename} is not a GGUF model ({n} bytes, starting with {head!r}); "
                     + ("it was not added to the library" if remove else f"the cached copy {path} is unusable"))


def _digests(partial: Path, writer: _Writer | None, size: int) -> tuple[str, str]:
    if writer is not None and writer.valid and writer.hashed == size == partial.stat().st_size:
        return writer.sha.hexdigest(), (writer.git.hexdigest() if writer.git else "")
    sha, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % partial.stat().st_size)
    with partial.open("rb") as f:
        while block := f.read(1 << 22):
            sha.update(block)
            git.update(block)
    return sha.hexdigest(), git.hexdigest()


def _origin(url: str) -> str:
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"
