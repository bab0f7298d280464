"""Per-conversation settings: system prompt, sampling, chat or completion mode."""
from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QLabel, QPlainTextEdit,
    QSpinBox, QVBoxLayout, QWidget,
)

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.history import MODES
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.ui import theme

MODE_HELP = ("chat: the model's chat template turns messages into a prompt. "
             "completion: the text is continued as it is (base models without a template).")


class ConversationDialog(QDialog):
    def __init__(self, *, system_prompt: str, sampling: SamplingSettings, mode: str,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Conversation settings")
        self.system = QPlainTextEdit(system_prompt)
        self.system.setPlaceholderText("e.g. You are a concise assistant.")
        self.system.setFixedHeight(80)
        self.mode = QComboBox()
        self.mode.addItems(list(MODES))
        self.mode.setCurrentText(mode)
        self.temperature = self._dspin(0, 5, 0.05, sampling.temperature)
        self.top_p = self._dspin(0, 1, 0.01, sampling.top_p)
        self.min_p = self._dspin(0, 1, 0.01, sampling.min_p)
        self.repeat_penalty = self._dspin(0, 10, 0.05, sampling.repeat_penalty)
        self.top_k = self._spin(0, 1_000_000, sampling.top_k)
        self.max_tokens = self._spin(1, 1 << 20, sampling.max_tokens)
        self.seed = self._spin(-1, 2**31 - 1, sampling.seed)
        self._rest = {"repeat_last_n": sampling.repeat_last_n, "stop": list(sampling.stop)}
        form = QFormLayout()
        form.addRow("System prompt", self.system)
        form.addRow("Mode", self.mode)
        note = QLabel(MODE_HELP)
        note.setWordWrap(True)
        note.setStyleSheet(f"color: {theme.css(theme.muted())};")
        form.addRow("", note)
        form.addRow("Temperature (0 = always the likeliest word)", self.temperature)
        form.addRow("Top-k", self.top_k)
        form.addRow("Top-p", self.top_p)
        form.addRow("Min-p", self.min_p)
        form.addRow("Repeat penalty", self.repeat_penalty)
        form.addRow("Max tokens per answer", self.max_tokens)
        form.addRow("Seed (-1 = random)", self.seed)
        self.error_label = QLabel()
        self.error_label.setStyleSheet(
            f"color: {theme.css(theme.tone(theme.ERROR_HUE, strong=True))};")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.error_label)
        lay.addWidget(buttons)

    def _dspin(self, lo: float, hi: float, step: float, value: float) -> QDoubleSpinBox:
        sb = QDoubleSpinBox()
        sb.setRange(lo, hi)
        sb.setSingleStep(step)
        sb.setDecimals(2)
        sb.setValue(value)
        return sb

    def _spin(self, lo: int, hi: int, value: int) -> QSpinBox:
        sb = QSpinBox()
        sb.setRange(lo, hi)
        sb.setValue(value)
        return sb

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(
            temperature=self.temperature.value(), top_k=self.top_k.value(),
            top_p=self.top_p.value(), min_p=self.min_p.value(),
            repeat_penalty=self.repeat_penalty.value(), seed=self.seed.value(),
            max_tokens=self.max_tokens.value(), **self._rest,
        )

    def accept(self) -> None:
        try:
            self.sampling()
        except SettingsError as e:
            self.error_label.setText(str(e))
            return
        super().accept()
