"""The answer lifecycle as plain unit tests: a scripted engine, a real history, no Qt, no process."""
from __future__ import annotations

import sqlite3

import pytest

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.link import protocol as P
from ggufdesk.session import Refused, build_request, title_from
from tests.session.conftest import locked


def test_send_streams_and_saves_both_messages(rig):
    rid = rig.send("hello there")
    s = rig.session
    assert s.phase == "streaming"
    assert rig.engine.requests[0]["messages"] == [{"role": "user", "content": "hello there"}]
    rig.answer(rid, "Hi", " you")
    assert s.phase == "idle" and rig.view.finished == ["done"]
    assert [(t.role, t.content, t.status) for t in s.turns] == [
        ("user", "hello there", "done"), ("assistant", "Hi you", "done")]
    assert rig.rows() == [("user", "hello there", "done"), ("assistant", "Hi you", "done")]
    assert rig.history.messages(s.conv.id)[1].stats["final"] is True
    rig.settle()
    assert s.conv.title == "hello there"
    assert rig.history.get_conversation(s.conv.id).title == "hello there"


def test_the_users_message_is_on_disk_before_the_engine_is_asked(rig):
    seen = []

    def spy(_kw):
        db = sqlite3.connect(rig.history.path)  # another connection: only committed rows show
        seen.append(db.execute("SELECT role, content, status FROM messages ORDER BY id").fetchall())
        db.close()

    rig.engine.on_generate = spy
    rig.send("is it saved?")
    assert seen == [[("user", "is it saved?", "done"), ("assistant", "", "streaming")]]


def test_partial_answers_are_saved_on_a_clock_and_coalesced(rig):
    rid = rig.send("count")
    s = rig.session
    s.on_event(P.Token(id=rid, text="one"))
    assert rig.rows()[1] == ("assistant", "", "streaming")  # not yet a second later
    rig.now += 1.5
    s.on_event(P.Token(id=rid, text=" two"))
    assert rig.rows()[1] == ("assistant", "one two", "streaming")
    rig.answer(rid, " three")
    assert rig.rows()[1] == ("assistant", "one two three", "done")


def test_tokens_of_other_requests_are_ignored(rig):
    rid = rig.send("mine")
    rig.session.on_event(P.Token(id="someone-else", text="nope"))
    rig.answer(rid, "yes")
    assert rig.session.turns[-1].content == "yes"


def test_stop_cancels_and_keeps_what_was_written(rig):
    rid = rig.send("count slowly")
    s = rig.session
    s.on_event(P.Token(id=rid, text="1 2"))
    s.stop()
    assert rig.engine.cancelled == [rid] and s.phase == "stopping"
    with pytest.raises(Refused, match="still being written"):
        s.send("again")
    s.on_event(P.Done(id=rid, finish_reason="cancelled"))
    assert rig.rows()[1] == ("assistant", "1 2", "cancelled") and s.phase == "idle"


def test_stop_before_the_engine_was_asked_never_asks_it(rig):
    s = rig.session
    with locked(rig.history.path):
        s.send("wait for the disk")
        assert s.phase == "saving"
        s.stop()
        assert s.phase == "idle" and rig.view.finished == ["cancelled"]  # at once, lock or not
        s.check_can_send()  # Send is available again while the database is still locked
    rig.settle()
    assert rig.engine.requests == []
    assert rig.rows()[1] == ("assistant", "", "cancelled")


@pytest.mark.parametrize("kind", ["crash", "hung"])
def test_engine_stop_keeps_the_partial_answer(rig, kind):
    rid = rig.send("long answer")
    s = rig.session
    s.on_event(P.Token(id=rid, text="Half of it"))
    s.on_event(P.Error(kind=kind, id=rid, message="the engine stopped (killed by SIGKILL); restarting"))
    assert rig.rows()[1] == ("assistant", "Half of it", "partial")
    assert rig.view.notices[-1] == ("error", "the engine stopped (killed by SIGKILL); restarting")
    assert s.phase == "idle" and s.model is None
    with pytest.raises(Refused, match="no model is loaded"):
        s.send("while it restarts")
    s.on_event(P.Lifecycle(state="loaded", restarted=True))
    s.on_event(P.Loaded(id="l2", model="/m/model.gguf", chat_format="template"))
    assert "nothing was lost" in rig.view.notices[-1][1]
    rig.answer(rig.send("still there?"), "yes")
    assert len(rig.rows()) == 4


