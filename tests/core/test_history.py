"""The SQLite chat history: schema versions, WAL, commits before generation, search, export."""
from __future__ import annotations

import json
import sqlite3

import pytest

from ggufdesk.core import history as hmod
from ggufdesk.core.errors import KnownError, SettingsError
from ggufdesk.core.history import History
from ggufdesk.core.settings import SamplingSettings


@pytest.fixture
def hist(tmp_path):
    h = History(tmp_path / "h.sqlite3")
    yield h
    h.close()


def test_default_path_is_in_user_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    h = History()
    try:
        assert h.path == tmp_path / "data" / "ggufdesk" / "history.sqlite3"
        assert h.path.exists()
    finally:
        h.close()


def test_fresh_database_is_wal_and_at_current_schema(hist):
    assert hist.schema_version == hmod.SCHEMA_VERSION
    mode = hist._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_user_message_is_visible_to_another_connection_at_once(hist):
    """Committed before generation starts: a second process reading the file sees it."""
    c = hist.new_conversation("hello")
    hist.add_message(c.id, "user", "what is 2+2?")
    other = sqlite3.connect(hist.path)
    rows = other.execute("SELECT role, content FROM messages").fetchall()
    other.close()
    assert rows == [("user", "what is 2+2?")]


def test_migration_from_version_1_keeps_data(tmp_path):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(hmod.MIGRATIONS[0])
    db.execute("INSERT INTO conversations(title, created, updated) VALUES ('old chat', 1, 1)")
    db.execute(
        "INSERT INTO messages(conversation_id, role, content, created) VALUES (1, 'user', 'hi', 1)"
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    h = History(path)
    try:
        assert h.schema_version == hmod.SCHEMA_VERSION
        (conv,) = h.list_conversations()
        assert conv.title == "old chat" and conv.model == ""
        (msg,) = h.messages(conv.id)
        assert msg.content == "hi" and msg.stats == {}
    finally:
        h.close()


def test_failed_migration_rolls_back(tmp_path, monkeypatch):
    path = tmp_path / "h.sqlite3"
    monkeypatch.setattr(hmod, "MIGRATIONS", (hmod.MIGRATIONS[0], "CREATE TABLE x(a); BROKEN SQL"))
    monkeypatch.setattr(hmod, "SCHEMA_VERSION", 2)
    with pytest.raises(KnownError):
        History(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    db.close()
    assert tables == set()  # nothing half-applied


def test_newer_schema_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "new.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(KnownError, match="newer ggufdesk"):
        History(path)


def test_corrupt_file_is_a_known_error(tmp_path):
    path = tmp_path / "junk.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(KnownError, match="cannot be opened"):
        History(path)


def test_conversation_crud_and_settings(hist):
    c = hist.new_conversation("first", system_prompt="be brief",
                              sampling=SamplingSettings(temperature=0.1, max_tokens=7))
    assert c.sampling.temperature == 0.1 and c.sampling.max_tokens == 7
    hist.rename(c.id, "renamed")
    c2 = hist.update_conversation(c.id, mode="completion", system_prompt="")
    assert (c2.title, c2.mode, c2.system_prompt) == ("renamed", "completion", "")
    with pytest.raises(SettingsError):
        hist.update_conversation(c.id, mode="poetry")
    with pytest.raises(KeyError):
        hist.update_conversation(12345, title="x")
    hist.add_message(c.id, "user", "hi")
    hist.delete(c.id)
    assert hist.list_conversations() == []
    assert hist._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0  # cascade


def test_bad_stored_sampling_falls_back_to_defaults(hist):
    c = hist.new_conversation("x")
    hist._db.execute("UPDATE conversations SET sampling = ? WHERE id = ?",
                     (json.dumps({"temperature": -3}), c.id))
    assert hist.get_conversation(c.id).sampling == SamplingSettings()


def test_search_matches_titles_and_messages_and_escapes_wildcards(hist):
    a = hist.new_conversation("Cooking pasta")
    b = hist.new_conversation("Physics")
    hist.add_message(b.id, "user", "explain 100% of entropy")
    hist.new_conversation("unrelated")
    assert [c.id for c in hist.list_conversations("pasta")] == [a.id]
    assert [c.id for c in hist.list_conversations("ENTROPY")] == [b.id]
    assert [c.id for c in hist.list_conversations("100%")] == [b.id]
    assert hist.list_conversations("0_%") == []
    assert len(hist.list_conversations("")) == 3


def test_list_is_most_recent_first(hist):
    a = hist.new_conversation("a")
    b = hist.new_conversation("b")
    hist.add_message(a.id, "user", "bump")
    assert [c.id for c in hist.list_conversations()] == [a.id, b.id]


def test_partial_answer_survives_and_streaming_rows_recover(tmp_path):
    path = tmp_path / "h.sqlite3"
    h = History(path)
    c = h.new_conversation("x")
    h.add_message(c.id, "user", "tell me")
    m = h.add_message(c.id, "assistant", "", status="streaming")
    h.update_message(m.id, content="Once upon a", stats={"decode_tok_s": 12.5})
    h.close()  # the app dies here
    h2 = History(path)
    try:
        msgs = h2.messages(c.id)
        assert [(x.role, x.content, x.status) for x in msgs] == [
            ("user", "tell me", "done"), ("assistant", "Once upon a", "partial")]
        assert msgs[1].stats == {"decode_tok_s": 12.5}
    finally:
        h2.close()


def test_truncate_from_drops_the_message_and_later_ones(hist):
    c = hist.new_conversation("x")
    ids = [hist.add_message(c.id, r, t).id for r, t in
           [("user", "1"), ("assistant", "2"), ("user", "3"), ("assistant", "4")]]
    hist.truncate_from(c.id, ids[2])
    assert [m.content for m in hist.messages(c.id)] == ["1", "2"]


def test_unknown_role_or_status_is_a_bug(hist):
    from ggufdesk.core.errors import BugError

    c = hist.new_conversation("x")
    with pytest.raises(BugError):
        hist.add_message(c.id, "wizard", "x")
    with pytest.raises(BugError):
        hist.add_message(c.id, "user", "x", status="weird")


def test_export_markdown_and_json(hist):
    c = hist.new_conversation("Code", system_prompt="You write Python.")
    hist.add_message(c.id, "user", "print hello")
    hist.add_message(c.id, "assistant", "```python\nprint('hello')\n```", status="partial")
    md = hist.export_markdown(c.id)
    assert md.startswith("# Code\n")
    assert "**System:**\n\nYou write Python." in md
    assert "**You:**\n\nprint hello" in md  # the window's words, not "User"
    assert "**Assistant:** _(partial: the engine stopped)_\n\n```python\nprint('hello')\n```" in md
    data = hist.export_json(c.id)
    json.dumps(data)  # serialisable
    assert data["title"] == "Code" and data["schema_version"] == hmod.SCHEMA_VERSION
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["sampling"]["temperature"] == SamplingSettings().temperature


def test_export_markdown_says_what_the_window_says(hist):
    c = hist.new_conversation("Story", mode="completion")
    hist.add_message(c.id, "user", "Once upon a time")
    m = hist.add_message(c.id, "assistant", " there was", status="cancelled")
    hist.update_message(m.id, stats={"finish_reason": "cancelled"})
    cut = hist.add_message(c.id, "assistant", " a cat")
    hist.update_message(cut.id, stats={"finish_reason": "length"})
    md = hist.export_markdown(c.id)
    assert "**Your text:**\n\nOnce upon a time" in md
    assert "**Continued by the model:** _(stopped by you)_\n\n there was" in md
    assert "**Continued by the model:** _(stopped at the token limit)_" in md
    assert "cancelled" not in md and "User" not in md
