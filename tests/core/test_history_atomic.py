"""History writes are atomic: a full disk or a crash halfway through a write leaves nothing half-done."""
from __future__ import annotations

import sqlite3

import pytest

from ggufdesk.core.history import History
from tests.fixtures.faulty_db import Crash, Faulty


@pytest.fixture
def hist(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    yield h
    h.close()


def on_disk(h: History, conv_id: int) -> tuple[list[tuple[str, str, int]], list[tuple[int, int]]]:
    """What another process reads from the file: committed rows only."""
    db = sqlite3.connect(h.path)
    try:
        msgs = db.execute("SELECT role, content, version FROM messages WHERE conversation_id = ? "
                          "ORDER BY id", (conv_id,)).fetchall()
        versions = db.execute("SELECT position, ordinal FROM message_versions WHERE "
                              "conversation_id = ? ORDER BY id", (conv_id,)).fetchall()
    finally:
        db.close()
    return msgs, versions


def test_keep_as_version_on_a_full_disk_says_the_disk_is_full_and_keeps_everything(hist):
    c = hist.new_conversation("x")
    hist.add_message(c.id, "user", "q")
    a = hist.add_message(c.id, "assistant", "a" * 40000)  # its copy needs pages the disk lacks
    pages = hist._db.execute("PRAGMA page_count").fetchone()[0]
    hist._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(sqlite3.OperationalError) as err:
        hist.keep_as_version(c.id, a.id)
    # SQLite rolled the transaction back by itself; the error is the disk's, not "cannot rollback"
    assert "full" in str(err.value) and err.value.sqlite_errorname == "SQLITE_FULL"
    assert [m.content[:1] for m in hist.messages(c.id)] == ["q", "a"] and hist.versions(c.id) == {}
    hist._db.execute("PRAGMA max_page_count = 1073741823")
    assert hist.keep_as_version(c.id, a.id) == 1  # the history still works


def test_add_message_that_fails_halfway_saves_nothing(hist):
    c = hist.new_conversation("x")
    hist._db = Faulty(hist._db, fail={r"UPDATE conversations SET updated": 1})  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError):
        hist.add_message(c.id, "user", "hello")
    assert on_disk(hist, c.id) == ([], [])  # the failure it reports is the truth: nothing saved
    hist.add_message(c.id, "user", "hello")  # the retry saves it once
    assert on_disk(hist, c.id)[0] == [("user", "hello", 0)]


@pytest.mark.parametrize("fault", ["crash", "full"])
def test_replace_message_is_one_write(hist, fault):
    c = hist.new_conversation("x")
    hist.add_message(c.id, "user", "q")
    a = hist.add_message(c.id, "assistant", "a")
    before = on_disk(hist, c.id)
    faulty = Faulty(hist._db, crash_at=0) if fault == "crash" else \
        Faulty(hist._db, fail={r"INSERT INTO messages": 1})
    hist._db = faulty  # type: ignore[assignment]
    with pytest.raises(Crash if fault == "crash" else sqlite3.OperationalError):
        hist.replace_message(c.id, a.id, "assistant", "a again", status="streaming")
    assert on_disk(hist, c.id) == before
    if fault == "full":
        new = hist.replace_message(c.id, a.id, "assistant", "a again", status="streaming")
        assert on_disk(hist, c.id) == ([("user", "q", 0), ("assistant", "a again", 1)], [(1, 0)])
        assert hist.versions(c.id) == {new.id: (2, 2)}


def test_atomic_blocks_nest_and_an_inner_failure_undoes_only_itself(hist):
    c = hist.new_conversation("x")
    with hist.atomic():
        hist.add_message(c.id, "user", "kept")
        with pytest.raises(KeyError):
            with hist.atomic():
                hist.add_message(c.id, "user", "undone")
                raise KeyError("inner")
        hist.add_message(c.id, "assistant", "kept too")
    assert [m.content for m in hist.messages(c.id)] == ["kept", "kept too"]
    with pytest.raises(RuntimeError):
        with hist.atomic():
            hist.add_message(c.id, "user", "all of this goes")
            hist.update_conversation(c.id, title="renamed")
            raise RuntimeError("the action failed")
    assert [m.content for m in hist.messages(c.id)] == ["kept", "kept too"]
    assert hist.get_conversation(c.id).title == "x"
