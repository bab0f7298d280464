"""The messages of the open conversation as the session holds them: visible before they are saved."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from ggufdesk.core.history import Message

_keys = itertools.count(1)


@dataclass(slots=True)
class Ref:
    """A database row that may not be written yet: the writer fills `id` in when it is."""

    id: int | None = None

    def get(self) -> int:
        if self.id is None:
            raise LookupError("this row has not been written")  # the writer keeps the order
        return self.id


@dataclass(eq=False, slots=True)
class Turn:
    """One message. `key` identifies it in views (stable before and after it is saved); `row` is
    its database row. Later additions (answer versions, stop reasons) are fields here."""

    role: str
    content: str
    status: str = "done"
    stats: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = ""
    version: tuple[int, int] = (1, 1)  # (which, of how many): regenerate/edit keep earlier ones
    row: Ref = field(default_factory=Ref)
    key: int = field(default_factory=lambda: next(_keys))
    created: float = field(default_factory=time.time)
    # a reasoning model's thinking, kept apart from `content` (never sent back to the model) and
    # saved in the message's stats: reasoning, reasoning_tokens, reasoning_s
    reasoning: str = ""

    @property
    def id(self) -> int:
        """What views call a message's id (ChatView and MessageWidget predate the session)."""
        return self.key

    @classmethod
    def from_message(cls, m: Message, version: tuple[int, int] = (1, 1)) -> Turn:
        return cls(role=m.role, content=m.content, status=m.status, stats=dict(m.stats),
                   finish_reason=str(m.stats.get("finish_reason", "")), version=version,
                   row=Ref(m.id), created=m.created, reasoning=str(m.stats.get("reasoning") or ""))
