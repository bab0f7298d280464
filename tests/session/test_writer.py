"""The history writer: ordered, retried through a locked database, coalesced, never blocking."""
from __future__ import annotations

import threading

from ggufdesk.session import HistoryWriter, SaveState
from tests.session.conftest import locked


def test_writes_run_in_order_and_report_back(history, writer):
    got = []
    conv = history.new_conversation("c")
    for text in ("a", "b", "c"):
        writer.submit(lambda h, t=text: h.add_message(conv.id, "user", t).content, then=got.append)
    assert writer.flush(10)
    assert got == ["a", "b", "c"]
    assert [m.content for m in history.messages(conv.id)] == ["a", "b", "c"]


def test_a_locked_database_is_retried_until_it_lets_go(history):
    states: list[SaveState] = []
    retrying = threading.Event()

    def on_state(st: SaveState) -> None:
        states.append(st)
        if st.status == "retrying":
            retrying.set()

    writer = HistoryWriter(history, on_state=on_state, retry_delays=(0.01, 0.05))
    conv = history.new_conversation("c")
    with locked(history.path):
        writer.submit(lambda h: h.add_message(conv.id, "assistant", "kept"))  # returns at once
        assert retrying.wait(10)
        assert writer.pending == 1 and not writer.flush(0.2)
    assert writer.flush(10)
    assert [m.content for m in history.messages(conv.id)] == ["kept"]
    st = next(s for s in states if s.status == "retrying")
    assert st.reason == "database is locked" and st.text == "could not save (database is locked), retrying"
    assert states[-1] == SaveState() and states[-1].text == ""
    writer.close()


def test_a_newer_write_with_the_same_key_replaces_the_pending_one(history, writer):
    conv = history.new_conversation("c")
    msg = history.add_message(conv.id, "assistant", "", status="streaming")
    ran = []

    def update(text: str):
        def run(h):
            ran.append(text)
            h.update_message(msg.id, content=text)
        return run

    with locked(history.path):
        writer.submit(lambda h: h.add_message(conv.id, "user", "first in the queue"))
        for text in ("p1", "p2", "p3"):
            writer.submit(update(text), key="answer")
    assert writer.flush(10)
    assert ran == ["p3"]  # the partial saves queued behind the lock collapsed into the last one
    assert history.get_message(msg.id).content == "p3"


def test_a_write_that_is_our_bug_is_dropped_and_the_rest_go_on(history, writer, caplog):
    conv = history.new_conversation("c")
    writer.submit(lambda h: h.get_conversation(99999))  # KeyError: not the database's fault
    writer.submit(lambda h: h.add_message(conv.id, "user", "after"))
    assert writer.flush(10)
    assert [m.content for m in history.messages(conv.id)] == ["after"]
    assert "dropped" in caplog.text


def test_close_gives_up_after_its_timeout_and_says_so(history, caplog):
    writer = HistoryWriter(history, retry_delays=(0.01,))
    conv = history.new_conversation("c")
    with locked(history.path):
        writer.submit(lambda h: h.add_message(conv.id, "user", "lost"))
        assert writer.close(timeout=0.3) is False
    assert "unsaved history writes" in caplog.text
    writer._thread.join(10)
    writer.submit(lambda h: h.add_message(conv.id, "user", "after close"))  # dropped, logged
    assert "after close" not in [m.content for m in history.messages(conv.id)]
    assert "a history write after close was dropped" in caplog.text


def test_save_state_texts():
    assert SaveState().text == ""
    assert SaveState("saving", 2).text == "saving…"
    assert SaveState("retrying", 1, "disk I/O error").text == "could not save (disk I/O error), retrying"
