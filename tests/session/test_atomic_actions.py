"""One transaction per user action: a crash or a full disk in the middle of send, edit or regenerate
leaves the history as it was before the action or as it is after it, never in between."""
from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from pathlib import Path

import pytest

from ggufdesk.core.history import History
from ggufdesk.engine.link import protocol as P
from ggufdesk.session import ChatSession, HistoryWriter
from ggufdesk.session.inbox import Inbox
from tests.fixtures.faulty_db import Crash, Faulty
from tests.session.conftest import RecordingView, ScriptedEngine

State = tuple[list[tuple], list[tuple], list[tuple]]


def on_disk(path: Path) -> State:
    """What a fresh start would find: committed rows only (another connection)."""
    db = sqlite3.connect(path)
    try:
        convs = db.execute("SELECT title, model FROM conversations ORDER BY id").fetchall()
        msgs = db.execute("SELECT conversation_id, role, content, status, version FROM messages "
                          "ORDER BY id").fetchall()
        versions = db.execute("SELECT conversation_id, position, ordinal FROM message_versions "
                              "ORDER BY id").fetchall()
    finally:
        db.close()
    return convs, msgs, versions


def assert_versions_make_sense(state: State) -> None:
    """Every version at a place has its own number, and the message shown is one of them."""
    _, msgs, versions = state
    live = {}
    for conv in {m[0] for m in msgs} | {v[0] for v in versions}:
        rows = [m for m in msgs if m[0] == conv]
        for pos, m in enumerate(rows):
            live[(conv, pos)] = m[4]
    places = Counter((c, p, o) for c, p, o in versions) + Counter(
        (c, p, o) for (c, p), o in live.items() if any(v[0] == c and v[1] == p for v in versions))
    assert all(n == 1 for n in places.values()), f"two versions share a number: {places}"
    for c, p, _ in versions:
        assert (c, p) in live, f"a version at {p} with nothing shown there: {state}"


class Run:
    """A session over a real history file whose connection can crash or fill up."""

    def __init__(self, path: Path) -> None:
        self.history = History(path)
        self.writer = HistoryWriter(self.history, retry_delays=(0.01,))
        self.engine = ScriptedEngine()
        self.inbox = Inbox()
        self.session = ChatSession(engine=self.engine, writer=self.writer, view=RecordingView(),
                                   post=self.inbox.post)
        self.session.on_event(P.Loaded(id="l", model="/m/model.gguf", chat_format="template"))
        self.faulty: Faulty | None = None

    def exchange(self, text: str, answer: str) -> None:
        n = len(self.engine.requests)
        self.session.send(text)
        assert self.inbox.run_until(lambda: len(self.engine.requests) > n, 10)
        rid = f"r{len(self.engine.requests)}"
        self.session.on_event(P.Token(id=rid, text=answer))
        self.session.on_event(P.Done(id=rid, finish_reason="stop"))
        assert self.writer.flush(10)

    def inject(self, **faults) -> Faulty:
        self.faulty = Faulty(self.history._db, **faults)
        self.history._db = self.faulty  # type: ignore[assignment]
        return self.faulty

    def settle(self) -> None:
        """Until the writer is done, or dead of the crash."""
        assert self.inbox.run_until(
            lambda: self.writer.pending == 0 or (self.faulty is not None and self.faulty.crashed
                                                 and not self.writer._thread.is_alive()), 10)
        self.inbox.run_pending()

    def close(self) -> None:
        if self.writer._thread.is_alive():
            self.writer.close(timeout=5)
        self.history.close()


@pytest.fixture
def quiet_crashes(monkeypatch):
    """The crash ends the writer thread (nothing survives a crash); that is not a test failure."""
    real = threading.excepthook
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: None if args.exc_type is Crash else real(args))


def crash_points(tmp_path: Path, setup, action) -> list[State]:
    """Run `action` once per commit it might make, crashing before the k-th one each time."""
    seen = []
    for k in range(6):
        path = tmp_path / f"k{k}.sqlite3"
        run = Run(path)
        try:
            setup(run)
            faulty = run.inject(crash_at=k)
            action(run)
            run.settle()
            seen.append(on_disk(path))
            if not faulty.crashed:
                break  # the action needed fewer commits than k: every point was tried
        finally:
            run.close()
    return seen


