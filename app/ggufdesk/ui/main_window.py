"""The chat window: conversations, streaming answers, gauges, one notification banner."""
from __future__ import annotations

import json
import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QByteArray, QModelIndex, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog, QHBoxLayout, QInputDialog, QLabel, QLineEdit, QListView, QMainWindow,
    QMessageBox, QPlainTextEdit, QPushButton, QSplitter, QVBoxLayout, QWidget,
)

from ggufdesk.core.errors import KnownError
from ggufdesk.core.history import Conversation, History, Message
from ggufdesk.core.settings import LoadSettings, Settings, SpeculationSettings, save_settings
from ggufdesk.engine import protocol as p
from ggufdesk.ui.chat_view import ChatView
from ggufdesk.ui.conversation_dialog import ConversationDialog
from ggufdesk.ui.conversation_model import ConversationListModel
from ggufdesk.ui.engine_adapter import EngineBridge
from ggufdesk.ui.gauges import GaugePanel, SystemSampler
from ggufdesk.ui.notify import Banner
from ggufdesk.ui.settings_dialog import SettingsDialog
from ggufdesk.session import ChatSession, HistoryWriter, Refused, SaveState, SessionView, Turn
from ggufdesk.session.conversation import Level, Phase
from ggufdesk.ui.tasks import describe_failure, run_in_background, run_on_main

log = logging.getLogger("ggufdesk.ui.chat")


def _as_message(turn: Turn) -> Message:
    """What ChatView shows: a Turn, with its session key as the message id (saved or not)."""
    return Message(id=turn.key, conversation_id=0, role=turn.role, content=turn.content,
                   created=turn.created, status=turn.status, stats=turn.stats)


class _WindowView(SessionView):
    """What the session tells the window, shown with its widgets (all on the GUI thread)."""

    def __init__(self, win: MainWindow) -> None:
        self.win = win

    def show_conversation(self, conv: Conversation | None, turns: list[Turn]) -> None:
        w = self.win
        w.chat.set_messages([_as_message(t) for t in turns])
        w.chat.set_actions_enabled(not w.session.busy)
        w._update_mode_label()
        w._select_current()
        if conv is not None:
            w.conversation_loaded.emit(conv.id)

    def turn_added(self, turn: Turn) -> None:
        self.win.chat.add(_as_message(turn))

    def turn_grew(self, turn: Turn, piece: str) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.append(piece)

    def turn_finished(self, turn: Turn) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.set_text(turn.content)
            widget.set_status(turn.status)
        self.win.answer_finished.emit(turn.status)

    def phase_changed(self, phase: Phase) -> None:
        w = self.win
        idle = phase == "idle"
        w.stop_btn.setEnabled(not idle)
        w.send_btn.setEnabled(idle)
        w.chat.set_actions_enabled(idle)

    def save_state_changed(self, state: SaveState) -> None:
        self.win.save_label.setText(state.text)
        self.win.save_label.setVisible(bool(state.text))

    def conversation_saved(self, conv: Conversation) -> None:
        w = self.win
        w.conv_model.update(conv)
        w._select_current()
        w._update_mode_label()

    def notice(self, text: str, level: Level = "info") -> None:
        self.win.banner.notify(text, level)


