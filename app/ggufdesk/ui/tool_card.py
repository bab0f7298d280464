"""A tool call in the chat: which server and tool, with what arguments; Allow once / Always for this
tool / Deny while it waits for the user, then its state and result."""
from __future__ import annotations

import json

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QPalette, QShowEvent
from PySide6.QtWidgets import (
    QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget,
)

from ggufdesk.ui import theme

STATE_WORDS = {
    "pending": "waiting", "asking": "waits for your permission", "running": "running…", "done": "done",
    "error": "failed", "denied": "denied", "stopped": "stopped",
}
SHOWN_RESULT_CHARS = 4000  # the card shows the start of a long result; the whole one is in the history


def pretty_arguments(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


class ToolCallCard(QFrame):
    """One call. `decided(decision)` carries "once", "always" or "deny" (the window forwards it to
    ChatSession.decide). `message_id` is the key of its tool message once there is one."""

    decided = Signal(str)

    def __init__(self, *, server: str, tool: str, arguments: str, state: str = "pending", result: str = "",
                 call_key: int = 0, call_id: str = "", message_id: int = 0, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("toolCard")
        self.server, self.tool = server, tool
        self.call_key, self.call_id, self.message_id = call_key, call_id, message_id
        self.state = state
        self.header = QLabel()
        self.header.setWordWrap(True)
        self.args = QLabel(pretty_arguments(arguments))
        self.args.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.args.setWordWrap(True)
        self.args.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result = QPlainTextEdit()
        self.result.setReadOnly(True)
        self.result.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.result.setAccessibleName("Tool result")
        self.allow_btn = QPushButton("&Allow once")
        self.allow_btn.setToolTip("Run this call now; the next call asks again")
        self.always_btn = QPushButton("Al&ways for this tool")
        self.always_btn.setToolTip(f"Run this call and every later call of {tool} on {server} without asking "
                                   "(kept in mcp.json; take it back in MCP servers)")
        self.deny_btn = QPushButton("&Deny")
        self.deny_btn.setToolTip("Do not run it; the model is told you did not allow it")
        for button, decision in ((self.allow_btn, "once"), (self.always_btn, "always"), (self.deny_btn, "deny")):
            button.clicked.connect(lambda _checked=False, d=decision: self._decide(d))
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        for b in (self.allow_btn, self.always_btn, self.deny_btn):
            buttons.addWidget(b)
        buttons.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 8)
        lay.setSpacing(4)
        lay.addWidget(self.header)
        lay.addWidget(self.args)
        lay.addLayout(buttons)
        lay.addWidget(self.result)
        pal = theme.palette()
        base = theme.role(QPalette.ColorRole.Base, pal)
        border = theme.mix(base, theme.tone(theme.WARNING_HUE, strong=True), 0.6)
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setStyleSheet(f"#toolCard {{ background: {theme.css(base)}; border: 1px solid {theme.css(border)};"
                           " border-radius: 8px; }")
        self.set_state(state, result)

    def _decide(self, decision: str) -> None:
        if self.state == "asking":
            for b in (self.allow_btn, self.always_btn, self.deny_btn):
                b.setEnabled(False)  # one answer per call
            self.decided.emit(decision)

    def set_state(self, state: str, result: str = "") -> None:
        self.state = state
        asking = state == "asking"
        for b in (self.allow_btn, self.always_btn, self.deny_btn):
            b.setVisible(asking)
            b.setEnabled(asking)
        hue = (theme.ERROR_HUE if state in ("error", "denied", "stopped")
               else theme.SUCCESS_HUE if state == "done" else theme.WARNING_HUE)
        colour = theme.css(theme.tone(hue, strong=True))
        self.header.setText(f"<b>Tool call: {self.server} / {self.tool}</b>&nbsp;&nbsp;"
                            f"<span style='color:{colour}'>{STATE_WORDS.get(state, state)}</span>")
        shown = result if len(result) <= SHOWN_RESULT_CHARS else (
            result[:SHOWN_RESULT_CHARS] + f"\n[… {len(result) - SHOWN_RESULT_CHARS:,} more characters]")
        self.result.setPlainText(shown)
        self.result.setVisible(bool(result))
        lines = min(8, max(1, shown.count("\n") + 1 + len(shown) // 100))  # long lines wrap
        self.result.setFixedHeight(self.result.fontMetrics().lineSpacing() * lines + 14)
        if asking and self.isVisible():
            self.allow_btn.setFocus()  # Space allows once; Tab reaches the others

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        if self.state == "asking":
            self.allow_btn.setFocus()

    @property
    def text(self) -> str:
        """What Copy and search read: the result."""
        return self.result.toPlainText()
