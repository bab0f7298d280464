"""The window over the session: Stop always ends an answer, and a locked database loses nothing."""
from __future__ import annotations

import sqlite3

import pytest


@pytest.fixture
def quick_bridge(qtbot, fake_command):
    from ggufdesk.ui.engine_adapter import EngineBridge

    b = EngineBridge(command=fake_command, client_options={"cancel_grace": 0.5})
    yield b
    b.shutdown(timeout=3)


def test_stop_ends_an_answer_whose_engine_ignores_it(qtbot, quick_bridge, history, tmp_path):
    from ggufdesk.ui.main_window import MainWindow

    w = MainWindow(engine=quick_bridge, history=history, persist_settings=False)
    qtbot.addWidget(w)
    with qtbot.waitSignal(quick_bridge.loaded, timeout=15000):
        w.load_model(str(tmp_path / "m.gguf"))
    assert w.send("__stuck__ a template that renders for ever")
    qtbot.waitUntil(lambda: w.session.phase == "streaming", timeout=10000)
    with qtbot.waitSignal(w.answer_finished, timeout=20000) as finished:
        w.stop_btn.click()
    assert finished.args == ["partial"]
    assert any("did not stop within" in text for _, _, text in w.banner.messages)
    assert w.send_btn.isEnabled()
    # restarted, reloaded, and the session has taken the new Loaded (the bridge's state can be first)
    qtbot.waitUntil(lambda: quick_bridge.state == "loaded" and w.session.model is not None and not w.session.busy,
                    timeout=20000)
    with qtbot.waitSignal(w.answer_finished, timeout=15000) as done:
        assert w.send("and now a normal one")
    assert done.args == ["done"]


def test_a_locked_database_shows_retrying_and_keeps_the_answer(qtbot, loaded_window):
    w = loaded_window
    w.history._db.execute("PRAGMA busy_timeout = 50")  # fail fast here (5 s in the app)
    other = sqlite3.connect(w.history.path, isolation_level=None)
    try:
        with qtbot.waitSignal(w.answer_finished, timeout=15000):
            assert w.send("first")  # written before the lock
        assert w.writer.flush(10)
        other.execute("BEGIN EXCLUSIVE")  # a backup tool holds the database
        w.session.new_conversation()
        assert w.send("during the lock")
        qtbot.waitUntil(lambda: "could not save (database is locked), retrying" in w.save_label.text(),
                        timeout=10000)
        assert w.send_btn.isEnabled() is False  # waiting for the message to be on disk: Stop works
        assert w.stop_btn.isEnabled()
        assert [x.text for x in w.chat.widgets][:1] == ["during the lock"]  # shown, not yet saved
        other.execute("ROLLBACK")
        with qtbot.waitSignal(w.answer_finished, timeout=15000) as done:
            pass
        assert done.args == ["done"]
        assert w.writer.flush(10)
        qtbot.waitUntil(lambda: w.save_label.text() == "", timeout=5000)
        msgs = w.history.messages(w.conv.id)
        assert [(m.role, m.status) for m in msgs] == [("user", "done"), ("assistant", "done")]
        assert msgs[0].content == "during the lock" and msgs[1].content.startswith("Echo: during the lock")
        assert w.send_btn.isEnabled()
    finally:
        other.close()
