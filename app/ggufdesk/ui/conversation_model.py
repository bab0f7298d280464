"""Qt list model over a plain list of conversations (the sidebar)."""
from __future__ import annotations

import datetime as dt

from PySide6.QtCore import QAbstractListModel, QModelIndex, QObject, QPersistentModelIndex, Qt

from ggufdesk.core.history import Conversation

IdRole = Qt.ItemDataRole.UserRole + 1

Index = QModelIndex | QPersistentModelIndex


class ConversationListModel(QAbstractListModel):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._items: list[Conversation] = []

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid() or not 0 <= index.row() < len(self._items):
            return None
        c = self._items[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return c.title
        if role == Qt.ItemDataRole.ToolTipRole:
            when = dt.datetime.fromtimestamp(c.updated).strftime("%Y-%m-%d %H:%M")
            return f"{c.title}\n{c.mode} mode · last used {when}"
        if role == IdRole:
            return c.id
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def set_conversations(self, items: list[Conversation]) -> None:
        self.beginResetModel()
        self._items = list(items)
        self.endResetModel()

    def conversation(self, row: int) -> Conversation:
        return self._items[row]

    def row_of(self, conversation_id: int) -> int:
        for i, c in enumerate(self._items):
            if c.id == conversation_id:
                return i
        return -1

    def update(self, conv: Conversation) -> None:
        row = self.row_of(conv.id)
        if row < 0:
            self.beginInsertRows(QModelIndex(), 0, 0)
            self._items.insert(0, conv)
            self.endInsertRows()
            return
        self._items[row] = conv
        idx = self.index(row)
        self.dataChanged.emit(idx, idx)

    def remove(self, conversation_id: int) -> None:
        row = self.row_of(conversation_id)
        if row >= 0:
            self.beginRemoveRows(QModelIndex(), row, row)
            del self._items[row]
            self.endRemoveRows()
