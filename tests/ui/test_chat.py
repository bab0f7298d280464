"""The chat window over the fake engine: streaming, stop, regenerate, edit, crash recovery, errors."""
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest



def send_and_wait(qtbot, w, text: str, timeout: int = 15000) -> str:
    with qtbot.waitSignal(w.answer_finished, timeout=timeout) as blocker:
        assert w.send(text)
    assert w.writer.flush(10)
    return blocker.args[0]


def contents(w) -> list[tuple[str, str, str]]:
    assert w.writer.flush(10)
    return [(m.role, m.content, m.status) for m in w.history.messages(w.conv.id)]


def test_streams_an_answer_and_saves_both_messages(qtbot, loaded_window):
    w = loaded_window
    assert send_and_wait(qtbot, w, "hello there") == "done"
    assert w.writer.flush(10)
    msgs = w.history.messages(w.conv.id)
    assert [(m.role, m.status) for m in msgs] == [("user", "done"), ("assistant", "done")]
    assert msgs[0].content == "hello there"
    assert msgs[1].content.startswith("Echo: hello there w0 w1")
    assert msgs[1].stats["final"] is True and msgs[1].stats["n_gen"] > 1
    widget = w.chat.widgets[-1]
    assert widget.text == msgs[1].content
    assert "Echo: hello there" in widget.body.toPlainText()
    assert w.conv.title == "hello there"
    assert w.send_btn.isEnabled() and not w.stop_btn.isEnabled()


def test_user_message_is_committed_before_the_engine_is_asked(qtbot, loaded_window, monkeypatch):
    w = loaded_window
    seen = []
    real = w.engine.generate

    def spy(**kw):
        db = sqlite3.connect(w.history.path)  # another connection: only committed rows are visible
        seen.append(db.execute("SELECT role, content FROM messages ORDER BY id").fetchall())
        db.close()
        return real(**kw)

    monkeypatch.setattr(w.engine, "generate", spy)
    send_and_wait(qtbot, w, "is it saved?")
    assert seen == [[("user", "is it saved?"), ("assistant", "")]]  # answer row waits, empty


def test_stop_keeps_the_partial_answer(qtbot, window, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_TOKENS_PER_S", "40")
    monkeypatch.setenv("FAKE_ENGINE_REPLY_TOKENS", "400")
    w = window
    with qtbot.waitSignal(w.engine.loaded, timeout=15000):
        w.load_model(str(tmp_path / "m.gguf"))
    with qtbot.waitSignal(w.engine.token, timeout=10000):
        w.send("count slowly")
    assert w.stop_btn.isEnabled()
    with qtbot.waitSignal(w.answer_finished, timeout=5000) as blocker:
        w.stop_btn.click()
    assert blocker.args == ["cancelled"]
    assert w.writer.flush(10)
    role, text, status = contents(w)[1]
    assert role == "assistant" and status == "cancelled"
    assert text.startswith("Echo:") and "w399" not in text
    assert w.chat.widgets[-1].status == "cancelled"


def test_regenerate_replaces_the_answer(qtbot, loaded_window):
    w = loaded_window
    send_and_wait(qtbot, w, "first question")
    assert w.writer.flush(10)
    first_answer = w.history.messages(w.conv.id)[1]
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        w.chat.widgets[-1].regen_btn.click()
    assert w.writer.flush(10)
    msgs = w.history.messages(w.conv.id)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].created > first_answer.created and msgs[1].status == "done"
    assert len(w.chat.widgets) == 2


def test_edit_and_resend_replaces_the_rest(qtbot, loaded_window):
    w = loaded_window
    send_and_wait(qtbot, w, "one")
    send_and_wait(qtbot, w, "two")
    first_user = w.chat.widgets[0]
    first_user.edit_btn.click()
    assert w.input.toPlainText() == "one"
    w.input.setPlainText("one, edited")
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        w.send_btn.click()
    assert [(r, c.split(" w0")[0]) for r, c, _ in contents(w)] == [
        ("user", "one, edited"), ("assistant", "Echo: one, edited")]


def test_copy_puts_the_message_on_the_clipboard(qtbot, loaded_window):
    from PySide6.QtGui import QGuiApplication

    w = loaded_window
    send_and_wait(qtbot, w, "copy me")
    w.chat.widgets[-1].copy_btn.click()
    assert w.writer.flush(10)
    assert QGuiApplication.clipboard().text() == w.history.messages(w.conv.id)[1].content


