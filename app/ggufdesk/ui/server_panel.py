"""The "Local server" dock: run ggufdesk's OpenAI/Anthropic-compatible API from the app (off by default).

The server runs in this process on a thread with its own event loop, over its own engine processes
(the chat's engine stays the chat's): a client that crashes or saturates the server's engine cannot
stall or kill the conversation on screen, and the server can decode several sequences at once while
the chat keeps its one. It serves the window's model (loaded when the server starts) and every other
model of the library, each loaded in an engine of its own when a request names it (or when "Load in
the server" is pressed) and unloaded when idle: the window's model is never taken away. Model files
are mapped, not copied, so the weights' pages are shared between engines; what is doubled is the KV
cache and compute buffers.
"""
from __future__ import annotations

import dataclasses
import logging
import secrets
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Callable, Protocol

from PySide6.QtCore import QEvent, QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDockWidget, QFormLayout, QFrame, QHBoxLayout, QLabel, QLineEdit, QMainWindow,
    QPlainTextEdit, QPushButton, QScrollArea, QSpinBox, QToolBar, QVBoxLayout, QWidget,
)

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, Settings
from ggufdesk.ui.tasks import describe_failure, run_in_background

if TYPE_CHECKING:
    from ggufdesk.core.library import LocalModel
    from ggufdesk.server.budget import Need
    from ggufdesk.server.pool import EnginePool
    from ggufdesk.server.router import ModelEntry
    from ggufdesk.server.runner import ServerRunner
    from ggufdesk.server.service import Service

log = logging.getLogger("ggufdesk.ui.server")

ModelSource = Callable[[], "tuple[str, LoadSettings] | None"]
PORT_KEY = "server/port"
DEFAULT_PORT = 8080
PANEL_MIN_WIDTH = 220  # with the chat's minimum, fits an 800 px window (the gauges fold away)
NeedFn = Callable[[str, "ModelEntry"], "Need"]  # the router's memory estimate of a model


class PoolFactory(Protocol):
    """server/pool.py's EnginePool as the panel makes it (tests pass stand-in engines)."""

    def __call__(self, *, model: str, load: LoadSettings) -> EnginePool: ...


def _library_file(m: LocalModel) -> str:
    """The path to load for a library model, made ready (a starter is assembled on first use)."""
    from ggufdesk.core import library

    return str(library.file_for(m))


def snippets(url: str, model: str, key: str) -> str:
    """Copy-paste examples for curl and the openai client."""
    auth = f' -H "Authorization: Bearer {key}"' if key else ""
    return (
        f"# curl\ncurl {url}/v1/chat/completions{auth} -H 'Content-Type: application/json' \\\n"
        f"  -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'\n\n"
        "# Python (pip install openai)\nfrom openai import OpenAI\n"
        f"client = OpenAI(base_url=\"{url}/v1\", api_key=\"{key or 'none'}\")\n"
        f"r = client.chat.completions.create(model=\"{model}\",\n"
        "    messages=[{\"role\": \"user\", \"content\": \"Hello!\"}])\nprint(r.choices[0].message.content)\n"
    )


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def remembered_port(settings: QSettings | None = None) -> int:
    """The port the server last started on (8080 the first time)."""
    value = (settings or QSettings()).value(PORT_KEY, DEFAULT_PORT, type=int)
    return value if isinstance(value, int) and 0 <= value <= 65535 else DEFAULT_PORT


