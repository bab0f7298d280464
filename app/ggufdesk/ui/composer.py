"""The message box: Enter sends and Shift+Enter starts a new line (or the other way round), Tab leaves it."""
from __future__ import annotations

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

ENTER_SENDS_KEY = "chat/enter_sends"


def enter_sends(settings: QSettings | None = None) -> bool:
    """The user's choice (QSettings), Enter sends by default as in every chat app."""
    return bool((settings or QSettings()).value(ENTER_SENDS_KEY, True, type=bool))


class Composer(QPlainTextEdit):
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
