"""Qt table model over a plain list of ModelChoice rows (the wizard's model list)."""
from __future__ import annotations


from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor

from ggufdesk.ui import theme
from ggufdesk.ui.gauges import human_bytes
from ggufdesk.ui.services import FIT_WORDS, ModelChoice

COLUMNS = ("Model", "Can", "Size", "Fit", "GPU layers", "Reads prompt", "Writes answer")
BADGES = {"reasoning": "reasons", "tools": "tools", "vision": "images", "moe": "MoE"}
FIT_HUES = {"full_gpu": theme.SUCCESS_HUE, "partial": 215, "cpu": theme.WARNING_HUE,
            "too_large": theme.ERROR_HUE}


def fit_colour(fit: str) -> QColor:
    """Green fits the GPU, blue splits, amber is the CPU, red does not fit: readable light or dark."""
    hue = FIT_HUES.get(fit)
    return theme.muted() if hue is None else theme.tone(hue, strong=True)

Index = QModelIndex | QPersistentModelIndex


def _speed(v: float | None) -> str:
    return f"~{v:.0f} tok/s" if v else "?"


def badges(c: ModelChoice) -> str:
    """The capability badges of a row: reasons · tools · images · MoE."""
    return " · ".join(BADGES[k] for k in BADGES if k in c.capabilities)


def gpu_layers(c: ModelChoice) -> str:
    layers = "all" if c.n_gpu_layers == -1 else str(c.n_gpu_layers)
    return f"{layers}, experts of {c.n_cpu_moe} on the CPU" if c.n_cpu_moe else layers


class ChoiceTableModel(QAbstractTableModel):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._rows: list[ModelChoice] = []

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802 - Qt API
                   role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if (role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal
                and 0 <= section < len(COLUMNS)):
            return COLUMNS[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        c = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._cell(c, col)
        if role == Qt.ItemDataRole.ForegroundRole and col == 3:
            return fit_colour(c.fit)
        if role == Qt.ItemDataRole.ForegroundRole and col == 1:
            return theme.tone(265, strong=True)
        if role == Qt.ItemDataRole.ToolTipRole:
            where = c.repo and f"{c.repo}/{c.filename}" or (str(c.path) if c.path else c.label)
            return f"{where}\n{c.note}".strip()
        return None

    @staticmethod
    def _cell(c: ModelChoice, col: int) -> str:
        if col == 0:
            return ("★ " if c.recommended else "") + c.label
        return (badges(c), human_bytes(c.size_bytes) if c.size_bytes else "?", FIT_WORDS.get(c.fit, c.fit),
                gpu_layers(c), _speed(c.pred_prefill_tok_s), _speed(c.pred_decode_tok_s))[col - 1]

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
