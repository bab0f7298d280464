"""The line above the chat: which model (and how it is loading), whether history is saved, the mode."""
from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QWidget

from ggufdesk.session.models import ModelState
from ggufdesk.session.writer import SaveState
from ggufdesk.ui import theme


class Header(QWidget):
    """The model area on the left (`model_row`: a model switcher goes in with `set_switcher`, in
    front of the model's status), then the save warning and the conversation's mode."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model_label = QLabel("No model loaded")
        self.model_label.setWordWrap(True)
        self.model_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.save_label = QLabel("")
        self.save_label.hide()
        self.mode_label = QLabel("")
        self.switcher: QWidget | None = None
        self.model_row = QHBoxLayout()
        self.model_row.setContentsMargins(0, 0, 0, 0)
        self.model_row.addWidget(self.model_label, 1)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addLayout(self.model_row, 1)
        row.addWidget(self.save_label)
        row.addWidget(self.mode_label)
        self.state = ModelState()
        self._restyle()

    def set_switcher(self, widget: QWidget) -> None:
        """Put a model switcher (a drop-down of models) in the model area, before the status."""
        if self.switcher is not None:
            self.model_row.removeWidget(self.switcher)
            self.switcher.deleteLater()
        self.switcher = widget
        self.model_row.insertWidget(0, widget)
        self.set_model_state(self.state)  # the switcher shows the name; the label the rest

    def set_model_state(self, state: ModelState) -> None:
        self.state = state
        self.model_label.setText(state.words(with_name=self.switcher is None))
        self.model_label.setToolTip(state.path or "")

    def set_save_state(self, state: SaveState) -> None:
        self.save_label.setText(state.text)
        self.save_label.setVisible(bool(state.text))

    def set_mode(self, text: str, tooltip: str = "") -> None:
        self.mode_label.setText(text)
        self.mode_label.setToolTip(tooltip)

    def _restyle(self) -> None:
        theme.restyle(self.model_label, "font-weight: 600;")
        theme.restyle(self.mode_label, f"color: {theme.css(theme.muted())};")
        theme.restyle(self.save_label, f"color: {theme.css(theme.tone(theme.WARNING_HUE, strong=True))};")

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt API
        super().changeEvent(event)
        if event.type() in theme.PALETTE_EVENTS:  # a child gets PaletteChange, a window the other
            self._restyle()
