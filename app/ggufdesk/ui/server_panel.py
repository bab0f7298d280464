"""The "Local server" dock: run ggufdesk's OpenAI/Anthropic-compatible API from the app (off by default).

The server runs in this process on a thread with its own event loop, over its own engine process
(the chat's engine stays the chat's): a client that crashes or saturates the server's engine cannot
stall or kill the conversation on screen, and the server can decode several sequences at once while
the chat keeps its one. The model file is mapped, not copied, so the weights' pages are shared
between the two engines; what is doubled is the KV cache and compute buffers.
"""
from __future__ import annotations

import dataclasses
import logging
import secrets
from typing import Any, Callable

from PySide6.QtCore import QEvent, QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox, QDockWidget, QFormLayout, QFrame, QHBoxLayout, QLabel, QLineEdit, QMainWindow,
    QPlainTextEdit, QPushButton, QScrollArea, QSpinBox, QVBoxLayout, QWidget,
)

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.ui.tasks import run_in_background

log = logging.getLogger("ggufdesk.ui.server")

ModelSource = Callable[[], "tuple[str, LoadSettings] | None"]
PORT_KEY = "server/port"
DEFAULT_PORT = 8080
PANEL_MIN_WIDTH = 220  # with the chat's minimum, fits an 800 px window (the gauges fold away)


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
                 pool_factory: Callable[..., Any] | None = None) -> None:
        super().__init__("Local server", parent)
        self.setObjectName("serverDock")
        self._model_source = model_source
        self._parallel = parallel
        self._pool_factory = pool_factory
        self.service: Any = None
        self.runner: Any = None
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

    # ---- start / stop ---------------------------------------------------------------------------

    def _on_toggle(self, on: bool) -> None:
        if on:
            self.start()
        else:
            self.stop()

    def start(self) -> bool:
        from ggufdesk.server.pool import EnginePool
        from ggufdesk.server.runner import ServerRunner
        from ggufdesk.server.service import ServerConfig, Service

        source = self._model_source()
        if source is None:
            return self._refuse("Load a model first: the server serves the model the chat has loaded.")
        model, load = source
        load = dataclasses.replace(load, n_parallel=self._parallel)
        factory = self._pool_factory or EnginePool
        pool = factory(model=model, load=load)
        key = self.key.text().strip()
        self.service = Service(pool=pool, config=ServerConfig(api_keys=(key,) if key else (),
                                                             parallel=self._parallel))
        try:
            self.runner = ServerRunner(self.service, host="127.0.0.1", port=self.port.value())
            self.url = self.runner.start_thread()
        except KnownError as e:
            self.service = self.runner = None
            return self._refuse(str(e))
        QSettings().setValue(PORT_KEY, self.port.value())  # the port that worked, next time too
        for w in (self.port, self.key, self.new_key):
            w.setEnabled(False)
        self.url_label.setText(self.url)
        self.snippet.setPlainText(snippets(self.url, pool.model_id, key))
        self._set_state("loading")
        self.timer.start()
        run_in_background(pool.start, self._loaded)
        return True

    def _loaded(self, fut: Any) -> None:
        if self.service is None:
            return  # stopped meanwhile
        err = fut.exception()
        self._set_state("failed" if err else "ready")
        if err:
            self.status.setText(f"The server's model did not load: {err}")

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
            run_in_background(service.pool.shutdown)
        for w in (self.port, self.key, self.new_key):
            w.setEnabled(True)
        self.url_label.setText("off")
        self.counts.setText("")
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


class _StopOnClose(QObject):
    def __init__(self, panel: ServerPanel) -> None:
        super().__init__(panel)
        self.panel = panel

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt API
        if event.type() == QEvent.Type.Close and self.panel.service is not None:
            self.panel.stop()
        return False


def attach(window: QMainWindow, toolbar: Any, model_source: ModelSource, *,
           make_room: Callable[[bool], None] | None = None) -> ServerPanel:
    """Add the panel to a main window: a hidden dock, a toolbar toggle, and stop-on-close.
    `make_room(showing)` runs before the panel shows (and after it hides): a narrow window folds
    something away for it rather than growing."""
    panel = ServerPanel(model_source=model_source, parent=window)
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
