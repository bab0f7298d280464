"""One request's reasoning in the engine: the split into reasoning and answer, and the budget that closes it."""
from __future__ import annotations

from ggufdesk.core.reasoning import Piece, ReasoningFormat, ReasoningSplit


class ReasoningControl:
    """Splits a request's output (core/reasoning.py) and counts its reasoning tokens; once `budget`
    of them are spent inside the block, `forced()` hands the engine the tokens that close it
    (`close_tokens`, the format's force_close), one per step, instead of sampling."""

    def __init__(self, fmt: ReasoningFormat, *, inside: bool, budget: int | None, close_tokens: list[int]) -> None:
        self.split = ReasoningSplit(fmt, inside=inside)
        self.budget = budget
        self.close_tokens = close_tokens
        self.tokens = 0  # generated tokens inside the reasoning block, its closing marker included
        self._queue: list[int] = []
        self.closed_by_budget = False

    def take(self, text: str) -> list[Piece]:
        """A generated token's text: the pieces to emit; counts the token as reasoning if it was."""
        before = self.split.in_reasoning
        pieces = self.split.push(text)
        if before:  # inside the block (its closing marker too; not the one that opens it)
            self.tokens += 1
        return pieces

    def finish(self) -> list[Piece]:
        return self.split.finish()

    def room(self) -> int | None:
        """Draft tokens a step may carry before the budget must be looked at again (None: no limit).
        `tokens` counts what the step loop has taken, after each step: a step that sampled past the
        budget inside one verification would write reasoning that plain decoding closes. With at most
        budget - tokens samples in a step, forced() sees each of them as plain decoding would. Once the
        budget has closed the block, each sample takes the next closing token as one step's would; once
        the model has closed it (or answered without one), the budget has nothing more to do."""
        if self.budget is None or self.closed_by_budget or self.split.settled:
            return None
        return max(0, self.budget - self.tokens - 1)

    def forced(self) -> int | None:
        """The next token to insert instead of sampling, or None."""
        if not self._queue and not self.closed_by_budget and self.budget is not None \
                and self.split.in_reasoning and self.tokens >= self.budget and self.close_tokens:
            self._queue = list(self.close_tokens)
            self.closed_by_budget = True
        return self._queue.pop(0) if self._queue else None
