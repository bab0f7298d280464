"""The disk prompt cache on llama.cpp: a finished sequence's KV saved, the longest saved prefix restored before prefill.

The files and their checks are core/prompt_cache.py's; here the KV state of one sequence is read
(`llama_state_seq_get_data`, on the step loop's thread, a memory copy) and handed to a writer
thread that writes the file, and an admitted request whose prompt starts with a saved prefix gets
it back (`llama_state_seq_set_data`) before its prefill: also after a restart of the engine, the
app or the server. The key holds the model file's sha256 (remembered by path, size and mtime; a
file not hashed before is hashed once, on a thread if it is large, and the cache waits for it).
Nothing here raises for the disk's sake: a failed save loses that entry, a failed restore is a
normal prefill.

When: a model without a sliding window saves a sequence when it finishes (its prompt and answer: a
conversation's next turn after a restart finds both); a model with one (Gemma 3) saves the prompt as
soon as it is prefilled, because llama.cpp keeps the window's layers only for a sequence's last
n_swa positions: a later prompt can then start from the saved state only where it ends (or one token
before), never after cutting the answer off again (engine/batching/prefix_cache.py).
"""
from __future__ import annotations

import ctypes
import logging
import os
import queue
import threading
from pathlib import Path

import llama_cpp

from ggufdesk.core import prompt_cache as pc
from ggufdesk.engine.batching.prefix_cache import Slot, Slots
from ggufdesk.engine.runtime.native import LoadedModel

log = logging.getLogger("ggufdesk.engine")

# Restoring a file costs a read of every saved position; a handful of tokens more than the memory
# cache already holds are cheaper to prefill (on the starter a restored token costs a few % of a
# prefilled one: bench/context.py), so the disk must bring at least this many more.
MIN_GAIN = 64
HASH_NOW_BYTES = 512 << 20  # a model file this small is hashed at load; a larger one on a thread
PENDING_SAVES = 2  # KV states waiting for the writer; more are dropped (the loop never waits)
CLOSE_TIMEOUT_S = 120.0


class DiskCache:
    """One loaded model's view of the prompt cache directory."""

    def __init__(self, lm: LoadedModel, store: pc.PromptStore, *, min_tokens: int) -> None:
        self.lm, self.store, self.min_tokens = lm, store, min_tokens
        self.model_path = os.path.abspath(lm.path)
        self.key: pc.CacheKey | None = None  # None until the model file's sha256 is known
        self._queue: queue.Queue[tuple[pc.CacheKey, list[int], bytearray] | None] = queue.Queue(PENDING_SAVES)
        self._writer = threading.Thread(target=self._write_loop, name="prompt-cache-writer", daemon=True)
        self._writer.start()
        self.saved = self.restored = 0  # entries, for the log and tests
        self.swa = bool(llama_cpp.llama_model_n_swa(lm.model.model))  # saved when prefilled, not at the end

    @classmethod
    def open(cls, lm: LoadedModel, root: Path | None = None) -> DiskCache | None:
        """The cache for a loaded model (None when its size cap is 0: turned off)."""
        s = lm.settings
        if s.prompt_cache_bytes <= 0:
            return None
        cache = cls(lm, pc.PromptStore(root or pc.cache_dir(), max_bytes=s.prompt_cache_bytes),
                    min_tokens=s.prompt_cache_min_tokens)
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

    # ---- restore ----------------------------------------------------------------------------------

    def restore(self, slots: Slots, slot: Slot, prompt: list[int]) -> int:
        """Put the longest saved prefix of `prompt` into `slot` when it beats what the slot holds
        (by MIN_GAIN); prompt tokens restored (0: the slot is as it was, or emptied when llama.cpp
        refused the state). Afterwards `slot.tokens` is a prefix of `prompt` either way."""
        key, have = self.key, len(slot.tokens)
        if key is None:
            return 0
        hit = self.store.best(key, prompt, limit=len(prompt) - 1, at_least=max(self.min_tokens, have + MIN_GAIN))
        if hit is None:
            return 0
        entry, n = hit
        if entry.n_tokens >= self.lm.n_ctx or not slots.room_for(slot, entry.n_tokens):
            return 0
        data = self.store.load(entry, key)
        if data is None:
            return 0
        slots.clear(slot)
        slots.evict(entry.n_tokens)
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        got = llama_cpp.llama_state_seq_set_data(self.lm.ctx.ctx, buf, len(data), slot.seq)
        del buf
        if got == 0:  # llama.cpp refused it (and emptied the sequence): never offered again
            slots.mem.seq_rm(slot.seq, -1, -1)
            log.warning("prompt cache: llama.cpp could not restore %s; deleted", entry.path.name)
            self.store.remove(entry)
            return 0
        slots.extend(slot, entry.tokens)
        if not slots.window_holds(slot, n):  # its sliding-window layers end too far after n
            slots.clear(slot)
            return 0
        slots.truncate(slot, n)
        self.restored += 1
        return n

    # ---- save -------------------------------------------------------------------------------------

    def prefilled(self, slot: Slot) -> bool:
        """A prompt was prefilled into `slot`: saved now for a sliding-window model."""
        return self.save(slot) if self.swa else False

    def finished(self, slot: Slot) -> bool:
        """A sequence ended: what `slot` holds is saved, unless the model has a sliding window."""
        return False if self.swa else self.save(slot)

    def save(self, slot: Slot) -> bool:
        """Queue the KV of what `slot` holds for the disk, unless it is short, already saved (all but
        fewer than min_tokens of it), or the writer is behind. On the loop's thread: a memory copy."""
        key, tokens = self.key, list(slot.reusable)
        if key is None or self.store.read_only is not None or len(tokens) < self.min_tokens:
            return False
        if min(tokens) < 0:  # an image's placeholders (engine/batching/media.py): the projector is not in the key
            return False
        if len(tokens) != len(slot.tokens) or len(tokens) >= self.lm.n_ctx:
            return False  # (a shifted sequence is cut back to its exact part before it is saved)
        if self.store.best(key, tokens, limit=len(tokens), at_least=len(tokens) - self.min_tokens + 1):
            return False
        ctx = self.lm.ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, slot.seq)
        if size <= 0 or size > self.store.max_bytes:
            return False
        data = bytearray(size)
        buf = (ctypes.c_uint8 * size).from_buffer(data)
        n = llama_cpp.llama_state_seq_get_data(ctx, buf, size, slot.seq)
        del buf
        if n <= 0:
            return False
        try:
            self._queue.put_nowait((key, tokens, data if n == size else data[:n]))
        except queue.Full:
            log.info("prompt cache: the writer is behind; %d tokens not saved", len(tokens))
            return False
        return True

    def _write_loop(self) -> None:
        while (job := self._queue.get()) is not None:
            key, tokens, data = job
            try:
                if self.store.save(key, tokens, data, model_path=self.model_path) is not None:
                    self.saved += 1
            except Exception:  # a bug here must not end the engine: the entry is lost
                log.exception("prompt cache: saving %d tokens failed", len(tokens))

    def close(self) -> None:
        """Finish the pending saves (a model is unloaded or the engine stops)."""
        self._queue.put(None)
        self._writer.join(CLOSE_TIMEOUT_S)
