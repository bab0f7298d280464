"""The disk prompt cache's files: KV snapshots of prompt prefixes, keyed, validated, capped (LRU), written atomically.

One file per entry, `<key>-<tokens>.kv`, in the cache directory (platformdirs' user cache dir, or
$GGUFDESK_PROMPT_CACHE):

    MAGIC (8 bytes) | header length (u32 LE) | header (JSON) | token ids (int32 LE) | KV state

The header names the key (model file sha256 + everything that changes the KV bytes: llama.cpp's
build, KV types, flash attention, the context's size class), the token count and their sha256, and
the state's length and CRC-32. An entry is used only when all of them check out; a file that does
not (truncated, overwritten, from another build) is deleted and never crashes anything. Files are
written to a temporary name and renamed, so a crash or a full disk leaves no half entry under a
real name. The least recently used entries (file mtime, touched on every restore) go first when the
directory outgrows its cap. Several processes (the window's engine, a server's) share the directory
safely: every file is written whole and entries are found by listing it. The llama.cpp side lives
in engine/batching/disk_cache.py; `ggufdesk cache` lists and clears.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import struct
import sys
import threading
import time
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ggufdesk.core.atomic import locked, write_atomic

log = logging.getLogger("ggufdesk.prompt_cache")

MAGIC = b"GGDKVC1\n"
FORMAT = 1
SUFFIX = ".kv"
HASHES = "model-hashes.json"
MAX_HEADER = 1 << 16
FREE_MARGIN = 64 << 20  # a save never leaves less than this free on the disk
HASH_CHUNK = 1 << 20


class CorruptEntry(ValueError):
    """A cache file that is not what its name and header promise."""


def cache_dir() -> Path:
    """Where entries live: $GGUFDESK_PROMPT_CACHE, else platformdirs' user cache dir."""
    env = os.environ.get("GGUFDESK_PROMPT_CACHE")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ggufdesk")) / "prompt-cache"


def token_bytes(tokens: list[int]) -> bytes:
    a = array("i", tokens)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def tokens_of(data: bytes) -> list[int]:
    a = array("i")
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()


def tokens_sha256(tokens: list[int]) -> str:
    return hashlib.sha256(token_bytes(tokens)).hexdigest()


