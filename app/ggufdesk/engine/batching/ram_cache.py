"""Recent prompts' KV states kept in RAM beyond the sequence slots (llama-server's `--cache-ram`).

A slot keeps its prompt's KV only until another request takes the slot: four agents or chats on a
server with four slots push each other's prompts out every wave, and the disk prompt cache keeps only
prompts of `prompt_cache_min_tokens` (256) or more. Measured on the starter (bench/server_lookup.py,
docs/bench/speculative-decoding.md): prompts of 137-295 tokens answered one wave earlier were prefilled
again in 0.4-1.8 s each while llama-server restored them from its RAM cache in 94 ms. Here a state is
the bytes `llama_state_seq_get_data` gave for a prefix (engine/batching/prompt_states.py reads and
writes them); this module only keeps them: least recently used first out under a byte cap. No
llama.cpp here, so it is tested on its own.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ggufdesk.core.prompt_cache import longest, supersedes


@dataclass
class RamEntry:
    tokens: list[int]
    data: bytearray
    used: int = 0  # a tick; smaller = evicted first
    n_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_tokens = len(self.tokens)


class RamCache:
    """Prompt states of one loaded model in this process's memory, at most `max_bytes` of them.

    window: the model's sliding window (0: none). A state of a sliding-window model holds the window's
    layers only for its last positions, so it serves a prefix cut far back from its end only when it is
    no longer than the window (engine/batching/prefix_cache.py): a longer entry then replaces a shorter
    one it starts with only under that condition; without a window it always does."""

    def __init__(self, max_bytes: int, *, window: int = 0) -> None:
        self.max_bytes, self.window = max_bytes, window
        self.entries: list[RamEntry] = []
        self._tick = itertools.count(1)

    @property
    def bytes(self) -> int:
        return sum(len(e.data) for e in self.entries)

    def best(self, prompt: list[int], *, limit: int, at_least: int) -> tuple[RamEntry, int] | None:
        """The entry sharing the longest prefix with `prompt` (at most `limit` tokens count, at least
        `at_least`), and that length; at a tie the shorter entry (less to copy back). With a window, an
        entry longer than it serves only where it ends (or one token before)."""
        return longest(self.entries, prompt, limit=limit, at_least=at_least, window=self.window)

    def holds(self, tokens: list[int], *, within: int) -> bool:
        """Whether an entry already holds all but fewer than `within` of `tokens` (not worth a copy)."""
        return self.best(tokens, limit=len(tokens), at_least=len(tokens) - within + 1) is not None

    def touch(self, entry: RamEntry) -> None:
        entry.used = next(self._tick)

    def put(self, tokens: list[int], data: bytearray) -> bool:
        """Keep a state (a copy of the tokens; the bytes as given), evicting the least recently used
        entries to stay under the cap; False when it alone is larger than the cap."""
        if len(data) > self.max_bytes:
            return False
        new = RamEntry(list(tokens), data)
        self.entries = [e for e in self.entries if not supersedes(new.tokens, e.tokens, self.window)]
        self.touch(new)
        kept, held = [], 0
        for e in sorted([new, *self.entries], key=lambda e: e.used, reverse=True):  # newest first
            held += len(e.data)
            if held > self.max_bytes:
                break  # this one and every older one go
            kept.append(e)
        self.entries = kept
        return True

    def remove(self, entry: RamEntry) -> None:
        self.entries = [e for e in self.entries if e is not entry]

    def clear(self) -> None:
        self.entries.clear()
