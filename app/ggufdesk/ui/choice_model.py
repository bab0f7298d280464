"""Qt table model over a plain list of ModelChoice rows (the wizard's model list)."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor

from ggufdesk.ui import theme
from ggufdesk.ui.gauges import human_bytes
from ggufdesk.ui.services import FIT_WORDS, ModelChoice

COLUMNS = ("Model", "Size", "Fit", "GPU layers", "Reads prompt", "Writes answer")
FIT_HUES = {"full_gpu": theme.SUCCESS_HUE, "partial": 215, "cpu": theme.WARNING_HUE,
            "too_large": theme.ERROR_HUE}


def fit_colour(fit: str) -> QColor:
    """Green fits the GPU, blue splits, amber is the CPU, red does not fit: readable light or dark."""
    hue = FIT_HUES.get(fit)
    return theme.muted() if hue is None else theme.tone(hue, strong=True)

Index = QModelIndex | QPersistentModelIndex


def _speed(v: float | None) -> str:
    return f"~{v:.0f} tok/s" if v else "?"


class ChoiceTableModel(QAbstractTableModel):
    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._rows: list[ModelChoice] = []

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802 - Qt API
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if (role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal
                and 0 <= section < len(COLUMNS)):
            return COLUMNS[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        c = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return ("★ " if c.recommended else "") + c.label
            if col == 1:
                return human_bytes(c.size_bytes) if c.size_bytes else "?"
            if col == 2:
                return FIT_WORDS.get(c.fit, c.fit)
            if col == 3:
                return "all" if c.n_gpu_layers == -1 else str(c.n_gpu_layers)
            if col == 4:
                return _speed(c.pred_prefill_tok_s)
            if col == 5:
                return _speed(c.pred_decode_tok_s)
        if role == Qt.ItemDataRole.ForegroundRole and col == 2:
            return fit_colour(c.fit)
        if role == Qt.ItemDataRole.ToolTipRole:
            where = c.repo and f"{c.repo}/{c.filename}" or (str(c.path) if c.path else c.label)
            return f"{where}\n{c.note}".strip()
        return None

    def set_rows(self, rows: list[ModelChoice]) -> None:
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def add(self, choice: ModelChoice) -> int:
        row = len(self._rows)
        self.beginInsertRows(QModelIndex(), row, row)
        self._rows.append(choice)
        self.endInsertRows()
        return row

    def choice(self, row: int) -> ModelChoice:
        return self._rows[row]

    @property
    def rows(self) -> list[ModelChoice]:
        return list(self._rows)
