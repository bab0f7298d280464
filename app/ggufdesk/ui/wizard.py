"""First run / model picker: what this computer has → which model → download → load."""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QAbstractItemView, QCheckBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
    QProgressBar, QPushButton, QTableView, QVBoxLayout, QWidget, QWizard, QWizardPage,
)

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.ui.choice_model import ChoiceTableModel
from ggufdesk.ui.gauges import human_bytes
from ggufdesk.ui.services import DownloadControl, DownloadStopped, ModelChoice, ModelServices, Selection
from ggufdesk.ui.tasks import alive, describe_failure, run_in_background, run_on_main

if TYPE_CHECKING:
    from ggufdesk.core.hardware import HardwareInfo

log = logging.getLogger("ggufdesk.ui.wizard")

HW_PAGE, MODEL_PAGE, DOWNLOAD_PAGE, FINISH_PAGE = range(4)


def _note(text: str = "") -> QLabel:
    lbl = QLabel(text)
    lbl.setWordWrap(True)
    return lbl


class RepoField(QLineEdit):
    """The repo box: Enter looks the repo up and stops there (it must not press the wizard's Next)."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt API
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            event.accept()
            self.submitted.emit()
            return
        super().keyPressEvent(event)


NETWORK_WORDS = ("Name or service not known", "Temporary failure in name resolution",
                 "Connection refused", "Network is unreachable", "timed out")


def offline_message(repo: str) -> str:
    return (f"Cannot look up {repo}: Hugging Face cannot be reached (this computer seems to be "
            "offline). The starter model and the models on this computer still work.")


def mark_pick(rows: list[ModelChoice]) -> None:
    """The page promises a ★ pick: when nothing is recommended (offline), the first that fits is."""
    if rows and not any(r.recommended for r in rows):
        best = next((r for r in rows if r.fit != "too_large"), None)
        if best is not None:
            best.recommended = True


class HardwarePage(QWizardPage):
    def __init__(self, wiz: ModelWizard) -> None:
        super().__init__()
        self.wiz = wiz
        self.setTitle("Your computer")
        self.setSubTitle("What ggufdesk found, and what it means for running a language model.")
        self.text = QLabel("Looking at your computer… The first time, this includes timing how fast its "
                           "processor runs a model (about a minute).")
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        lay = QVBoxLayout(self)
        lay.addWidget(self.text)
        lay.addStretch(1)
        self.done = False

    def initializePage(self) -> None:  # noqa: N802 - Qt API
        if self.done:
            return

        def probed(fut: Future[HardwareInfo]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.text.setText(f"Could not look at this computer: {msg}<br>"
                                  "You can still pick a model.")
                self.wiz.hw = None
            else:
                self.wiz.hw = fut.result()
                lines = self.wiz.services.describe(self.wiz.hw)
                self.text.setText("<ul>" + "".join(f"<li style='margin-bottom:6px'>{ln}</li>"
                                                   for ln in lines) + "</ul>")
            self.done = True
            self.completeChanged.emit()
            self.wiz.probe_done.emit()

        run_in_background(self.wiz.services.probe, probed, owner=self)

    def isComplete(self) -> bool:  # noqa: N802 - Qt API
        return self.done


class ModelPage(QWizardPage):
    def __init__(self, wiz: ModelWizard) -> None:
        super().__init__()
        self.wiz = wiz
        self.setTitle("Choose a model")
        self.setSubTitle("★ marks our pick for this computer. The speeds are predictions.")
        self.model = ChoiceTableModel(self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)
        self.repo = RepoField(placeholderText="or type a Hugging Face repo, e.g. unsloth/gemma-3-1b-it-GGUF")
        self.lookup_btn = QPushButton("Look up")
        self.lookup_btn.setAutoDefault(False)
        # clicked(bool) must not land in a parameter: every slot here is called without arguments.
        self.lookup_btn.clicked.connect(lambda _checked=False: self.lookup())
        self.repo.submitted.connect(self.lookup)
        self.file_btn = QPushButton("Open a .gguf file…")
        self.file_btn.setAutoDefault(False)
        self.file_btn.clicked.connect(lambda _checked=False: self.pick_file())
        self.status = _note()
        self.draft_box = QCheckBox()
        self.draft_box.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.repo, 1)
        row.addWidget(self.lookup_btn)
        row.addWidget(self.file_btn)
        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 1)
        lay.addLayout(row)
        lay.addWidget(self.draft_box)
        lay.addWidget(self.status)
        self._loaded = False

    def initializePage(self) -> None:  # noqa: N802 - Qt API
        if self._loaded:
            return
        self._loaded = True
        self.status.setText("Finding models that suit this computer…")
        svc, hw = self.wiz.services, self.wiz.hw

        def gather() -> tuple[bool, list[ModelChoice]]:
            online = svc.hub_reachable()
            rows = svc.recommendations(hw) if online else []
            return online, rows + svc.local_choices(hw)

        def done(fut: Future[tuple[bool, list[ModelChoice]]]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.status.setText(f"Could not list models: {msg}. You can open a .gguf file.")
            else:
                online, rows = fut.result()
                self.wiz.online = online
                mark_pick(rows)
                self.model.set_rows(rows)
                self.status.setText("" if online else
                                    "Offline: Hugging Face cannot be reached, so here are the "
                                    "starter model and the models already on this computer.")
                best = next((i for i, r in enumerate(rows) if r.recommended), 0 if rows else -1)
                if best >= 0:
                    self.table.selectRow(best)
            for col in range(1, self.model.columnCount()):
                self.table.resizeColumnToContents(col)
            self.wiz.choices_loaded.emit()

        run_in_background(gather, done, owner=self)

    def lookup(self) -> None:
        repo = self.repo.text().strip()
        if not repo:
            return
        self.status.setText(f"Looking up {repo}…")
        self.lookup_btn.setEnabled(False)
        svc, hw = self.wiz.services, self.wiz.hw

        def find() -> list[ModelChoice]:
            # Offline, the hub library would retry for ~25 s before failing: ask once, quickly.
            if not svc.hub_reachable():
                raise KnownError(offline_message(repo))
            try:
                return svc.lookup_repo(repo, hw)
            except KnownError:
                raise
            except OSError as e:  # a dropped network after the check: say so plainly
                raise KnownError(offline_message(repo)) from e
            except Exception as e:
                if any(w in str(e) for w in NETWORK_WORDS):
                    raise KnownError(offline_message(repo)) from e
                raise

        def done(fut: Future[list[ModelChoice]]) -> None:
            self.lookup_btn.setEnabled(True)
            if (msg := describe_failure(fut)) is not None:
                self.status.setText(msg)
            else:
                rows = fut.result()
                keep = [r for r in self.model.rows if r.repo != repo]
                self.model.set_rows(keep + rows)
                self.status.setText(f"{len(rows)} GGUF files in {repo}." if rows else
                                    f"No GGUF files in {repo}.")
                if rows:
                    self.table.selectRow(len(keep))
            self.wiz.choices_loaded.emit()

        run_in_background(find, done, owner=self)

    def pick_file(self, path: str | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Open a model", str(Path.home()),
                                                  "GGUF models (*.gguf)")
            if not path:
                return
        try:
            choice = self.wiz.services.choice_for_file(Path(path), self.wiz.hw)
        except Exception as e:  # noqa: BLE001 - shown to the user, then they pick again
            self.status.setText(str(e))
            return
        self.table.selectRow(self.model.add(choice))

    def current(self) -> ModelChoice | None:
        rows = self.table.selectionModel().selectedRows()
        return self.model.choice(rows[0].row()) if rows else None

    def _selection_changed(self, *_: object) -> None:
        c = self.current()
        draft = c.draft if c else None
        self.draft_box.setVisible(draft is not None)
        if draft is not None:
            self.draft_box.setText(f"Also get {draft.label} ({human_bytes(draft.size_bytes)}) as a "
                                   "draft model: usually faster answers, same quality")
            self.draft_box.setChecked(True)
        if c is not None and c.fit == "too_large":
            self.status.setText("That model is larger than this computer's memory.")
        self.completeChanged.emit()

    def isComplete(self) -> bool:  # noqa: N802 - Qt API
        c = self.current()
        return c is not None and c.fit != "too_large"

    def nextId(self) -> int:  # noqa: N802 - Qt API
        c = self.current()
        draft = c.draft if c is not None and self.draft_box.isChecked() else None
        if c is not None and not c.needs_download and c.source != "starter" and not (
                draft is not None and draft.needs_download):
            return FINISH_PAGE
        return DOWNLOAD_PAGE


class DownloadPage(QWizardPage):
    def __init__(self, wiz: ModelWizard) -> None:
        super().__init__()
        self.wiz = wiz
        self.setTitle("Downloading")
        self.what = QLabel()
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.detail = _note()
        self.pause_btn = QPushButton("Pause")
        self.cancel_btn = QPushButton("Cancel")
        self.pause_btn.clicked.connect(lambda _checked=False: self.toggle_pause())
        self.cancel_btn.clicked.connect(lambda _checked=False: self.cancel())
        for b in (self.pause_btn, self.cancel_btn):
            b.setAutoDefault(False)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.pause_btn)
        row.addWidget(self.cancel_btn)
        lay = QVBoxLayout(self)
        lay.addWidget(self.what)
        lay.addWidget(self.bar)
        lay.addWidget(self.detail)
        lay.addLayout(row)
        lay.addStretch(1)
        self.control = DownloadControl()
        self.state = "idle"  # idle | running | paused | cancelled | failed | done
        self.queue: list[ModelChoice] = []
        self._speed = 0.0
        self._last: tuple[float, int] = (0.0, 0)

    def initializePage(self) -> None:  # noqa: N802 - Qt API
        c = self.wiz.model_page.current()
        assert c is not None
        self.wiz.model_path = None if c.needs_download or c.source == "starter" else c.path
        self.wiz.draft_path = None
        self.queue = [c] if self.wiz.model_path is None else []
        if c.draft is not None and self.wiz.model_page.draft_box.isChecked():
            if c.draft.needs_download:
                self.queue.append(c.draft)
            else:
                self.wiz.draft_path = c.draft.path
        self.start()

    def start(self) -> None:
        if not self.queue:
            self.state = "done"
            # Nothing left to pause or cancel: go straight on to the last page.
            self.pause_btn.setVisible(False)
            self.cancel_btn.setVisible(False)
            self.bar.setValue(self.bar.maximum())
            self.detail.setText("Done.")
            self.completeChanged.emit()
            # Not from inside initializePage: QWizard records the page in its history afterwards.
            QTimer.singleShot(0, self._advance)
            return
        item = self.queue[0]
        self.state = "running"
        self.pause_btn.setText("Pause")
        self.control = DownloadControl()
        control = self.control
        self.what.setText(self._what(item))
        self.pause_btn.setVisible(True)
        self.cancel_btn.setVisible(True)
        self._speed, self._last = 0.0, (time.monotonic(), -1)
        last_ui = [0.0]

        def progress(done: int, total: int) -> None:  # worker thread
            now = time.monotonic()
            if now - last_ui[0] >= 0.1 or done >= total:
                last_ui[0] = now
                run_on_main(lambda: self._show_progress_if_open(done, total))

        def finished(fut: Future[Path]) -> None:
            if control is not self.control:
                return
            exc = fut.exception()
            if isinstance(exc, DownloadStopped) or (exc is None and control.stopped):
                self.state = "paused" if control.reason == "pause" else "cancelled"
                self.detail.setText("Paused. Resume continues where it stopped."
                                    if self.state == "paused" else "Cancelled.")
                self.wiz.download_state.emit(self.state)
                return
            if (msg := describe_failure(fut)) is not None:
                self.state = "failed"
                self.detail.setText(f"The download failed: {msg}")
                self.pause_btn.setText("Retry")
                self.wiz.download_state.emit(self.state)
                return
            path = Path(fut.result())
            done_item = self.queue.pop(0)
            if self.wiz.model_path is None and done_item is self.wiz.model_page.current():
                self.wiz.model_path = path
            else:
                self.wiz.draft_path = path
            self.start()

        run_in_background(lambda: self.wiz.services.download(item, progress, control), finished,
                          owner=self)

    def _advance(self) -> None:
        if self.state == "done" and self.wiz.currentPage() is self:
            self.wiz.next()
        self.wiz.download_finished.emit()

    @staticmethod
    def _what(item: ModelChoice) -> str:
        if item.source != "starter":
            return f"Getting {item.label}"
        from ggufdesk.core import starter

        s = starter.by_filename(item.filename or "") or starter.GEMMA
        if starter.ready(s):
            return f"Opening {item.label}"
        return f"{'Unpacking' if s.assembled else 'Checking'} {item.label} (first time only)"

    def _show_progress_if_open(self, done: int, total: int) -> None:
        if alive(self):  # the wizard may have closed while the download ran
            self._show_progress(done, total)

    def _show_progress(self, done: int, total: int) -> None:
        if self.state != "running":
            return
        now = time.monotonic()
        t0, b0 = self._last
        if b0 >= 0 and now > t0:
            inst = (done - b0) / (now - t0)
            self._speed = inst if self._speed == 0 else 0.7 * self._speed + 0.3 * inst
        self._last = (now, done)
        self.bar.setValue(int(1000 * done / total) if total else 0)
        eta = (total - done) / self._speed if self._speed > 0 else None
        eta_s = f", about {eta:.0f} s left" if eta is not None and eta < 86400 else ""
        self.detail.setText(f"{human_bytes(done)} of {human_bytes(total)} · "
                            f"{human_bytes(self._speed)}/s{eta_s}")

    def toggle_pause(self) -> None:
        if self.state == "running":
            self.control.request("pause")
        elif self.state in ("paused", "failed", "cancelled"):
            self.start()

    def cancel(self) -> None:
        if self.state == "running":
            self.control.request("cancel")
        self.wiz.back()

    def isComplete(self) -> bool:  # noqa: N802 - Qt API
        return self.state == "done"


class FinishPage(QWizardPage):
    def __init__(self, wiz: ModelWizard) -> None:
        super().__init__()
        self.wiz = wiz
        self.setTitle("Ready")
        self.text = QLabel()
        self.text.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.addWidget(self.text)
        lay.addStretch(1)

    def initializePage(self) -> None:  # noqa: N802 - Qt API
        c = self.wiz.model_page.current()
        if self.wiz.model_path is None and c is not None:
            self.wiz.model_path = c.path
            if c.draft is not None and self.wiz.model_page.draft_box.isChecked():
                self.wiz.draft_path = c.draft.path
        draft = f" with {Path(self.wiz.draft_path).name} as draft" if self.wiz.draft_path else ""
        assert self.wiz.model_path is not None  # the model page moves on only with a choice on disk or fetched
        self.text.setText(f"Press Load to open {Path(self.wiz.model_path).name}{draft}. "
                          "You can change engine settings later from the toolbar.")


class ModelWizard(QWizard):
    probe_done = Signal()
    choices_loaded = Signal()
    download_state = Signal(str)
    download_finished = Signal()

    def __init__(self, services: ModelServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("ggufdesk — choose a model")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnStartPage, True)
        self.services = services
        self.hw: HardwareInfo | None = None
        self.online = False
        self.model_path: Path | None = None
        self.draft_path: Path | None = None
        self.selection: Selection | None = None
        self.hw_page = HardwarePage(self)
        self.model_page = ModelPage(self)
        self.download_page = DownloadPage(self)
        self.finish_page = FinishPage(self)
        self.setPage(HW_PAGE, self.hw_page)
        self.setPage(MODEL_PAGE, self.model_page)
        self.setPage(DOWNLOAD_PAGE, self.download_page)
        self.setPage(FINISH_PAGE, self.finish_page)
        self.setButtonText(QWizard.WizardButton.FinishButton, "Load")
        self.resize(820, 560)

    def accept(self) -> None:
        c = self.model_page.current()
        if self.model_path is not None and c is not None:
            spec = (SpeculationSettings(mode="draft", draft_model=str(self.draft_path))
                    if self.draft_path else SpeculationSettings())
            self.selection = Selection(path=Path(self.model_path), speculation=spec,
                                       load=LoadSettings(n_gpu_layers=c.n_gpu_layers, n_cpu_moe=c.n_cpu_moe,
                                                         n_ctx=c.n_ctx))
        super().accept()

    def reject(self) -> None:
        if self.download_page.state == "running":
            self.download_page.control.request("cancel")
        super().reject()
