"""Documents attached to the conversation: a button and drag-and-drop, indexing with a progress bar, count,
ETA and Cancel, and the collection the answers come from (session/docs.py does the retrieval).

Attached files and folders go into a collection of their own (`chat-<conversation>`, kept in the data
directory like `ggufdesk docs add` collections, which can be attached too); it is indexed in a
background thread (session/docs_index.IndexJob) and watched while attached: a QFileSystemWatcher on
its folders asks for an incremental pass when something changes there. It stays attached until the chip's
× detaches it. With no embedding model the search is BM25 only, and the chip says so.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QFileSystemWatcher, QMimeData, QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtWidgets import QFileDialog, QFrame, QHBoxLayout, QLabel, QProgressBar, QToolButton, QWidget

from ggufdesk.core.docs.indexer import Progress, Report
from ggufdesk.core.docs.store import Collection, collection_path
from ggufdesk.core.errors import KnownError
from ggufdesk.session.docs import Attached, Retriever
from ggufdesk.session.docs_index import IndexJob, describe, eta_text, summary
from ggufdesk.ui.message_widget import Citation
from ggufdesk.ui.tasks import run_on_main

if TYPE_CHECKING:
    from ggufdesk.session.embedding import EmbeddingEngine
    from ggufdesk.ui.main_window import MainWindow

log = logging.getLogger("ggufdesk.ui")
EMBED_MODEL_KEY = "docs/embed_model"  # an embedding GGUF chosen by the user (none: BM25 only)
WATCH_DEBOUNCE_MS = 1500
MAX_WATCHED = 2000  # folders; a huge tree is re-indexed on demand (attach again) beyond this


class AttachChip(QFrame):
    """Above the message box: what is attached, the indexing bar (count, ETA), Cancel and Detach."""

    cancel_requested = Signal()
    detach_requested = Signal()
    model_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("docsChip")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.label = QLabel()
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.bar = QProgressBar()
        self.bar.setMinimumWidth(380)
        self.bar.setVisible(False)
        self.cancel_btn = QToolButton()
        self.cancel_btn.setText("Cancel")
        self.cancel_btn.setToolTip("Stop indexing (what is indexed so far stays)")
        self.cancel_btn.setVisible(False)
        self.model_btn = QToolButton()
        self.model_btn.setText("Embedding model…")
        self.model_btn.setToolTip("Choose an embedding GGUF for hybrid search (BM25 + vectors); the passages "
                                  "get vectors without the files being read again")
        self.model_btn.setVisible(False)
        self.detach_btn = QToolButton()
        self.detach_btn.setText("×")
        self.detach_btn.setToolTip("Stop answering from these documents")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 2, 6, 2)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.bar)
        lay.addWidget(self.cancel_btn)
        lay.addWidget(self.model_btn)
        lay.addWidget(self.detach_btn)
        self.cancel_btn.clicked.connect(lambda: self.cancel_requested.emit())
        self.detach_btn.clicked.connect(lambda: self.detach_requested.emit())
        self.model_btn.clicked.connect(lambda: self.model_requested.emit())

    def show_progress(self, p: Progress) -> None:
        self.bar.setVisible(True)
        self.cancel_btn.setVisible(True)
        if p.phase == "scanning":
            self.bar.setRange(0, 0)  # busy: the count is still growing
            self.bar.setFormat(f"scanning… {p.files_total:,} files")
        else:
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(1000 * p.bytes_done / p.bytes_total) if p.bytes_total else 1000)
            eta = "" if p.eta_s is None else f" · {eta_text(p.eta_s)}"
            self.bar.setFormat(f"{p.files_done:,}/{p.files_total:,} files · {p.bytes_done / 1e6:,.0f} of "
                               f"{p.bytes_total / 1e6:,.0f} MB{eta}")
        self.bar.setToolTip(describe(p))

    def show_idle(self, text: str, tooltip: str = "", *, offer_model: bool = False) -> None:
        self.model_btn.setVisible(offer_model)
        self.bar.setVisible(False)
        self.cancel_btn.setVisible(False)
        self.label.setText(text)
        self.label.setToolTip(tooltip)


class DocsAttach(QObject):
    """The window's documents: attach (files, folder, a collection), index, watch, detach."""

    attached = Signal(str)  # the collection's name, once it answers
    indexing_done = Signal(object)  # the Report (or None after an error)

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.name = ""
        self.job: IndexJob | None = None
        self.coll: Collection | None = None
        self.engine: EmbeddingEngine | None = None
        self.chip = self._new_chip()
        self.chip_shown = False
        self.files_btn = QToolButton()
        self.files_btn.setText("Attach files…")
        self.files_btn.setToolTip("Answer from your files: PDF, Word, Markdown, text, HTML, code "
                                  "(or drop files and folders on the window)")
        self.files_btn.clicked.connect(lambda: self.choose_files())
        self.folder_btn = QToolButton()
        self.folder_btn.setText("Attach folder…")
        self.folder_btn.setToolTip("Answer from every document in a folder; it is watched while attached")
        self.folder_btn.clicked.connect(lambda: self.choose_folder())
        self._changed = QTimer(self, singleShot=True, interval=WATCH_DEBOUNCE_MS)
        self.watcher = QFileSystemWatcher(self)
        self.watcher.directoryChanged.connect(lambda _p: self._changed.start())
        self.watcher.fileChanged.connect(lambda _p: self._changed.start())
        self._changed.timeout.connect(self.refresh)
        self._last_progress = 0.0

    # ---- choosing what to attach ---------------------------------------------------------------------

    def choose_files(self) -> None:
        files, _ = QFileDialog.getOpenFileNames(self.window, "Attach documents", str(Path.home()),
                                                "Documents (*.pdf *.docx *.md *.txt *.html *.htm *.rst *.py *.*)")
        if files:
            self.attach_paths([Path(f) for f in files])

    def choose_model(self) -> None:
        """An embedding GGUF for hybrid search: remembered, and the attached collection gets its vectors."""
        path, _ = QFileDialog.getOpenFileName(self.window, "Embedding model", str(Path.home()),
                                              "GGUF models (*.gguf)")
        if not path:
            return
        QSettings().setValue(EMBED_MODEL_KEY, path)
        if self.name:
            name = self.name
            self.close_collection()  # reopened with its vectors when the pass ends
            self.name = ""
            self.window.session.attach_docs(None)
            self._start(name, [], model=path)

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.window, "Attach a folder", str(Path.home()))
        if folder:
            self.attach_paths([Path(folder)])

    def conversation_name(self) -> str:
        conv = getattr(self.window, "conv", None)
        ident = conv.id if conv is not None and conv.id else time.strftime("%Y%m%d-%H%M%S")
        return f"chat-{ident}"

    # ---- attaching and indexing ----------------------------------------------------------------------

    def attach_paths(self, paths: list[Path]) -> None:
        """Index `paths` into this conversation's collection (made if new) and answer from it."""
        if self.job is not None and self.job.running:
            self.window.banner.notify("documents are still being indexed: wait, or cancel first", "warning")
            return
        name = self.name or self.conversation_name()
        self._start(name, paths)

    def attach_collection(self, name: str) -> None:
        """Answer from a collection made before (ggufdesk docs add), brought up to date first (no
        button yet: the window's own attachments cover files and folders)."""
        if self.job is not None and self.job.running:
            return
        self._start(name, [])

    def refresh(self) -> None:
        """An incremental pass over what is attached (the folder watcher calls it)."""
        if self.name and (self.job is None or not self.job.running):
            self._start(self.name, [], quiet=True)

    def _start(self, name: str, paths: list[Path], *, quiet: bool = False, model: str = "") -> None:
        self._show_chip()
        if not quiet:
            self.chip.label.setText(f"Indexing into {name}…")
        engine, model = self._embedder(name, model)
        self.job = IndexJob(name, paths, embed=engine, embed_model=model, embed_dim=getattr(engine, "dim", 0),
                            on_progress=self._progress_from_thread,
                            on_done=lambda report, error: run_on_main(lambda: self._done(name, report, error)))
        self.job.start()

    def _embedder(self, name: str, model: str = "") -> tuple[EmbeddingEngine | None, str]:
        """The embedding engine for this collection: the model just chosen, else its own model, else the
        user's chosen one, else none."""
        if not model and collection_path(name).exists():
            with Collection.open(name) as coll:
                model = coll.embed_model
        model = model or str(QSettings().value(EMBED_MODEL_KEY, "", type=str) or "")
        if not model or not Path(model).is_file():
            return None, ""
        if self.engine is None or self.engine.model != model:
            from ggufdesk.session.embedding import EmbeddingEngine

            if self.engine is not None:
                self.engine.close()
            self.engine = EmbeddingEngine(model)
        return self.engine, model

    def _progress_from_thread(self, p: Progress) -> None:
        now = time.monotonic()
        if p.phase != "done" and now - self._last_progress < 0.1:
            return  # the bar needs no more than ten updates a second
        self._last_progress = now
        snapshot = Progress(**{f: getattr(p, f) for f in Progress.__slots__})
        run_on_main(lambda: self.chip.show_progress(snapshot))

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def _done(self, name: str, report: Report | None, error: KnownError | None) -> None:
        self.job = None
        if error is not None:
            self._failed(name, error)
            return
        assert report is not None
        self._answer_from(name)
        skipped = f"; skipped: {len(report.notes)}" if report.notes else ""
        notes = "\n".join(f"{Path(p).name}: {r}" for p, r in report.notes[:20])
        if report.cancelled:
            self.window.banner.notify(f"indexing cancelled: {summary(report)}", "warning")
        elif report.added or report.updated or report.removed:
            self.window.banner.notify(f"{name}: {summary(report)}")
        self._chip_text(skipped, notes)
        self.indexing_done.emit(report)

    def _failed(self, name: str, error: KnownError) -> None:
        if self.engine is not None:  # most likely the embedding model: forget it, go on with BM25
            self.engine.close()
            self.engine = None
            QSettings().remove(EMBED_MODEL_KEY)
            self.window.banner.notify(f"the embedding model cannot be used ({error}): search is BM25 only",
                                      "error")
        else:
            self.window.banner.notify(f"indexing failed: {error}", "error")
        if collection_path(name).exists():
            try:
                self._answer_from(name)
                self._chip_text("", "")
            except KnownError:
                self.chip.show_idle(f"Indexing {name} failed: {error}")
        else:
            self.chip.show_idle(f"Indexing {name} failed: {error}")
        self.indexing_done.emit(None)

    def _answer_from(self, name: str) -> None:
        if self.coll is not None and self.name == name:
            return
        self.close_collection()
        self.name = name
        self.coll = Collection.open(name)
        embed = self.engine if self.engine is not None and self.engine.model == self.coll.embed_model else None
        self.window.session.attach_docs(Attached(Retriever(self.coll, embed=embed)))
        self._watch()
        self.attached.emit(name)

    def _chip_text(self, skipped: str, notes: str) -> None:
        if self.coll is None or self.window.session.docs is None:
            return
        st = self.coll.stats()
        retriever = self.window.session.docs.retriever
        self.chip.show_idle(f"Documents: {self.name}: {st['files']:,} files, {st['chunks']:,} passages{skipped} — "
                            f"{retriever.note}", notes, offer_model=retriever.mode == "bm25")

    def _watch(self) -> None:
        if self.coll is None:
            return
        old = self.watcher.directories() + self.watcher.files()
        if old:
            self.watcher.removePaths(old)
        folders: list[str] = []
        for root in self.coll.roots:
            p = Path(root)
            if p.is_file():
                folders.append(str(p.parent))
            elif p.is_dir():
                folders += [str(p)] + [str(d) for d in p.rglob("*") if d.is_dir() and not d.name.startswith(".")][
                    :MAX_WATCHED]
        if folders:
            self.watcher.addPaths(sorted(set(folders))[:MAX_WATCHED])

    def detach(self) -> None:
        """Stop answering from documents (the index stays in the data directory)."""
        self.cancel()
        self.window.session.attach_docs(None)
        self.close_collection()
        self.name = ""
        if self.chip_shown:
            self.window.composer.remove_attachment(self.chip)
            self.chip = self._new_chip()
            self.chip_shown = False

    def close_collection(self) -> None:
        if self.coll is not None:
            self.coll.close()
            self.coll = None
        old = self.watcher.directories() + self.watcher.files()
        if old:
            self.watcher.removePaths(old)

    def shutdown(self) -> None:
        self.cancel()
        if self.job is not None:
            self.job.wait(5)
        self.close_collection()
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def _show_chip(self) -> None:
        if not self.chip_shown:
            self.window.composer.add_attachment(self.chip)
            self.chip_shown = True
        self.chip.show()

    def _new_chip(self) -> AttachChip:
        chip = AttachChip()
        chip.cancel_requested.connect(self.cancel)
        chip.detach_requested.connect(self.detach)
        chip.model_requested.connect(self.choose_model)
        return chip

    # ---- drag and drop ---------------------------------------------------------------------------------

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt API
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop):
            paths = dropped_documents(event.mimeData())  # type: ignore[attr-defined]
            if paths:
                event.acceptProposedAction()  # type: ignore[attr-defined]
                if kind == QEvent.Type.Drop:
                    self.attach_paths(paths)
                return True
        elif kind == QEvent.Type.Close and obj is self.window:
            self.shutdown()
        return False


def dropped_documents(mime: QMimeData) -> list[Path]:
    """Local files and folders in a drop, other than GGUF models (the window loads those)."""
    if not mime.hasUrls():
        return []
    out = [Path(u.toLocalFile()) for u in mime.urls() if u.isLocalFile()]
    return [p for p in out if not p.name.lower().endswith(".gguf")]


def attach(window: MainWindow) -> DocsAttach:
    """Give the window its documents: the Attach button under the message box, drops on the window,
    the chat and the box, sources that open their passage, and detaching when the conversation changes."""
    docs = DocsAttach(window)
    window.composer.add_tool(docs.files_btn)
    window.composer.add_tool(docs.folder_btn)
    for target in (window, window.chat.viewport(), window.composer.box, window.composer.box.viewport()):
        target.setAcceptDrops(True)
        target.installEventFilter(docs)
    window.chat.citation_requested.connect(lambda c: open_passage(window, c))
    return docs


def open_passage(window: QWidget, citation: Citation) -> None:
    from ggufdesk.ui.passage_dialog import PassageDialog

    dialog = PassageDialog(citation, window)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dialog.show()
