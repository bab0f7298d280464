"""The one notification channel: a banner above the chat that shows info, warnings and errors."""
from __future__ import annotations

import logging
import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

log = logging.getLogger("ggufdesk.ui.notify")

LEVELS = {
    "info": ("#e8f1fb", "#1d4f91"),
    "warning": ("#fff4dc", "#7a5200"),
    "error": ("#fde8e8", "#8f1d1d"),
}


class Banner(QFrame):
    """Shows the latest message; info hides itself after a few seconds, errors stay until closed."""

    shown = Signal(str, str)  # level, text

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        row.addWidget(self.label, 1)
        row.addWidget(close)
        self.level = "info"
        self.messages: list[tuple[float, str, str]] = []  # (time, level, text): the whole log
        self._timer = QTimer(self, singleShot=True, interval=6000)
        self._timer.timeout.connect(self.hide)
        self.hide()

    @property
    def text(self) -> str:
        return self.label.text()

    def notify(self, text: str, level: str = "info") -> None:
        bg, fg = LEVELS.get(level, LEVELS["info"])
        self.level = level
        self.messages.append((time.time(), level, text))
        getattr(log, "info" if level == "info" else "warning")("%s: %s", level, text)
        self.setStyleSheet(
            f"#banner {{ background: {bg}; border: 1px solid {fg}; border-radius: 6px; }}"
            f" #banner QLabel {{ color: {fg}; }}"
        )
        self.label.setText(text)
        self.show()
        self._timer.stop()
        if level == "info":
            self._timer.start()
        self.shown.emit(level, text)
