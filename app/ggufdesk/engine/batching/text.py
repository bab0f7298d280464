"""Token text without llama_cpp: UTF-8-safe streaming and stop strings held back until decided."""
from __future__ import annotations

import codecs


class TextStream:
    """Turns token bytes into text pieces that are safe to show now.

    Incomplete UTF-8 sequences wait for their next byte; text that could be the start of a stop
    string waits until it is known not to be one. When a stop string completes, `stopped` is set
    and nothing from the stop string on is ever emitted.

    `trim` (a chat answer): no whitespace at its start or end. A SentencePiece model's first token
    often carries the word's leading space ("▁Hi" -> " Hi!"), and a JSON grammar lets the model end
    with a space; a reply in a chat begins and ends with its words (as HF's decode gives them).
    Whitespace inside waits for the next word, and is dropped if none comes.
    """

    def __init__(self, stops: list[str] | tuple[str, ...] = (), *, trim: bool = False) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = [s for s in stops if s]
        self._pending = ""
        # everything emitted so far, in pieces: `text += out` copied the whole answer at every token
        # (an attribute is never grown in place), 35 us a token 30,000 tokens into an answer
        self._out: list[str] = []
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, if one did
        self.trim = trim

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._out)

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
        if self.trim and not self._out:
            self._pending = self._pending.lstrip()  # nothing shown yet: no leading whitespace
        pending = self._pending
        found = [(i, n, s) for n, s in enumerate(self._stops) if (i := pending.find(s)) >= 0]
        if found:
            hit, _, self.matched = min(found)  # the earliest; at a tie the first listed
            out, self._pending, self.stopped = pending[:hit], "", True
            if self.trim:
                out = out.rstrip()
        elif final:
            out, self._pending = (pending.rstrip() if self.trim else pending), ""
        else:
            keep = self._held_back(pending)
            if self.trim:  # and the whitespace before it, until a word follows
                head = pending[: len(pending) - keep]
                keep += len(head) - len(head.rstrip())
            out, self._pending = pending[: len(pending) - keep], pending[len(pending) - keep:]
        if out:
            self._out.append(out)
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
