"""The message column: a scrolling stack of MessageWidgets (and tool-call cards) that follows a
streaming answer."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QScrollArea, QVBoxLayout, QWidget

from ggufdesk.core.history import Message
from ggufdesk.core.image_store import images_of
from ggufdesk.ui.message_widget import MessageWidget
from ggufdesk.ui.tool_card import ToolCallCard


class ChatView(QScrollArea):
    edit_requested = Signal(int)
    regenerate_requested = Signal(int)
    version_requested = Signal(int, int)  # message id, step
    copied = Signal()
    citation_requested = Signal(dict)
    tool_decided = Signal(int, str)  # a tool call's key, "once" | "always" | "deny"

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
        self.cards: list[ToolCallCard] = []  # tool calls, live or read back (tool messages)
        self.mode = "chat"
        self.image_loader: Callable[[str], bytes | None] | None = None  # a message's image by sha256
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
        for w in [*self.widgets, *self.cards]:
            w.setParent(None)
            w.deleteLater()
        self.widgets.clear()
        self.cards.clear()

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

    def add(self, m: Message, version: tuple[int, int] = (1, 1)) -> MessageWidget | ToolCallCard:
        if m.role == "tool":
            return self.add_tool_message(m)
        w = MessageWidget(message_id=m.id, role=m.role, text=m.content, status=m.status,
                          stats=m.stats, mode=self.mode)
        w.set_versions(*version)
        keys = images_of(m.stats)
        if keys:
            w.set_images([self.image_loader(k) if self.image_loader is not None else None for k in keys])
        w.edit_requested.connect(self.edit_requested)
        w.regenerate_requested.connect(self.regenerate_requested)
        w.version_requested.connect(self.version_requested)
        w.copy_requested.connect(self.copied)
        w.citation_requested.connect(self.citation_requested)
        self.column.insertWidget(self.column.count() - 1, w)
        self.widgets.append(w)
        self._follow = True
        return w

    def _insert(self, w: QWidget) -> None:
        self.column.insertWidget(self.column.count() - 1, w)
        self._follow = True

    def show_call(self, *, key: int, call_id: str, server: str, tool: str, arguments: str, state: str,
                  result: str) -> ToolCallCard:
        """A live tool call: its card is added the first time, then follows the call's state."""
        card = next((c for c in self.cards if c.call_key == key), None)
        if card is None:
            card = ToolCallCard(server=server, tool=tool, arguments=arguments, state=state, result=result,
                                call_key=key, call_id=call_id)
            card.decided.connect(lambda decision, k=key: self.tool_decided.emit(k, decision))
            self.cards.append(card)
            self._insert(card)
        else:
            card.set_state(state, result)
        return card

    def add_tool_message(self, m: Message) -> ToolCallCard:
        """A tool message: the live card of its call takes it, or a card is made (a stored one)."""
        call_id = str(m.stats.get("call_id", ""))
        card = next((c for c in self.cards if c.call_id == call_id and not c.message_id), None) if call_id else None
        if card is None:
            card = ToolCallCard(server=str(m.stats.get("server", "")), tool=str(m.stats.get("tool", "")),
                                arguments=str(m.stats.get("arguments", "")), state=str(m.stats.get("state", "done")),
                                result=m.content, call_id=call_id)
            self.cards.append(card)
            self._insert(card)
        card.message_id = m.id
        return card

    def widget_for(self, message_id: int) -> MessageWidget | None:
        return next((w for w in self.widgets if w.message_id == message_id), None)

    def set_actions_enabled(self, enabled: bool) -> None:
        for w in self.widgets:
            w.set_actions_enabled(enabled)
