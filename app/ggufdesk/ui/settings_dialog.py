"""Engine settings: the prefill/decode split, context, offload, KV cache, speculation; validated by core.settings."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, TypeVar, get_args

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QGroupBox,
    QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton, QScrollArea, QSizePolicy, QSpinBox,
    QVBoxLayout, QWidget,
)

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import FlashAttn, KvType, LoadSettings, SpecMode, SpeculationSettings
from ggufdesk.ui import theme
from ggufdesk.ui.services import ContextEstimate
from ggufdesk.ui.tasks import describe_failure, run_in_background

ESTIMATE_DELAY_MS = 200  # ask the planner once typing pauses

T = TypeVar("T")
# the combo boxes' entries, in order, as the settings' own types
FLASH_CHOICES: tuple[FlashAttn, ...] = get_args(FlashAttn)
KV_CHOICES: tuple[KvType, ...] = get_args(KvType)
SPEC_CHOICES: tuple[SpecMode, ...] = get_args(SpecMode)

# field -> (label, one-line explanation)
HELP: dict[str, tuple[str, str]] = {
    "n_ctx": ("Context length", "Tokens the model sees at once; more costs KV-cache memory."),
    "n_gpu_layers": ("GPU layers", "Layers kept on the GPU (-1 = all). More is faster until VRAM runs out."),
    "n_batch": ("Batch size", "Prompt tokens handed to llama.cpp per call."),
    "n_ubatch": ("Micro-batch", "Tokens computed together (≤ batch): prefill speed vs memory."),
    "n_threads": ("Decode threads", "CPU threads while writing the answer, token by token (0 = cores)."),
    "n_threads_batch": ("Prefill threads", "CPU threads for the prompt and draft checks (0 = cores)."),
    "flash_attn": ("Flash attention", "A faster, leaner attention kernel; needed for a quantized V cache."),
    "type_k": ("K cache type", "Precision of attention keys; q8_0 halves their memory."),
    "type_v": ("V cache type", "Precision of attention values; quantized needs flash attention."),
    "mode": ("Speculation", "off, a small draft model proposing tokens, or copying from the prompt (lookup)."),
    "draft_model": ("Draft model", "A small model with the same vocabulary; its guesses are verified by the big one."),
    "k_max": ("Max draft length", "Most tokens proposed per step."),
    "k_min": ("Min draft length", "Fewest tokens proposed per step when adaptive."),
    "adaptive": ("Adaptive length", "Lengthen drafts while they are accepted, shorten them when not."),
    "ngram": ("Lookup n-gram", "Longest run of prompt tokens matched when copying from the prompt."),
    "rpc": ("Remote workers", "host:port of machines running `ggufdesk worker`, one per line: the model is "
            "spread over them. No authentication or encryption: a trusted network or an SSH tunnel only."),
}


def _add_row(form: QFormLayout, widget: QWidget, field_name: str) -> QLabel:
    """The field on one row, its one-line explanation spanning the row below."""
    form.addRow(HELP[field_name][0], widget)
    note = QLabel(HELP[field_name][1])
    note.setWordWrap(True)
    note.setStyleSheet(f"color: {theme.css(theme.muted())}; margin-bottom: 4px;")
    note.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
    form.addRow(note)
    return note


def _chosen(box: QComboBox, choices: tuple[T, ...]) -> T:
    """The box's entry as its settings value: the box lists exactly `choices`, in this order."""
    return choices[box.currentIndex()]


