"""Regenerate and edit keep what they replace: earlier versions, with their own later turns, come back."""
from __future__ import annotations

import sqlite3

import pytest

from ggufdesk.core import history as hmod
from ggufdesk.core.history import History


@pytest.fixture
def hist(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    yield h
    h.close()


def contents(h, cid):
    return [m.content for m in h.messages(cid)]


def test_regenerating_an_earlier_answer_keeps_the_later_turns_as_a_version(hist):
    c = hist.new_conversation("t")
    q1 = hist.add_message(c.id, "user", "q1")
    a1 = hist.add_message(c.id, "assistant", "a1")
    hist.add_message(c.id, "user", "q2")
    hist.add_message(c.id, "assistant", "a2")
    n = hist.keep_as_version(c.id, a1.id)  # regenerate a1
    assert contents(hist, c.id) == ["q1"]
    new = hist.add_message(c.id, "assistant", "a1 again")
    hist.set_version(new.id, n)
    assert hist.versions(c.id) == {new.id: (2, 2)}
    msgs = hist.switch_version(c.id, new.id, -1)
    assert [m.content for m in msgs] == ["q1", "a1", "q2", "a2"]  # nothing was lost
    first = msgs[1]
    assert hist.versions(c.id) == {first.id: (1, 2)}
    msgs = hist.switch_version(c.id, first.id, +1)
    assert [m.content for m in msgs] == ["q1", "a1 again"]
    assert hist.switch_version(c.id, msgs[1].id, +1)[-1].content == "a1 again"  # no version 3
    assert q1.id == msgs[0].id


def test_versions_inside_versions_travel_with_their_branch(hist):
    c = hist.new_conversation("t")
    hist.add_message(c.id, "user", "q1")
    a1 = hist.add_message(c.id, "assistant", "a1")
    hist.add_message(c.id, "user", "q2")
    a2 = hist.add_message(c.id, "assistant", "a2")
    n = hist.keep_as_version(c.id, a2.id)  # regenerate a2 inside branch 1
    b = hist.add_message(c.id, "assistant", "a2 again")
    hist.set_version(b.id, n)
    n = hist.keep_as_version(c.id, a1.id)  # then regenerate a1: branch 1 (with its a2 versions) is kept
    x = hist.add_message(c.id, "assistant", "a1 again")
    hist.set_version(x.id, n)
    assert hist.versions(c.id) == {x.id: (2, 2)}
    msgs = hist.switch_version(c.id, x.id, -1)
    assert [m.content for m in msgs] == ["q1", "a1", "q2", "a2 again"]
    assert sorted(hist.versions(c.id).values()) == [(1, 2), (2, 2)]
    msgs = hist.switch_version(c.id, msgs[3].id, -1)
    assert [m.content for m in msgs] == ["q1", "a1", "q2", "a2"]


def test_a_deleted_conversation_takes_its_versions_along(hist):
    c = hist.new_conversation("t")
    hist.add_message(c.id, "user", "q")
    a = hist.add_message(c.id, "assistant", "a")
    hist.keep_as_version(c.id, a.id)
    hist.delete(c.id)
    left = hist._db.execute("SELECT COUNT(*) FROM message_versions").fetchone()[0]
    assert left == 0


def test_schema_2_databases_migrate(tmp_path):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    for statement in ";".join(hmod.MIGRATIONS[:2]).split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute("INSERT INTO conversations(title, created, updated) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages(conversation_id, role, content, created) VALUES (1, 'user', 'hi', 1)")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    h = History(path)
    try:
        assert h.schema_version == hmod.SCHEMA_VERSION == 4
        assert contents(h, 1) == ["hi"] and h.versions(1) == {}
    finally:
        h.close()


def test_unknown_message_is_refused(hist):
    c = hist.new_conversation("t")
    with pytest.raises(KeyError):
        hist.keep_as_version(c.id, 999)
    with pytest.raises(KeyError):
        hist.switch_version(c.id, 999, -1)


def test_exports_record_the_model(hist):
    c = hist.new_conversation("t", model="/models/qwen2.5-7b-q4_k_m.gguf")
    hist.add_message(c.id, "user", "hi")
    assert hist.export_json(c.id)["model"] == "/models/qwen2.5-7b-q4_k_m.gguf"
    assert "_Model: qwen2.5-7b-q4_k_m.gguf_" in hist.export_markdown(c.id)
