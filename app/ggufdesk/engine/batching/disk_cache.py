"""The disk prompt cache on llama.cpp: prompt states written to files, found again by later requests.

The files and their checks are core/prompt_cache.py's; engine/batching/prompt_states.py reads a
sequence's KV state (`llama_state_seq_get_data`, on the step loop's thread, a memory copy) and hands
it here, where a writer thread writes the file; an admitted request whose prompt starts with a saved
prefix gets it back before its prefill: also after a restart of the engine, the app or the server.
The key holds the model file's sha256 (remembered by path, size and mtime; a file not hashed before
is hashed once, on a thread if it is large, and the cache waits for it). Nothing here raises for the
disk's sake: a failed save loses that entry, a failed restore is a normal prefill.
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from pathlib import Path

import llama_cpp

from ggufdesk.core import prompt_cache as pc
from ggufdesk.engine.runtime.native import LoadedModel

log = logging.getLogger("ggufdesk.engine")

HASH_NOW_BYTES = 512 << 20  # a model file this small is hashed at load; a larger one on a thread
PENDING_SAVES = 2  # KV states waiting for the writer; more are dropped (the loop never waits)
CLOSE_TIMEOUT_S = 120.0


def yield_cpu() -> None:
    """This thread runs only where the decoding threads leave a core: a state written a moment later costs
    nothing, while a core taken from llama.cpp's threads (which wait for each other) slows the step of every
    stream. Measured (bench/prompt_memory.py --tokens 160, 2 cores, docs/bench/runs/2026-12-07): with a
    sliding-window model saving both at the prompt and at the answer's end, four clients' first turns ran
    4-5% slower than before with the writer at the same priority, level with the disk off, and 0.3-2% slower
    with it niced (in two rounds of three; the third met a slow spell of the machine). Only Linux gives a
    thread its own nice value (elsewhere a thread id passed as a process id could renice another process)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError:  # (a sandbox may refuse it: the writer runs as it did)
        pass


class DiskCache:
    """One loaded model's view of the prompt cache directory."""

    def __init__(self, lm: LoadedModel, store: pc.PromptStore, *, min_tokens: int, window: int = 0) -> None:
        self.lm, self.store, self.min_tokens, self.window = lm, store, min_tokens, window  # window: the model's n_swa
        self.model_path = os.path.abspath(lm.path)
        self.key: pc.CacheKey | None = None  # None until the model file's sha256 is known
        self._queue: queue.Queue[tuple[pc.CacheKey, list[int], bytearray] | None] = queue.Queue(PENDING_SAVES)
        self._writer = threading.Thread(target=self._write_loop, name="prompt-cache-writer", daemon=True)
        self._writer.start()
        self.saved = 0  # entries written, for the log and tests
        self._inflight: list[list[int]] = []  # tokens of the states handed to the writer, not yet written
        self._lock = threading.Lock()

    @classmethod
    def open(cls, lm: LoadedModel, root: Path | None = None, *, window: int = 0) -> DiskCache | None:
        """The cache for a loaded model (None when its size cap is 0: turned off)."""
        s = lm.settings
        if s.prompt_cache_bytes <= 0:
            return None
        cache = cls(lm, pc.PromptStore(root or pc.cache_dir(), max_bytes=s.prompt_cache_bytes),
                    min_tokens=s.prompt_cache_min_tokens, window=window)
        sha = pc.known_sha256(lm.path, cache.store.root)
        if sha is not None:
            cache._keyed(sha)
        elif os.path.getsize(lm.path) <= HASH_NOW_BYTES:
            cache._hash()
        else:
            threading.Thread(target=cache._hash, name="prompt-cache-hash", daemon=True).start()
        return cache

    def _hash(self) -> None:
        try:
            self._keyed(pc.model_sha256(self.lm.path, self.store.root))
        except OSError as e:
            log.warning("prompt cache off: could not read %s to hash it (%s)", self.lm.path, e)

    def _keyed(self, sha: str) -> None:
        s = self.lm.settings
        key = pc.CacheKey(model_sha256=sha, runtime=f"llama-cpp-python {llama_cpp.__version__}",
                          type_k=s.type_k, type_v=s.type_v, flash_attn=s.flash_attn,
                          n_ctx_class=pc.ctx_class(self.lm.n_ctx))
        gone = self.store.forget_model(self.model_path, sha)
        if gone:
            log.info("prompt cache: %d entries of an earlier %s deleted", gone, os.path.basename(self.lm.path))
        self.key = key

    # ---- reading ----------------------------------------------------------------------------------

    def best(self, prompt: list[int], *, limit: int, at_least: int) -> tuple[pc.Entry, int] | None:
        """The saved entry sharing the longest prefix with `prompt` (at most `limit` tokens count, at least
        `at_least` and min_tokens), and that length; None before the model file's hash is known."""
        if self.key is None:
            return None
        return self.store.best(self.key, prompt, limit=limit, at_least=max(self.min_tokens, at_least),
                               window=self.window)

    def load(self, entry: pc.Entry) -> bytearray | None:
        """The entry's checked KV state (None: a bad file, deleted)."""
        return None if self.key is None else self.store.load(entry, self.key)

    def refused(self, entry: pc.Entry) -> None:
        """llama.cpp refused the entry's state: never offered again."""
        log.warning("prompt cache: llama.cpp could not restore %s; deleted", entry.path.name)
        self.store.remove(entry)

    # ---- saving -----------------------------------------------------------------------------------

    def wants(self, tokens: list[int]) -> bool:
        """Whether a state of `tokens` should be written: long enough, the folder writable, and not
        already saved (all but fewer than min_tokens of it), nor waiting for the writer to save it."""
        key = self.key
        if key is None or self.store.read_only is not None or len(tokens) < self.min_tokens:
            return False
        at_least = len(tokens) - self.min_tokens + 1
        with self._lock:
            waiting = list(self._inflight)
        if any((n := pc.serves(t, tokens, limit=len(tokens), window=self.window)) is not None and n >= at_least
               for t in waiting):
            return False
        return self.store.best(key, tokens, limit=len(tokens), at_least=at_least, window=self.window) is None

    def put(self, tokens: list[int], data: bytearray) -> bool:
        """Hand a state to the writer thread; False when the writer is behind (the loop never waits)."""
        if self.key is None or len(data) > self.store.max_bytes:
            return False
        job = (self.key, list(tokens), data)
        with self._lock:
            self._inflight.append(job[1])
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self._written(job[1])
            log.info("prompt cache: the writer is behind; %d tokens not saved", len(tokens))
            return False
        return True

    def _write_loop(self) -> None:
        yield_cpu()
        while (job := self._queue.get()) is not None:
            key, tokens, data = job
            try:
                if self.store.save(key, tokens, data, model_path=self.model_path, window=self.window) is not None:
                    self.saved += 1
            except Exception:  # a bug here must not end the engine: the entry is lost
                log.exception("prompt cache: saving %d tokens failed", len(tokens))
            finally:
                self._written(tokens)

    def _written(self, tokens: list[int]) -> None:
        with self._lock:
            self._inflight = [t for t in self._inflight if t is not tokens]

    def close(self) -> None:
        """Finish the pending saves (a model is unloaded or the engine stops)."""
        self._queue.put(None)
        self._writer.join(CLOSE_TIMEOUT_S)
