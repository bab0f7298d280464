"""KV-cache slots and the cross-request prefix cache: which sequence holds which tokens, shared cells.

The engine runs one llama.cpp context with a unified KV cache: n_parallel sequence ids (slots)
draw cells from one pool of n_ctx cells, so each sequence may grow up to n_ctx. A finished
request's cells stay resident in its slot; a new request takes the slot whose tokens share the
longest prefix with its prompt, or copies that prefix from another slot with
`llama_memory_seq_cp` (in a unified cache a copy only tags the same cells with one more
sequence id: no data moves, no memory is used). Idle slots are evicted least recently used
first when cells run short.

`Slots` mirrors llama.cpp's cell bookkeeping exactly (a cell is free when no sequence holds it)
so the scheduler knows the free cells without asking llama.cpp, which has no call for it.

Sliding-window attention (Gemma 3: `n_swa` 512): llama.cpp keeps a sequence's sliding-window layers
only for its last n_swa positions, so a prefix cut back further than that lacks what the next token
must see. Such a prefix is not reused (llama-server's rule: the smallest position the sequence
holds must be at most n - n_swa + 1); the whole prompt is prefilled instead. (A sequence in memory
holds all its positions: llama.cpp's SWA cache is full-size here; a state read back from the disk
prompt cache holds only the last window.)
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from ggufdesk.core.prompt_cache import common_prefix


class Memory(Protocol):
    """The llama.cpp memory calls we need (engine/batching/batch.py passes the real ones; tests a fake)."""

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None: ...

    def seq_pos_min(self, seq: int) -> int: ...


@dataclass
class Slot:
    seq: int  # llama.cpp sequence id
    tokens: list[int] = field(default_factory=list)  # what the KV cache holds, position by position
    cells: list[int] = field(default_factory=list)  # our id of the cell behind each position
    busy: bool = False
    last_used: int = 0  # a tick; smaller = evicted first
    # positions whose KV equals a fresh prefill of `tokens` (None: all). A context shift keeps the KV of
    # later tokens, computed beside tokens that are gone: never reused for another prompt.
    exact: int | None = None

    @property
    def reusable(self) -> list[int]:
        return self.tokens if self.exact is None else self.tokens[:self.exact]


class Slots:
    """The sequences of one context and the cells they hold."""

    def __init__(self, n_slots: int, n_cells: int, memory: Memory, *, n_swa: int = 0) -> None:
        self.slots = [Slot(seq=i) for i in range(n_slots)]
        self.n_cells = n_cells
        self.mem = memory
        self.n_swa = n_swa  # the model's sliding window (0: none)
        self._refs: Counter[int] = Counter()  # cell id -> sequences holding it
        self._ids = itertools.count()
        self._tick = itertools.count(1)

    # ---- cells --------------------------------------------------------------------------------

    @property
    def used(self) -> int:
        return len(self._refs)

    @property
    def free(self) -> int:
        return self.n_cells - self.used

    def _drop(self, cells: list[int]) -> None:
        for c in cells:
            self._refs[c] -= 1
            if self._refs[c] <= 0:
                del self._refs[c]

    def extend(self, slot: Slot, tokens: list[int]) -> None:
        """Tokens were decoded into `slot` at its next positions (new cells)."""
        new = [next(self._ids) for _ in tokens]
        self._refs.update(new)
        slot.tokens.extend(tokens)
        slot.cells.extend(new)

    def truncate(self, slot: Slot, n: int) -> None:
        """Keep only the first n positions of `slot`."""
        if n >= len(slot.tokens):
            return
        if not self.mem.seq_rm(slot.seq, n, -1):
            n = 0  # a memory that cannot cut in the middle drops the whole sequence
            self.mem.seq_rm(slot.seq, -1, -1)
        self._drop(slot.cells[n:])
        del slot.tokens[n:], slot.cells[n:]
        if slot.exact is not None and slot.exact >= n:
            slot.exact = None

    def shared(self, slot: Slot) -> int:
        """How many leading positions of `slot` are cells another sequence holds too (a copied prefix)."""
        n = 0
        for c in slot.cells:
            if self._refs[c] <= 1:
                break
            n += 1
        return n

    def shift(self, slot: Slot, n_keep: int, n_discard: int) -> None:
        """Context shift: positions [n_keep, n_keep + n_discard) leave the sequence and the ones after
        move back by n_discard (llama.cpp shifts their keys' RoPE at the next decode). The caller
        makes sure no shifted cell is shared (`shared`): a shift moves a cell for every sequence."""
        end = n_keep + n_discard
        self.mem.seq_rm(slot.seq, n_keep, end)
        self.mem.seq_add(slot.seq, end, -1, -n_discard)
        self._drop(slot.cells[n_keep:end])
        del slot.tokens[n_keep:end], slot.cells[n_keep:end]
        slot.exact = n_keep if slot.exact is None else min(slot.exact, n_keep)

    def clear(self, slot: Slot) -> None:
        self.truncate(slot, 0)

    # ---- requests -----------------------------------------------------------------------------

    def best_match(self, prompt: list[int]) -> tuple[Slot | None, int]:
        """The slot (busy or idle) sharing the longest prefix with prompt, and that length."""
        best, n_best = None, 0
        for s in self.slots:
            n = common_prefix(s.reusable, prompt)
            if n > n_best or (n == n_best and best is not None and best.busy and not s.busy):
                best, n_best = s, n
        return best, n_best

    def window_holds(self, slot: Slot, n: int) -> bool:
        """Whether `slot` cut back to n positions still holds, in its sliding-window layers, the
        n_swa positions before n that the next token attends to (always, without a window)."""
        if not self.n_swa or n >= len(slot.tokens) or not slot.tokens:
            return True
        # the token at position n sees positions p with n - p < n_swa (llama.cpp's is_masked_swa)
        return self.mem.seq_pos_min(slot.seq) <= max(0, n - self.n_swa + 1)

    def idle(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def acquire(self, prompt: list[int], *, reuse: bool = True) -> tuple[Slot, int]:
        """Take an idle slot for `prompt`, holding the longest cached prefix; returns (slot, reused).

        The last prompt token is always evaluated again (its logits are needed), so at most
        len(prompt) - 1 positions are reused. reuse=False: none are (an empty slot, or the least valuable).
        """
        idle = self.idle()
        if not idle:
            raise RuntimeError("no idle slot")  # the scheduler admits only when one is
        src, n = self.best_match(prompt) if reuse else (None, 0)
        n = min(n, len(prompt) - 1)
        if src is not None and n > 0 and not self.window_holds(src, n):
            n = 0  # its sliding-window layers no longer hold what follows position n
        others = [s for s in idle if s is not src]
        if src is not None and not src.busy and n > 0 and (n == len(src.tokens) or not others):
            slot = src  # continue where it left off (a conversation's next turn)
            self.truncate(slot, n)
        else:
            slot = self._copy_prefix(src if n > 0 else None, n, others or idle)
        slot.busy = True
        slot.last_used = next(self._tick)
        return slot, len(slot.tokens)

    def _copy_prefix(self, src: Slot | None, n: int, candidates: list[Slot]) -> Slot:
        """The least valuable candidate (empty first, then least recently used), cleared, holding src's
        first n positions (none without a src): the source keeps its own continuation for its own next turn."""
        slot = min(candidates, key=lambda s: (len(s.tokens) > 0, s.last_used))
        self.clear(slot)
        if src is not None:
            self.mem.seq_cp(src.seq, slot.seq, 0, n)
            cells = src.cells[:n]
            self._refs.update(cells)
            slot.tokens, slot.cells = list(src.tokens[:n]), list(cells)
        return slot

    def release(self, slot: Slot, *, keep: bool = True) -> None:
        """The request using `slot` ended; its KV stays resident for later prefixes unless keep=False."""
        slot.busy = False
        slot.last_used = next(self._tick)
        if not keep:
            self.clear(slot)

    def room_for(self, slot: Slot, need: int) -> bool:
        """Whether `need` cells can be had for `slot` by clearing it and evicting idle slots."""
        held = {c for s in self.slots if s.busy and s is not slot for c in s.cells}
        return self.n_cells - len(held) >= need

    def evict(self, need: int) -> bool:
        """Clear idle slots, least recently used first, until `need` cells are free; True if they are."""
        for s in sorted(self.idle(), key=lambda s: s.last_used):
            if self.free >= need:
                break
            self.clear(s)
        return self.free >= need

    def reset(self) -> None:
        """Forget everything (after llama_memory_clear)."""
        for s in self.slots:
            s.tokens.clear()
            s.cells.clear()
            s.busy = False
            s.exact = None
        self._refs.clear()
