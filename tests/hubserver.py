"""A local Hugging Face hub on 127.0.0.1 for tests and benchmarks: real files, real protocol, injectable faults.

It speaks the part of the hub protocol that huggingface_hub 2.4 uses to download and inspect files:

- ``HEAD/GET /{repo}/resolve/{revision}/{file}``: ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag`` and
  ``X-Linked-Size``. LFS files (``.gguf`` and anything not ``.md/.json/.txt``) answer with a 302 to a
  "CDN" URL on ``http://localhost:{port}/cdn/...`` (another origin than ``127.0.0.1``, so the library
  drops the auth header there, as it does for the real CDN). ``Range: bytes=N-`` gives 206.
- ``GET /api/models/{repo}[/revision/{rev}]`` (model_info, with ``?blobs=true`` sizes and LFS sha256),
  ``GET /api/models/{repo}/tree/{rev}[/{path}]`` (list_repo_tree, HfFileSystem) and
  ``POST /api/models/{repo}/paths-info/{rev}`` (get_paths_info).
- Errors carry the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``,
  ``GatedRepo``), so huggingface_hub raises its own typed errors.

Pointing huggingface_hub at it: the library reads ``HF_ENDPOINT`` once, at import, into
``huggingface_hub.constants.ENDPOINT`` and ``constants.HUGGINGFACE_CO_URL_TEMPLATE`` (used by
``hf_hub_url``). ``HfApi``/``HfFileSystem`` read ``constants.ENDPOINT`` when they are created, and the
module-level functions (``huggingface_hub.list_repo_tree``, ``model_info``, ...) are bound methods of
one ``HfApi`` made at import (``huggingface_hub.hf_api.api``). So in a process where the library is
already imported, setting the env var is not enough: use ``server.patch_endpoint(monkeypatch)``
(tests) or ``with server.endpoint_patched():`` (scripts), which set the env var, both constants and
``hf_api.api.endpoint``; or pass ``endpoint=server.url`` explicitly.

Usage::

    with HubServer({"org/tiny-GGUF": {"tiny-Q4_K_M.gguf": path}}, gated={"org/gated"}) as hub:
        hub.faults.add(Fault(file="tiny-Q4_K_M.gguf", drop_at=12345))   # cut the next GET there
        ... hub.url ... hub.requests ...   # every request: method, path, range start, status, bytes sent

A pytest fixture ``hub`` lives in tests/conftest.py (an empty server, endpoint patched; add repos with
``hub.add_repo``).
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

TOKEN = "hf_test_token_0123456789"
NON_LFS_SUFFIXES = (".md", ".json", ".txt", ".gitattributes")
_SEND_BLOCK = 1 << 20


@dataclass
class Fault:
    """One injected fault. ``repo``/``file`` None match everything; ``times`` None means forever.

    Body faults (offsets are absolute byte positions in the file, whatever the Range):
    ``drop_at`` cuts the connection once the body reaches that offset (``reset=True``: TCP RST, which
    huggingface_hub does not retry; ``reset=False``: a clean close mid-body, which it retries inside
    one call); ``stall_at``/``stall_s`` pause the body there; ``corrupt_at`` flips the bytes at those
    offsets; ``body_size`` serves only that many bytes in total (a wrong size, with a matching
    Content-Length). ``advertised_size`` makes HEAD/tree/paths-info report that size instead.
    ``status`` answers HEAD and GET on the file with this HTTP status (e.g. 404, 500).
    ``ignore_range=True`` answers a GET with Range by 200 and the whole file (as some proxies do).
    """

    repo: str | None = None
    file: str | None = None
    drop_at: int | None = None
    reset: bool = True
    stall_at: int | None = None
    stall_s: float = 0.0
    corrupt_at: tuple[int, ...] = ()
    body_size: int | None = None
    advertised_size: int | None = None
    status: int | None = None
    ignore_range: bool | None = None
    times: int | None = 1
    hits: int = 0

    def matches(self, repo: str, file: str) -> bool:
        return (self.repo in (None, repo)) and (self.file in (None, file)) and (
            self.times is None or self.hits < self.times
        )


class Faults:
    """The server's fault table (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def find(self, repo: str, file: str, *, consume: bool, kind: str) -> Fault | None:
        """First live fault for this file that has ``kind`` set; counts a hit if ``consume``."""
        with self._lock:
            for f in self._faults:
                value = getattr(f, kind)
                if f.matches(repo, file) and value is not None and value != ():
                    if consume:
                        f.hits += 1
                    return f
        return None

    def advertised(self, repo: str, file: str) -> int | None:
        with self._lock:
            for f in self._faults:
                if f.advertised_size is not None and f.repo in (None, repo) and f.file in (None, file):
                    return f.advertised_size
        return None


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    range_start: int | None
    status: int
    sent: int  # body bytes written
    auth: bool  # an Authorization header came with it
    # time.monotonic() when the request arrived; a GET with a body is recorded when done, any other
    # answer just before it is sent (a client that got it always finds it)
    started: float = 0.0


