"""The message box and its Send / Stop buttons: Enter sends and Shift+Enter starts a new line (or
the other way round), Tab leaves the box.

Room to grow: `add_tool()` puts a button (Attach…) in the row under the box, and `attachments`
is the row above the box where attached files are shown (both hidden while empty).
"""
from __future__ import annotations

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

ENTER_SENDS_KEY = "chat/enter_sends"
BOX_HEIGHT = 84


def enter_sends(settings: QSettings | None = None) -> bool:
    """The user's choice (QSettings), Enter sends by default as in every chat app."""
    return bool((settings or QSettings()).value(ENTER_SENDS_KEY, True, type=bool))


class MessageBox(QPlainTextEdit):
    """`submitted` fires on Enter (or Ctrl+Enter when Enter makes new lines); Tab moves focus."""

    submitted = Signal()

    def __init__(self, parent: QWidget | None = None, *, enter_sends: bool = True) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)  # Tab / Shift+Tab leave the box, like any other field
        self.enter_sends = enter_sends

    def hint(self) -> str:
        return ("Enter sends · Shift+Enter for a new line" if self.enter_sends
                else "Ctrl+Enter sends · Enter for a new line")

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt API
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers()
            shift = bool(mods & Qt.KeyboardModifier.ShiftModifier)
            ctrl = bool(mods & Qt.KeyboardModifier.ControlModifier)
            if ctrl or (self.enter_sends and not shift):
                event.accept()
                self.submitted.emit()
                return
            if shift:
                self.insertPlainText("\n")  # Shift+Enter: a plain new line, not a paragraph break
                event.accept()
                return
        super().keyPressEvent(event)


class Composer(QWidget):
    """The box, Send and Stop. `send_requested` carries the text as typed (the window decides what
    an empty box means); `stop_requested` the Stop button; `draft_changed` every edit."""

    send_requested = Signal(str)
    stop_requested = Signal()
    draft_changed = Signal()

    def __init__(self, parent: QWidget | None = None, *, enter_sends: bool = True) -> None:
        super().__init__(parent)
        self.box = MessageBox(enter_sends=enter_sends)
        self.box.setFixedHeight(BOX_HEIGHT)
        self.send_btn = QPushButton("Send")
        self.send_btn.setDefault(True)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setEnabled(False)
        self.attachments = QHBoxLayout()  # attached files, shown above the box
        self.attachments.setContentsMargins(0, 0, 0, 0)
        self.tools = QHBoxLayout()  # buttons that add to the message (Attach…), under the box
        self.tools.setContentsMargins(0, 0, 0, 0)
        self.tools.addStretch(1)
        self._attach_row = self._row(self.attachments)
        self._tool_row = self._row(self.tools)
        column = QVBoxLayout()
        column.addWidget(self._attach_row)
        column.addWidget(self.box)
        column.addWidget(self._tool_row)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_btn)
        buttons.addWidget(self.stop_btn)
        buttons.addStretch(1)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(column, 1)
        lay.addLayout(buttons)
        self.box.submitted.connect(self._send)
        self.send_btn.clicked.connect(self._send)
        self.stop_btn.clicked.connect(lambda: self.stop_requested.emit())
        self.box.textChanged.connect(lambda: self.draft_changed.emit())

    @staticmethod
    def _row(layout: QHBoxLayout) -> QWidget:
        row = QWidget()
        row.setLayout(layout)
        row.hide()
        return row

    def _send(self) -> None:
        self.send_requested.emit(self.box.toPlainText())

    # ---- what the window sets -------------------------------------------------------------------

    def text(self) -> str:
        return self.box.toPlainText()

    def set_text(self, text: str) -> None:
        self.box.setPlainText(text)

    def clear(self) -> None:
        self.box.clear()

    def set_busy(self, busy: bool) -> None:
        """While an answer is written, Send waits and Stop works."""
        self.send_btn.setEnabled(not busy)
        self.stop_btn.setEnabled(busy)

    def set_send_words(self, text: str, tooltip: str, placeholder: str) -> None:
        """Chat mode: "Send"; completion mode: "Continue" (the model continues the box's text)."""
        self.send_btn.setText(text)
        self.send_btn.setToolTip(tooltip)
        self.box.setPlaceholderText(f"{placeholder} ({self.box.hint()})")

    # ---- room to grow ---------------------------------------------------------------------------

    def add_tool(self, widget: QWidget) -> None:
        """A control that adds to the message (Attach an image…), in the row under the box."""
        self.tools.insertWidget(self.tools.count() - 1, widget)
        self._tool_row.show()

    def add_attachment(self, widget: QWidget) -> None:
        """Show an attached file (a chip with a remove button) above the box."""
        self.attachments.addWidget(widget)
        self._attach_row.show()

    def remove_attachment(self, widget: QWidget) -> None:
        self.attachments.removeWidget(widget)
        widget.deleteLater()
        self._attach_row.setVisible(self.attachments.count() > 0)
