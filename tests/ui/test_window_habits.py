"""The window's habits: chat-app keys, a small screen, restarts, a failed load, a base model's banner."""
from __future__ import annotations

from PySide6.QtCore import QRect, QSettings, Qt
from PySide6.QtWidgets import QApplication

from tests.ui.test_chat import send_and_wait


def test_enter_sends_and_shift_enter_is_a_new_line(qtbot, loaded_window):
    w = loaded_window
    w.input.setFocus()
    qtbot.keyClicks(w.input, "first line")
    qtbot.keyClick(w.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(w.input, "second line")
    assert w.input.toPlainText() == "first line\nsecond line" and not w.session.busy
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        qtbot.keyClick(w.input, Qt.Key.Key_Return)
    assert w.session.turns[0].content == "first line\nsecond line"
    assert w.input.toPlainText() == ""


def test_enter_can_make_new_lines_instead(qtbot, loaded_window):
    w = loaded_window
    w.enter_action.setChecked(False)
    assert QSettings().value("chat/enter_sends", type=bool) is False  # remembered
    assert "Ctrl+Enter sends" in w.input.placeholderText()
    w.input.setFocus()
    qtbot.keyClicks(w.input, "a")
    qtbot.keyClick(w.input, Qt.Key.Key_Return)
    qtbot.keyClicks(w.input, "b")
    assert w.input.toPlainText() == "a\nb" and not w.session.busy
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        qtbot.keyClick(w.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    w.enter_action.setChecked(True)


def test_escape_stops_and_shortcuts_exist(qtbot, loaded_window):
    w = loaded_window
    keys = {a.text(): a.shortcut().toString() for a in
            (w.new_action, w.find_action, w.focus_action, w.stop_action, w.quit_action)}
    assert keys == {"New chat": "Ctrl+N", "Search conversations": "Ctrl+F",
                    "Go to the message box": "Ctrl+L", "Stop the answer": "Esc", "Quit": "Ctrl+Q"}
    assert not w.stop_action.isEnabled()  # Esc means nothing while no answer is written
    with qtbot.waitSignal(w.answer_finished, timeout=15000) as done:
        w.send("stop me")
        assert w.stop_action.isEnabled()
        w.stop_action.trigger()
    assert done.args[0] in ("cancelled", "done")
    w.find_action.trigger()
    assert QApplication.focusWidget() is w.search or not w.isActiveWindow()
    w.focus_action.trigger()
    before = w.conv  # its row id may still be on its way to the database (the writer is async)
    w.new_action.trigger()
    assert w.conv is not None and w.conv is not before and not w.session.turns


def test_tab_leaves_the_message_box(qtbot, loaded_window):
    w = loaded_window
    assert w.input.tabChangesFocus()
    w.input.setPlainText("x")
    qtbot.keyClick(w.input, Qt.Key.Key_Tab)
    assert w.input.toPlainText() == "x"  # no tab character typed


def test_usable_at_800_by_600(qtbot, loaded_window):
    w = loaded_window
    send_and_wait(qtbot, w, "hello")
    hint = w.minimumSizeHint()
    assert hint.width() <= 800 and hint.height() <= 600, hint
    w.resize(800, 600)
    qtbot.waitUntil(lambda: w.width() == 800 and w.height() == 600, timeout=3000)
    QApplication.processEvents()
    area = QRect(0, 0, w.width(), w.height())
    for widget in (w.input, w.send_btn, w.stop_btn, w.chat, w.new_btn):
        top_left = widget.mapTo(w, widget.rect().topLeft())
        rect = QRect(top_left, widget.size())
        assert widget.isVisible() and area.contains(rect), (widget, rect)
    # the gauges are either fully inside the window or folded away by the user, never cut off
    assert w.gauges.widget().width() <= w.gauges.viewport().width()  # nor their contents
    g = QRect(w.gauges.mapTo(w, w.gauges.rect().topLeft()), w.gauges.size())
    assert w.gauges.width() == 0 or area.contains(g)


def test_last_conversation_and_draft_come_back(qtbot, bridge, history, tmp_path):
    from ggufdesk.ui.main_window import MainWindow

    qs = QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat)
    w1 = MainWindow(engine=bridge, history=history, persist_settings=False)
    qtbot.addWidget(w1)
    with qtbot.waitSignal(bridge.loaded, timeout=15000):
        w1.load_model(str(tmp_path / "model-instruct.gguf"))
    send_and_wait(qtbot, w1, "remember me")
    assert w1.writer.flush(10)
    conv_id = w1.conv.id
    w1.input.setPlainText("an unsent draft")
    w1.save_geometry(qs)
    w1.close()
    w2 = MainWindow(engine=bridge, history=history, persist_settings=False)
    qtbot.addWidget(w2)
    with qtbot.waitSignal(w2.conversation_loaded, timeout=10000):
        w2.restore_state(QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat))
    assert w2.conv.id == conv_id and w2.session.turns[0].content == "remember me"
    assert w2.input.toPlainText() == "an unsent draft"


def test_a_failed_load_keeps_the_previous_model(qtbot, loaded_window, tmp_path):
    w = loaded_window
    good = w.engine.loaded_event.model
    with qtbot.waitSignal(w.engine.loaded, timeout=15000) as again:
        w.load_model(str(tmp_path / "bad-model.gguf"))
    assert again.args[0].model == good  # loaded again after the failure
    assert "could not load the model" in " ".join(t for _, _, t in w.banner.messages)
    assert w.switcher.text().startswith("model-instruct") and "ctx" in w.model_label.text()  # name in the switcher
    assert w.gauges.memory  # the gauges show the model that is loaded
    send_and_wait(qtbot, w, "still works")


def test_a_failed_load_with_nothing_before_leaves_nothing_loaded(qtbot, window, tmp_path):
    w = window
    with qtbot.waitSignal(w.engine.error, timeout=15000):
        w.load_model(str(tmp_path / "bad-model.gguf"))
    assert w.model_label.text() == "No model loaded" and not w.gauges.memory


def test_the_base_model_banner_is_not_shown_on_every_launch(qtbot, bridge, history, tmp_path):
    from ggufdesk.ui import tasks
    from ggufdesk.ui.main_window import MainWindow

    shown = []
    for _ in range(2):
        w = MainWindow(engine=bridge, history=history, persist_settings=False)
        qtbot.addWidget(w)
        with qtbot.waitSignal(bridge.loaded, timeout=15000):
            w.load_model(str(tmp_path / "gemma-base.gguf"))
        qtbot.waitUntil(lambda: tasks.manager().idle, timeout=15000)  # the banner's words are found off the GUI thread
        shown.append(any("is a base model" in t for _, _, t in w.banner.messages))
        w.close()
    assert shown == [True, False]