def test_engine_crash_loses_nothing_and_restarts(qtbot, loaded_window):
    w = loaded_window
    send_and_wait(qtbot, w, "a normal question")
    with qtbot.waitSignals([w.engine.crashed, w.answer_finished, w.engine.loaded],
                           timeout=20000, order="none"):
        w.send("__crash__ now")
    qtbot.waitUntil(lambda: "nothing was lost" in w.banner.text, timeout=10000)
    shown = [(level, text) for _, level, text in w.banner.messages]
    assert ("error", "the engine stopped (killed by SIGKILL); restarting") in shown
    msgs = contents(w)
    assert msgs[:2] == [("user", "a normal question", "done"), msgs[1]]
    assert msgs[2] == ("user", "__crash__ now", "done")
    role, text, status = msgs[3]
    assert role == "assistant" and status == "partial" and text.startswith("Echo:")
    assert w.chat.widgets[-1].status == "partial"
    # The restarted engine has the model again and the conversation goes on.
    assert w.engine.loaded_event is not None
    assert send_and_wait(qtbot, w, "still there?") == "done"
    assert len(contents(w)) == 6
    assert w.chat.widgets[-1].text.startswith("Echo: still there?")


def test_killed_engine_mid_answer_keeps_partial(qtbot, window, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_TOKENS_PER_S", "50")
    monkeypatch.setenv("FAKE_ENGINE_REPLY_TOKENS", "1000")
    w = window
    with qtbot.waitSignal(w.engine.loaded, timeout=15000):
        w.load_model(str(tmp_path / "m.gguf"))
    with qtbot.waitSignal(w.engine.token, timeout=10000):
        w.send("long answer please")
    qtbot.waitUntil(lambda: len(w.session.answer.content) > 30, timeout=10000)
    with qtbot.waitSignals([w.answer_finished, w.engine.loaded], timeout=20000, order="none"):
        w.engine.kill()
    _, (role, text, status) = contents(w)
    assert status == "partial" and text.startswith("Echo: long answer please")


def test_load_failure_shows_llama_reason(qtbot, window, tmp_path):
    with qtbot.waitSignal(window.engine.error, timeout=15000):
        window.load_model(str(tmp_path / "bad-model.gguf"))
    assert window.banner.level == "error"
    assert "data is not within the file bounds" in window.banner.text
    assert window.model_label.text() == "No model loaded"
    assert not window.send("hello")  # nothing loaded: refused with a message, nothing saved
    assert "no model is loaded" in window.banner.text


def test_out_of_memory_suggests_fewer_layers(qtbot, bridge, history, tmp_path):
    from ggufdesk.core.settings import LoadSettings, SpeculationSettings
    from ggufdesk.ui.main_window import MainWindow

    w = MainWindow(engine=bridge, history=history, persist_settings=False,
                   recommended=lambda: (LoadSettings(n_gpu_layers=12, n_ctx=2048),
                                        SpeculationSettings()))
    qtbot.addWidget(w)
    with qtbot.waitSignal(bridge.error, timeout=15000):
        w.load_model(str(tmp_path / "oom-model.gguf"))
    assert "fewer GPU layers or a smaller context" in w.banner.text
    assert "12 GPU layers, context 2048" in w.banner.text


def test_generation_error_marks_the_answer(qtbot, loaded_window):
    w = loaded_window
    assert send_and_wait(qtbot, w, "__error__") == "error"
    assert contents(w)[1][2] == "error"
    assert "fake generation error" in w.banner.text


def test_completion_mode_for_a_base_model(qtbot, window, tmp_path, monkeypatch):
    from ggufdesk.core import library

    monkeypatch.setattr(library, "entries", lambda **kw: [])  # no starter, nothing on disk
    w = window
    with qtbot.waitSignal(w.engine.loaded, timeout=15000):
        w.load_model(str(tmp_path / "gemma-base.gguf"))
    qtbot.waitUntil(lambda: "is a base model: it continues the text you start" in w.banner.text,
                    timeout=15000)
    # offline with no chat model on this computer: no model is named that could not be had
    assert w.banner.text.endswith("choose a chat-tuned model (Model ▸ Choose model…).")
    conv = w.new_conversation()
    assert conv.mode == "completion" and w.mode_label.text() == "continue-text mode"
    assert w.send_btn.text() == "Continue" and "Write the beginning of a text" in w.input.placeholderText()
    sent = []
    real = w.engine.generate
    w.engine.generate = lambda **kw: (sent.append(kw), real(**kw))[1]
    send_and_wait(qtbot, w, "Once upon a time")
    assert sent[0]["prompt"] == "Once upon a time" and sent[0]["messages"] is None


def test_continue_with_an_empty_box_writes_on(qtbot, window, tmp_path):
    w = window
    with qtbot.waitSignal(w.engine.loaded, timeout=15000):
        w.load_model(str(tmp_path / "gemma-base.gguf"))
    w.new_conversation()
    w.send_btn.click()  # nothing written yet: said, not silently ignored
    assert "write the beginning of a text first" in w.banner.text
    send_and_wait(qtbot, w, "Once upon a time")
    assert w.input.toPlainText() == "" and w.send_btn.text() == "Continue"
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        w.send_btn.click()
    assert [t.role for t in w.session.turns] == ["user", "assistant", "assistant"]


def test_conversations_new_rename_search_delete_export(qtbot, loaded_window, tmp_path, monkeypatch):
    import json

    from PySide6.QtWidgets import QInputDialog

    w = loaded_window
    send_and_wait(qtbot, w, "about pasta")
    pasta = w.conv.id
    w.new_conversation()
    send_and_wait(qtbot, w, "about physics")
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Physics chat", True))
    w.rename_btn.click()
    assert w.writer.flush(10)
    assert w.history.get_conversation(w.conv.id).title == "Physics chat"
    with qtbot.waitSignal(w.conv_model.modelReset, timeout=5000):
        w.search.setText("pasta")
    assert w.conv_model.rowCount() == 1 and w.conv_model.conversation(0).id == pasta
    md = export(qtbot, w, tmp_path / "chat.md")
    data = json.loads(export(qtbot, w, tmp_path / "chat.json").read_text())
    assert md.read_text().startswith("# Physics chat")
    assert data["messages"][0]["content"] == "about physics"
    assert export(qtbot, w, tmp_path / "no" / "such" / "dir.md") is None
    assert w.banner.level == "error"
    gone = w.conv.id
    w.delete_current(confirm=False)
    assert w.writer.flush(10)
    with pytest.raises(KeyError):
        w.history.get_conversation(gone)
    assert w.conv_model.row_of(gone) == -1


def test_selecting_a_conversation_loads_it_off_the_gui_thread(qtbot, loaded_window):
    w = loaded_window
    send_and_wait(qtbot, w, "first chat")
    first = w.conv.id
    w.new_conversation()
    assert w.chat.widgets == []
    with qtbot.waitSignal(w.conversation_loaded, timeout=5000) as blocker:
        w.conv_list.setCurrentIndex(w.conv_model.index(w.conv_model.row_of(first)))
    assert blocker.args == [first]
    assert [x.role for x in w.chat.widgets] == ["user", "assistant"]


def export(qtbot, w, path):
    with qtbot.waitSignal(w.exported, timeout=10000) as blocker:
        w.export_current(str(path))
    return blocker.args[0]


def _drop(w, path) -> None:
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDropEvent

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    from PySide6.QtCore import Qt

    w.dropEvent(QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))