def test_a_failed_reload_says_why_no_model_is_loaded(rig):
    s = rig.session
    s.on_event(P.Error(kind="crash", message="the engine stopped (killed by SIGBUS); restarting"))
    s.on_event(P.Error(kind="load", id="l9", message="llama.cpp could not load model.gguf: truncated"))
    why = ("the model could not be loaded again after the engine stopped (killed by SIGBUS): "
           "llama.cpp could not load model.gguf: truncated")
    s.on_event(P.Lifecycle(state="ready", reason=why, restarted=True))
    with pytest.raises(Refused) as e:
        s.send("hello?")
    assert str(e.value) == f"no model is loaded: {why}"
    assert rig.view.notices[-1] == ("error", why)


def test_context_overflow_is_explained(rig):
    rid = rig.send("a very long paste")
    rig.session.on_event(P.Error(kind="context", id=rid, message="the prompt is 9000 tokens but ..."))
    assert rig.rows()[1][2] == "error"
    level, text = rig.view.notices[-1]
    assert level == "error" and "does not fit the model's context" in text and "new conversation" in text


def test_generation_error_marks_the_answer(rig):
    rid = rig.send("__error__")
    rig.session.on_event(P.Error(kind="generate", id=rid, message="fake generation error"))
    assert rig.rows()[1][2] == "error"
    assert rig.view.notices[-1] == ("error", "the answer failed: fake generation error")


def test_an_engine_that_cannot_take_the_request_ends_the_answer(rig):
    rig.engine.fail = KnownError("the engine is not running: it keeps stopping")
    s = rig.session
    s.send("anyone?")
    rig.until(lambda: s.phase == "idle")
    assert rig.rows()[1] == ("assistant", "", "error")
    assert rig.view.notices[-1] == ("error", "could not start the answer: the engine is not running: "
                                             "it keeps stopping")


def test_refusals_change_nothing(rig):
    s = rig.session
    with pytest.raises(Refused, match="nothing to send"):
        s.send("   ")
    s.on_event(P.Unloaded())
    with pytest.raises(Refused, match="no model is loaded yet"):
        s.send("hello")
    assert s.conv is None and s.turns == []


def test_regenerate_replaces_the_answer(rig):
    rig.answer(rig.send("first question"), "first answer")
    s = rig.session
    rig.session.regenerate(s.turns[1].key)
    rig.until(lambda: len(rig.engine.requests) == 2)
    assert rig.engine.requests[1]["messages"] == [{"role": "user", "content": "first question"}]
    rig.answer("r2", "second answer")
    assert rig.rows() == [("user", "first question", "done"), ("assistant", "second answer", "done")]


def test_edit_and_resend_replaces_the_rest(rig):
    rig.answer(rig.send("one"), "A1")
    rig.answer(rig.send("two"), "A2")
    s = rig.session
    assert s.edit(s.turns[0].key) == "one"
    rig.answer(rig.send("one, edited"), "A3")
    assert rig.rows() == [("user", "one, edited", "done"), ("assistant", "A3", "done")]
    assert [t.content for t in s.turns] == ["one, edited", "A3"]


def test_a_locked_database_loses_nothing_and_never_blocks_sending(rig):
    rid = rig.send("first")
    s = rig.session
    with locked(rig.history.path):
        rig.answer(rid, "an answer written while the database is locked")
        assert s.phase == "idle"  # Send is available again at once
        rig.until(lambda: rig.writer.state.status == "retrying")
        assert rig.view.save_states[-1].text.startswith("could not save (database is locked")
        assert s.turns[-1].content == "an answer written while the database is locked"  # still shown
        s.send("second")  # queued behind the lock; the engine waits for the message to be saved
        assert s.phase == "saving"
    rig.until(lambda: s.phase == "streaming")
    rig.answer("r2", "fine")
    assert rig.rows() == [("user", "first", "done"),
                          ("assistant", "an answer written while the database is locked", "done"),
                          ("user", "second", "done"), ("assistant", "fine", "done")]
    rig.settle()
    assert rig.view.save_states[-1].status == "saved" and rig.view.save_states[-1].text == ""


