"""History start-up when the database is locked, read-only or damaged: no traceback, a mode and a
plain warning for the window, and the user's file is never deleted."""
from __future__ import annotations

import sqlite3

import pytest

from ggufdesk.core.history import History, HistoryError


def _with_chat(path):
    h = History(path)
    c = h.new_conversation("Kept")
    h.add_message(c.id, "user", "hello")
    m = h.add_message(c.id, "assistant", "half an ans", status="streaming")
    h.close()
    return c, m


def test_healthy(tmp_path):
    opened = History.open(tmp_path / "h.sqlite3")
    assert opened.mode == "ok" and opened.warning is None
    opened.history.close()


def test_locked_at_start_opens_read_only(tmp_path):
    """_recover_interrupted() ran outside the try and the app died with 'database is locked'."""
    path = tmp_path / "h.sqlite3"
    c, m = _with_chat(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # a backup tool, another instance
    try:
        with pytest.raises(HistoryError) as e:
            History(path, timeout=0.05)
        assert e.value.kind == "locked"
        opened = History.open(path, timeout=0.05)
        assert opened.mode == "read_only" and "locked" in opened.warning
        h = opened.history
        assert [x.content for x in h.messages(c.id)] == ["hello", "half an ans"]
        with pytest.raises(HistoryError, match="read-only"):
            h.add_message(c.id, "user", "more")
        h.close()
    finally:
        other.execute("ROLLBACK")
        other.close()
    h = History(path)  # the lock is gone: a normal start recovers the interrupted answer
    assert h.get_message(m.id).status == "partial"
    h.close()


def test_read_only_via_sqlite_refusal(tmp_path, monkeypatch):
    """A read-only file or folder (simulated: the tests may run as root, which ignores permissions)."""
    path = tmp_path / "h.sqlite3"
    c, _ = _with_chat(path)
    real = History.__init__

    def refuse_writes(self, p=None, *, read_only=False, memory=False, timeout=5.0):
        if not read_only and not memory:
            raise HistoryError("attempt to write a readonly database", "read_only")
        real(self, p, read_only=read_only, memory=memory, timeout=timeout)

    monkeypatch.setattr(History, "__init__", refuse_writes)
    opened = History.open(path)
    assert opened.mode == "read_only" and "cannot be written" in opened.warning
    assert opened.history.list_conversations()[0].title == "Kept"
    opened.history.close()


def test_corrupt_file_is_moved_aside_and_a_new_history_started(tmp_path):
    path = tmp_path / "history.sqlite3"
    garbage = b"this is not SQLite" * 100
    path.write_bytes(garbage)
    opened = History.open(path)
    assert opened.mode == "recovered"
    assert opened.moved_to.name.startswith("history.sqlite3.broken-")
    assert opened.moved_to.read_bytes() == garbage  # kept, byte for byte
    assert str(opened.moved_to) in opened.warning
    h = opened.history
    conv = h.new_conversation("fresh")
    assert h.list_conversations()[0].id == conv.id
    h.close()


def test_unopenable_path_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    opened = History.open(blocker / "sub" / "h.sqlite3")  # its folder cannot be created
    assert opened.mode == "memory" and "memory only" in opened.warning
    c = opened.history.new_conversation("in memory")
    assert opened.history.get_conversation(c.id).title == "in memory"
    opened.history.close()


def test_newer_schema_opens_read_only(tmp_path):
    path = tmp_path / "h.sqlite3"
    _with_chat(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    opened = History.open(path)
    assert opened.mode == "read_only" and "newer" in opened.warning
    opened.history.close()
