"""The chat window: conversations, streaming answers, gauges, one notification banner."""
from __future__ import annotations

import json
import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QByteArray, QEvent, QModelIndex, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog, QGridLayout, QHBoxLayout, QInputDialog, QLabel, QLineEdit, QListView, QMainWindow,
    QMessageBox, QPushButton, QSizePolicy, QSplitter, QVBoxLayout, QWidget,
)

from ggufdesk.core.errors import KnownError
from ggufdesk.core.history import Conversation, History, Message
from ggufdesk.core.settings import LoadSettings, Settings, SpeculationSettings, save_settings
from ggufdesk.engine.link import protocol as p
from ggufdesk.ui import theme
from ggufdesk.ui.chat_view import ChatView
from ggufdesk.ui.composer import ENTER_SENDS_KEY, Composer, enter_sends
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
    stats = {**turn.stats, "finish_reason": turn.finish_reason} if turn.finish_reason else turn.stats
    return Message(id=turn.key, conversation_id=0, role=turn.role, content=turn.content,
                   created=turn.created, status=turn.status, stats=stats)


class _WindowView(SessionView):
    """What the session tells the window, shown with its widgets (all on the GUI thread)."""

    def __init__(self, win: MainWindow) -> None:
        self.win = win

    def show_conversation(self, conv: Conversation | None, turns: list[Turn]) -> None:
        w = self.win
        w.chat.set_messages([_as_message(t) for t in turns], {t.key: t.version for t in turns})
        w.chat.set_actions_enabled(not w.session.busy)
        w._update_mode_label()
        w._select_current()
        if conv is not None:
            w.conversation_loaded.emit(conv.id)

    def turn_added(self, turn: Turn) -> None:
        self.win.chat.add(_as_message(turn), version=turn.version)

    def turn_grew(self, turn: Turn, piece: str) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.append(piece)

    def turn_finished(self, turn: Turn) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.set_text(turn.content)
            widget.set_status(turn.status)
            widget.set_stats({**turn.stats, "finish_reason": turn.finish_reason})
        self.win.answer_finished.emit(turn.status)

    def phase_changed(self, phase: Phase) -> None:
        w = self.win
        idle = phase == "idle"
        w.stop_btn.setEnabled(not idle)
        w.stop_action.setEnabled(not idle)  # Esc stops only while an answer is being written
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

    def base_model_loaded(self, model: p.Loaded) -> None:
        self.win._base_model_loaded(model)


