"""The conversation list on the left: New chat, search, the list, Rename / Delete / Export."""
from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt, QTimer, Signal
from PySide6.QtWidgets import QGridLayout, QLineEdit, QListView, QPushButton, QVBoxLayout, QWidget

from ggufdesk.core.history import Conversation
from ggufdesk.ui.conversation_model import ConversationListModel

SEARCH_DELAY_MS = 150  # typing pauses this long before the list is searched


class Sidebar(QWidget):
    """Shows the conversations and says what the user asked for; it reads and writes nothing."""

    new_requested = Signal()
    rename_requested = Signal()
    delete_requested = Signal()
    export_requested = Signal()
    conversation_chosen = Signal(int)  # a conversation's id, picked in the list
    search_changed = Signal(str)  # the search text, once typing pauses

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumWidth(150)
        self.search = QLineEdit(placeholderText="Search conversations")
        self.search.setClearButtonEnabled(True)
        self.model = ConversationListModel(self)
        self.list = QListView()
        self.list.setModel(self.model)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)  # long titles end in "…"
        self.new_btn = QPushButton("New chat")
        self.rename_btn = QPushButton("Rename")
        self.delete_btn = QPushButton("Delete")
        self.export_btn = QPushButton("Export…")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.new_btn)
        lay.addWidget(self.search)
        lay.addWidget(self.list, 1)
        row = QGridLayout()  # two rows: the side panel stays narrow at 800 px
        row.addWidget(self.rename_btn, 0, 0)
        row.addWidget(self.delete_btn, 0, 1)
        row.addWidget(self.export_btn, 1, 0, 1, 2)
        lay.addLayout(row)
        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.search.text()))
        self.search.textChanged.connect(lambda _text: self._search_timer.start())
        self.new_btn.clicked.connect(lambda: self.new_requested.emit())
        self.rename_btn.clicked.connect(lambda: self.rename_requested.emit())
        self.delete_btn.clicked.connect(lambda: self.delete_requested.emit())
        self.export_btn.clicked.connect(lambda: self.export_requested.emit())
        self.list.selectionModel().currentChanged.connect(self._on_current)
        self._shown: int | None = None  # the conversation shown as selected (not re-announced)

    def query(self) -> str:
        return self.search.text()

    def _on_current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if not current.isValid():
            return
        conv_id = self.model.conversation(current.row()).id
        if conv_id != self._shown:
            self._shown = conv_id
            self.conversation_chosen.emit(conv_id)

    def set_conversations(self, items: list[Conversation], select: int | None = None) -> None:
        """Replace the list (a search, a refresh) and keep `select` selected if it is listed."""
        self.model.set_conversations(items)
        self.select(select)

    def conversation_changed(self, conv: Conversation) -> None:
        """A conversation was written: show its new title (and list it, if it is new)."""
        self.model.update(conv)

    def remove(self, conversation_id: int) -> None:
        self.model.remove(conversation_id)

    def select(self, conversation_id: int | None) -> None:
        """Show `conversation_id` as the open one (none: nothing selected); emits nothing."""
        self._shown = conversation_id or None
        row = self.model.row_of(conversation_id) if conversation_id else -1
        self.list.setCurrentIndex(self.model.index(row) if row >= 0 else QModelIndex())
