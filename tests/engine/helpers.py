"""Small helpers for engine tests: collect a request's events."""
from __future__ import annotations

from dataclasses import dataclass, field

from ggufdesk.engine.link import protocol as P


@dataclass
class Result:
    text: str = ""
    done: P.Done | None = None
    error: P.Error | None = None
    stats: P.Stats | None = None
    progress: list[P.Progress] = field(default_factory=list)
    tokens: int = 0


def collect(client, rid: str, timeout: float = 600.0) -> Result:
    """A request's events to its end (timeout: a hang guard, generous for a loaded machine)."""
    r = Result()
    for ev in client.stream(rid, timeout=timeout):
        if isinstance(ev, P.Token):
            r.text += ev.text
            r.tokens += 1
        elif isinstance(ev, P.Stats):
            r.stats = ev
        elif isinstance(ev, P.Progress):
            r.progress.append(ev)
        elif isinstance(ev, P.Done):
            r.done = ev
        elif isinstance(ev, P.Error):
            r.error = ev
    return r


def greedy(max_tokens: int = 24, **kw) -> dict:
    return {"temperature": 0.0, "max_tokens": max_tokens, **kw}
