"""What the step loop asks of a drafter (prompt lookup, a draft model): the protocol, in one place."""
from __future__ import annotations

from typing import Protocol

from ggufdesk.engine.speculation.adaptive import DraftLength


class Drafter(Protocol):
    """Proposes tokens that the target model then verifies in the step's batch.

    Each step the loop prices draft rows for the sequence (`control.price`, engine/speculation/planner.py),
    reads `k` (0 = no draft this step), calls `propose` within the rows it may use, and after the
    step reports back with `feedback`: drafted, accepted, and what the step cost the sequence, in
    units of its share of a plain step now (its decode row's share of the step, plus what its draft
    rows added, plus its drafting time), also for plain steps (n_drafted = 0), so the drafter can
    compare and choose its length, or pause. While its control says k stays 0 for a while (`idle`:
    resting, paused, disabled) the loop skips it, and tells it at the end what was written (`woke`).
    """

    control: DraftLength
    setup_s: float  # seconds of the last propose spent catching up once (a draft model syncing the prompt)

    @property
    def k(self) -> int: ...

    @property
    def status(self) -> str: ...  # for stats: "draft", "lookup", "disabled: <why>"

    def propose(self, history: list[int], last: int, k: int) -> list[int]: ...

    def feedback(self, n_drafted: int, n_accepted: int, cost: float, drafting: float = 0.0) -> None: ...

    def woke(self, tokens: int) -> None: ...  # tokens written while the loop skipped it (its control's `idle`)

    def close(self) -> None: ...  # the request ended


class Controlled:
    """What drafters share: the controller decides k and tells the status (prompt lookup and the
    draft model's drafter build on it)."""

    control: DraftLength
    setup_s = 0.0

    @property
    def k(self) -> int:
        return self.control.k

    @property
    def status(self) -> str:
        return self.control.status

    def woke(self, tokens: int) -> None:
        self.control.woke(tokens)

    def close(self) -> None:
        pass