class MainWindow(QMainWindow):
    """A view over a ChatSession (session/): it shows the conversation and forwards clicks; the
    answer lifecycle and the history writes live in the session."""

    answer_finished = Signal(str)  # final status of an answer: done | cancelled | partial | error
    conversation_loaded = Signal(int)
    exported = Signal(object)  # Path, or None when the export failed

    def __init__(self, *, engine: EngineBridge, history: History, settings: Settings | None = None,
                 choose_model: Callable[[], None] | None = None,
                 recommended: Callable[[], tuple[LoadSettings, SpeculationSettings]] | None = None,
                 persist_settings: bool = True) -> None:
        super().__init__()
        self.setAcceptDrops(True)  # drop a .gguf file to add and load it
        self.setWindowTitle("ggufdesk")
        self.engine = engine
        self.history = history
        self.settings = settings or Settings()
        self._persist = persist_settings
        self._choose_model = choose_model
        self._recommended = recommended
        self.model_path: str | None = None
        self._build()
        self.writer = HistoryWriter(history)
        self.session = ChatSession(engine=engine, writer=self.writer, view=_WindowView(self),
                                   post=run_on_main)
        self._wire()
        self.refresh_conversations()

    @property
    def conv(self) -> Conversation | None:
        return self.session.conv

    # ---- layout -------------------------------------------------------------------------------

    def _build(self) -> None:
        self.search = QLineEdit(placeholderText="Search conversations")
        self.search.setClearButtonEnabled(True)
        self.conv_model = ConversationListModel(self)
        self.conv_list = QListView()
        self.conv_list.setModel(self.conv_model)
        self.new_btn = QPushButton("New chat")
        self.rename_btn = QPushButton("Rename")
        self.delete_btn = QPushButton("Delete")
        self.export_btn = QPushButton("Export…")
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.addWidget(self.new_btn)
        ll.addWidget(self.search)
        ll.addWidget(self.conv_list, 1)
        row = QHBoxLayout()
        for b in (self.rename_btn, self.delete_btn, self.export_btn):
            row.addWidget(b)
        ll.addLayout(row)

        self.banner = Banner()
        self.save_label = QLabel("")
        self.save_label.setStyleSheet("color: #7a5200;")
        self.save_label.hide()
        self.model_label = QLabel("No model loaded")
        self.model_label.setStyleSheet("color: #40556b; font-weight: 600;")
        self.mode_label = QLabel("")
        self.mode_label.setStyleSheet("color: #66727f;")
        self.chat = ChatView()
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Write a message… (Ctrl+Enter sends)")
        self.input.setFixedHeight(84)
        self.send_btn = QPushButton("Send")
        self.send_btn.setDefault(True)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setEnabled(False)
        center = QWidget()
        cl = QVBoxLayout(center)
        top = QHBoxLayout()
        top.addWidget(self.model_label, 1)
        top.addWidget(self.save_label)
        top.addWidget(self.mode_label)
        cl.addLayout(top)
        cl.addWidget(self.banner)
        cl.addWidget(self.chat, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_btn)
        buttons.addWidget(self.stop_btn)
        bottom.addLayout(buttons)
        cl.addLayout(bottom)

        self.gauges = GaugePanel()
        self.gauges.setMinimumWidth(250)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(center)
        self.splitter.addWidget(self.gauges)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([220, 640, 280])
        self.setCentralWidget(self.splitter)

        tb = self.addToolBar("Main")
        tb.setObjectName("mainToolbar")
        tb.setMovable(False)
        self.model_action = QAction("Choose model…", self)
        self.settings_action = QAction("Engine settings…", self)
        self.conv_settings_action = QAction("Conversation settings…", self)
        for a in (self.model_action, self.settings_action, self.conv_settings_action):
            tb.addAction(a)
        from ggufdesk.ui import server_panel  # the "Local server" dock (off by default)
        self.server_panel = server_panel.attach(
            self, tb, lambda: (self.model_path, self.settings.load) if self.model_path else None)
        send_shortcut = QAction(self)
        send_shortcut.setShortcut(QKeySequence("Ctrl+Return"))
        send_shortcut.triggered.connect(lambda: self.send())
        self.addAction(send_shortcut)
        self.sampler = SystemSampler(lambda: self.engine.pid, parent=self)
        self.resize(1180, 760)

    def _wire(self) -> None:
        e = self.engine
        e.engine_event.connect(self.session.on_event)
        e.loaded.connect(self._on_loaded)
        e.unloaded.connect(self.gauges.on_unloaded)
        e.stats.connect(self.gauges.on_stats)
        e.progress.connect(self.gauges.on_progress)
        e.error.connect(self._on_error)
        e.lifecycle.connect(self._on_lifecycle)
        self.sampler.sampled.connect(self.gauges.on_sample)
        self.send_btn.clicked.connect(lambda: self.send())
        self.stop_btn.clicked.connect(lambda: self.stop())
        self.new_btn.clicked.connect(lambda: self.new_conversation())
        self.rename_btn.clicked.connect(self.rename_current)
        self.delete_btn.clicked.connect(lambda: self.delete_current())
        self.export_btn.clicked.connect(lambda: self.export_current())
        self.conv_list.selectionModel().currentChanged.connect(self._on_conv_selected)
        self._search_timer = QTimer(self, singleShot=True, interval=150)
        self._search_timer.timeout.connect(self.refresh_conversations)
        self.search.textChanged.connect(lambda _: self._search_timer.start())
        self.chat.edit_requested.connect(self.edit_message)
        self.chat.regenerate_requested.connect(self.regenerate)
        self.chat.copied.connect(lambda: self.banner.notify("copied to the clipboard"))
        self.model_action.triggered.connect(lambda: self._choose_model and self._choose_model())
        self.settings_action.triggered.connect(self.open_settings)
        self.conv_settings_action.triggered.connect(self.open_conversation_settings)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        self.sampler.start()

    # ---- geometry -----------------------------------------------------------------------------

    def restore_geometry(self, qs: QSettings) -> None:
        geo = qs.value("window/geometry")
        if isinstance(geo, QByteArray):
            self.restoreGeometry(geo)
        split = qs.value("window/splitter")
        if isinstance(split, QByteArray):
            self.splitter.restoreState(split)

    def save_geometry(self, qs: QSettings) -> None:
        qs.setValue("window/geometry", self.saveGeometry())
        qs.setValue("window/splitter", self.splitter.saveState())
        qs.sync()

    # ---- model --------------------------------------------------------------------------------

    def load_model(self, path: str, load: LoadSettings | None = None,
                   speculation: SpeculationSettings | None = None) -> None:
        if load is not None:
            self.settings.load = load
        if speculation is not None:
            self.settings.speculation = speculation
        self.model_path = path
        self.model_label.setText(f"Loading {Path(path).name}…")
        self.engine.load(path, self.settings.load, self.settings.speculation)

    def _on_loaded(self, ev: p.Loaded) -> None:
        self.gauges.on_loaded(ev)
        self.model_path = ev.model
        name = Path(ev.model).name
        where = "GPU" if ev.n_gpu_layers else "CPU"
        draft = f" + draft {Path(ev.draft).name}" if ev.draft else ""
        self.model_label.setText(f"{name}{draft} · {ev.n_ctx} ctx · {where} · loaded in {ev.load_s:.1f} s")
        self.settings.model = ev.model
        if self._persist:
            try:
                save_settings(self.settings)
            except OSError as e:
                self.banner.notify(f"could not save settings: {e}", "error")
        self._update_mode_label()

    def _on_lifecycle(self, ev: p.Lifecycle) -> None:
        if ev.state == "starting" and ev.restarted:
            self.model_label.setText("Restarting the engine…")
        elif ev.state == "loading" and ev.restarted and self.model_path:
            self.model_label.setText(f"Restarting the engine: loading {Path(self.model_path).name} again…")
        elif ev.state == "failed":
            self.model_label.setText("The engine is not running")
        elif ev.state == "ready" and ev.reason:
            self.model_label.setText("No model loaded")

    def _on_error(self, ev: p.Error) -> None:
        if ev.kind not in ("load", "settings"):
            return  # the session tells the user about everything else
        self.model_label.setText("No model loaded")
        msg = f"could not load the model: {ev.message}"
        if ev.out_of_memory:
            msg += f" — try fewer GPU layers or a smaller context in Engine settings{self._oom_hint()}"
        self.banner.notify(msg, "error")

    def _oom_hint(self) -> str:
        if not self._recommended:
            return ""
        try:
            load, _ = self._recommended()
        except Exception:  # noqa: BLE001 - the hint is optional; the message stands without it
            return ""
        return f" (recommended here: {load.n_gpu_layers} GPU layers, context {load.n_ctx})"

    # ---- conversations ------------------------------------------------------------------------

    def refresh_conversations(self, select_id: int | None = None) -> None:
        query = self.search.text()

        def done(fut: Future[list[Conversation]]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                return
            keep = select_id or (self.conv.id if self.conv else None)
            self.conv_model.set_conversations(fut.result())
            if keep and (row := self.conv_model.row_of(keep)) >= 0:
                self.conv_list.setCurrentIndex(self.conv_model.index(row))

        run_in_background(lambda: self.history.list_conversations(query), done)

    def new_conversation(self, title: str = "New chat") -> Conversation | None:
        try:
            return self.session.new_conversation(title=title, system_prompt=self.settings.system_prompt,
                                                 sampling=self.settings.sampling)
        except Refused as e:
            self.banner.notify(str(e), "warning")
            return None

    def _on_conv_selected(self, current: Any, _previous: Any) -> None:
        if not current.isValid():
            return
        conv = self.conv_model.conversation(current.row())
        if self.conv and conv.id == self.conv.id:
            return
        self.open_conversation(conv.id)

    def open_conversation(self, conversation_id: int) -> None:
        def done(fut: Future[tuple[Conversation, list[Message]]]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                return
            conv, msgs = fut.result()
            self.session.open(conv, msgs)

        def read() -> tuple[Conversation, list[Message]]:
            self.writer.flush(2.0)  # what this window wrote comes back with it
            return self.history.get_conversation(conversation_id), self.history.messages(conversation_id)

        run_in_background(read, done)

    def _select_current(self) -> None:
        """The list shows the open conversation as selected (none while a new one is unsaved)."""
        row = self.conv_model.row_of(self.conv.id) if self.conv and self.conv.id else -1
        self.conv_list.setCurrentIndex(self.conv_model.index(row) if row >= 0 else QModelIndex())

    def _update_mode_label(self) -> None:
        self.mode_label.setText(f"{self.conv.mode} mode" if self.conv else "")

    def rename_current(self) -> None:
        if not self.conv:
            return
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title", text=self.conv.title)
        if ok and title.strip():
            self.session.update_conversation(title=title)

    def delete_current(self, confirm: bool = True) -> None:
        conv = self.conv
        if not conv or self.session.busy:
            return
        if confirm and QMessageBox.question(
                self, "Delete conversation", f"Delete “{conv.title}” for good?"
        ) != QMessageBox.StandardButton.Yes:
            return
        self.session.delete_conversation()
        self.conv_model.remove(conv.id)

    def export_current(self, path: str | None = None) -> None:
        """Export the open conversation (after pending writes land, off the GUI thread); `exported`
        tells the path, or None."""
        conv = self.conv
        if not conv:
            return
        if path is None:
            path, _ = QFileDialog.getSaveFileName(
                self, "Export conversation", f"{conv.title}.md", "Markdown (*.md);;JSON (*.json)")
            if not path:
                return
        out = Path(path)

        def export() -> Path:
            if not self.writer.flush(10.0):
                raise KnownError(f"could not export: {self.writer.state.reason or 'not saved yet'}")
            conv_id = self.conv.id if self.conv else conv.id
            try:
                if out.suffix.lower() == ".json":
                    out.write_text(json.dumps(self.history.export_json(conv_id), indent=2,
                                              ensure_ascii=False), encoding="utf-8")
                else:
                    out.write_text(self.history.export_markdown(conv_id), encoding="utf-8")
            except OSError as e:
                raise KnownError(f"could not export to {out}: {e.strerror or e}") from e
            return out

        def done(fut: Future[Path]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                self.exported.emit(None)
                return
            self.banner.notify(f"exported to {out}")
            self.exported.emit(out)

        run_in_background(export, done)

    # ---- sending (the session does the work) --------------------------------------------------

    def send(self, text: str | None = None) -> bool:
        text = (self.input.toPlainText() if text is None else text).strip()
        if not text:
            return False
        try:
            self.session.send(text, system_prompt=self.settings.system_prompt,
                              sampling=self.settings.sampling)
        except Refused as e:
            self.banner.notify(str(e), "warning")
            return False
        self.input.clear()
        return True

    def stop(self) -> None:
        self.session.stop()

    def regenerate(self, key: int) -> None:
        try:
            self.session.regenerate(key)
        except Refused as e:
            self.banner.notify(str(e), "warning")

    def edit_message(self, key: int) -> None:
        try:
            text = self.session.edit(key)
        except Refused as e:
            self.banner.notify(str(e), "warning")
            return
        self.input.setPlainText(text)
        self.input.setFocus()
        self.banner.notify("editing: sending replaces that message and everything after it")

    # ---- dialogs ------------------------------------------------------------------------------

    def open_settings(self) -> None:
        dlg = SettingsDialog(self.settings.load, self.settings.speculation,
                             recommended=self._recommended, parent=self)
        if dlg.exec():
            load, spec = dlg.values()
            if self.model_path:
                self.load_model(self.model_path, load, spec)
            else:
                self.settings.load, self.settings.speculation = load, spec

    def open_conversation_settings(self) -> None:
        if not self.conv:
            self.new_conversation()
        conv = self.conv
        if conv is None:
            return
        dlg = ConversationDialog(system_prompt=conv.system_prompt, sampling=conv.sampling,
                                 mode=conv.mode, parent=self)
        if dlg.exec():
            self.session.update_conversation(system_prompt=dlg.system.toPlainText(),
                                             sampling=dlg.sampling(), mode=dlg.mode.currentText())
            self._update_mode_label()

    # ---- drag and drop a .gguf onto the window: remember it in the library and load it ----------

    @staticmethod
    def _dropped_gguf(mime: Any) -> str | None:
        for url in mime.urls() if mime.hasUrls() else []:
            if url.isLocalFile() and url.toLocalFile().lower().endswith(".gguf"):
                return str(url.toLocalFile())
        return None

    def dragEnterEvent(self, event: Any) -> None:  # noqa: N802 - Qt API
        if self._dropped_gguf(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: Any) -> None:  # noqa: N802 - Qt API
        path = self._dropped_gguf(event.mimeData())
        if path is None:
            return
        event.acceptProposedAction()
        from ggufdesk.core import library

        try:
            library.add_path(path)  # used in place, listed next time with the models on disk
        except KnownError as e:
            self.banner.notify(str(e), "error")
            return
        self.load_model(path)

    # ---- closing ------------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt API
        self.session.close()  # an answer in progress is kept as a partial one
        if not self.writer.close(timeout=3.0):
            log.error("some of the chat history could not be saved: %s", self.writer.state.reason)
        self.sampler.stop()
        super().closeEvent(event)
