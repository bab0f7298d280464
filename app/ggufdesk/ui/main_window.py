"""The chat window: conversations, streaming answers, gauges, one notification banner."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
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
from ggufdesk.ui.message_widget import MessageWidget
from ggufdesk.ui.notify import Banner
from ggufdesk.ui.settings_dialog import SettingsDialog
from ggufdesk.ui.tasks import describe_failure, run_in_background

log = logging.getLogger("ggufdesk.ui.chat")

SAVE_PARTIAL_EVERY_S = 1.0


@dataclass
class Stream:
    rid: str
    message_id: int
    widget: MessageWidget
    text: str = ""
    saved_at: float = 0.0
    stats: p.Stats | None = None


def build_request(conv: Conversation, messages: list[Message]) -> dict[str, Any]:
    """What the engine gets for the next answer: chat messages, or one prompt in completion mode."""
    turns = [m for m in messages if m.role in ("user", "assistant") and m.content]
    if conv.mode == "completion":
        text = conv.system_prompt + "\n\n" if conv.system_prompt else ""
        for i, m in enumerate(turns):
            sep = "\n" if (i and m.role == "user") else ""
            text += sep + m.content
        return {"prompt": text, "messages": None}
    msgs = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    msgs += [{"role": m.role, "content": m.content} for m in turns]
    return {"prompt": None, "messages": msgs}


def title_from(text: str, limit: int = 48) -> str:
    """A conversation title: the first line of the first message, shortened at a word."""
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else "New chat"
    if len(first) <= limit:
        return first
    return first[:limit].rsplit(" ", 1)[0] + "…"


class MainWindow(QMainWindow):
    answer_finished = Signal(str)  # final status of an answer: done | cancelled | partial | error
    conversation_loaded = Signal(int)

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
        self.conv: Conversation | None = None
        self.stream: Stream | None = None
        self.editing_id: int | None = None
        self.model_path: str | None = None
        self._build()
        self._wire()
        self.refresh_conversations()

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
        send_shortcut = QAction(self)
        send_shortcut.setShortcut(QKeySequence("Ctrl+Return"))
        send_shortcut.triggered.connect(lambda: self.send())
        self.addAction(send_shortcut)
        self.sampler = SystemSampler(lambda: self.engine.pid, parent=self)
        self.resize(1180, 760)

    def _wire(self) -> None:
        e = self.engine
        e.loaded.connect(self._on_loaded)
        e.unloaded.connect(self.gauges.on_unloaded)
        e.token.connect(self._on_token)
        e.stats.connect(self._on_stats)
        e.progress.connect(self.gauges.on_progress)
        e.done.connect(self._on_done)
        e.error.connect(self._on_error)
        e.crashed.connect(self._on_crashed)
        e.start_failed.connect(lambda msg: self.banner.notify(
            f"the engine could not start: {msg}", "error"))
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
        restarted = self.model_path == ev.model and self.model_label.text().startswith("Restarting")
        self.model_path = ev.model
        name = Path(ev.model).name
        where = "GPU" if ev.n_gpu_layers else "CPU"
        draft = f" + draft {Path(ev.draft).name}" if ev.draft else ""
        self.model_label.setText(f"{name}{draft} · {ev.n_ctx} ctx · {where} · loaded in {ev.load_s:.1f} s")
        if restarted:
            self.banner.notify("the engine restarted and the model is loaded again; nothing was lost")
        self.settings.model = ev.model
        if self._persist:
            try:
                save_settings(self.settings)
            except OSError as e:
                self.banner.notify(f"could not save settings: {e}", "warning")
        if ev.chat_format == "completion" and self.conv and self.conv.mode == "chat" \
                and not self.history.messages(self.conv.id):
            self.conv = self.history.update_conversation(self.conv.id, mode="completion")
            self.conv_model.update(self.conv)
        if ev.chat_format == "completion":
            self.banner.notify(f"{name} has no chat template: new conversations use completion "
                               "mode (the model continues your text)")
        self._update_mode_label()

    @property
    def model_chat_format(self) -> str:
        ev = self.engine.loaded_event
        return ev.chat_format if ev else "template"

    # ---- conversations ------------------------------------------------------------------------

    def refresh_conversations(self, select_id: int | None = None) -> None:
        query = self.search.text()

        def done(fut) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                return
            keep = select_id or (self.conv.id if self.conv else None)
            self.conv_model.set_conversations(fut.result())
            if keep is not None and (row := self.conv_model.row_of(keep)) >= 0:
                self.conv_list.setCurrentIndex(self.conv_model.index(row))

        run_in_background(lambda: self.history.list_conversations(query), done)

    def new_conversation(self, title: str = "New chat") -> Conversation:
        mode = "completion" if self.model_chat_format == "completion" else "chat"
        conv = self.history.new_conversation(title, mode=mode,
                                             system_prompt=self.settings.system_prompt,
                                             sampling=self.settings.sampling)
        self.conv_model.update(conv)
        self._show_conversation(conv, [])
        self.conv_list.setCurrentIndex(self.conv_model.index(self.conv_model.row_of(conv.id)))
        return conv

    def _on_conv_selected(self, current, _previous) -> None:
        if not current.isValid():
            return
        conv = self.conv_model.conversation(current.row())
        if self.conv and conv.id == self.conv.id:
            return
        if self.stream:
            self.stop()
        self.open_conversation(conv.id)

    def open_conversation(self, conversation_id: int) -> None:
        def done(fut) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                return
            conv, msgs = fut.result()
            self._show_conversation(conv, msgs)

        run_in_background(lambda: (self.history.get_conversation(conversation_id),
                                   self.history.messages(conversation_id)), done)

    def _show_conversation(self, conv: Conversation, msgs: list[Message]) -> None:
        self.conv = conv
        self.editing_id = None
        self.chat.set_messages(msgs)
        self._update_mode_label()
        self.conversation_loaded.emit(conv.id)

    def _update_mode_label(self) -> None:
        self.mode_label.setText(f"{self.conv.mode} mode" if self.conv else "")

    def rename_current(self) -> None:
        if not self.conv:
            return
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title", text=self.conv.title)
        if ok and title.strip():
            self.conv = self.history.update_conversation(self.conv.id, title=title)
            self.conv_model.update(self.conv)

    def delete_current(self, confirm: bool = True) -> None:
        if not self.conv or self.stream:
            return
        if confirm and QMessageBox.question(
                self, "Delete conversation", f"Delete “{self.conv.title}” for good?"
        ) != QMessageBox.StandardButton.Yes:
            return
        self.history.delete(self.conv.id)
        self.conv_model.remove(self.conv.id)
        self.conv = None
        self.chat.clear()
        self._update_mode_label()

    def export_current(self, path: str | None = None) -> Path | None:
        if not self.conv:
            return None
        if path is None:
            path, _ = QFileDialog.getSaveFileName(
                self, "Export conversation", f"{self.conv.title}.md",
                "Markdown (*.md);;JSON (*.json)")
            if not path:
                return None
        out = Path(path)
        try:
            if out.suffix.lower() == ".json":
                out.write_text(json.dumps(self.history.export_json(self.conv.id), indent=2,
                                          ensure_ascii=False), encoding="utf-8")
            else:
                out.write_text(self.history.export_markdown(self.conv.id), encoding="utf-8")
        except OSError as e:
            self.banner.notify(f"could not export to {out}: {e.strerror or e}", "error")
            return None
        self.banner.notify(f"exported to {out}")
        return out

    # ---- sending and streaming ----------------------------------------------------------------

    def send(self, text: str | None = None) -> bool:
        text = (self.input.toPlainText() if text is None else text).strip()
        if not text:
            return False
        if self.stream:
            self.banner.notify("an answer is still being written; stop it first", "warning")
            return False
        if self.engine.loaded_event is None:
            self.banner.notify("no model is loaded yet: choose one first", "warning")
            return False
        if self.conv is None:
            self.new_conversation()
        assert self.conv is not None
        if self.editing_id is not None:
            self.history.truncate_from(self.conv.id, self.editing_id)
            self.editing_id = None
        # The user's message is committed before the engine hears about it.
        self.history.add_message(self.conv.id, "user", text)
        if self.conv.title == "New chat":
            self.conv = self.history.update_conversation(self.conv.id, title=title_from(text))
        self.conv_model.update(self.history.get_conversation(self.conv.id))
        self.input.clear()
        self._start_answer()
        return True

    def _start_answer(self) -> None:
        assert self.conv is not None
        msgs = self.history.messages(self.conv.id)
        self.chat.set_messages(msgs)
        req = build_request(self.conv, msgs)
        answer = self.history.add_message(self.conv.id, "assistant", "", status="streaming")
        widget = self.chat.add(answer)
        try:
            rid = self.engine.generate(sampling=self.conv.sampling, **req)
        except (KnownError, OSError) as e:
            self.history.update_message(answer.id, status="error")
            widget.set_status("error")
            self.banner.notify(f"could not start the answer: {e}", "error")
            return
        self.stream = Stream(rid=rid, message_id=answer.id, widget=widget, saved_at=time.monotonic())
        self._set_streaming(True)

    def _set_streaming(self, on: bool) -> None:
        self.stop_btn.setEnabled(on)
        self.send_btn.setEnabled(not on)
        self.chat.set_actions_enabled(not on)

    def stop(self) -> None:
        if self.stream:
            self.engine.cancel(self.stream.rid)

    def _on_token(self, ev: p.Token) -> None:
        s = self.stream
        if s is None or ev.id != s.rid:
            return
        s.text += ev.text
        s.widget.append(ev.text)
        now = time.monotonic()
        if now - s.saved_at >= SAVE_PARTIAL_EVERY_S:
            self.history.update_message(s.message_id, content=s.text)
            s.saved_at = now

    def _on_stats(self, ev: p.Stats) -> None:
        self.gauges.on_stats(ev)
        if self.stream and ev.id == self.stream.rid:
            self.stream.stats = ev

    def _finish(self, status: str) -> None:
        s = self.stream
        if s is None:
            return
        self.stream = None
        stats = dataclasses.asdict(s.stats) if s.stats else {}
        self.history.update_message(s.message_id, content=s.text, status=status, stats=stats)
        s.widget.set_text(s.text)
        s.widget.set_status(status)
        self._set_streaming(False)
        self.answer_finished.emit(status)

    def _on_done(self, ev: p.Done) -> None:
        if self.stream and ev.id == self.stream.rid:
            if ev.text and not self.stream.text:
                self.stream.text = ev.text
            self._finish("cancelled" if ev.finish_reason == "cancelled" else "done")

    def _on_error(self, ev: p.Error) -> None:
        if self.stream and ev.id == self.stream.rid:
            self._finish("error")
            self.banner.notify(f"the answer failed: {ev.message}", "error")
            return
        if ev.kind == "load":
            self.model_label.setText("No model loaded")
            msg = f"could not load the model: {ev.message}"
            if "memory" in ev.message.lower() or "alloc" in ev.message.lower():
                msg += (" — try fewer GPU layers or a smaller context in Engine settings"
                        f"{self._oom_hint()}")
            self.banner.notify(msg, "error")
        else:
            self.banner.notify(ev.message, "error")

    def _oom_hint(self) -> str:
        if not self._recommended:
            return ""
        try:
            load, _ = self._recommended()
        except Exception:  # noqa: BLE001 - the hint is optional
            return ""
        return f" (recommended here: {load.n_gpu_layers} GPU layers, context {load.n_ctx})"

    def _on_crashed(self, message: str) -> None:
        if self.stream:
            self._finish("partial")
        self.model_label.setText("Restarting the engine…")
        self.banner.notify(message, "error")

    # ---- regenerate / edit --------------------------------------------------------------------

    def regenerate(self, message_id: int) -> None:
        if self.stream or not self.conv:
            return
        if self.engine.loaded_event is None:
            self.banner.notify("no model is loaded yet: choose one first", "warning")
            return
        self.history.truncate_from(self.conv.id, message_id)
        self._start_answer()

    def edit_message(self, message_id: int) -> None:
        if self.stream or not self.conv:
            return
        m = self.history.get_message(message_id)
        self.input.setPlainText(m.content)
        self.input.setFocus()
        self.editing_id = message_id
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
        assert self.conv is not None
        dlg = ConversationDialog(system_prompt=self.conv.system_prompt,
                                 sampling=self.conv.sampling, mode=self.conv.mode, parent=self)
        if dlg.exec():
            self.conv = self.history.update_conversation(
                self.conv.id, system_prompt=dlg.system.toPlainText(), sampling=dlg.sampling(),
                mode=dlg.mode.currentText())
            self.conv_model.update(self.conv)
            self._update_mode_label()

    # ---- closing ------------------------------------------------------------------------------

    # ---- drag and drop a .gguf onto the window: remember it in the library and load it ----------

    @staticmethod
    def _dropped_gguf(mime: Any) -> str | None:
        for url in mime.urls() if mime.hasUrls() else []:
            if url.isLocalFile() and url.toLocalFile().lower().endswith(".gguf"):
                return url.toLocalFile()
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

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt API
        if self.stream:
            s = self.stream
            self.history.update_message(s.message_id, content=s.text, status="partial")
            self.stream = None
        self.sampler.stop()
        super().closeEvent(event)
