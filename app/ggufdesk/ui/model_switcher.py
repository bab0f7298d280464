"""The header's model switcher: the model's name as a drop-down of the loaded and available models, with memory."""
from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, TypedDict

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QHideEvent
from PySide6.QtWidgets import QMenu, QToolButton, QWidget

from ggufdesk.core.library import LocalModel
from ggufdesk.ui.tasks import describe_failure, run_in_background

log = logging.getLogger("ggufdesk.ui.switcher")
GB = 1e9


def memory_words(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= 0.1 * GB else f"{n / 2**20:.0f} MB"


def list_library() -> list[LocalModel]:
    """The library, starters first (read off the GUI thread: it scans folders)."""
    from ggufdesk.core import library

    return library.entries()


class ServerModel(TypedDict):
    """A model the local server holds: one of server/service.py's Service.snapshot()["models"]."""

    id: str
    path: str
    state: str  # loading | ready | unloading | failed
    active: int
    ram_bytes: int
    vram_bytes: int


class ModelSwitcher(QToolButton):
    """The loaded model's name; pressed, a menu of the models: the one loaded here (with the memory its
    engine reports), those the local server holds, then every other model of the library with its size.
    Choosing one emits `chosen(path, library id)`; the window loads it and keeps the conversation."""

    chosen = Signal(str, str)  # path, library id
    choose_other = Signal()  # "Choose or download a model…"

    def __init__(self, *, models: Callable[[], list[LocalModel]] | None = None,
                 server_models: Callable[[], list[ServerModel]] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelSwitcher")
        self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.setToolTip("Switch model (the conversation stays)")
        self._source = models or (lambda: list_library())  # looked up when called (tests replace it)
        self._server_models = server_models
        self.models: list[LocalModel] = []
        self.current_path: str | None = None
        self.current_memory = 0
        # Opened with popup(), which returns at once (QToolButton's own menu modes run it with exec()).
        self.menu_ = QMenu(self)
        self.menu_.aboutToShow.connect(self.refresh)
        self.clicked.connect(lambda _checked=False: self.open_menu())
        self._listing: Future[list[LocalModel]] | None = None
        self.set_current(None)
        self.refresh()

    # ---- what is shown --------------------------------------------------------------------------

    def set_current(self, path: str | None, memory: int = 0) -> None:
        """The window's model (None: nothing loaded) and the bytes its engine holds."""
        self.current_path, self.current_memory = path, memory
        self.setText(f"{self.model_id(path)} ▾" if path else "Choose a model ▾")
        self._rebuild()

    def model_id(self, path: str | None) -> str:
        if not path:
            return ""
        from ggufdesk.core import library

        return library.id_for(path, self.models)

    def open_menu(self) -> None:
        self.menu_.popup(self.mapToGlobal(self.rect().bottomLeft()))

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802 - Qt API
        self.menu_.close()  # a popup left open would take every key press of the application
        super().hideEvent(event)

    def refresh(self) -> None:
        """Read the library again in the background; the menu is rebuilt when it arrives."""
        if self._listing is not None and not self._listing.done():
            return

        def done(fut: Future[list[LocalModel]]) -> None:
            if (msg := describe_failure(fut)) is not None:
                log.warning("cannot list the models: %s", msg)
                return
            self.models = fut.result()
            self.set_current(self.current_path, self.current_memory)

        self._listing = run_in_background(self._source, done, owner=self)

    def _rebuild(self) -> None:
        menu = self.menu_
        menu.clear()
        other = menu.addAction("Choose or download a model…")
        other.triggered.connect(lambda _=False: self.choose_other.emit())
        here = self.current_path
        server = self._server_loaded()
        if here:
            menu.addSection("Loaded here")
            a = self._entry(self.model_id(here), here, f"in use · {memory_words(self.current_memory)}"
                            if self.current_memory else "in use")
            a.setCheckable(True)
            a.setChecked(True)
        if server:
            menu.addSection("Loaded in the local server")
            for s in server:
                if s.get("path"):
                    self._entry(s["id"], s["path"], f"{s['state']} · {memory_words(s.get('ram_bytes') or 0)}")
        rest = [m for m in self.models if not here or Path(m.path) != Path(here)]
        if rest:
            menu.addSection("Available")
            for m in rest:
                self._entry(m.id, str(m.path), f"{memory_words(m.size)} on disk"
                            + (" · starter" if m.source == "starter" else ""))

    def _entry(self, model_id: str, path: str, note: str) -> QAction:
        a = self.menu_.addAction(f"{model_id}  —  {note}")
        a.setToolTip(path)
        a.triggered.connect(lambda _=False, p=path, i=model_id: self._choose(p, i))
        return a

    def _server_loaded(self) -> list[ServerModel]:
        if self._server_models is None:
            return []
        try:
            return [m for m in self._server_models() if m.get("state") in ("ready", "loading")]
        except Exception:  # the server may be stopping; the menu still works
            log.debug("server models unavailable", exc_info=True)
            return []

    def _choose(self, path: str, model_id: str) -> None:
        if self.current_path and Path(path) == Path(self.current_path):
            self._rebuild()  # already loaded here: keep the check mark
            return
        self.chosen.emit(path, model_id)