class SettingsDialog(QDialog):
    """Edits LoadSettings + SpeculationSettings; OK is enabled only while they validate."""

    memory_checked = Signal(object)  # ContextEstimate

    def __init__(self, load: LoadSettings, speculation: SpeculationSettings, *,
                 recommended: Callable[[], tuple[LoadSettings, SpeculationSettings]] | None = None,
                 n_ctx_train: int = 0,
                 estimate: Callable[[LoadSettings], ContextEstimate | None] | None = None,
                 parent: QWidget | None = None, model_id: str | None = None, for_model: bool = False) -> None:
        """`n_ctx_train` bounds the context (the model's trained length); `estimate(load)` returns
        the planner's ContextEstimate (runs off the GUI thread) for the memory warning. With a
        `model_id`, the settings can be saved for that model only (its preset) or as the defaults;
        `for_model` starts on the former (the model has its own settings already)."""
        super().__init__(parent)
        self.setWindowTitle("Engine settings")
        self.scope_box = self._scope_box(model_id, for_model)
        screen = QGuiApplication.primaryScreen()
        avail = screen.availableGeometry() if screen is not None else None
        self.resize(min(900, avail.width() - 40) if avail else 900,
                    min(720, avail.height() - 60) if avail else 720)
        self._recommended = recommended or (lambda: (LoadSettings(), SpeculationSettings()))
        self.n_ctx_train = n_ctx_train
        self._estimate = estimate
        self.last_estimate: ContextEstimate | None = None
        self.spins: dict[str, QSpinBox] = {}
        self.combos: dict[str, QComboBox] = {}
        perf = self._memory_group(n_ctx_train)
        spec = self._speculation_group()
        # every field by name (the tests and the signal wiring below go through it)
        self.w: dict[str, QWidget] = {**self.spins, **self.combos, "draft_model": self.draft_edit,
                                      "adaptive": self.adaptive_box}
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet(
            f"color: {theme.css(theme.tone(theme.ERROR_HUE, strong=True))}; font-weight: 600;")
        self.ctx_warning.setStyleSheet(
            f"color: {theme.css(theme.tone(theme.WARNING_HUE, strong=True))}; font-weight: 600;")
        self._estimate_timer = QTimer(self, singleShot=True, interval=ESTIMATE_DELAY_MS)
        self._estimate_timer.timeout.connect(self.check_memory)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.reset_btn = self.buttons.addButton("Reset to recommended",
                                                QDialogButtonBox.ButtonRole.ResetRole)
        self.reset_btn.clicked.connect(lambda _checked=False: self.reset_to_recommended())
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self._lay_out(perf, spec, with_scope=bool(model_id))
        self._use_mmap, self._use_mlock = load.use_mmap, load.use_mlock  # kept as they are
        self._draft_gpu_layers, self._draft_ctx = speculation.draft_gpu_layers, speculation.draft_ctx
        self._p_min = speculation.p_min
        self.set_values(load, speculation)
        self._connect_fields()
        self.validate()
        self.check_memory()

    def _scope_box(self, model_id: str | None, for_model: bool) -> QComboBox:
        """Save as the defaults or as this model's preset (shown only with a model)."""
        box = QComboBox()
        box.addItem("Defaults, for every model", "defaults")
        if model_id:
            box.addItem(f"For this model only ({model_id})", "model")
            box.setCurrentIndex(1 if for_model else 0)
        box.setToolTip("A model's own settings (its preset) apply wherever it is loaded: "
                       "here, `ggufdesk run` and the server")
        box.setVisible(bool(model_id))
        return box

    def _memory_group(self, n_ctx_train: int) -> QGroupBox:
        """Context, offload, batches, threads, KV cache and remote workers."""
        perf = QGroupBox("Model and memory")
        pf = QFormLayout(perf)
        for name, lo, hi in (("n_ctx", 16, 1 << 20), ("n_gpu_layers", -1, 100_000),
                             ("n_batch", 1, 1 << 16), ("n_ubatch", 1, 1 << 16),
                             ("n_threads", 0, 1024), ("n_threads_batch", 0, 1024)):
            sb = QSpinBox()
            if name == "n_ctx" and n_ctx_train > 0:
                hi = max(lo, n_ctx_train)  # past its trained length a model writes nonsense
            sb.setRange(lo, hi)
            sb.setObjectName(name)
            self.spins[name] = sb
            note = _add_row(pf, sb, name)
            if name == "n_ctx":
                if n_ctx_train > 0:
                    note.setText(f"{HELP[name][1]} This model was trained on up to "
                                 f"{n_ctx_train:,} tokens.")
                self.ctx_warning = QLabel()
                self.ctx_warning.setWordWrap(True)
                self.ctx_warning.setVisible(False)
                pf.addRow(self.ctx_warning)
        for name, choices in (("flash_attn", FLASH_CHOICES), ("type_k", KV_CHOICES), ("type_v", KV_CHOICES)):
            cb = QComboBox()
            cb.addItems(list(choices))
            cb.setObjectName(name)
            self.combos[name] = cb
            _add_row(pf, cb, name)
        self.rpc_edit = QPlainTextEdit()  # Remote workers (RPC), one host:port per line
        self.rpc_edit.setObjectName("rpc")
        self.rpc_edit.setPlaceholderText("192.168.1.20:50052")
        self.rpc_edit.setFixedHeight(60)
        _add_row(pf, self.rpc_edit, "rpc")
        return perf

    def _speculation_group(self) -> QGroupBox:
        """Off, a draft model or prompt lookup, and the draft lengths."""
        spec = QGroupBox("Speculative decoding")
        sf = QFormLayout(spec)
        mode = QComboBox()
        mode.addItems(list(SPEC_CHOICES))
        self.combos["mode"] = mode
        _add_row(sf, mode, "mode")
        self.draft_edit = QLineEdit()
        self.draft_edit.setPlaceholderText("path to a small .gguf")
        browse = QPushButton("Browse…")
        browse.clicked.connect(lambda _checked=False: self._browse_draft())
        row = QWidget()
        rl = QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.draft_edit, 1)
        rl.addWidget(browse)
        _add_row(sf, row, "draft_model")
        for name, lo, hi in (("k_max", 1, 64), ("k_min", 1, 64), ("ngram", 1, 16)):
            sb = QSpinBox()
            sb.setRange(lo, hi)
            self.spins[name] = sb
            _add_row(sf, sb, name)
        self.adaptive_box = QCheckBox("adjust the draft length as it goes")
        _add_row(sf, self.adaptive_box, "adaptive")
        return spec

    def _lay_out(self, perf: QGroupBox, spec: QGroupBox, *, with_scope: bool) -> None:
        """The two groups side by side in a scroll area, the scope above, the buttons below."""
        body = QWidget()
        cols = QHBoxLayout(body)
        cols.setContentsMargins(0, 0, 0, 0)
        cols.addWidget(perf, 1)
        cols.addWidget(spec, 1)
        scroll = QScrollArea()  # small screens: scroll rather than squeeze the explanations
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(body)
        lay = QVBoxLayout(self)
        if with_scope:
            scope_row = QHBoxLayout()
            scope_row.addWidget(QLabel("Save these settings as"))
            scope_row.addWidget(self.scope_box, 1)
            lay.addLayout(scope_row)
        lay.addWidget(scroll, 1)
        lay.addWidget(self.error_label)
        lay.addWidget(self.buttons)

    def _connect_fields(self) -> None:
        """Every change validates; a change that alters the memory asks the planner again (soon)."""
        for sb in self.spins.values():
            sb.valueChanged.connect(lambda *_: self.validate())
        for cb in self.combos.values():
            cb.currentIndexChanged.connect(lambda *_: self.validate())
        self.draft_edit.textChanged.connect(lambda *_: self.validate())
        self.adaptive_box.toggled.connect(lambda *_: self.validate())
        self.rpc_edit.textChanged.connect(lambda: self.validate())
        for name in ("n_ctx", "n_gpu_layers", "n_ubatch"):
            self.spins[name].valueChanged.connect(lambda *_: self._estimate_timer.start())
        for name in ("type_k", "type_v", "flash_attn"):
            self.combos[name].currentIndexChanged.connect(lambda *_: self._estimate_timer.start())

    def check_memory(self) -> None:
        """Ask the planner what this context costs; warn when it will not fit."""
        if self._estimate is None:
            return
        try:
            load, _ = self.values()
        except SettingsError:
            return
        estimate = self._estimate

        def shown(fut: Future[ContextEstimate | None]) -> None:
            if describe_failure(fut) is not None:
                return
            est = fut.result()
            self.last_estimate = est
            if est is None or est.n_ctx != self.spins["n_ctx"].value():
                return  # nothing to say, or the value changed meanwhile
            self.ctx_warning.setText(est.words())
            self.ctx_warning.setVisible(not est.fits)
            self.spins["n_ctx"].setToolTip(est.words())
            self.memory_checked.emit(est)

        run_in_background(lambda: estimate(load), shown, owner=self)

    def _browse_draft(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Draft model", "", "GGUF models (*.gguf)")
        if path:
            self.draft_edit.setText(path)

    def set_values(self, load: LoadSettings, spec: SpeculationSettings) -> None:
        for name in ("n_ctx", "n_gpu_layers", "n_batch", "n_ubatch", "n_threads", "n_threads_batch"):
            self.spins[name].setValue(getattr(load, name))
        for name in ("flash_attn", "type_k", "type_v"):
            self.combos[name].setCurrentText(getattr(load, name))
        self.combos["mode"].setCurrentText(spec.mode)
        self.draft_edit.setText(spec.draft_model or "")
        for name in ("k_max", "k_min", "ngram"):
            self.spins[name].setValue(getattr(spec, name))
        self.adaptive_box.setChecked(spec.adaptive)
        self.rpc_edit.setPlainText("\n".join(load.rpc))

    def values(self) -> tuple[LoadSettings, SpeculationSettings]:
        """The settings as typed objects; raises SettingsError when they cannot work."""
        n = {name: sb.value() for name, sb in self.spins.items()}
        rpc = [ln.strip() for ln in self.rpc_edit.toPlainText().replace(",", "\n").splitlines() if ln.strip()]
        load = LoadSettings(
            n_ctx=n["n_ctx"], n_gpu_layers=n["n_gpu_layers"], n_batch=n["n_batch"], n_ubatch=n["n_ubatch"],
            n_threads=n["n_threads"], n_threads_batch=n["n_threads_batch"],
            flash_attn=_chosen(self.combos["flash_attn"], FLASH_CHOICES),
            type_k=_chosen(self.combos["type_k"], KV_CHOICES), type_v=_chosen(self.combos["type_v"], KV_CHOICES),
            use_mmap=self._use_mmap, use_mlock=self._use_mlock, rpc=rpc)
        spec = SpeculationSettings(
            mode=_chosen(self.combos["mode"], SPEC_CHOICES), draft_model=self.draft_edit.text().strip() or None,
            adaptive=self.adaptive_box.isChecked(), draft_gpu_layers=self._draft_gpu_layers,
            draft_ctx=self._draft_ctx, p_min=self._p_min, k_max=n["k_max"], k_min=n["k_min"], ngram=n["ngram"])
        return load, spec

    def validate(self) -> bool:
        try:
            self.values()
        except SettingsError as e:
            self.error_label.setText(str(e))
            self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(False)
            return False
        self.error_label.setText("")
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(True)
        return True

    def reset_to_recommended(self) -> None:
        self.set_values(*self._recommended())
        self.validate()

    def scope(self) -> str:
        """"model" (this model's preset) or "defaults"."""
        return str(self.scope_box.currentData())

    def accept(self) -> None:
        if self.validate():
            super().accept()

