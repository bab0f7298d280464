"""Session fixtures: a real History in tmp (short busy timeout), a writer, a scripted engine."""
from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ggufdesk.core.history import History
from ggufdesk.engine.link import protocol as P
from ggufdesk.session import ChatSession, HistoryWriter, SessionView
from ggufdesk.session.inbox import Inbox


class ScriptedEngine:
    """Records generate/cancel; the test plays the engine's events into the session."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.cancelled: list[str] = []
        self.fail: Exception | None = None
        self.on_generate = None

    def generate(self, **kw) -> str:
        if self.fail is not None:
            raise self.fail
        if self.on_generate is not None:
            self.on_generate(kw)
        self.requests.append(kw)
        return f"r{len(self.requests)}"

    def cancel(self, rid: str) -> None:
        self.cancelled.append(rid)


class RecordingView(SessionView):
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.notices: list[tuple[str, str]] = []
        self.finished: list[str] = []
        self.save_states: list = []
        self.phases: list[str] = []

    def show_conversation(self, conv, turns) -> None:
        self.calls.append(("show", conv.id if conv else None, [t.content for t in turns]))

    def turn_added(self, turn) -> None:
        self.calls.append(("added", turn.role, turn.content))

    def turn_finished(self, turn) -> None:
        self.finished.append(turn.status)

    def phase_changed(self, phase) -> None:
        self.phases.append(phase)

    def save_state_changed(self, state) -> None:
        self.save_states.append(state)

    def notice(self, text, level="info") -> None:
        self.notices.append((level, text))


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    h = History(tmp_path / "history.sqlite3")
    h._db.execute("PRAGMA busy_timeout = 50")  # a locked database fails fast here (5 s in the app)
    yield h
    h.close()


@pytest.fixture
def writer(history: History) -> Iterator[HistoryWriter]:
    w = HistoryWriter(history, retry_delays=(0.01, 0.05))
    yield w
    w.close(timeout=5)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Another process's write lock on the database, as a backup tool or a second app holds it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


class Rig:
    """A session over a scripted engine and a real history, driven from the test's thread."""

    def __init__(self, history: History, writer: HistoryWriter) -> None:
        self.history = history
        self.writer = writer
        self.engine = ScriptedEngine()
        self.view = RecordingView()
        self.inbox = Inbox()
        self.now = 0.0
        self.session = ChatSession(engine=self.engine, writer=writer, view=self.view,
                                   post=self.inbox.post, clock=lambda: self.now)
        self.session.on_event(P.Loaded(id="l1", model="/m/model.gguf", chat_format="template"))

    def settle(self, timeout: float = 10.0) -> None:
        """Let the writer finish and run what it handed back."""
        assert self.inbox.run_until(lambda: self.writer.pending == 0, timeout)
        self.inbox.run_pending()

    def until(self, done, timeout: float = 10.0) -> None:
        assert self.inbox.run_until(done, timeout)

    def rows(self) -> list[tuple[str, str, str]]:
        assert self.writer.flush(10)
        conv = self.session.conv
        assert conv is not None and conv.id
        return [(m.role, m.content, m.status) for m in self.history.messages(conv.id)]

    def send(self, text: str) -> str:
        """Send and wait until the engine was asked; the request id."""
        n = len(self.engine.requests)
        self.session.send(text)
        self.until(lambda: len(self.engine.requests) > n)
        return f"r{len(self.engine.requests)}"

    def answer(self, rid: str, *pieces: str, reason: P.FinishReason = "stop") -> None:
        for piece in pieces:
            self.session.on_event(P.Token(id=rid, text=piece))
        self.session.on_event(P.Stats(id=rid, n_gen=len(pieces), final=True))
        self.session.on_event(P.Done(id=rid, finish_reason=reason))


@pytest.fixture
def rig(history: History, writer: HistoryWriter) -> Rig:
    return Rig(history, writer)

