"""Prompt lookup drafting: propose the continuation of the latest earlier match of the text's last n-gram."""
from __future__ import annotations

from collections import deque

from ggufdesk.engine.adaptive import DraftLength


class NgramIndex:
    """For every n-gram (n = 1..n_max) of a growing token sequence, where its latest continuation starts."""

    def __init__(self, n_max: int) -> None:
        self.n_max = n_max
        self.seq: list[int] = []
        self.where: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]
        self._indexed = 0  # continuations starting before this position are in the index

    def sync(self, history: list[int], last: int) -> None:
        """Make seq == history + [last]. Within a request the history only grows past the old seq."""
        n = len(self.seq)
        if n == 0 or len(history) < n or history[n - 1] != self.seq[n - 1]:
            self.__init__(self.n_max)  # type: ignore[misc]
            self.seq.extend(history)
        else:
            self.seq.extend(history[n:])
        self.seq.append(last)
        # index the n-grams ending just before each position c that has a continuation (c < end)
        seq, end = self.seq, len(self.seq) - 1
        for c in range(max(self._indexed, 1), end):
            for k in range(1, min(self.n_max, c) + 1):
                self.where[k][tuple(seq[c - k:c])] = c
        self._indexed = max(self._indexed, end)

    def match(self) -> tuple[int, int]:
        """(n, c): the longest suffix n-gram seen before and where its continuation starts; (0, -1) if none."""
        seq = self.seq
        for n in range(min(self.n_max, len(seq) - 1), 0, -1):
            c = self.where[n].get(tuple(seq[-n:]))
            if c is not None:
                return n, c
        return 0, -1


PRIOR = {1: 0.5, 2: 0.7}  # acceptance guessed per match length before any evidence; longer: 0.9
PRIOR_WEIGHT = 4.0


class PromptLookup:
    """Drafter: the continuation of the last n-gram's latest earlier occurrence in prompt + output.

    Acceptance is tracked per match length: a draft is proposed only when the acceptance seen for
    matches of that length (a prior at first) makes a speculative step predicted faster than a
    plain one at the measured costs. Short matches in free text then cost nothing, while long
    matches in copied text draft at full length.
    """

    def __init__(self, *, ngram: int, k_min: int, k_max: int, adaptive: bool) -> None:
        self.index = NgramIndex(ngram)
        self.control = DraftLength(k_min=k_min, k_max=k_max, adaptive=adaptive, label="lookup",
                                   k_start=min(k_max, 8))
        self.by_n: dict[int, deque[tuple[int, int]]] = {}  # match length -> recent (drafted, accepted)
        self._last_n = 0

    @property
    def k(self) -> int:
        return self.control.k

    @property
    def status(self) -> str:
        return self.control.status

    def alpha(self, n: int) -> float:
        hist = self.by_n.get(n, ())
        acc = sum(a for _, a in hist)
        fails = sum(1 for d, a in hist if a < d)
        prior = PRIOR.get(n, 0.9)
        return (acc + PRIOR_WEIGHT * prior) / (acc + fails + PRIOR_WEIGHT)

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        self.index.sync(history, last)
        n, c = self.index.match()
        self._last_n = n
        if n == 0:
            return []
        k = self.control.worth(self.alpha(n), k)
        return self.index.seq[c:c + k] if k > 0 else []

    def feedback(self, n_drafted: int, n_accepted: int, seconds: float) -> None:
        if n_drafted:
            self.by_n.setdefault(self._last_n, deque(maxlen=16)).append((n_drafted, n_accepted))
        self.control.feedback(n_drafted, n_accepted, seconds)
