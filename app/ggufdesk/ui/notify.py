"""The one notification channel: a banner above the chat that shows info, warnings and errors."""
from __future__ import annotations

import hashlib
import logging
import time

from PySide6.QtCore import QEvent, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

from ggufdesk.ui import theme

log = logging.getLogger("ggufdesk.ui.notify")

LEVELS = ("info", "warning", "error")


def level_colours(level: str) -> tuple[QColor, QColor]:
    """(background, text) of a banner level, derived from the palette: readable light or dark."""
    if level == "warning":
        return theme.tone(theme.WARNING_HUE, strong=False), theme.tone(theme.WARNING_HUE, strong=True)
    if level == "error":
        return theme.tone(theme.ERROR_HUE, strong=False), theme.tone(theme.ERROR_HUE, strong=True)
    base, hi = theme.role(QPalette.ColorRole.Base), theme.role(QPalette.ColorRole.Highlight)
    return theme.mix(base, hi, 0.15), theme.role(QPalette.ColorRole.Text)


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
        close.setToolTip("Close this message")
        close.clicked.connect(lambda _checked=False: self.hide())
        self.close_btn = close
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

    def _restyle(self) -> None:
        bg, fg = level_colours(self.level)
        theme.restyle(self, f"#banner {{ background: {theme.css(bg)}; border: 1px solid {theme.css(fg)};"
                      f" border-radius: 6px; }} #banner QLabel, #banner QToolButton {{ color: {theme.css(fg)}; }}")

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt API
        super().changeEvent(event)
        if event.type() in theme.PALETTE_EVENTS:  # a child gets PaletteChange, a window the other
            self._restyle()

    def notify_once(self, key: str, text: str, level: str = "info",
                    settings: QSettings | None = None) -> bool:
        """Show `text` only the first time `key` comes up (remembered across launches)."""
        qs = settings or QSettings()
        seen = "notices/" + hashlib.sha1(key.encode()).hexdigest()[:16]  # a path is a fine key
        if qs.value(seen, False, type=bool):
            log.info("%s (shown before): %s", level, text)
            return False
        qs.setValue(seen, True)
        self.notify(text, level)
        return True

    def notify(self, text: str, level: str = "info") -> None:
        level = level if level in LEVELS else "info"
        self.level = level
        self.messages.append((time.time(), level, text))
        getattr(log, "info" if level == "info" else "warning")("%s: %s", level, text)
        self._restyle()
        self.label.setText(text)
        self.show()
        self._timer.stop()
        if level == "info":
            self._timer.start()
        self.shown.emit(level, text)
