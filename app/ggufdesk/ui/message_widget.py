"""One chat message: a Markdown body (Qt's own renderer) with copy / edit / regenerate buttons."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QTextDocument
from PySide6.QtWidgets import (
    QFrame, QHBoxLayout, QLabel, QSizePolicy, QTextBrowser, QToolButton, QVBoxLayout, QWidget,
)

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
STATUS_NOTES = {
    "streaming": "writing…",
    "partial": "partial: the engine stopped",
    "cancelled": "stopped",
    "error": "failed",
}
RENDER_INTERVAL_MS = 50  # a streaming body re-renders at most 20 times a second


class MarkdownView(QTextBrowser):
    """A QTextBrowser that is exactly as tall as its content (no inner scrollbar)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().contentsChanged.connect(self._fit)

    def _fit(self) -> None:
        self.document().setTextWidth(max(50, self.viewport().width()))
        h = int(self.document().size().height()) + 4
        if h != self.height():
            self.setFixedHeight(h)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        return QSize(400, int(self.document().size().height()) + 4)


class MessageWidget(QFrame):
    copy_requested = Signal()
    edit_requested = Signal(int)  # message id
    regenerate_requested = Signal(int)

    def __init__(self, *, message_id: int, role: str, text: str, status: str = "done",
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message_id = message_id
        self.role = role
        self.status = status
        self._text = text
        self.setObjectName(f"msg_{role}")
        bg = "#f3f6fa" if role == "user" else "#ffffff"
        self.setStyleSheet(f"#msg_{role} {{ background: {bg}; border: 1px solid #dde3ea;"
                           " border-radius: 8px; }")
        self.header = QLabel()
        self.header.setStyleSheet("font-weight: 600; color: #40556b;")
        self.body = MarkdownView()
        self.body.setStyleSheet(f"background: {bg};")
        self.copy_btn = self._button("Copy", "Copy this message as Markdown", self.copy)
        self.edit_btn = self._button("Edit", "Put this message back in the input box; sending "
                                     "replaces it and everything after it",
                                     lambda: self.edit_requested.emit(self.message_id))
        self.regen_btn = self._button("Regenerate", "Write this answer again",
                                      lambda: self.regenerate_requested.emit(self.message_id))
        self.edit_btn.setVisible(role == "user")
        self.regen_btn.setVisible(role == "assistant")
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.header, 1)
        for b in (self.copy_btn, self.edit_btn, self.regen_btn):
            top.addWidget(b)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 8)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.body)
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render)
        self.set_status(status)
        self._render()

    def _button(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    @property
    def text(self) -> str:
        return self._text

    def set_status(self, status: str) -> None:
        self.status = status
        note = STATUS_NOTES.get(status, "")
        name = ROLE_NAMES.get(self.role, self.role)
        self.header.setText(f"{name}  <span style='font-weight:400;color:#8a5a00'>{note}</span>"
                            if note else name)
        streaming = status == "streaming"
        self.regen_btn.setEnabled(not streaming)
        self.edit_btn.setEnabled(not streaming)

    def set_actions_enabled(self, enabled: bool) -> None:
        self.regen_btn.setEnabled(enabled and self.status != "streaming")
        self.edit_btn.setEnabled(enabled)

    def append(self, piece: str) -> None:
        """Streaming: add text now, re-render the Markdown soon (coalesced)."""
        self._text += piece
        if not self._render_timer.isActive():
            self._render_timer.start()

    def set_text(self, text: str) -> None:
        self._text = text
        self._render_timer.stop()
        self._render()

    def flush(self) -> None:
        if self._render_timer.isActive():
            self._render_timer.stop()
            self._render()

    def _render(self) -> None:
        if self.role == "user":
            self.body.setPlainText(self._text)
        else:
            self.body.setMarkdown(self._text or " ")

    def rendered_markdown(self) -> str:
        return self.body.document().toMarkdown(QTextDocument.MarkdownFeature.MarkdownDialectGitHub)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self._text)
        self.copy_requested.emit()