@dataclass
class _File:
    path: Path
    size: int
    sha256: str
    git_oid: str
    lfs: bool


@dataclass
class _Repo:
    commits: dict[str, dict[str, _File]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    private: bool = False


def _hash_file(path: Path) -> tuple[str, str]:
    sha = hashlib.sha256()
    size = path.stat().st_size
    git = hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            sha.update(block)
            git.update(block)
    return sha.hexdigest(), git.hexdigest()


_HASH_CACHE: dict[tuple[str, int, int], tuple[str, str]] = {}


def _file_entry(name: str, path: Path) -> _File:
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASH_CACHE:
        _HASH_CACHE[key] = _hash_file(path)
    sha, git = _HASH_CACHE[key]
    return _File(path=path, size=st.st_size, sha256=sha, git_oid=git, lfs=not name.endswith(NON_LFS_SUFFIXES))


class HubServer:
    """A threaded hub on 127.0.0.1. ``repos`` maps repo id → {filename in repo: local Path}."""

    def __init__(
        self,
        repos: Mapping[str, Mapping[str, Path]] | None = None,
        *,
        gated: Iterable[str] = (),
        private: Iterable[str] = (),
        token: str = TOKEN,
        cdn_redirect: bool = True,
        rate_bps: float | None = None,
    ) -> None:
        self.token = token
        self.rate_bps = rate_bps  # pace every body at this many bytes/s per connection (a link's speed)
        self.cdn_redirect = cdn_redirect
        self.faults = Faults()
        self.requests: list[RequestRecord] = []
        self._busy = 0  # requests being answered (a body's record lands after its last byte)
        self._idle = threading.Condition()
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.Lock()
        gated, private = set(gated), set(private)
        for repo_id, files in (repos or {}).items():
            self.add_repo(repo_id, files, gated=repo_id in gated, private=repo_id in private)
        self._httpd = _QuietServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.hub = self  # type: ignore[attr-defined]
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    # -- content -------------------------------------------------------------------------------
    def add_repo(
        self, repo_id: str, files: Mapping[str, Path], *, gated: bool = False, private: bool = False
    ) -> str:
        """Create (or replace) a repo whose ``main`` is one commit with these files; returns the commit."""
        with self._lock:
            self._repos[repo_id] = _Repo(gated=gated, private=private)
        return self.push(repo_id, files)

    def push(self, repo_id: str, files: Mapping[str, Path], *, branch: str = "main") -> str:
        """Add a commit with exactly these files and move ``branch`` to it; returns the commit hash."""
        entries = {name: _file_entry(name, p) for name, p in files.items()}
        h = hashlib.sha1(repo_id.encode())
        for name in sorted(entries):
            h.update(f"{name}\0{entries[name].sha256}\0".encode())
        with self._lock:
            repo = self._repos[repo_id]
            h.update(str(len(repo.commits)).encode())
            commit = h.hexdigest()
            repo.commits[commit] = entries
            repo.refs[branch] = commit
        return commit

    def commit(self, repo_id: str, revision: str = "main") -> str:
        return self._repos[repo_id].refs[revision]

    def settle(self, timeout: float = 5.0) -> None:
        """Wait until no request is being answered: a client can hold a body's last byte before
        the server has appended that request's record. Call before inspecting `requests`."""
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, timeout)

    def sha256(self, repo_id: str, filename: str, revision: str = "main") -> str:
        return self._repos[repo_id].commits[self.commit(repo_id, revision)][filename].sha256

    def ranges(self, filename: str | None = None, method: str = "GET") -> list[int]:
        """Range starts (0 = whole file) of the body requests for ``filename``, in arrival order."""
        return [
            r.range_start or 0
            for r in sorted(self.requests, key=lambda r: r.started)
            if r.method == method
            and (r.path.startswith("/cdn/") or "/resolve/" in r.path)
            and (filename is None or unquote(r.path.split("?")[0]).endswith("/" + filename)
                 or f"file={quote(filename, safe='')}" in r.path)
        ]

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> HubServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="hubserver",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def patch_endpoint(self, monkeypatch) -> None:
        """Point huggingface_hub at this server for one test (env var and the import-time constants)."""
        from huggingface_hub import constants, hf_api

        monkeypatch.setenv("HF_ENDPOINT", self.url)
        monkeypatch.setattr(hf_api.api, "endpoint", self.url)
        monkeypatch.setattr(constants, "ENDPOINT", self.url)
        monkeypatch.setattr(
            constants, "HUGGINGFACE_CO_URL_TEMPLATE", self.url + "/{repo_id}/resolve/{revision}/{filename}"
        )

    @contextmanager
    def endpoint_patched(self) -> Iterator[HubServer]:
        """Same as ``patch_endpoint`` for scripts, restored on exit."""
        from huggingface_hub import constants, hf_api

        saved = (os.environ.get("HF_ENDPOINT"), constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE,
                 hf_api.api.endpoint)
        os.environ["HF_ENDPOINT"] = self.url
        hf_api.api.endpoint = self.url
        constants.ENDPOINT = self.url
        constants.HUGGINGFACE_CO_URL_TEMPLATE = self.url + "/{repo_id}/resolve/{revision}/{filename}"
        try:
            yield self
        finally:
            if saved[0] is None:
                os.environ.pop("HF_ENDPOINT", None)
            else:
                os.environ["HF_ENDPOINT"] = saved[0]
            constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE = saved[1], saved[2]
            hf_api.api.endpoint = saved[3]

    # -- lookups used by the handler -----------------------------------------------------------
    def _lookup(self, repo_id: str, revision: str) -> tuple[_Repo | None, str | None]:
        with self._lock:
            repo = self._repos.get(repo_id)
        if repo is None:
            return None, None
        revision = unquote(revision)
        commit = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        return repo, commit

    def _blob_by_sha(self, sha: str) -> _File | None:
        with self._lock:
            for repo in self._repos.values():
                for files in repo.commits.values():
                    for f in files.values():
                        if f.sha256 == sha:
                            return f
        return None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # dropped connections are the point
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hubserver/1"
    # headers and body go out in two writes: with Nagle on, the body waits for the client's delayed
    # ACK (40 ms on Linux) on every small JSON answer, a stall no real hub has
    disable_nagle_algorithm = True

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
        pass

    # -- plumbing ------------------------------------------------------------------------------
    def _record(self, status: int, sent: int = 0, range_start: int | None = None) -> None:
        self.hub.requests.append(RequestRecord(self.command, self.path, range_start, status, sent,
                                               "Authorization" in self.headers, self._started))

    def _error(self, status: int, code: str | None = None, message: str = "error", headers: dict | None = None):
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self._record(status)  # before the answer leaves: a client that got it finds the record
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self._record(200, len(body))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.hub.token}"

    def _access(self, repo: _Repo | None, *, download: bool) -> bool:
        """Send the hub's error and return False when the repo is missing or not accessible."""
        if repo is None or (repo.private and not self._authorized()):
            self._error(401 if repo is None else 404, "RepoNotFound", "Repository not found")
            return False
        if repo.gated and download and not self._authorized():
            self._error(401, "GatedRepo", "Access to this model is restricted. Please log in.")
            return False
        return True

    # -- routing -------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        with self.hub._idle:
            self.hub._busy += 1
        try:
            self._route_inner()
        finally:
            with self.hub._idle:
                self.hub._busy -= 1
                self.hub._idle.notify_all()

    def _route_inner(self) -> None:
        self._started = time.monotonic()
        try:
            path = urlsplit(self.path).path
            if path.startswith("/cdn/"):
                return self._cdn()
            if path.startswith("/api/models/"):
                return self._api(path[len("/api/models/"):])
            if "/resolve/" in path:
                return self._resolve(path)
            self._error(404, None, "Not found")
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    # -- /api/models/... -----------------------------------------------------------------------
    def _api(self, rest: str) -> None:
        query = parse_qs(urlsplit(self.path).query)
        parts = rest.split("/")
        repo_id = "/".join(parts[:2])
        tail = parts[2:]
        kind, revision, sub = "info", "main", ""
        if tail and tail[0] in ("revision", "tree", "paths-info") and len(tail) >= 2:
            kind, revision, sub = tail[0], tail[1], unquote("/".join(tail[2:]))
        elif tail:
            return self._error(404, None, "Not found")
        if self.command == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
        repo, commit = self.hub._lookup(repo_id, revision)
        if not self._access(repo, download=False):
            return None
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        files = repo.commits[commit]
        if kind in ("info", "revision"):
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for name, f in sorted(files.items()):
                s: dict = {"rfilename": name}
                if blobs:
                    s.update(size=self._size(repo_id, name, f), blobId=f.git_oid)
                    if f.lfs:
                        s["lfs"] = {"sha256": f.sha256, "size": self._size(repo_id, name, f), "pointerSize": 134}
                siblings.append(s)
            return self._json({
                "_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit, "private": repo.private,
                "gated": "manual" if repo.gated else False, "disabled": False, "downloads": 0, "likes": 0,
                "tags": ["gguf"], "siblings": siblings,
            })
        if kind == "tree":
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            prefix = sub.strip("/")
            entries, folders = [], set()
            for name, f in sorted(files.items()):
                if prefix and not name.startswith(prefix + "/"):
                    continue
                rel = name[len(prefix) + 1:] if prefix else name
                dirs = rel.split("/")[:-1]
                for i in range(len(dirs)):
                    if i == 0 or recursive:
                        folders.add("/".join(([prefix] if prefix else []) + dirs[: i + 1]))
                if recursive or not dirs:
                    entries.append(self._entry(repo_id, name, f))
            if prefix and not entries and not folders:
                return self._error(404, "EntryNotFound", f"{prefix} does not exist")
            dir_entries = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "path": d}
                           for d in sorted(folders)]
            return self._json(dir_entries + entries)
        # paths-info
        out = []
        for p in form.get("paths", []):
            p = p.strip("/")
            if p in files:
                out.append(self._entry(repo_id, p, files[p]))
            elif any(n.startswith(p + "/") for n in files):
                out.append({"type": "directory", "oid": hashlib.sha1(p.encode()).hexdigest(), "path": p})
        return self._json(out)

    def _size(self, repo_id: str, name: str, f: _File) -> int:
        adv = self.hub.faults.advertised(repo_id, name)
        return f.size if adv is None else adv

    def _entry(self, repo_id: str, name: str, f: _File) -> dict:
        size = self._size(repo_id, name, f)
        e: dict = {"type": "file", "oid": f.git_oid, "size": size, "path": name}
        if f.lfs:
            e["lfs"] = {"oid": f.sha256, "size": size, "pointerSize": 134}
        return e

    # -- /{repo}/resolve/{rev}/{file} ----------------------------------------------------------
    def _resolve(self, path: str) -> None:
        head, _, rest = path.partition("/resolve/")
        repo_id = head.strip("/")
        revision, _, filename = rest.partition("/")
        filename = unquote(filename)
        repo, commit = self.hub._lookup(repo_id, revision)
        if not self._access(repo, download=True):
            return None
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        fault = self.hub.faults.find(repo_id, filename, consume=True, kind="status")
        if fault is not None:
            return self._error(fault.status, None, f"injected {fault.status}",
                               headers={"X-Repo-Commit": commit})
        f = repo.commits[commit].get(filename)
        if f is None:
            return self._error(404, "EntryNotFound", f"{filename} does not exist",
                               headers={"X-Repo-Commit": commit})
        size = self._size(repo_id, filename, f)
        common = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if f.lfs:
            common.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(size), "ETag": f'"{f.git_oid}"'})
        else:
            common["ETag"] = f'"{f.git_oid}"'
        if f.lfs and self.hub.cdn_redirect:
            loc = (f"http://localhost:{self.hub.port}/cdn/{f.sha256}"
                   f"?repo={quote(repo_id, safe='')}&file={quote(filename, safe='')}")
            self.send_response(302)
            for k, v in common.items():
                self.send_header(k, v)
            self.send_header("Location", loc)
            self.send_header("Content-Length", "0")
            self._record(302)
            self.end_headers()
            return None
        self._body(repo_id, filename, f, common)

    def _cdn(self) -> None:
        parts = urlsplit(self.path)
        sha = parts.path[len("/cdn/"):]
        q = parse_qs(parts.query)
        repo_id, filename = q.get("repo", [""])[0], q.get("file", [""])[0]
        f = self.hub._blob_by_sha(sha)
        if f is None:
            return self._error(404, None, "NoSuchKey")
        fault = self.hub.faults.find(repo_id, filename, consume=True, kind="status")
        if fault is not None:
            return self._error(fault.status, None, f"injected {fault.status}")
        self._body(repo_id, filename, f, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"})

    def _body(self, repo_id: str, filename: str, f: _File, headers: dict[str, str]) -> None:
        faults = self.hub.faults
        body_fault = None
        if self.command == "GET":
            for kind in ("drop_at", "stall_at", "corrupt_at", "body_size"):
                body_fault = faults.find(repo_id, filename, consume=True, kind=kind)
                if body_fault is not None:
                    break
        total = f.size
        if body_fault is not None and body_fault.body_size is not None:
            total = body_fault.body_size
        start = 0
        rng = self.headers.get("Range")
        if rng and self.command == "GET" and faults.find(repo_id, filename, consume=True, kind="ignore_range"):
            rng = None
        if rng and rng.startswith("bytes="):
            a, _, b = rng[len("bytes="):].partition("-")
            start = int(a) if a else 0
            if start >= total:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{total}")
                self.send_header("Content-Length", "0")
                self._record(416, 0, start)
                self.end_headers()
                return None
        end = total  # exclusive
        if rng and rng.startswith("bytes="):
            b = rng[len("bytes="):].partition("-")[2]
            if b:
                end = min(int(b) + 1, total)
        status = 206 if rng else 200
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{total}")
        if self.command == "HEAD":
            self._record(status, 0, start if rng else None)
            self.end_headers()
            return None
        self.end_headers()
        sent = 0
        try:
            sent = self._send(f, start, end, body_fault)
        finally:
            self._record(status, sent, start if rng else None)

    def _send(self, f: _File, start: int, end: int, fault: Fault | None) -> int:
        """Write bytes [start, end) of the file, applying the fault; returns the bytes written."""
        self.wfile.flush()
        sock: socket.socket = self.connection
        cut = fault.drop_at if fault is not None and fault.drop_at is not None and fault.drop_at > start else None
        stall = fault.stall_at if fault is not None and fault.stall_at is not None and fault.stall_at >= start else None
        corrupt = sorted(fault.corrupt_at) if fault is not None else []
        with f.path.open("rb") as src:
            rate = self.hub.rate_bps
            if cut is None and stall is None and not corrupt and end <= f.size and not rate:
                return sock.sendfile(src, offset=start, count=end - start) if end > start else 0
            pos = start
            src.seek(start)
            t0 = time.monotonic()
            block = min(_SEND_BLOCK, max(int(rate / 100), 16 << 10)) if rate else _SEND_BLOCK
            while pos < end:
                if rate:
                    ahead = (pos - start) / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
                stop = min(end, pos + block)
                for mark in (cut, stall):
                    if mark is not None and pos < mark < stop:
                        stop = mark
                if pos == cut:
                    self._drop(fault.reset)
                    return pos - start
                if pos == stall:
                    time.sleep(fault.stall_s)
                    stall = None
                    continue
                data = bytearray(src.read(stop - pos))
                data += b"\0" * (stop - pos - len(data))  # body_size beyond the real file: pad
                for c in corrupt:
                    if pos <= c < stop:
                        data[c - pos] ^= 0xFF
                sock.sendall(data)
                pos = stop
            return pos - start

    def _drop(self, reset: bool) -> None:
        self.close_connection = True
        sock: socket.socket = self.connection
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        else:
            sock.shutdown(socket.SHUT_RDWR)


def write_blob(path: Path, size: int, seed: int = 0) -> Path:
    """A file of ``size`` pseudo-random bytes starting with the GGUF magic (for transfer tests)."""
    import random

    path.parent.mkdir(parents=True, exist_ok=True)
    data = bytearray(b"GGUF" + random.Random(seed).randbytes(max(size - 4, 0)))
    path.write_bytes(bytes(data[:size]))
    return path
