"""Press every button, action and menu entry of every window, page and dialog, with and without a model.

Any exception in a slot, Qt warning, bug logged by a callback, hang (faulthandler_timeout dumps every
thread's stack) or crash (faulthandler prints the stack of a segfault) fails the test.
"""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from tests.ui.presser import Presser
from tests.ui.test_wizard import FakeServices


@pytest.fixture
def presser(qtbot, monkeypatch, tmp_path):
    made = []

    def make(**kw) -> Presser:
        p = Presser(qtbot, monkeypatch, tmp_path, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture(autouse=True)
def small_library(monkeypatch, tmp_path):
    """The model switcher lists two small models (not the installed starters, which pressing would
    check or assemble: hundreds of MB)."""
    from ggufdesk.core.library import LocalModel
    from ggufdesk.ui import model_switcher

    models = []
    for name in ("tiny-a", "tiny-b"):
        f = tmp_path / f"{name}.gguf"
        f.write_bytes(b"GGUF" + b"\0" * 64)
        models.append(LocalModel(f, f.name, 68, "user", None, id=name))
    monkeypatch.setattr(model_switcher, "list_library", lambda: list(models))
    return models


@pytest.fixture
def app_window(qtbot, fake_command, tmp_path):
    """The window as the app builds it (build_main_window), on the fake engine and fake services."""
    from ggufdesk.ui.app import build_main_window

    win, engine, history, choose_model = build_main_window(
        engine_command=fake_command, services=FakeServices(tmp_path, online=False))
    win._persist = False
    qtbot.addWidget(win)
    win.resize(1000, 700)
    win.show()
    qtbot.waitExposed(win)
    yield win
    win.close()
    engine.shutdown(timeout=3)
    history.close()


def window_settle(win, qtbot):
    def settle() -> None:
        qtbot.waitUntil(lambda: not win.session.busy, timeout=15000)
        assert win.writer.flush(10.0)
        QApplication.processEvents()  # what the writer reported back
        qtbot.waitUntil(lambda: tasks_idle(), timeout=15000)
        qtbot.waitUntil(lambda: win.docs.job is None, timeout=30000)  # attached documents indexed
    return settle


def seed_conversation(win, qtbot) -> None:
    """Two turns, so messages with Copy / Edit / Regenerate exist."""
    with qtbot.waitSignal(win.answer_finished, timeout=15000):
        win.send("first question")
    win.input.setPlainText("a draft the Send button will send")


def test_main_window_without_a_model(qtbot, app_window, presser):
    win = app_window
    p = presser(settle=window_settle(win, qtbot))
    win.input.setPlainText("hello")
    pressed = p.press_all(win)
    p.assert_clean()
    names = " ".join(pressed)
    for expected in ("New chat", "Send", "Rename", "Export", "Choose model", "Engine settings",
                     "Conversation settings"):
        assert expected in names, (expected, pressed)
    assert "ModelWizard" in p.dialogs and "SettingsDialog" in p.dialogs


def test_main_window_with_a_model(qtbot, app_window, presser, tmp_path):
    win = app_window
    with qtbot.waitSignal(win.engine.loaded, timeout=15000):
        win.load_model(str(tmp_path / "model-instruct.gguf"))
    seed_conversation(win, qtbot)
    p = presser(settle=window_settle(win, qtbot))
    # Stop (and Esc) only work while an answer streams: press them then.
    for stop in (win.stop_btn.click, win.stop_action.trigger):
        with qtbot.waitSignal(win.answer_finished, timeout=15000):
            win.send("a long answer")
            assert win.stop_btn.isEnabled() and win.stop_action.isEnabled()
            stop()
    with qtbot.waitSignal(win.answer_finished, timeout=15000):  # an answer with two versions
        win.regenerate(win.session.turns[1].key)
    p.settle()
    win.input.setPlainText("a draft the Send button will send")
    pressed = p.press_all(win, rounds=3)
    p.assert_clean()
    names = " ".join(pressed)
    for expected in ("Copy", "Edit", "Regenerate", "Send", "Delete", "Export", "‹", "New chat",
                     "Search conversations", "Go to the message box", "Enter sends", "Quit", "Attach files…",
                     "Attach folder…", "×", "tiny-a  —", "tiny-b  —", "Choose or download a model",
                     "Load in the server"):
        assert expected in names, (expected, pressed)
    assert pressed[-1].endswith("Quit") and not win.isVisible()


def test_main_window_with_an_mcp_tool_call(qtbot, presser, fake_command, tmp_path):
    """An MCP server in mcp.json, a call card waiting for permission: every button of the window,
    the card (Allow once / Always / Deny) and the MCP servers page (Tools ▸ MCP servers…)."""
    import json

    from ggufdesk.core.mcp.config import mcp_config_path
    from ggufdesk.ui.app import build_main_window
    from tests.fixtures.mcp_servers import stdio_entry

    mcp_config_path().parent.mkdir(parents=True, exist_ok=True)
    mcp_config_path().write_text(json.dumps({"mcpServers": {"calc": stdio_entry("only=add,echo")}}))
    win, engine, history, _ = build_main_window(engine_command=fake_command,
                                                services=FakeServices(tmp_path, online=False))
    win._persist = False
    qtbot.addWidget(win)
    win.resize(1000, 700)
    win.show()
    try:
        with qtbot.waitSignal(win.engine.loaded, timeout=15000):
            win.load_model(str(tmp_path / "model-instruct.gguf"))
        win.send('add please __call__ add {"a": 2, "b": 3}')
        qtbot.waitUntil(lambda: any(c.state == "asking" for c in win.chat.cards), timeout=60000)

        def settle() -> None:  # the tool runs on its own thread: wait for the loop to finish
            qtbot.waitUntil(lambda: win.session.phase in ("idle", "tool") and not any(
                c.state == "running" for c in win.chat.cards), timeout=60000)
            window_settle(win, qtbot)() if win.session.phase == "idle" else None

        p = presser(settle=settle)
        pressed = p.press_all(win, rounds=2)
        p.assert_clean()
    finally:
        if win.isVisible():
            win.close()
        engine.shutdown(timeout=3)
        history.close()
    names = " ".join(pressed)
    for expected in ("Allow once", "Always for this tool", "MCP servers", "Add", "Remove", "Start / restart"):
        assert expected in names, (expected, pressed)
    assert "McpServersDialog" in p.dialogs


def test_every_wizard_page(qtbot, presser, tmp_path):
    from ggufdesk.ui.wizard import ModelWizard

    p = presser()
    wiz = ModelWizard(FakeServices(tmp_path))
    qtbot.addWidget(wiz)
    with qtbot.waitSignal(wiz.probe_done, timeout=5000):
        wiz.show()
    seen = []
    for _ in range(6):  # hardware, models, download, finish (and back again)
        page = wiz.currentPage()
        seen.append(type(page).__name__)
        p.settle()
        p.press_all(page)
        p.settle()
        if wiz.currentId() == wiz.startId() or not wiz.button(wiz.WizardButton.NextButton).isEnabled():
            if not wiz.button(wiz.WizardButton.NextButton).isVisible():
                break
        next_btn = wiz.button(wiz.WizardButton.NextButton)
        if next_btn.isVisible() and next_btn.isEnabled():
            next_btn.click()
            p.settle()
        else:
            break
    for which in (wiz.WizardButton.BackButton, wiz.WizardButton.CancelButton):
        b = wiz.button(which)
        if b.isVisible() and b.isEnabled():
            p.press(b)
    p.assert_clean()
    assert {"HardwarePage", "ModelPage"} <= set(seen)


@pytest.mark.parametrize("with_estimate", [False, True])
def test_settings_dialog(qtbot, presser, with_estimate):
    from ggufdesk.core.settings import LoadSettings, SpeculationSettings
    from ggufdesk.ui.settings_dialog import SettingsDialog
    from tests.ui.test_settings_guard import fake_estimate

    p = presser()
    dlg = SettingsDialog(LoadSettings(), SpeculationSettings(mode="draft", draft_model="/x.gguf"),
                         n_ctx_train=32768 if with_estimate else 0,
                         estimate=fake_estimate if with_estimate else None)
    qtbot.addWidget(dlg)
    dlg.show()
    pressed = p.press_all(dlg)
    p.assert_clean()
    assert any("Reset to recommended" in n for n in pressed) and any("Browse" in n for n in pressed)


def test_conversation_dialog(qtbot, presser):
    from ggufdesk.core.settings import SamplingSettings
    from ggufdesk.ui.conversation_dialog import ConversationDialog

    p = presser()
    dlg = ConversationDialog(system_prompt="", sampling=SamplingSettings(), mode="chat")
    qtbot.addWidget(dlg)
    dlg.show()
    p.press_all(dlg)
    p.assert_clean()


def test_gauges_and_banner(qtbot, presser):
    from ggufdesk.ui.gauges import GaugePanel
    from ggufdesk.ui.notify import Banner

    p = presser()
    banner = Banner()
    qtbot.addWidget(banner)
    banner.notify("something went wrong", "error")
    banner.show()
    assert any("Close" in n or "✕" in n for n in p.press_all(banner))
    assert banner.isHidden()
    panel = GaugePanel()
    qtbot.addWidget(panel)
    panel.show()
    p.press_all(panel)
    p.assert_clean()


def test_replay_wizard_open_error_enter_back_cancel(qtbot, presser, tmp_path, monkeypatch):
    """Issue item 3: a segfault was seen once after this sequence; replayed on the real services."""
    import huggingface_hub.constants

    from PySide6.QtWidgets import QFileDialog

    from ggufdesk.ui.services import ModelServices
    from ggufdesk.ui.wizard import MODEL_PAGE, ModelWizard

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # offline, as reported
    p = presser()
    broken = tmp_path / "not-a-model.gguf"
    broken.write_bytes(b"this is not a GGUF file")
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(broken), "GGUF models (*.gguf)")))
    for _ in range(3):
        wiz = ModelWizard(ModelServices())  # deleted below, as the app's wizard is
        with qtbot.waitSignal(wiz.probe_done, timeout=60000):
            wiz.show()
        with qtbot.waitSignal(wiz.choices_loaded, timeout=30000):
            wiz.next()
        page = wiz.model_page
        page.file_btn.click()  # Open .gguf -> an error in the status line
        p.settle()
        assert page.status.text()
        page.repo.setFocus()
        qtbot.keyClicks(page.repo, str(tmp_path / "typed" / "model.gguf"))
        qtbot.keyClick(page.repo, Qt.Key.Key_Return)  # + Enter
        assert wiz.currentId() == MODEL_PAGE
        wiz.back()  # Back
        wiz.reject()  # Cancel
        wiz.deleteLater()
        p.settle()
        qtbot.waitUntil(lambda: tasks_idle(), timeout=30000)
    p.assert_clean()


def tasks_idle() -> bool:
    from ggufdesk.ui import tasks

    return tasks.manager().idle