class ServerPanel(QDockWidget):
    """Toggle, port, API key, URL, snippets and live counts of the in-app server."""

    state_changed = Signal(str)  # "off" | "loading" | "ready" | "failed"

    def __init__(self, *, model_source: ModelSource, parallel: int = 4, parent: QWidget | None = None,
                 pool_factory: PoolFactory | None = None,
                 settings_source: Callable[[], Settings] | None = None, idle_unload_s: float = 600.0,
                 need: NeedFn | None = None) -> None:
        """`pool_factory(model=, load=)` and `need(path, entry)` (the router's memory estimate) are for
        tests: stand-in engines, made-up sizes."""
        super().__init__("Local server", parent)
        self.setObjectName("serverDock")
        self._model_source = model_source
        self._settings_source = settings_source
        self._parallel = parallel
        self._pool_factory = pool_factory
        self._idle_unload_s = idle_unload_s
        self._need = need
        self.service: Service | None = None
        self.runner: ServerRunner | None = None
        self.state = "off"
        self.url = ""
        self.view_action: QAction | None = None  # the toolbar's toggle (attach)

        self.toggle = QCheckBox("Serve the loaded model")
        self.about = QLabel("An OpenAI- and Anthropic-compatible API on this computer, for other "
                            "programs (editors, agents, scripts).")
        self.about.setWordWrap(True)
        self.port = QSpinBox(minimum=0, maximum=65535, value=remembered_port())
        self.key = QLineEdit(placeholderText="none (this computer only)")
        self.new_key = QPushButton("New key")
        self.url_label = QLabel("off")
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.counts = QLabel("")
        self.loaded_label = QLabel("")
        self.loaded_label.setWordWrap(True)
        self.load_box = QComboBox()
        self.load_box.setToolTip("Any model of the library: the server loads it in an engine of its own")
        self.load_btn = QPushButton("Load in the server")
        self.load_btn.setEnabled(False)
        self.snippet = QPlainTextEdit(readOnly=True)
        self.snippet.setMinimumHeight(120)
        self.snippet.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.copy = QPushButton("Copy")

        body = QWidget()
        body.setMinimumWidth(PANEL_MIN_WIDTH)
        lay = QVBoxLayout(body)
        lay.addWidget(self.toggle)
        lay.addWidget(self.about)
        form = QFormLayout()
        form.addRow("Port", self.port)
        key_row = QHBoxLayout()
        key_row.addWidget(self.key, 1)
        key_row.addWidget(self.new_key)
        form.addRow("API key", key_row)
        form.addRow("URL", self.url_label)
        form.addRow("Now", self.counts)
        form.addRow("Models", self.loaded_label)
        load_row = QHBoxLayout()
        load_row.addWidget(self.load_box, 1)
        load_row.addWidget(self.load_btn)
        form.addRow("Load", load_row)
        lay.addLayout(form)
        lay.addWidget(self.status)
        lay.addWidget(self.snippet, 1)
        lay.addWidget(self.copy)
        scroll = QScrollArea()  # short windows scroll the panel rather than grow
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(body)
        scroll.setMinimumWidth(PANEL_MIN_WIDTH + scroll.verticalScrollBar().sizeHint().width())
        self.setWidget(scroll)

        self.timer = QTimer(self, interval=500)
        self.timer.timeout.connect(self.refresh)
        self.toggle.toggled.connect(self._on_toggle)
        self.new_key.clicked.connect(lambda: self.key.setText(secrets.token_urlsafe(24)))
        self.copy.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.snippet.toPlainText()))
        self.load_btn.clicked.connect(lambda _checked=False: self.load_other())

    # ---- start / stop ---------------------------------------------------------------------------

    def _on_toggle(self, on: bool) -> None:
        if on:
            self.start()
        else:
            self.stop()

    def start(self) -> bool:
        source = self._model_source()
        if source is None:
            return self._refuse("Load a model first: the server serves the model the chat has loaded "
                                "(and loads the library's others when asked).")
        model, load = source
        load = dataclasses.replace(load, n_parallel=self._parallel)
        key = self.key.text().strip()
        for w in (self.port, self.key, self.new_key):
            w.setEnabled(False)
        self._set_state("loading")
        settings = self._settings_source() if self._settings_source is not None else None
        run_in_background(lambda: self._entries(model, load, settings), lambda fut: self._serve(fut, key),
                          owner=self)
        return True

    def _entries(self, model: str, load: LoadSettings, settings: Settings | None) -> list[ModelEntry]:
        """The window's model first, then the library's others (each with its preset), off the GUI thread."""
        from ggufdesk.core import library
        from ggufdesk.server.router import ModelEntry

        from ggufdesk.ui import model_switcher

        found = model_switcher.list_library()  # the same list as the window's model switcher
        first = library.id_for(model, found)
        out = [ModelEntry(id=first, path=model, load=load, name=model.rsplit("/", 1)[-1])]
        for m in found:
            if m.id == first:
                continue
            try:
                ms = settings.for_model(m.id) if settings is not None else None
            except KnownError as e:
                log.warning("preset of %s not used: %s", m.id, e)
                ms = settings
            preset = settings.presets.get(m.id) if settings is not None else None
            out.append(ModelEntry(
                id=m.id, path=str(m.path), name=m.name, size=m.size, source=m.source, quant=m.quant,
                load=dataclasses.replace(ms.load if ms else load, n_parallel=self._parallel),
                sampling=preset.known("sampling") if preset else {},
                system_prompt=preset.system_prompt if preset else None,
                file=partial(_library_file, m)))
        return out

    def _serve(self, fut: Future[list[ModelEntry]], key: str) -> None:
        if self.state != "loading":
            return  # stopped meanwhile
        if (msg := describe_failure(fut)) is not None:
            self.stop()
            self._refuse(msg)
            return
        from ggufdesk.server.pool import EnginePool
        from ggufdesk.server.router import Router
        from ggufdesk.server.runner import ServerRunner
        from ggufdesk.server.service import ServerConfig, Service

        entries = fut.result()
        factory: PoolFactory = self._pool_factory or EnginePool
        router = Router(entries=entries, idle_unload_s=self._idle_unload_s, need=self._need,
                        pool_factory=lambda e, path: factory(model=path, load=e.load))
        self.service = Service(router=router, config=ServerConfig(api_keys=(key,) if key else (),
                                                                  parallel=self._parallel))
        try:
            self.runner = ServerRunner(self.service, host="127.0.0.1", port=self.port.value())
            self.url = self.runner.start_thread()
        except KnownError as e:
            self.stop()
            self._refuse(str(e))
            return
        QSettings().setValue(PORT_KEY, self.port.value())  # the port that worked, next time too
        self.url_label.setText(self.url)
        self.snippet.setPlainText(snippets(self.url, router.default_id, key))
        self.load_box.clear()
        for entry in entries:
            self.load_box.addItem(entry.id, entry.id)
        self.load_btn.setEnabled(True)
        self.timer.start()
        service = self.service
        run_in_background(lambda: service.request_load(router.default_id).result(), self._loaded, owner=self)

    def _loaded(self, fut: Future[None]) -> None:
        if self.service is None:
            return  # stopped meanwhile
        err = fut.exception()
        self._set_state("failed" if err else "ready")
        if err:
            self.status.setText(f"The server's model did not load: {err}")

    def load_other(self, model_id: str | None = None) -> None:
        """Have the server load a model (the chosen one) in an engine of its own; the window's stays."""
        service = self.service
        model_id = model_id or self.load_box.currentData()
        if service is None or not model_id:
            return
        self.status.setText(f"Loading {model_id} in the server…")

        def done(fut: Future[None]) -> None:
            if self.service is not service:
                return
            msg = describe_failure(fut)
            self.status.setText(f"{model_id}: {msg}" if msg else f"{model_id} is loaded in the server.")
            self.refresh()

        run_in_background(lambda: service.request_load(model_id).result(), done, owner=self)

    def _refuse(self, message: str) -> bool:
        self.status.setText(message)
        self.toggle.blockSignals(True)
        self.toggle.setChecked(False)
        self.toggle.blockSignals(False)
        return False

    def stop(self) -> None:
        runner, service = self.runner, self.service
        self.runner = self.service = None
        self.timer.stop()
        if runner is not None:
            runner.stop()
        if service is not None:
            run_in_background(service.shutdown)
        for w in (self.port, self.key, self.new_key):
            w.setEnabled(True)
        self.load_btn.setEnabled(False)
        self.load_box.clear()
        self.url_label.setText("off")
        self.counts.setText("")
        self.loaded_label.setText("")
        self._set_state("off")

    def _set_state(self, state: str) -> None:
        self.state = state
        text = {"off": "", "loading": "Loading the model in the server's own engine…",
                "ready": "Ready. Point any OpenAI or Anthropic client at the URL."}.get(state)
        if text is not None:
            self.status.setText(text)
        self.refresh()
        self.state_changed.emit(state)

    def refresh(self) -> None:
        if self.service is None:
            return
        s = self.service.snapshot()
        self.counts.setText(f"{plural(s['clients'], 'client')} · {s['running']} running · "
                            f"{s['queued']} queued")
        self.loaded_label.setText(" · ".join(
            f"{m['id']} ({m['state']}" + (f", {m['ram_bytes'] / 2**20:.0f} MB" if m["ram_bytes"] else "") + ")"
            for m in s["models"]) or "none loaded")


