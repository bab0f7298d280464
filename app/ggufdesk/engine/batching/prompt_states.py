"""Prompt states kept beyond the slots, in RAM (this process) and on disk (also across restarts).

A state is what `llama_state_seq_get_data` gives for one sequence: its KV for the tokens it holds.
One copy of it goes to both places (engine/batching/ram_cache.py keeps recent ones in memory under a
byte cap; engine/batching/disk_cache.py writes those of `prompt_cache_min_tokens` or more to files),
and an admitted request whose prompt starts with a saved prefix longer than what its slot holds gets
it back (`llama_state_seq_set_data`) before its prefill: from RAM, unless the disk has a prefix longer
by MIN_GAIN. A state llama.cpp refuses is dropped and the request prefills as usual.

When: every model saves a sequence when it finishes (its prompt and answer: a conversation's or an
agent's next turn finds both); a model with a sliding window (Gemma 3) saves the prompt as soon as it
is prefilled too, because llama.cpp keeps the window's layers only for a sequence's last n_swa
positions: a state longer than the window serves a later prompt only where it ends (or one token
before), so the answer cannot be cut off it again for the same prompt asked anew
(engine/batching/prefix_cache.py); each tier offers such a state only there. Either is queued in the
step and saved at its end, after the step's tokens and Done went out (`save_pending`).
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import llama_cpp

from ggufdesk.engine.batching.disk_cache import DiskCache
from ggufdesk.engine.batching.prefix_cache import Slot, Slots
from ggufdesk.engine.batching.ram_cache import RamCache
from ggufdesk.engine.runtime.native import LoadedModel

log = logging.getLogger("ggufdesk.engine")

# Restoring copies every saved position back (from a file: reads it too); a handful of tokens more than
# the slot already holds are cheaper to prefill (on the starter a token restored from disk costs a few %
# of a prefilled one, bench/context.py), so a state must bring at least this many more. A prompt shorter
# than this is never kept: it could never bring that much.
MIN_GAIN = 64


class PromptStates:
    """One loaded model's saved prompt states: a RAM tier, a disk tier, either may be off."""

    def __init__(self, lm: LoadedModel, *, ram: RamCache | None, disk: DiskCache | None, window: int) -> None:
        self.lm, self.ram, self.disk = lm, ram, disk
        self.swa = window > 0  # a sliding-window model's state is saved when prefilled too
        self.restored = {"ram": 0, "disk": 0}  # restores by tier (tests read them)
        self.pending: list[Slot] = []  # slots to save once the step's events went out (save_pending)

    @classmethod
    def open(cls, lm: LoadedModel, root: Path | None = None) -> PromptStates | None:
        """Both tiers as the settings ask (a cap of 0 turns one off); None when both are off. A disk
        folder that cannot be used leaves the RAM tier."""
        s, window = lm.settings, int(llama_cpp.llama_model_n_swa(lm.model.model))
        ram = RamCache(s.prompt_cache_ram_bytes, window=window) if s.prompt_cache_ram_bytes > 0 else None
        try:
            disk = DiskCache.open(lm, root, window=window)
        except OSError as e:
            log.warning("prompt cache on disk off: %s", e)
            disk = None
        return None if ram is None and disk is None else cls(lm, ram=ram, disk=disk, window=window)

    def held(self) -> list[list[int]]:
        """The token prefixes saved (rolling overflow keeps cutting where a cache holds a prefix)."""
        held = [e.tokens for e in self.ram.entries] if self.ram is not None else []
        d = self.disk
        if d is not None and d.key is not None:
            held += [e.tokens for e in d.store.entries(d.key.digest)]
        return held

    # ---- restore ----------------------------------------------------------------------------------

    def restore(self, slots: Slots, slot: Slot, prompt: list[int]) -> tuple[int, str]:
        """Put the longest saved prefix of `prompt` into `slot` when it beats what the slot holds by
        MIN_GAIN; returns (prompt tokens restored, "ram" or "disk"), (0, "") when the slot is as it was
        or emptied (llama.cpp refused the state). Afterwards `slot.tokens` is a prefix of `prompt`."""
        ram, disk, limit = self.ram, self.disk, len(prompt) - 1
        hit = ram.best(prompt, limit=limit, at_least=len(slot.tokens) + MIN_GAIN) if ram is not None else None
        far = None if disk is None else \
            disk.best(prompt, limit=limit, at_least=(len(slot.tokens) if hit is None else hit[1]) + MIN_GAIN)
        if disk is not None and far is not None and self._fits(slots, slot, far[0].n_tokens) \
                and (data := disk.load(far[0])) is not None:
            got = self._apply(slots, slot, far[0].tokens, data, far[1])
            if got:
                return self._done(got, "disk")
            if got is None:
                disk.refused(far[0])  # (the slot is empty now: the memory's prefix gains more still)
        if ram is not None and hit is not None and self._fits(slots, slot, hit[0].n_tokens):
            got = self._apply(slots, slot, hit[0].tokens, hit[0].data, hit[1])
            if got:
                ram.touch(hit[0])
                return self._done(got, "ram")
            if got is None:
                log.warning("prompt cache: llama.cpp could not restore a state kept in memory; dropped")
                ram.remove(hit[0])
        return 0, ""

    def _done(self, n: int, tier: str) -> tuple[int, str]:
        self.restored[tier] += 1
        return n, tier

    def _fits(self, slots: Slots, slot: Slot, n_tokens: int) -> bool:
        return n_tokens < self.lm.n_ctx and slots.room_for(slot, n_tokens)

    def _apply(self, slots: Slots, slot: Slot, tokens: list[int], data: bytearray, n: int) -> int | None:
        """The state of `tokens` into `slot`, cut back to n positions: n, 0 when its sliding-window
        layers do not hold what follows n (the slot is emptied), None when llama.cpp refused it."""
        slots.clear(slot)
        slots.evict(len(tokens))
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        got = llama_cpp.llama_state_seq_set_data(self.lm.ctx.ctx, buf, len(data), slot.seq)
        del buf
        if got == 0:  # (llama.cpp emptied the sequence)
            slots.mem.seq_rm(slot.seq, -1, -1)
            return None
        slots.extend(slot, tokens)
        if not slots.window_holds(slot, n):  # its sliding-window layers end too far after n
            slots.clear(slot)
            return 0
        slots.truncate(slot, n)
        return n

    # ---- save -------------------------------------------------------------------------------------

    def prefilled(self, slot: Slot) -> None:
        """A prompt was prefilled into `slot`: to be saved for a sliding-window model."""
        if self.swa:
            self._queue(slot)

    def finished(self, slot: Slot) -> None:
        """A sequence ended: what `slot` holds (prompt and answer) is to be saved."""
        self._queue(slot)

    def _queue(self, slot: Slot) -> None:
        if all(s is not slot for s in self.pending):
            self.pending.append(slot)

    def save_pending(self) -> int:
        """Save the slots queued in this step; called between steps, after the step's tokens went out:
        a big model's state is hundreds of MB to copy, which a first token (a sliding-window model saves
        at the end of the prompt) or a Done (the others save at the end) must not wait for. Between
        steps a slot's tokens and its KV agree, and its next request is not admitted yet."""
        slots, self.pending = self.pending, []
        return sum(self.save(s) for s in slots)

    def save(self, slot: Slot) -> bool:
        """Keep the KV of what `slot` holds, in RAM and (when long enough) on disk, unless it is short or
        already kept. On the loop's thread: one memory copy, shared by both tiers."""
        tokens = list(slot.reusable)
        if len(tokens) < MIN_GAIN or len(tokens) != len(slot.tokens) or len(tokens) >= self.lm.n_ctx:
            return False  # (a shifted sequence is cut back to its exact part before it is saved)
        if min(tokens) < 0:  # an image's placeholders (engine/batching/media.py): the projector is not in the key
            return False
        ram, disk = self._tiers_for(tokens)
        if ram is None and disk is None:
            return False
        data = self._read(slot, max(0 if ram is None else ram.max_bytes, 0 if disk is None else disk.store.max_bytes))
        if data is None:
            return False
        kept = ram is not None and ram.put(tokens, data)
        written = disk is not None and disk.put(tokens, data)
        return kept or written

    def _tiers_for(self, tokens: list[int]) -> tuple[RamCache | None, DiskCache | None]:
        """The tiers that want a state of `tokens` (not holding it already; the disk: long enough)."""
        ram = self.ram if self.ram is not None and not self.ram.holds(tokens, within=MIN_GAIN) else None
        return ram, self.disk if self.disk is not None and self.disk.wants(tokens) else None

    def _read(self, slot: Slot, cap: int) -> bytearray | None:
        """The slot's KV state (None: larger than `cap`, or no memory for the copy: nothing is kept, the
        request goes on)."""
        ctx = self.lm.ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, slot.seq)
        if size <= 0 or size > cap:
            return None
        try:
            data = bytearray(size)
        except MemoryError:  # (the memory ceiling, engine/runtime/memlimit.py): a cache is not worth a request
            log.warning("prompt cache: no memory for a %d MiB prompt state; not kept", size >> 20)
            return None
        buf = (ctypes.c_uint8 * size).from_buffer(data)
        n = llama_cpp.llama_state_seq_get_data(ctx, buf, size, slot.seq)
        del buf
        if n <= 0:
            return None
        return data if n == size else data[:n]

    def close(self) -> None:
        """Finish the pending disk saves and let the RAM go (a model is unloaded or the engine stops)."""
        if self.disk is not None:
            self.disk.close()
        if self.ram is not None:
            self.ram.clear()
