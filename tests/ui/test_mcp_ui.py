"""The MCP servers page and the tool-call card: validated as you type, keyboard-reachable, and every
button pressed (press-everything style)."""
from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt

from ggufdesk.core.mcp.config import load_mcp_config, parse_config, save_mcp_config
from ggufdesk.core.mcp.host import McpHost
from ggufdesk.ui.mcp_dialog import McpServersDialog, McpSignals
from ggufdesk.ui.tool_card import ToolCallCard
from tests.fixtures.mcp_servers import stdio_entry
from tests.ui.presser import Presser


@pytest.fixture
def setup(qtbot, tmp_path):
    path = tmp_path / "mcp.json"
    config = parse_config({"mcpServers": {"calc": stdio_entry(alwaysAllow=["add"]),
                                          "web": {"url": "http://127.0.0.1:9/mcp"}}})
    save_mcp_config(config, path)
    signals = McpSignals()
    host = McpHost(config, log_dir=tmp_path / "logs", on_change=signals.changed.emit)
    other = tmp_path / "claude.json"
    other.write_text(json.dumps({"mcpServers": {"fs": {"command": "npx", "args": ["-y", "server-fs"]},
                                                "calc": {"command": "other"}}}))
    dlg = McpServersDialog(host, save=lambda c: save_mcp_config(c, path), signals=signals,
                           conversation_off=("web",), sources=[("Claude Desktop", other)])
    qtbot.addWidget(dlg)
    dlg.show()
    yield dlg, host, path
    host.close()


def test_validated_as_you_type_and_saved(qtbot, setup):
    dlg, host, path = setup
    assert [dlg.list.item(i).text() for i in range(dlg.list.count())] == ["calc", "web"]
    dlg.list.setCurrentRow(1)
    assert dlg.editor.kind.currentData() == "http" and not dlg.save_btn.isEnabled()
    dlg.editor.url.clear()
    qtbot.keyClicks(dlg.editor.url, "ftp://nope")
    assert dlg.error.text().startswith("URL must be an http:// or https:// address") and not dlg.save_btn.isEnabled()
    dlg.editor.url.setText("http://127.0.0.1:8123/mcp")
    dlg.editor.headers.setPlainText("no colon here")
    assert "Headers, line 1" in dlg.error.text() or "headers, line 1" in dlg.error.text()
    dlg.editor.headers.setPlainText("Authorization: Bearer t")
    assert dlg.error.text() == "" and dlg.save_btn.isEnabled()
    dlg.save_btn.click()
    saved = load_mcp_config(path).servers["web"]
    assert saved.url == "http://127.0.0.1:8123/mcp" and saved.headers == {"Authorization": "Bearer t"}
    assert host.config.servers["web"] == saved


def test_add_rename_and_duplicate_names(qtbot, setup):
    dlg, host, path = setup
    dlg.add_btn.click()
    assert dlg.editor.name.text() == "server" and dlg.focusWidget() is dlg.editor.command
    assert "Command must be a non-empty text" in dlg.error.text()
    dlg.editor.command.setText("uvx")
    dlg.editor.args.setText("mcp-server-time --local-timezone 'Europe/Oslo'")
    dlg.editor.env.setPlainText("TZ=UTC")
    dlg.editor.name.setText("calc")
    assert "exists already" in dlg.error.text()
    dlg.editor.name.setText("time")
    dlg.save_btn.click()
    time = load_mcp_config(path).servers["time"]
    assert time.args == ("mcp-server-time", "--local-timezone", "Europe/Oslo") and time.env == {"TZ": "UTC"}
    dlg.editor.args.setText("'unclosed")
    assert "Arguments" in dlg.error.text() or "arguments" in dlg.error.text()


def test_permissions_and_conversation_ticks(qtbot, setup):
    dlg, host, path = setup
    dlg.list.setCurrentRow(0)
    assert dlg.editor.allowed.text() == "add" and dlg.editor.forget_btn.isEnabled()
    dlg.editor.forget_btn.click()
    dlg.save_btn.click()
    assert load_mcp_config(path).servers["calc"].always_allow == ()
    changes = []
    dlg.conversation_changed.connect(changes.append)
    web = dlg.list.item(1)
    assert web.checkState() == Qt.CheckState.Unchecked
    web.setCheckState(Qt.CheckState.Checked)
    dlg.list.item(0).setCheckState(Qt.CheckState.Unchecked)
    assert changes == [(), ("calc",)]


def test_a_started_server_shows_its_dot_tools_and_calls(qtbot, setup):
    dlg, host, path = setup
    dlg.list.setCurrentRow(0)
    dlg.restart_btn.click()
    qtbot.waitUntil(lambda: host.status("calc").state == "ready", timeout=60000)
    host.call("calc", "add", {"a": 2, "b": 3}).result(60)
    qtbot.waitUntil(lambda: "add {'a': 2, 'b': 3}" in dlg.log.toPlainText(), timeout=10000)
    assert "echo — Say the text back." in [dlg.tools.item(i).text() for i in range(dlg.tools.count())]
    assert "tools" in dlg.list.item(0).text()


def test_press_everything_on_the_page(qtbot, monkeypatch, tmp_path, setup):
    dlg, host, path = setup
    p = Presser(qtbot, monkeypatch, tmp_path)
    try:
        pressed = p.press_all(dlg, rounds=2)
        p.assert_clean()
    finally:
        p.close()
    names = " ".join(pressed)
    for expected in ("Add", "Remove", "Start / restart", "Forget permissions", "Import from Claude Desktop"):
        assert expected in names, (expected, pressed)
    assert p.dialogs.count("QMessageBox.question") >= 2  # Remove and Import asked first


def test_import_shows_what_it_adds_and_never_replaces(qtbot, monkeypatch, setup):
    dlg, host, path = setup
    asked = []
    monkeypatch.setattr("PySide6.QtWidgets.QMessageBox.question",
                        staticmethod(lambda _parent, _title, text, *a: asked.append(text)
                                     or __import__("PySide6.QtWidgets", fromlist=["x"]).QMessageBox.StandardButton.Yes))
    dlg.import_btns[0].click()
    assert "• fs: npx -y server-fs" in asked[0] and "calc (a server of that name exists)" in asked[0]
    servers = load_mcp_config(path).servers
    assert "fs" in servers and servers["calc"].command != "other"


def test_the_card_asks_once_and_shows_the_result(qtbot):
    card = ToolCallCard(server="calc", tool="add", arguments='{"a": 2, "b": 3}', state="asking")
    qtbot.addWidget(card)
    card.show()
    assert '"a": 2' in card.args.text() and card.allow_btn.isVisible() and card.focusWidget() is card.allow_btn
    decisions = []
    card.decided.connect(decisions.append)
    qtbot.keyClick(card.allow_btn, Qt.Key.Key_Space)  # the keyboard reaches it
    card.deny_btn.click()  # too late: one answer per call
    assert decisions == ["once"]
    card.set_state("done", "5")
    assert not card.allow_btn.isVisible() and card.text == "5" and "done" in card.header.text()
    card.set_state("done", "x" * 10_000)
    assert "more characters" in card.text


def test_press_everything_on_a_card(qtbot, monkeypatch, tmp_path):
    p = Presser(qtbot, monkeypatch, tmp_path)
    try:
        for state in ("asking", "running", "done"):
            card = ToolCallCard(server="s", tool="t", arguments="not json", state=state, result="r")
            qtbot.addWidget(card)
            card.show()
            p.press_all(card)
        p.assert_clean()
    finally:
        p.close()