class _StopOnClose(QObject):
    def __init__(self, panel: ServerPanel) -> None:
        super().__init__(panel)
        self.panel = panel

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt API
        if event.type() == QEvent.Type.Close and self.panel.service is not None:
            self.panel.stop()
        return False


def attach(window: QMainWindow, toolbar: QToolBar, model_source: ModelSource, *,
           settings_source: Callable[[], Settings] | None = None,
           make_room: Callable[[bool], None] | None = None) -> ServerPanel:
    """Add the panel to a main window: a hidden dock, a toolbar toggle, and stop-on-close.
    `make_room(showing)` runs before the panel shows (and after it hides): a narrow window folds
    something away for it rather than growing."""
    panel = ServerPanel(model_source=model_source, parent=window, settings_source=settings_source)
    window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, panel)
    panel.hide()
    action = QAction("Local server", window, checkable=True)
    action.setToolTip("Show the Local server panel")

    def toggled(on: bool) -> None:
        if on and make_room is not None:
            make_room(True)
        panel.setVisible(on)

    def visibility(visible: bool) -> None:
        action.setChecked(visible)
        if not visible and make_room is not None and not panel.isVisible():
            make_room(False)

    action.triggered.connect(toggled)
    panel.visibilityChanged.connect(visibility)
    panel.view_action = action
    toolbar.addAction(action)
    window.installEventFilter(_StopOnClose(panel))
    return panel