def test_dropping_a_gguf_adds_it_to_the_library_and_loads_it(qtbot, window, tiny_model, tmp_path):
    from ggufdesk.core import library

    with qtbot.waitSignal(window.engine.loaded, timeout=15000) as blocker:
        _drop(window, tiny_model)
    assert blocker.args[0].model == str(tiny_model)
    assert [m.path for m in library.user_models()] == [tiny_model.resolve()]
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("not a model")
    _drop(window, bogus)  # refused with a message; nothing remembered
    assert "not a GGUF" in window.banner.text
    assert len(library.user_models()) == 1


def test_export_starts_in_documents_then_where_the_last_export_went(qtbot, loaded_window, tmp_path,
                                                                   monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    w = loaded_window
    send_and_wait(qtbot, w, "a/b: notes?")
    asked = []
    target = tmp_path / "exports" / "mine.md"
    target.parent.mkdir()
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda _parent, _title, path, _filter: (asked.append(path),
                                                                             (str(target), ""))[1]))
    with qtbot.waitSignal(w.exported, timeout=10000):
        w.export_current()
    first = Path(asked[0])
    assert first.parent != Path.cwd() and first.name == "a-b- notes.md"  # no folder from the title
    assert target.read_text().startswith("# a/b: notes?") and "**You:**" in target.read_text()
    with qtbot.waitSignal(w.exported, timeout=10000):
        w.export_current()
    assert Path(asked[1]).parent == target.parent


def test_the_base_model_banner_names_a_chat_model_on_this_computer(qtbot, window, tmp_path,
                                                                   monkeypatch):
    from ggufdesk.core import library
    from tests.fixtures.ggufs import TinySpec, write_tiny_llama

    monkeypatch.setattr(library, "starter_models", lambda: [])  # only what the user added
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    library.add_path(write_tiny_llama(tmp_path / "Tiny-Instruct.gguf", TinySpec(chat_template=chatml)))
    library.add_path(write_tiny_llama(tmp_path / "Fake-Instruct.gguf"))  # says it chats; has no template
    with qtbot.waitSignal(window.engine.loaded, timeout=15000):
        window.load_model(str(tmp_path / "gemma-base.gguf"))
    qtbot.waitUntil(lambda: "is a base model" in window.banner.text, timeout=15000)
    assert "e.g. Tiny-Instruct.gguf (tiny-instruct), which is on this computer" in window.banner.text