class MainWindow(QMainWindow):
    """A view over a ChatSession (session/): it shows the conversation and forwards clicks; the
    answer lifecycle and the history writes live in the session."""

    answer_finished = Signal(str)  # final status of an answer: done | cancelled | partial | error
    conversation_loaded = Signal(int)
    exported = Signal(object)  # Path, or None when the export failed

    def __init__(self, *, engine: EngineBridge, history: History, settings: Settings | None = None,
                 choose_model: Callable[[], None] | None = None,
                 recommended: Callable[[], tuple[LoadSettings, SpeculationSettings]] | None = None,
                 estimate: Callable[[str, LoadSettings], Any] | None = None,
                 persist_settings: bool = True) -> None:
        """`estimate(model, load)` is the planner's ContextEstimate for the settings dialog."""
        super().__init__()
        self.setAcceptDrops(True)  # drop a .gguf file to add and load it
        self.setWindowTitle("ggufdesk")
        self.engine = engine
        self.history = history
        self.settings = settings or Settings()
        self._persist = persist_settings
        self._choose_model = choose_model
        self._recommended = recommended
        self._estimate_for = estimate
        self.model_path: str | None = None
        self._loading: tuple[str, LoadSettings, SpeculationSettings] | None = None
        self._last_good: tuple[str, LoadSettings, SpeculationSettings] | None = None
        self._recovering = False
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
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conv_list.setTextElideMode(Qt.TextElideMode.ElideRight)  # long titles end in "…"
        self.new_btn = QPushButton("New chat")
        self.rename_btn = QPushButton("Rename")
        self.delete_btn = QPushButton("Delete")
        self.export_btn = QPushButton("Export…")
        left = QWidget()
        left.setMinimumWidth(150)
        ll = QVBoxLayout(left)
        ll.setContentsMargins(4, 4, 4, 4)
        ll.addWidget(self.new_btn)
        ll.addWidget(self.search)
        ll.addWidget(self.conv_list, 1)
        row = QGridLayout()  # two rows: the side panel stays narrow at 800 px
        row.addWidget(self.rename_btn, 0, 0)
        row.addWidget(self.delete_btn, 0, 1)
        row.addWidget(self.export_btn, 1, 0, 1, 2)
        ll.addLayout(row)
        self.left_panel = left

        self.banner = Banner()
        self.save_label = QLabel("")
        self.save_label.hide()
        self.model_label = QLabel("No model loaded")
        self.model_label.setWordWrap(True)
        self.model_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.mode_label = QLabel("")
        self._restyle()
        self.chat = ChatView()
        self.input = Composer(enter_sends=enter_sends())
        self.input.setFixedHeight(84)
        self._update_placeholder()
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

        self.gauges = GaugePanel()  # scrolls when short; the splitter can fold it away
        center.setMinimumWidth(300)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(center)
        self.splitter.addWidget(self.gauges)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setCollapsible(1, False)
        self.splitter.setSizes([190, 700, 230])  # at 800 px the conversation keeps most room
        self.setCentralWidget(self.splitter)

        tb = self.addToolBar("Main")
        tb.setObjectName("mainToolbar")
        tb.setMovable(False)
        self.model_action = QAction("Choose model…", self)
        self.settings_action = QAction("Engine settings…", self)
        self.conv_settings_action = QAction("Conversation settings…", self)
        for a in (self.model_action, self.settings_action, self.conv_settings_action):
            tb.addAction(a)
        self._build_menus()
        from ggufdesk.ui import server_panel  # the "Local server" dock (off by default)
        self.server_panel = server_panel.attach(
            self, tb, lambda: (self.model_path, self.settings.load) if self.model_path else None)
        self.sampler = SystemSampler(lambda: self.engine.pid, parent=self)
        self.resize(1180, 760)

    def _build_menus(self) -> None:
        """The chat apps' keyboard habits, each also a menu entry (so they can be found)."""
        def action(text: str, keys: QKeySequence | str, slot: Callable[[], Any], *,
                   tip: str = "") -> QAction:
            a = QAction(text, self)
            a.setShortcut(QKeySequence(keys))
            a.setToolTip(tip or text)
            a.triggered.connect(lambda _checked=False: slot())
            return a

        # Spelled out: some platforms (Windows, bare X11) define no standard key for Quit.
        self.new_action = action("New chat", "Ctrl+N", self.new_conversation)
        self.find_action = action("Search conversations", "Ctrl+F", self.focus_search)
        self.focus_action = action("Go to the message box", "Ctrl+L", self.focus_input)
        self.stop_action = action("Stop the answer", "Esc", self.stop)
        self.stop_action.setEnabled(False)
        self.quit_action = action("Quit", "Ctrl+Q", self.close)
        self.enter_action = QAction("Enter sends (Shift+Enter for a new line)", self, checkable=True)
        self.enter_action.setChecked(self.input.enter_sends)
        self.enter_action.toggled.connect(self.set_enter_sends)
        chat = self.menuBar().addMenu("&Chat")
        for a in (self.new_action, self.find_action, self.focus_action, self.stop_action):
            chat.addAction(a)
        chat.addSeparator()
        chat.addAction(self.enter_action)
        chat.addSeparator()
        chat.addAction(self.quit_action)
        model = self.menuBar().addMenu("&Model")
        for a in (self.model_action, self.settings_action, self.conv_settings_action):
            model.addAction(a)

    def _restyle(self) -> None:
        muted = theme.css(theme.muted())
        self.model_label.setStyleSheet("font-weight: 600;")
        self.mode_label.setStyleSheet(f"color: {muted};")
        self.save_label.setStyleSheet(
            f"color: {theme.css(theme.tone(theme.WARNING_HUE, strong=True))};")

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt API
        super().changeEvent(event)
        if event.type() == QEvent.Type.ApplicationPaletteChange:
            self._restyle()

    # ---- keyboard -----------------------------------------------------------------------------

    def focus_search(self) -> None:
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    def focus_input(self) -> None:
        self.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def set_enter_sends(self, on: bool) -> None:
        self.input.enter_sends = bool(on)
        QSettings().setValue(ENTER_SENDS_KEY, bool(on))
        self._update_placeholder()

    def _update_placeholder(self) -> None:
        completion = self.conv is not None and self.conv.mode == "completion" \
            if hasattr(self, "session") else False
        if completion:
            from ggufdesk.core.starter import EXAMPLE_PROMPT

            self.input.setPlaceholderText(f"Write the beginning of a text, e.g. “{EXAMPLE_PROMPT}”"
                                          f" ({self.input.hint()})")
        else:
            self.input.setPlaceholderText(f"Write a message… ({self.input.hint()})")

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
        self._draft_timer = QTimer(self, singleShot=True, interval=500)
        self._draft_timer.timeout.connect(lambda: self.save_draft())
        self.input.submitted.connect(lambda: self.send())
        self.input.textChanged.connect(lambda: self._draft_timer.start())
        self.send_btn.clicked.connect(lambda: self.send())
        self.stop_btn.clicked.connect(lambda: self.stop())
        self.new_btn.clicked.connect(lambda: self.new_conversation())
        self.rename_btn.clicked.connect(lambda: self.rename_current())
        self.delete_btn.clicked.connect(lambda: self.delete_current())
        self.export_btn.clicked.connect(lambda: self.export_current())
        self.conv_list.selectionModel().currentChanged.connect(self._on_conv_selected)
        self._search_timer = QTimer(self, singleShot=True, interval=150)
        self._search_timer.timeout.connect(lambda: self.refresh_conversations())
        self.search.textChanged.connect(lambda _: self._search_timer.start())
        self.chat.edit_requested.connect(self.edit_message)
        self.chat.regenerate_requested.connect(self.regenerate)
        self.chat.version_requested.connect(self.step_version)
        self.chat.copied.connect(lambda: self.banner.notify("copied to the clipboard"))
        self.model_action.triggered.connect(lambda: self._choose_model and self._choose_model())
        self.settings_action.triggered.connect(lambda: self.open_settings())
        self.conv_settings_action.triggered.connect(lambda: self.open_conversation_settings())

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
        self.save_draft(qs)
        qs.sync()

    # ---- what comes back after a restart: the last conversation and the unsent draft -----------

    def save_draft(self, qs: QSettings | None = None) -> None:
        qs = qs or QSettings()
        qs.setValue("chat/draft", self.input.toPlainText())
        qs.setValue("chat/last_conversation", self.conv.id if self.conv and self.conv.id else 0)

    def restore_state(self, qs: QSettings | None = None) -> None:
        """Reopen the conversation that was open last time and put the unsent draft back."""
        qs = qs or QSettings()
        draft = str(qs.value("chat/draft", "", type=str) or "")
        stored = qs.value("chat/last_conversation", 0, type=int)
        last = stored if isinstance(stored, int) else 0
        if draft and not self.input.toPlainText():
            self.input.setPlainText(draft)
        if last:
            def done(fut: Future[bool]) -> None:
                if describe_failure(fut) is None and fut.result() and self.conv is None:
                    self.open_conversation(last)

            def exists() -> bool:
                try:
                    self.history.get_conversation(last)
                except KeyError:
                    return False
                return True

            run_in_background(exists, done, owner=self)

    # ---- model --------------------------------------------------------------------------------

    def load_model(self, path: str, load: LoadSettings | None = None,
                   speculation: SpeculationSettings | None = None) -> None:
        if load is not None:
            self.settings.load = load
        if speculation is not None:
            self.settings.speculation = speculation
        self.model_path = path
        self._loading = (path, self.settings.load, self.settings.speculation)
        self.model_label.setText(f"Loading {Path(path).name}…")
        self.engine.load(path, self.settings.load, self.settings.speculation)

    def _on_loaded(self, ev: p.Loaded) -> None:
        self.gauges.on_loaded(ev)
        self.model_path = ev.model
        if self._loading is not None and self._loading[0] == ev.model:
            self._last_good = self._loading
        elif self._last_good is None or self._last_good[0] != ev.model:
            self._last_good = (ev.model, self.settings.load, self.settings.speculation)
        self._loading = None
        self._recovering = False
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
        self.gauges.on_unloaded()  # the truth: the engine holds no model now
        self.model_label.setText("No model loaded")
        msg = f"could not load the model: {ev.message}"
        if ev.out_of_memory:
            msg += f" — try fewer GPU layers or a smaller context in Engine settings{self._oom_hint()}"
        failed, self._loading = self._loading, None
        good = self._last_good
        if good is not None and not self._recovering and (failed is None or failed != good):
            # A failed load must not leave the user without the model that worked: load it again.
            self._recovering = True
            self.settings.load, self.settings.speculation = good[1], good[2]
            self.model_path = good[0]
            self.model_label.setText(f"Loading {Path(good[0]).name} again…")
            self.engine.load(good[0], good[1], good[2])
            msg += f"; {Path(good[0]).name} is loaded again"
        elif self._recovering:
            self._recovering = False
            self._last_good = None
            self.model_path = None
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
        def done(fut: Future[tuple[Conversation, list[Message], dict[int, tuple[int, int]]]]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                return
            conv, msgs, versions = fut.result()
            self.session.open(conv, msgs, versions)

        def read() -> tuple[Conversation, list[Message], dict[int, tuple[int, int]]]:
            self.writer.flush(2.0)  # what this window wrote comes back with it
            return (self.history.get_conversation(conversation_id),
                    self.history.messages(conversation_id), self.history.versions(conversation_id))

        run_in_background(read, done)

    def _select_current(self) -> None:
        """The list shows the open conversation as selected (none while a new one is unsaved)."""
        row = self.conv_model.row_of(self.conv.id) if self.conv and self.conv.id else -1
        self.conv_list.setCurrentIndex(self.conv_model.index(row) if row >= 0 else QModelIndex())

    def _update_mode_label(self) -> None:
        conv = self.conv
        completion = conv is not None and conv.mode == "completion"
        self.mode_label.setText("" if conv is None else
                                "continue-text mode" if completion else "chat mode")
        self.send_btn.setText("Continue" if completion else "Send")
        self.send_btn.setToolTip("The model continues your text" if completion else
                                 "Send the message")
        self.chat.set_mode(conv.mode if conv else "chat")
        self._update_placeholder()
        loaded = self.session.model.model if self.session.model else ""
        if conv is not None and conv.model and loaded and conv.model != loaded:
            self.mode_label.setText(self.mode_label.text() + f" · written with {Path(conv.model).name}")
            self.mode_label.setToolTip(f"This conversation was written with {conv.model}; "
                                       f"{Path(loaded).name} is loaded now (Model ▸ Choose model…)")
        else:
            self.mode_label.setToolTip("")

    def _base_model_loaded(self, model: p.Loaded) -> None:
        """A base model continues text: say so once per model (not on every launch), with what to
        download for chatting."""
        name = Path(model.model).name
        text = (f"{name} is a base model: it continues the text you start (no chat template). "
                "For a chat, choose a chat-tuned model")
        try:
            from ggufdesk.core import catalog, starter

            if (entry := starter.chat_suggestion(catalog.load())) is not None:
                text += f", e.g. {entry.name} (Model ▸ Choose model…)"
        except KnownError:
            pass
        self.banner.notify_once(f"base-model:{model.model}", text + ".")

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

    def step_version(self, key: int, step: int) -> None:
        try:
            self.session.step_version(key, step)
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
        self.banner.notify("editing: sending replaces that message and what follows; the current "
                           "ones stay as an earlier version (‹ ›)")

    # ---- dialogs ------------------------------------------------------------------------------

    def _estimate(self, load: LoadSettings) -> Any:
        if self._estimate_for is None or not self.model_path:
            return None
        return self._estimate_for(self.model_path, load)

    def open_settings(self) -> None:
        loaded = self.engine.loaded_event
        dlg = SettingsDialog(self.settings.load, self.settings.speculation,
                             recommended=self._recommended,
                             n_ctx_train=loaded.n_ctx_train if loaded else 0,
                             estimate=self._estimate if self.model_path else None, parent=self)
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
        self.save_draft()
        self.session.close()  # an answer in progress is kept as a partial one
        if not self.writer.close(timeout=3.0):
            log.error("some of the chat history could not be saved: %s", self.writer.state.reason)
        self.sampler.stop()
        super().closeEvent(event)
