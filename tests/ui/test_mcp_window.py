"""MCP tools in the window: "what is 2+3 — use the tool" shows a call card, Allow once runs the add
server's tool, and the answer carries its result (the fake engine plays a scripted tool-calling model)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ggufdesk.core.mcp.config import load_mcp_config, mcp_config_path
from tests.fixtures.mcp_servers import stdio_entry

ASK = 'what is 2+3 — use the tool __call__ add {"a": 2, "b": 3}'
WAIT_MS = 60000


@pytest.fixture
def mcp_window(qtbot, bridge, history, tmp_path):
    """The main window with an `add` server in mcp.json, a model loaded in the fake engine."""
    from ggufdesk.ui.main_window import MainWindow

    mcp_config_path().parent.mkdir(parents=True, exist_ok=True)
    mcp_config_path().write_text(json.dumps({"mcpServers": {"calc": stdio_entry()}}))
    w = MainWindow(engine=bridge, history=history, persist_settings=False)
    qtbot.addWidget(w)
    w.resize(1100, 720)
    w.show()
    with qtbot.waitSignal(w.engine.loaded, timeout=15000):
        w.load_model(str(tmp_path / "model-instruct.gguf"))
    yield w
    w.close()


def ask_and_wait_for_the_card(qtbot, w):
    w.send(ASK)
    qtbot.waitUntil(lambda: any(c.state == "asking" for c in w.chat.cards), timeout=WAIT_MS)
    (card,) = w.chat.cards
    return card


def test_call_card_allow_once_and_the_answer_has_the_result(qtbot, mcp_window, tmp_path):
    w = mcp_window
    card = ask_and_wait_for_the_card(qtbot, w)
    assert (card.server, card.tool) == ("calc", "add") and '"a": 2' in card.args.text()
    assert w.session.phase == "tool" and w.stop_btn.isEnabled() and not w.send_btn.isEnabled()
    assert w.focusWidget() is card.allow_btn  # the keyboard is on the card: Space allows
    with qtbot.waitSignal(w.answer_finished, timeout=WAIT_MS, check_params_cb=lambda s: s == "done"):
        card.allow_btn.click()
    qtbot.waitUntil(lambda: w.chat.widgets[-1].text == "Tool said: 5", timeout=WAIT_MS)
    assert card.state == "done" and card.text == "5" and card.message_id
    assert [x.role for x in w.chat.widgets] == ["user", "assistant", "assistant"]
    assert not w.chat.widgets[1].tools.isVisible()  # the call is on the card, not repeated as text
    w.grab().save(str(tmp_path / "mcp-call.png"))
    # read back from the history: the tool message is its own card again
    w.writer.flush(10)
    w.open_conversation(w.conv.id)
    qtbot.waitUntil(lambda: len(w.chat.cards) == 1 and w.chat.cards[0] is not card, timeout=10000)
    assert w.chat.cards[0].text == "5" and w.chat.cards[0].state == "done"


def test_deny_and_always_from_the_card(qtbot, mcp_window):
    w = mcp_window
    card = ask_and_wait_for_the_card(qtbot, w)
    with qtbot.waitSignal(w.answer_finished, timeout=WAIT_MS):
        card.deny_btn.click()
    qtbot.waitUntil(lambda: w.chat.widgets[-1].text.startswith("Tool said: The user did not allow"),
                    timeout=WAIT_MS)
    assert card.state == "denied"
    card2 = None

    def second() -> bool:
        nonlocal card2
        card2 = next((c for c in w.chat.cards if c.state == "asking"), None)
        return card2 is not None

    w.send(ASK)
    qtbot.waitUntil(second, timeout=WAIT_MS)
    with qtbot.waitSignal(w.answer_finished, timeout=WAIT_MS):
        card2.always_btn.click()
    assert load_mcp_config(mcp_config_path()).servers["calc"].always_allow == ("add",)
    n = len(w.chat.cards)
    with qtbot.waitSignal(w.answer_finished, timeout=WAIT_MS):
        w.send(ASK)
    qtbot.waitUntil(lambda: len(w.chat.cards) == n + 1 and w.chat.cards[-1].state == "done", timeout=WAIT_MS)


def test_stop_while_a_card_waits(qtbot, mcp_window):
    w = mcp_window
    card = ask_and_wait_for_the_card(qtbot, w)
    w.stop_action.trigger()  # Esc
    qtbot.waitUntil(lambda: not w.session.busy, timeout=10000)
    assert card.state == "stopped" and not card.allow_btn.isVisible() and w.send_btn.isEnabled()


def test_the_page_turns_a_server_off_for_this_conversation(qtbot, mcp_window, monkeypatch):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QDialog

    w = mcp_window
    w.new_conversation()
    seen = []

    def fake_exec(dlg) -> int:
        seen.append(dlg)
        dlg.list.item(0).setCheckState(Qt.CheckState.Unchecked)
        return 0

    monkeypatch.setattr(QDialog, "exec", fake_exec)
    w.mcp_action.trigger()
    assert seen and w.conv.mcp_off == ("calc",)
    with qtbot.waitSignal(w.answer_finished, timeout=WAIT_MS):
        w.send(ASK)  # no tools offered: the fake model just answers
    assert w.chat.cards == [] and w.chat.widgets[-1].text.startswith("Echo:")


def test_the_window_does_not_import_the_mcp_sdk_nor_start_servers(tmp_path):
    code = ("import sys, json, pathlib;"
            "from ggufdesk.core.mcp.config import mcp_config_path;"
            "p = mcp_config_path(); p.parent.mkdir(parents=True, exist_ok=True);"
            "p.write_text(json.dumps({'mcpServers': {n: {'command': 'false'} for n in 'abc'}}));"
            "from PySide6.QtWidgets import QApplication; app = QApplication([]);"
            "import ggufdesk.ui.app, ggufdesk.ui.main_window as m;"
            "from ggufdesk.core.history import History;"
            "from ggufdesk.ui.engine_adapter import EngineBridge;"
            "w = m.MainWindow(engine=EngineBridge(command=['true']), history=History(memory=True), persist_settings=False);"
            "print(len(w.mcp_host.config.servers), w.mcp_host.started, 'mcp' in sys.modules, 'anyio' in sys.modules)")
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.split() == ["3", "False", "False", "False"], out.stderr[-2000:]
