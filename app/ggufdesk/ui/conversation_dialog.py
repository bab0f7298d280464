"""Per-conversation settings: system prompt, sampling, chat or completion mode."""
from __future__ import annotations

import dataclasses
from typing import TypedDict

from PySide6.QtWidgets import (
    QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QLabel, QPlainTextEdit,
    QSpinBox, QVBoxLayout, QWidget,
)

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.history import MODES
from ggufdesk.core.schema import SchemaError
from ggufdesk.core.tools import request_fields
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.ui import theme

STRUCTURED_KINDS = ("Off", "Any JSON object", "JSON schema", "Tools")
STRUCTURED_HELP = {
    "JSON schema": '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}',
    "Tools": '[{"type": "function", "function": {"name": "get_weather", "parameters": '
             '{"type": "object", "properties": {"city": {"type": "string"}}}}}]',
}


def _split_structured(value: str) -> tuple[str, str]:
    """SamplingSettings.structured -> (the combo's choice, the text field)."""
    text = value.strip()
    if not text:
        return "Off", ""
    if text == "json_object":
        return "Any JSON object", ""
    return ("Tools" if text.startswith("[") else "JSON schema"), text


TOOL_CHOICE_WORDS = {"auto": "the model decides (auto)", "required": "it must call a tool (required)",
                     "none": "it may not call one (none)"}


MODE_HELP = ("chat: the model's chat template turns messages into a prompt. "
             "completion: the text is continued as it is (base models without a template).")
# SamplingSettings.context_overflow, in words (docs/context.md); the first is the window's default
OVERFLOW_CHOICES = {
    "rolling": "Drop the oldest turns",
    "truncate-middle": "Cut the middle of a long message",
    "shift": "Drop the oldest tokens while writing (context shift)",
    "error": "Stop and say so",
}


class FunctionSpec(TypedDict):
    name: str


class FunctionTool(TypedDict):
    """An OpenAI-style function tool as core/tools.py reads it (only what the dialog uses)."""

    function: FunctionSpec


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
        self.structured_valid = True
        self._sampling = sampling  # what the dialog does not show (stop, think...) is kept as it was
        self.overflow = QComboBox()
        for policy, label in OVERFLOW_CHOICES.items():
            self.overflow.addItem(label, policy)
        self.overflow.setCurrentIndex(max(0, self.overflow.findData(sampling.context_overflow)))
        self.overflow.setToolTip("What happens when the conversation no longer fits the model's context; "
                                 "anything left out is said above the answer")
        self.structured_kind = QComboBox()
        self.structured_kind.addItems(list(STRUCTURED_KINDS))
        self.structured_text = QPlainTextEdit()
        self.structured_text.setFixedHeight(90)
        self.structured_status = QLabel()
        self.structured_status.setWordWrap(True)
        kind, text = _split_structured(sampling.structured)
        self.structured_kind.setCurrentText(kind)
        self.structured_text.setPlainText(text)
        self.tool_choice = QComboBox()  # filled with the tools' names by _check_structured
        self._wanted_choice = sampling.tool_choice
        self.structured_kind.currentTextChanged.connect(self._check_structured)
        self.structured_text.textChanged.connect(self._check_structured)
        self._check_structured()
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
        form.addRow("When the conversation outgrows the context", self.overflow)
        form.addRow("Structured output", self.structured_kind)
        form.addRow("", self.structured_text)
        form.addRow("", self.structured_status)
        form.addRow("Tool choice", self.tool_choice)
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
        return dataclasses.replace(
            self._sampling, temperature=self.temperature.value(), top_k=self.top_k.value(),
            top_p=self.top_p.value(), min_p=self.min_p.value(),
            repeat_penalty=self.repeat_penalty.value(), seed=self.seed.value(),
            max_tokens=self.max_tokens.value(), structured=self.structured(),
            tool_choice=self.chosen_tool() if self.structured_kind.currentText() == "Tools" else "auto",
            context_overflow=str(self.overflow.currentData()), stop=list(self._sampling.stop),
        )

    def chosen_tool(self) -> str:
        """auto | required | none | a tool's name (SamplingSettings.tool_choice)."""
        return str(self.tool_choice.currentData() or self._wanted_choice or "auto")

    def _fill_tool_choice(self, tools: list[FunctionTool]) -> None:
        keep = self.chosen_tool() if self.tool_choice.count() else self._wanted_choice
        self.tool_choice.blockSignals(True)
        self.tool_choice.clear()
        for value, words in TOOL_CHOICE_WORDS.items():
            self.tool_choice.addItem(words, value)
        for t in tools:
            name = t["function"]["name"]
            self.tool_choice.addItem(f"it must call {name}", name)
        self.tool_choice.setCurrentIndex(max(0, self.tool_choice.findData(keep)))
        self.tool_choice.blockSignals(False)

    def structured(self) -> str:
        """The structured-output setting as SamplingSettings.structured holds it."""
        kind = self.structured_kind.currentText()
        if kind == "Off":
            return ""
        if kind == "Any JSON object":
            return "json_object"
        return self.structured_text.toPlainText().strip()

    def _check_structured(self) -> None:
        """Validate as the user types: the answer is constrained only by a schema we can enforce."""
        kind = self.structured_kind.currentText()
        needs_text = kind in ("JSON schema", "Tools")
        self.structured_text.setEnabled(needs_text)
        self.tool_choice.setEnabled(False)
        self.structured_text.setPlaceholderText(STRUCTURED_HELP.get(kind, ""))
        if not needs_text:
            self.structured_status.setText(
                "" if kind == "Off" else "Every answer will be one JSON object.")
            return
        text = self.structured_text.toPlainText().strip()
        if not text:
            self._structured_state("empty: paste a JSON schema" if kind == "JSON schema"
                                   else "empty: paste a JSON list of tools", ok=False)
            return
        try:
            fields = request_fields(text)
        except SchemaError as e:
            self._structured_state(str(e), ok=False)
            return
        if kind == "JSON schema" and "json_schema" not in fields:
            self._structured_state("this is a list: choose Tools, or paste a schema object", ok=False)
        elif kind == "Tools" and "tools" not in fields:
            self._structured_state("tools are a JSON list of {\"type\": \"function\", ...}", ok=False)
        else:
            what = "schema" if kind == "JSON schema" else f"{len(fields['tools'])} tool(s)"
            self._structured_state(f"\u2713 valid {what}: answers will match it", ok=True)
            if kind == "Tools":
                self._fill_tool_choice(fields["tools"])
                self.tool_choice.setEnabled(True)

    def _structured_state(self, text: str, *, ok: bool) -> None:
        hue = theme.tone(theme.SUCCESS_HUE if ok else theme.ERROR_HUE, strong=True)
        self.structured_status.setStyleSheet(f"color: {theme.css(hue)};")
        self.structured_status.setText(text)
        self.structured_valid = ok

    def accept(self) -> None:
        try:
            self.sampling()
        except SettingsError as e:
            self.error_label.setText(str(e))
            return
        super().accept()
