"""Token text without llama_cpp: UTF-8-safe streaming and stop strings held back until decided."""
from __future__ import annotations

import codecs


class TextStream:
    """Turns token bytes into text pieces that are safe to show now.

    Incomplete UTF-8 sequences wait for their next byte; text that could be the start of a stop
    string waits until it is known not to be one. When a stop string completes, `stopped` is set
    and nothing from the stop string on is ever emitted.
    """

    def __init__(self, stops: list[str] | tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._pending = ""
        self.text = ""  # everything emitted so far
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, if one did

    def push(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        return self._release(final=False)

    def flush(self) -> str:
        """End of generation: release what was held back (incomplete bytes become U+FFFD)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        pending = self._pending
        found = [(i, n, s) for n, s in enumerate(self._stops) if (i := pending.find(s)) >= 0]
        if found:
            hit, _, self.matched = min(found)  # the earliest; at a tie the first listed
            out, self._pending, self.stopped = pending[:hit], "", True
        else:
            keep = 0 if final else self._held_back(pending)
            out, self._pending = pending[: len(pending) - keep], pending[len(pending) - keep:]
        self.text += out
        return out

    def _held_back(self, pending: str) -> int:
        """Length of the longest tail of `pending` that is a proper prefix of a stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(pending)), best, -1):
                if pending.endswith(stop[:n]):
                    best = n
                    break
        return best
