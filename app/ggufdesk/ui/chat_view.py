"""The message column: a scrolling stack of MessageWidgets that follows a streaming answer."""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QScrollArea, QVBoxLayout, QWidget

from ggufdesk.core.history import Message
from ggufdesk.ui.message_widget import MessageWidget


class ChatView(QScrollArea):
    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    version_requested = Signal(int, int)  # message id, step
    copied = Signal()
    citation_requested = Signal(dict)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        inner.setObjectName("chatInner")
        self.column = QVBoxLayout(inner)
        self.column.setContentsMargins(12, 12, 12, 12)
        self.column.setSpacing(10)
        self.column.addStretch(1)
        self.setWidget(inner)
        self.widgets: list[MessageWidget] = []
        self.mode = "chat"
        self._follow = True
        self.verticalScrollBar().rangeChanged.connect(self._on_range)
        self.verticalScrollBar().valueChanged.connect(self._on_scroll)

    def _on_scroll(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 30

    def _on_range(self, lo: int, hi: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(hi)

    def clear(self) -> None:
        for w in self.widgets:
            w.setParent(None)
            w.deleteLater()
        self.widgets.clear()

    def set_messages(self, messages: list[Message],
                     versions: dict[int, tuple[int, int]] | None = None) -> None:
        """Show these messages; `versions` maps a message id to (its version, how many)."""
        self.clear()
        versions = versions or {}
        for m in messages:
            self.add(m, version=versions.get(m.id, (1, 1)))
        self._follow = True
        QTimer.singleShot(0, self._scroll_to_end)  # a bound method: dropped if the view is gone

    def _scroll_to_end(self) -> None:
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def set_mode(self, mode: str) -> None:
        """chat: a conversation of turns; completion: one text the model continues."""
        self.mode = mode
        for w in self.widgets:
            w.set_mode(mode)

    def add(self, m: Message, version: tuple[int, int] = (1, 1)) -> MessageWidget:
        w = MessageWidget(message_id=m.id, role=m.role, text=m.content, status=m.status,
                          stats=m.stats, mode=self.mode)
        w.set_versions(*version)
        w.edit_requested.connect(self.edit_requested)
        w.regenerate_requested.connect(self.regenerate_requested)
        w.version_requested.connect(self.version_requested)
        w.copy_requested.connect(self.copied)
        w.citation_requested.connect(self.citation_requested)
        self.column.insertWidget(self.column.count() - 1, w)
        self.widgets.append(w)
        self._follow = True
        return w

    def widget_for(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self.widgets if w.message_id == message_id), None)

    def set_actions_enabled(self, enabled: bool) -> None:
        for w in self.widgets:
            w.set_actions_enabled(enabled)