# Below this many tokens the search for the first difference compares one token at a time.
LINEAR_BELOW = 32


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share (the engine's prefix cache and the draft model use it too).

    Compared a block at a time (list slices compare in C), doubling the blocks, then bisecting the
    block where they differ: a draft model syncs its context with the request's every step, and a
    Python loop over a 16k-token context took 0.55 ms (4k: 0.14 ms) on the 2-core CPU;
    bench/bookkeeping.py --contexts times both."""
    if type(a) is not list or type(b) is not list:
        a, b = list(a), list(b)  # (slices of a list and a tuple never compare equal)
    n = min(len(a), len(b))
    lo, step = 0, LINEAR_BELOW
    while lo < n:  # a[:lo] == b[:lo]
        hi = min(n, lo + step)
        if a[lo:hi] != b[lo:hi]:
            break
        lo, step = hi, 2 * step
    else:
        return n
    while hi - lo > LINEAR_BELOW:  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


def ctx_class(n_ctx: int) -> int:
    """The context length rounded up to a power of two: contexts of one class share entries."""
    return 1 << max(0, int(n_ctx) - 1).bit_length()


@dataclass(frozen=True)
class CacheKey:
    """Everything that decides the KV bytes of a token prefix; entries of another key are never used."""

    model_sha256: str
    runtime: str  # the llama.cpp build (llama-cpp-python's version): the state format is its own
    type_k: str
    type_v: str
    flash_attn: str
    n_ctx_class: int
    rope: str = ""  # RoPE overrides ("" = the model's own; there are none to set yet)
    lora: tuple[str, ...] = ()  # sha256 of each adapter ("" = none; there are none to load yet)

    @property
    def digest(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass
class Entry:
    """One saved prefix, as its header says (checked in full only when its state is read)."""

    path: Path
    key: str
    n_tokens: int
    tokens: list[int]
    tokens_sha256: str
    payload_offset: int
    payload_bytes: int
    payload_crc32: int
    size: int  # file bytes
    used: float  # mtime: when it was saved or last restored
    model_path: str = ""
    model_sha256: str = ""
    fields: dict[str, Any] = field(default_factory=dict)  # the CacheKey's fields, for `ggufdesk cache`


# ---- the file format --------------------------------------------------------------------------------


def _header(key: CacheKey, model_path: str, tokens: list[int], payload_bytes: int, crc: int) -> bytes:
    head = {"format": FORMAT, "key": key.digest, "fields": dataclasses.asdict(key), "model_path": model_path,
            "model_sha256": key.model_sha256, "n_tokens": len(tokens), "tokens_sha256": tokens_sha256(tokens),
            "payload_bytes": payload_bytes, "payload_crc32": crc, "created": time.time()}
    raw = json.dumps(head, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw


def read_entry(path: Path) -> Entry:
    """The header and tokens of one file (its size checked too); raises CorruptEntry or OSError."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        lead = f.read(len(MAGIC) + 4)
        if len(lead) < len(MAGIC) + 4 or lead[:len(MAGIC)] != MAGIC:
            raise CorruptEntry("not a prompt cache file")
        (n,) = struct.unpack("<I", lead[len(MAGIC):])
        if n > MAX_HEADER:
            raise CorruptEntry("header too long")
        try:
            head = json.loads(f.read(n))
            n_tokens, payload = int(head["n_tokens"]), int(head["payload_bytes"])
            if head.get("format") != FORMAT or n_tokens <= 0 or payload <= 0:
                raise ValueError("bad header")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise CorruptEntry(f"unreadable header ({e})") from None
        raw = f.read(4 * n_tokens)
    tokens = tokens_of(raw) if len(raw) == 4 * n_tokens else []
    offset = len(MAGIC) + 4 + n + 4 * n_tokens
    if len(tokens) != n_tokens or tokens_sha256(tokens) != head.get("tokens_sha256"):
        raise CorruptEntry("its tokens do not match their hash")
    if st.st_size != offset + payload:
        raise CorruptEntry(f"{st.st_size} bytes where {offset + payload} were written")
    return Entry(path=path, key=str(head.get("key", "")), n_tokens=n_tokens, tokens=tokens,
                 tokens_sha256=str(head["tokens_sha256"]), payload_offset=offset, payload_bytes=payload,
                 payload_crc32=int(head.get("payload_crc32", -1)), size=st.st_size, used=st.st_mtime,
                 model_path=str(head.get("model_path", "")), model_sha256=str(head.get("model_sha256", "")),
                 fields=dict(head.get("fields") or {}))


def read_payload(entry: Entry) -> bytearray:
    """The entry's KV state, checked against its length and CRC-32; raises CorruptEntry or OSError.
    (A bytearray: llama.cpp reads it in place, without another copy of a state that may be 100s of MB.)"""
    data = bytearray(entry.payload_bytes)
    with open(entry.path, "rb") as f:
        if os.fstat(f.fileno()).st_size != entry.size:
            raise CorruptEntry("the file changed since it was listed")
        f.seek(entry.payload_offset)
        got = f.readinto(data)
    if got != entry.payload_bytes:
        raise CorruptEntry("truncated")
    if zlib.crc32(data) != entry.payload_crc32:
        raise CorruptEntry("its KV state does not match its checksum")
    return data


# ---- the model file's hash ----------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def known_sha256(model: str, root: Path) -> str | None:
    """The model file's sha256 if it was hashed before at this size and mtime (no hashing)."""
    try:
        st = os.stat(model)
    except OSError:
        return None
    rec = _read_json(root / HASHES).get(os.path.abspath(model))
    if isinstance(rec, dict) and rec.get("size") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns:
        sha = rec.get("sha256")
        return sha if isinstance(sha, str) else None
    return None


def model_sha256(model: str, root: Path) -> str:
    """The model file's sha256, remembered by path + size + mtime so a 4 GB file is read once, not
    per request or per start. Raises OSError if the model cannot be read."""
    sha = known_sha256(model, root)
    if sha is not None:
        return sha
    st = os.stat(model)
    h = hashlib.sha256()
    with open(model, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    sha = h.hexdigest()
    try:
        with locked(root / HASHES):  # the window's engine and a server's share the file
            hashes = _read_json(root / HASHES)
            hashes[os.path.abspath(model)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
            write_atomic(root / HASHES, json.dumps(hashes, indent=1, sort_keys=True))
    except (OSError, TimeoutError) as e:  # a read-only cache directory: hashed again next time
        log.info("could not remember the model's hash in %s: %s", root, e)
    return sha


# ---- the store --------------------------------------------------------------------------------------


def serves(saved: list[int], prompt: list[int], *, limit: int, window: int = 0) -> int | None:
    """How many tokens of `prompt` a state of `saved` gives back (at most `limit`); None where it would be
    cut back too far: with a sliding `window`, a state longer than the window serves only where it ends
    (or one token before), as its window layers hold only its last positions (engine/batching/prefix_cache.py)."""
    n = min(common_prefix(saved, prompt), limit)
    return None if window and len(saved) > window and n < len(saved) - 1 else n


class Saved(Protocol):
    tokens: list[int]
    n_tokens: int


S = TypeVar("S", bound=Saved)


def longest(entries: Iterable[S], prompt: list[int], *, limit: int, at_least: int,
            window: int = 0) -> tuple[S, int] | None:
    """The entry that gives back the most of `prompt` (`serves`, at least `at_least`), and that length;
    at a tie the shorter entry (less to read back). Both tiers' lookup (this store, the engine's RAM)."""
    best: tuple[S, int] | None = None
    for e in entries:
        n = serves(e.tokens, prompt, limit=limit, window=window)
        if n is None or n < at_least:
            continue
        if best is None or n > best[1] or (n == best[1] and e.n_tokens < best[0].n_tokens):
            best = (e, n)
    return best


def supersedes(new: list[int], old: list[int], window: int = 0) -> bool:
    """Whether a state of `new` serves every prefix a state of `old` serves: it starts with old's tokens
    and, with a sliding `window`, is no longer than the window (see `serves`)."""
    return len(old) <= len(new) and new[:len(old)] == old and (not window or len(new) <= window)


class PromptStore:
    """The entries of one cache directory: find the longest saved prefix, read, save, evict.

    Every method is safe to call from the engine's main thread and its writer thread at once, and
    none raises for the disk's sake: an unreadable file is dropped, a failed write is logged.
    """

    def __init__(self, root: Path, *, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.read_only: str | None = None  # why nothing can be saved here (said once in the log)
        self._lock = threading.RLock()
        self._index: dict[str, tuple[int, int, Entry | None]] = {}  # name -> (mtime_ns, size, entry)

    # ---- listing --------------------------------------------------------------------------------

    def entries(self, key: str | None = None) -> list[Entry]:
        """Every readable entry (of one key); files that are not entries are deleted."""
        with self._lock:
            try:
                found = [d for d in os.scandir(self.root) if d.name.endswith(SUFFIX) and d.is_file()]
            except OSError:
                return []
            names = {d.name for d in found}
            for stale in set(self._index) - names:
                del self._index[stale]
            out = []
            for d in found:
                if key is not None and not d.name.startswith(key + "-"):
                    continue
                entry = self._entry(d)
                if entry is not None:
                    out.append(entry)
            return out

    def _entry(self, d: os.DirEntry[str]) -> Entry | None:
        try:
            st = d.stat()
        except OSError:
            return None
        seen = self._index.get(d.name)
        if seen is not None and seen[0] == st.st_mtime_ns and seen[1] == st.st_size:
            if seen[2] is not None:
                seen[2].used = st.st_mtime
            return seen[2]
        try:
            entry: Entry | None = read_entry(Path(d.path))
        except (CorruptEntry, OSError) as e:
            self._discard(Path(d.path), f"{e}")
            entry = None
        if entry is not None and not d.name.startswith(entry.key + "-"):
            self._discard(Path(d.path), "its name does not match its key")
            entry = None
        self._index[d.name] = (st.st_mtime_ns, st.st_size, entry)
        return entry

    def best(self, key: CacheKey, prompt: list[int], *, limit: int, at_least: int,
             window: int = 0) -> tuple[Entry, int] | None:
        """The entry sharing the longest prefix with `prompt` (at most `limit` tokens count, at least
        `at_least`), and that length; entries longer than `limit` + what they share are still usable
        (the rest is cut after restoring), but for a model with a sliding `window` one longer than the
        window only where it ends (or one token before): cut further back its window layers hold too
        little (engine/batching/prefix_cache.py)."""
        return longest(self.entries(key.digest), prompt, limit=limit, at_least=at_least, window=window)

    # ---- reading --------------------------------------------------------------------------------

    def load(self, entry: Entry, key: CacheKey) -> bytearray | None:
        """The entry's checked KV state, or None (a bad file is deleted and the reason logged)."""
        if entry.key != key.digest or entry.model_sha256 != key.model_sha256:
            self._discard(entry.path, "its key does not match the loaded model and settings")
            return None
        try:
            data = read_payload(entry)
        except FileNotFoundError:
            return None  # another process evicted it meanwhile
        except (CorruptEntry, OSError) as e:
            self._discard(entry.path, str(e))
            return None
        self.touch(entry)
        return data

    def touch(self, entry: Entry) -> None:
        """Mark the entry as just used (least recently used entries are evicted first)."""
        try:
            os.utime(entry.path)
        except OSError:
            pass

    # ---- writing --------------------------------------------------------------------------------

    def save(self, key: CacheKey, tokens: list[int], payload: bytes | bytearray | memoryview, *,
             model_path: str = "", window: int = 0) -> Entry | None:
        """Write a new entry (atomically), then drop the entries it supersedes (its prefixes; with a
        sliding `window`, only when it is no longer than the window, as only then does it serve them:
        see best) and evict down to the cap. None when it was not written: no room under the cap or on
        the disk, a read-only or missing directory, a full disk (each logged, none raised)."""
        if self.read_only is not None or not tokens:
            return None
        crc = zlib.crc32(payload)
        head = _header(key, model_path, tokens, len(payload), crc)
        size = len(head) + 4 * len(tokens) + len(payload)
        if size > self.max_bytes:
            return None
        path = self.root / f"{key.digest}-{tokens_sha256(tokens)[:24]}{SUFFIX}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if shutil.disk_usage(self.root).free < size + FREE_MARGIN:
                log.warning("prompt cache: not saving %d tokens (%d MB): the disk is nearly full",
                            len(tokens), size >> 20)
                return None
            write_atomic(path, [head, token_bytes(tokens), payload])
        except PermissionError as e:
            self._read_only(str(e))
            return None
        except OSError as e:
            if e.errno == 30:  # EROFS
                self._read_only(str(e))
            else:  # ENOSPC, EDQUOT, EIO...: this entry is lost, the cache goes on
                log.warning("prompt cache: could not save %d tokens: %s", len(tokens), e)
            return None
        with self._lock:
            self._index.pop(path.name, None)
            for old in self.entries(key.digest):  # a longer entry of the same line replaces its prefixes
                if old.path != path and supersedes(tokens, old.tokens, window):
                    self.remove(old)
            self.evict()
            try:
                entry = read_entry(path)
            except (CorruptEntry, OSError):
                return None
        return entry

    def _read_only(self, why: str) -> None:
        if self.read_only is None:
            log.warning("prompt cache: %s cannot be written (%s); prompts are not saved", self.root, why)
        self.read_only = why

    def evict(self) -> int:
        """Delete the least recently used entries until the directory fits its cap; bytes freed."""
        with self._lock:
            entries = sorted(self.entries(), key=lambda e: e.used)
            total = sum(e.size for e in entries)
            freed = 0
            for e in entries:
                if total <= self.max_bytes:
                    break
                if self.remove(e):
                    total -= e.size
                    freed += e.size
            return freed

    def remove(self, entry: Entry) -> bool:
        with self._lock:
            self._index.pop(entry.path.name, None)
            try:
                entry.path.unlink()
            except FileNotFoundError:
                return True
            except OSError:
                return False
            return True

    def forget_model(self, model_path: str, sha256: str) -> int:
        """Delete entries saved for `model_path` when it held another file (other sha256); count."""
        path = os.path.abspath(model_path)
        gone = [e for e in self.entries() if e.model_path == path and e.model_sha256 != sha256]
        return sum(self.remove(e) for e in gone)

    def clear(self) -> tuple[int, int]:
        """Delete every entry; (files, bytes) removed."""
        files = size = 0
        for e in self.entries():
            if self.remove(e):
                files, size = files + 1, size + e.size
        return files, size

    def _discard(self, path: Path, why: str) -> None:
        log.warning("prompt cache: %s is not used (%s); deleted", path.name, why)
        try:
            path.unlink()
        except OSError:
            pass

    # ---- facts ----------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """What `ggufdesk cache --json` prints."""
        entries = sorted(self.entries(), key=lambda e: e.used, reverse=True)
        return {
            "dir": str(self.root), "bytes": sum(e.size for e in entries), "max_bytes": self.max_bytes,
            "entries": [{"file": e.path.name, "model": e.model_path, "model_sha256": e.model_sha256,
                         "tokens": e.n_tokens, "bytes": e.size, "bytes_per_token": round(e.payload_bytes / e.n_tokens),
                         "last_used": e.used, "type_k": e.fields.get("type_k"), "type_v": e.fields.get("type_v"),
                         "flash_attn": e.fields.get("flash_attn"), "n_ctx_class": e.fields.get("n_ctx_class")}
                        for e in entries],
        }
