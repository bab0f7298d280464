"""Context shift: a sequence that fills the context drops its oldest tokens after the system prompt and goes on.

llama-server's context shift, on our slots: when a `shift` request's sequence has no room for its
next rows, half of its tokens after `n_keep` (the BOS and the system prompt) leave the KV cache
(`llama_memory_seq_rm`) and the later ones move back (`llama_memory_seq_add`; llama.cpp re-rotates
their keys at the next decode). Generation goes on as if the prompt had been the kept tokens, except
that the keys and values of the kept tokens were computed beside the dropped ones (with one layer
they depend on the token and its position only, so a shifted cache then equals a fresh prefill).
Models whose cache cannot shift (`llama_memory_can_shift`: M-RoPE, recurrent state) get `rolling`
instead, and the request is told so.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggufdesk.engine.batching.prefix_cache import Slot, Slots
from ggufdesk.engine.link.protocol import OverflowPolicy

NO_SHIFT_NOTE = "this model's context cannot shift (llama_memory_can_shift is false); rolling was used instead"


@dataclass
class ContextUse:
    """A request's dealings with its context: the overflow policy, what it dropped, what came from a cache."""

    policy: OverflowPolicy = "error"  # the request's overflow policy, after any fallback
    n_keep: int = 0  # leading tokens a shift never drops (BOS, system prompt)
    truncated: int = 0  # prompt tokens dropped to fit, plus tokens shifted out
    dropped_messages: int = 0
    applied: OverflowPolicy | None = None  # the policy that dropped tokens (None: none yet)
    note: str = ""
    shifts: int = 0
    shifted: int = 0  # of `truncated`, the tokens shifts dropped from the KV cache
    restored: int = 0  # prompt tokens read from the disk prompt cache
    cells: int = 0  # the most KV cells it may hold (a shifting sequence: the context; 0 = no cap)

    @property
    def shifting(self) -> bool:
        return self.policy == "shift"


def room_needed(slot: Slot, rows: int, n_ctx: int) -> bool:
    """Whether `rows` more positions would not fit the sequence's context."""
    return len(slot.tokens) + rows > n_ctx - 1


def shift(slots: Slots, slot: Slot, use: ContextUse, n_ctx: int) -> int:
    """Drop half of the tokens after use.n_keep (all of a prefix shared with another sequence, whose
    cells cannot move) and move the rest back; the number dropped (0: nothing can be dropped)."""
    n_keep = min(use.n_keep, n_ctx // 2)
    n = len(slot.tokens)
    n_discard = max((n - n_keep) // 2, slots.shared(slot) - n_keep)
    if n_discard <= 0 or n_keep + n_discard >= n:
        return 0
    slots.shift(slot, n_keep, n_discard)
    use.truncated += n_discard
    use.shifted += n_discard
    use.shifts += 1
    use.applied = "shift"
    return n_discard