def test_a_crash_anywhere_in_regenerate_leaves_before_or_after(tmp_path, quiet_crashes):
    def setup(run: Run) -> None:
        run.exchange("q", "a")

    seen = crash_points(tmp_path, setup,
                        lambda run: run.session.regenerate(run.session.turns[1].key))
    before = ([("q", "/m/model.gguf")], [(1, "user", "q", "done", 0), (1, "assistant", "a", "done", 0)],
              [])
    after = ([("q", "/m/model.gguf")],
             [(1, "user", "q", "done", 0), (1, "assistant", "", "streaming", 1)], [(1, 1, 0)])
    for state in seen:
        assert_versions_make_sense(state)
        assert state in (before, after), state
    assert seen[0] == before and seen[-1] == after


def test_a_crash_anywhere_in_an_edit_leaves_before_or_after(tmp_path, quiet_crashes):
    def setup(run: Run) -> None:
        run.exchange("q", "a")
        run.session.edit(run.session.turns[0].key)

    seen = crash_points(tmp_path, setup, lambda run: run.session.send("q, edited"))
    before = ([("q", "/m/model.gguf")], [(1, "user", "q", "done", 0), (1, "assistant", "a", "done", 0)],
              [])
    after = ([("q, edited", "/m/model.gguf")],
             [(1, "user", "q, edited", "done", 1), (1, "assistant", "", "streaming", 0)], [(1, 0, 0)])
    for state in seen:
        assert_versions_make_sense(state)
        assert state in (before, after), state
    assert seen[-1] == after


def test_a_crash_anywhere_in_the_first_send_leaves_nothing_or_everything(tmp_path, quiet_crashes):
    seen = crash_points(tmp_path, lambda run: None, lambda run: run.session.send("hello"))
    after = ([("hello", "/m/model.gguf")],
             [(1, "user", "hello", "done", 0), (1, "assistant", "", "streaming", 0)], [])
    for state in seen:
        assert state in (([], [], []), after), state


def test_a_full_disk_in_the_middle_of_send_saves_each_message_once(tmp_path):
    run = Run(tmp_path / "h.sqlite3")
    try:
        run.exchange("first", "one")
        run.inject(fail={r"UPDATE conversations SET updated": 1})  # after the row is inserted
        run.session.send("second")
        run.settle()
        assert run.writer.state.status == "saved"
        _, msgs, _ = on_disk(run.history.path)
        assert [(m[1], m[2]) for m in msgs] == [("user", "first"), ("assistant", "one"),
                                               ("user", "second"), ("assistant", "")]
        assert len(run.engine.requests) == 2  # asked once the rows were on disk
    finally:
        run.close()


def test_a_full_disk_during_regenerate_waits_and_then_saves_it_whole(tmp_path):
    run = Run(tmp_path / "h.sqlite3")
    try:
        run.exchange("q", "a" * 40000)  # keeping it as a version needs pages the disk lacks
        db = run.history._db
        db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
        s = run.session
        states = []
        run.writer.on_state = lambda st: (states.append(st.status),
                                          run.inbox.post(lambda: s.view.save_state_changed(st)))
        s.regenerate(s.turns[1].key)
        assert run.inbox.run_until(lambda: "retrying" in states, 10)
        assert s.phase == "saving" and len(run.engine.requests) == 1  # not asked while unsaved
        _, msgs, versions = on_disk(run.history.path)
        assert [m[2][:1] for m in msgs] == ["q", "a"] and versions == []  # nothing half-written
        db.execute("PRAGMA max_page_count = 1073741823")  # room again
        assert run.inbox.run_until(lambda: len(run.engine.requests) == 2, 10)
        state = on_disk(run.history.path)
        assert_versions_make_sense(state)
        assert [(m[1], m[2], m[4]) for m in state[1]] == [("user", "q", 0), ("assistant", "", 1)]
        assert state[2] == [(1, 1, 0)]
    finally:
        run.close()
