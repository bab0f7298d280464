"""The engine (runtime/worker.py's Engine) in the test process: requests run to their end between calls,
and the prompt each request ran is recorded (what the overflow policy kept, token by token)."""
from __future__ import annotations

from typing import Any

from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.worker import CancelBook, Engine


class Live:
    """An engine in this process: requests run to their end, the prompts it ran are recorded."""

    def __init__(self, model: Any, **load: Any) -> None:  # load: LoadSettings fields
        self.events: list[Any] = []
        self.engine = Engine(self.events.append, CancelBook())  # type: ignore[arg-type]
        self.engine.load(P.Load(id="load", model=str(model), settings=LoadSettings(**load)))
        assert self.engine.batch is not None, self.events
        self.prompts: dict[str, list[int]] = {}
        submit = self.engine.batch.submit

        def recorded(seq: Any) -> None:
            self.prompts[seq.rid] = list(seq.prompt)
            submit(seq)

        self.engine.batch.submit = recorded  # type: ignore[method-assign]

    def run(self, rid: str, **fields: Any) -> list[Any]:
        if isinstance(fields.get("sampling"), dict):  # (the protocol carries settings dataclasses)
            fields["sampling"] = SamplingSettings(**fields["sampling"])
        self.engine.generate(P.Generate(id=rid, **fields))
        while self.engine.batch.busy:
            self.engine.batch.step()
        return [e for e in self.events if getattr(e, "id", None) == rid]

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.engine._chat_tokens(messages)

    def close(self) -> None:
        self.engine.unload(quiet=True)


def one(events: list[Any], kind: type) -> Any:
    found = [e for e in events if isinstance(e, kind)]
    assert len(found) == 1, events
    return found[0]