def test_a_base_model_gets_completion_mode(rig):
    s = rig.session
    s.on_event(P.Loaded(id="l2", model="/m/gemma-base.gguf", chat_format="completion"))
    assert "no chat template" in rig.view.notices[-1][1]
    assert s.new_conversation().mode == "completion"
    rig.send("Once upon a time")
    assert rig.engine.requests[0] == {"sampling": s.conv.sampling, "prompt": "Once upon a time",
                                      "messages": None}


def test_continue_with_nothing_typed_writes_on_from_where_the_text_ends(rig):
    s = rig.session
    s.on_event(P.Loaded(id="l2", model="/m/gemma-base.gguf", chat_format="completion"))
    s.new_conversation()
    with pytest.raises(Refused, match="write the beginning of a text first"):
        s.continue_text()  # nothing to continue yet
    rig.answer(rig.send("Once upon a time"), " there was a cat.")
    s.continue_text()
    rig.until(lambda: len(rig.engine.requests) == 2)
    assert rig.engine.requests[1]["prompt"] == "Once upon a time there was a cat."
    rig.answer("r2", " It slept.")
    assert rig.rows() == [("user", "Once upon a time", "done"),
                          ("assistant", " there was a cat.", "done"), ("assistant", " It slept.", "done")]
    s.update_conversation(mode="chat")
    with pytest.raises(Refused):
        s.continue_text()  # a chat needs a message


def test_open_shows_stored_messages_and_continues(rig):
    rig.answer(rig.send("stored question"), "stored answer")
    conv = rig.session.conv
    rig.session.close_conversation()
    rig.settle()  # a reader sees what the writer has committed (the window flushes before reading)
    rig.session.open(rig.history.get_conversation(conv.id), rig.history.messages(conv.id))
    assert [t.content for t in rig.session.turns] == ["stored question", "stored answer"]
    rig.send("follow-up")
    assert [m["content"] for m in rig.engine.requests[-1]["messages"]] == [
        "stored question", "stored answer", "follow-up"]


def test_close_keeps_an_answer_in_progress_as_partial(rig):
    rid = rig.send("closing soon")
    rig.session.on_event(P.Token(id=rid, text="so far"))
    rig.session.close()
    assert rig.engine.cancelled == [rid]
    assert rig.rows()[1] == ("assistant", "so far", "partial")


def test_conversation_edits_are_written_in_order(rig):
    s = rig.session
    s.new_conversation(system_prompt="Be brief.")
    s.update_conversation(title="  Renamed  ", system_prompt="Be kind.")
    rig.settle()
    stored = rig.history.get_conversation(s.conv.id)
    assert (stored.title, stored.system_prompt) == ("Renamed", "Be kind.")
    gone = s.conv.id
    s.delete_conversation()
    assert s.conv is None
    rig.settle()
    with pytest.raises(KeyError):
        rig.history.get_conversation(gone)


def test_build_request_modes(history):
    c = history.new_conversation("x", system_prompt="Be brief.")
    history.add_message(c.id, "user", "Hi")
    history.add_message(c.id, "assistant", "Hello!")
    history.add_message(c.id, "user", "Bye")
    req = build_request(c, history.messages(c.id))
    assert req["messages"] == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "Hello!"},
                               {"role": "user", "content": "Bye"}]
    c2 = history.update_conversation(c.id, mode="completion")
    assert build_request(c2, history.messages(c.id)) == {
        "prompt": "Be brief.\n\nHiHello!\nBye", "messages": None}


def test_title_from_first_line():
    assert title_from("A short guide.\n\nSpeculative decoding makes") == "A short guide."
    assert title_from("  many   spaces  ") == "many spaces"
    long = "word " * 30
    assert title_from(long).endswith("…") and len(title_from(long)) <= 49
