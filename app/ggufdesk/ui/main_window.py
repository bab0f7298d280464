"""The chat window: sidebar, header, chat and composer widgets over a ChatSession and a ModelSession.

The window shows what the sessions (session/) say and forwards what the user asks for; the answer
lifecycle, the history writes and the model-loading policy (the last good model comes back after a
failed load) live there, testable without Qt.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from PySide6.QtCore import (
    QByteArray, QEvent, QMimeData, QSettings, QStandardPaths, Qt, QTimer, Signal,
)
from PySide6.QtGui import (
    QAction, QActionGroup, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence, QShowEvent,
)
from PySide6.QtWidgets import (
    QApplication, QFileDialog, QInputDialog, QMainWindow, QMenu, QMessageBox, QSplitter, QVBoxLayout,
    QWidget,
)

from ggufdesk.core.errors import KnownError
from ggufdesk.core.history import Conversation, History, Message
from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import LoadSettings, Preset, Settings, SpeculationSettings, save_settings
from ggufdesk.engine.link import protocol as p
from ggufdesk.session import ChatSession, HistoryWriter, Refused, SaveState, SessionView, Turn
from ggufdesk.session.conversation import Level, Phase
from ggufdesk.session.models import ModelSession, ModelState, ModelView, find_base_model_advice
from ggufdesk.session.tool_loop import ToolCall, ToolLoop
from ggufdesk.ui import theme
from ggufdesk.ui.chat_view import ChatView
from ggufdesk.ui.composer import ENTER_SENDS_KEY, Composer, enter_sends
from ggufdesk.ui.conversation_dialog import ConversationDialog
from ggufdesk.ui.engine_adapter import EngineBridge
from ggufdesk.ui.gauges import GaugePanel, SystemSampler
from ggufdesk.ui.header import Header
from ggufdesk.ui.model_switcher import ModelSwitcher, ServerModel
from ggufdesk.ui.notify import Banner
from ggufdesk.ui.services import ContextEstimate
from ggufdesk.ui.settings_dialog import SettingsDialog
from ggufdesk.ui.sidebar import Sidebar
from ggufdesk.ui.tasks import describe_failure, run_in_background, run_on_main

log = logging.getLogger("ggufdesk.ui.chat")

Recommended = Callable[[], tuple[LoadSettings, SpeculationSettings]]
Estimate = Callable[[str, LoadSettings], ContextEstimate | None]
EXPORT_DIR_KEY = "export/dir"
_Read = tuple[Conversation, list[Message], dict[int, tuple[int, int]]]  # a conversation, read back


def export_dir(settings: QSettings | None = None) -> Path:
    """Where Export… starts: the folder of the last export, else the user's documents (never the
    process's working directory)."""
    last = str((settings or QSettings()).value(EXPORT_DIR_KEY, "", type=str) or "")
    if last and Path(last).is_dir():
        return Path(last)
    docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    return Path(docs) if docs and Path(docs).is_dir() else Path.home()


def file_name(title: str) -> str:
    """A conversation's title as a file name (no folder separators or characters Windows refuses)."""
    name = re.sub(r'[\\/:*?"<>|\x00-\x1f]+', "-", title).strip(" .-")
    return name[:80] or "conversation"


def _as_message(turn: Turn) -> Message:
    """What ChatView shows: a Turn, with its session key as the message id (saved or not)."""
    stats = {**turn.stats, "finish_reason": turn.finish_reason} if turn.finish_reason else turn.stats
    return Message(id=turn.key, conversation_id=0, role=turn.role, content=turn.content,
                   created=turn.created, status=turn.status, stats=stats)


class _WindowView(SessionView, ModelView):
    """What the sessions tell the window, shown with its widgets (all on the GUI thread)."""

    def __init__(self, win: MainWindow) -> None:
        self.win = win

    def show_conversation(self, conv: Conversation | None, turns: list[Turn]) -> None:
        w = self.win
        w.chat.set_messages([_as_message(t) for t in turns], {t.key: t.version for t in turns})
        w.chat.set_actions_enabled(not w.session.busy)
        w.show_mode()
        w.sidebar.select(conv.id if conv is not None else None)
        if conv is not None:
            w.conversation_loaded.emit(conv.id)

    def turn_added(self, turn: Turn) -> None:
        self.win.chat.add(_as_message(turn), version=turn.version)

    def turn_grew(self, turn: Turn, piece: str) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.append(piece)

    def turn_thought(self, turn: Turn, piece: str) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.think(turn.stats)

    def turn_changed(self, turn: Turn) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.set_text(turn.content)

    def context_noted(self, turn: Turn) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.set_stats(turn.stats)  # a quiet line above the answer, not a banner

    def tool_call_changed(self, call: ToolCall) -> None:
        card = self.win.chat.show_call(key=call.key, call_id=call.call_id, server=call.server, tool=call.tool,
                                       arguments=call.arguments_text, state=call.state, result=call.result)
        if call.state == "asking":
            card.allow_btn.setFocus(Qt.FocusReason.OtherFocusReason)  # Space allows; Tab reaches Always, Deny

    def turn_finished(self, turn: Turn) -> None:
        if (widget := self.win.chat.widget_for(turn.key)) is not None:
            widget.set_text(turn.content)
            widget.set_status(turn.status)
            widget.set_stats({**turn.stats, "finish_reason": turn.finish_reason})
        self.win.answer_finished.emit(turn.status)

    def phase_changed(self, phase: Phase) -> None:
        w = self.win
        idle = phase == "idle"
        w.composer.set_busy(not idle)
        w.stop_action.setEnabled(not idle)  # Esc stops only while an answer is being written
        w.chat.set_actions_enabled(idle)

    def save_state_changed(self, state: SaveState) -> None:
        self.win.header.set_save_state(state)

    def conversation_saved(self, conv: Conversation) -> None:
        w = self.win
        w.sidebar.conversation_changed(conv)
        w.sidebar.select(w.conv.id if w.conv is not None else None)
        w.show_mode()

    def notice(self, text: str, level: Level = "info") -> None:
        self.win.banner.notify(text, level)

    def base_model_loaded(self, model: p.Loaded) -> None:
        # Said once per model (not on every launch), with a chat model the user can have now (the
        # library's folders and the hub are looked at off the GUI thread).
        def done(fut: Future[str]) -> None:
            if describe_failure(fut) is None:
                self.win.banner.notify_once(f"base-model:{model.model}", fut.result())

        run_in_background(lambda: find_base_model_advice(model), done, owner=self.win)

    def model_state_changed(self, state: ModelState) -> None:
        self.win.header.set_model_state(state)
        memory = sum(v for v in state.loaded.memory.values() if isinstance(v, int)) if state.loaded else 0
        self.win.switcher.set_current(state.path, memory)
        self.win.show_mode()  # (what the composer takes follows the model: images for a vision model)

    def load_failed(self) -> None:
        self.win.gauges.on_unloaded()  # the truth: the engine holds no model now


class MainWindow(QMainWindow):
    """A view over a ChatSession and a ModelSession (session/), composed of a Sidebar, a Header, a
    ChatView, a Composer and the GaugePanel; it shows what the sessions say and forwards clicks."""

    answer_finished = Signal(str)  # final status of an answer: done | cancelled | partial | error
    conversation_loaded = Signal(int)
    exported = Signal(object)  # Path, or None when the export failed

    def __init__(self, *, engine: EngineBridge, history: History, settings: Settings | None = None,
                 choose_model: Callable[[], None] | None = None,
                 recommended: Recommended | None = None, estimate: Estimate | None = None,
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
        self._build()
        view = _WindowView(self)
        self.writer = HistoryWriter(history)
        self.tools = self._mcp_tools()
        self.session = ChatSession(engine=engine, writer=self.writer, view=view, post=run_on_main, tools=self.tools,
                                   images=history.images.get)
        self.chat.image_loader = self.session.image
        self.models = ModelSession(engine=engine, settings=self.settings, view=view,
                                   recommended=recommended, save=self._save_settings)
        self._wire()
        self.refresh_conversations()

    @property
    def conv(self) -> Conversation | None:
        return self.session.conv

    @property
    def model_path(self) -> str | None:
        """The model loaded, being loaded, or whose load just failed (ModelSession.path)."""
        return self.models.path

    def _save_settings(self, settings: Settings) -> None:
        if self._persist:
            save_settings(settings)

    def _mcp_tools(self) -> ToolLoop:
        """The MCP servers of mcp.json (read now, started when a message first needs them)."""
        from ggufdesk.core.mcp.config import mcp_log_dir, open_mcp_config, save_mcp_config
        from ggufdesk.core.mcp.host import McpHost
        from ggufdesk.ui.mcp_dialog import McpSignals

        report = open_mcp_config()
        if report.warning:
            self.banner.notify(report.warning, "error")
        self.mcp_signals = McpSignals(self)
        self.mcp_host = McpHost(report.config, log_dir=mcp_log_dir(), on_change=self.mcp_signals.changed.emit)
        return ToolLoop(self.mcp_host, save_config=lambda config: save_mcp_config(config))

    # ---- layout -------------------------------------------------------------------------------

    def _build(self) -> None:
        self.sidebar = Sidebar()
        self.header = Header()
        self.switcher = ModelSwitcher(server_models=self._server_models)
        self.header.set_switcher(self.switcher)
        self.banner = Banner()
        self.chat = ChatView()
        self.composer = Composer(enter_sends=enter_sends(), images=True)
        self.gauges = GaugePanel()  # scrolls when short; the splitter can fold it away
        # Short names for the controls that tests, benches and screenshots reach for.
        self.search, self.conv_list, self.conv_model = (self.sidebar.search, self.sidebar.list,
                                                        self.sidebar.model)
        self.new_btn, self.rename_btn = self.sidebar.new_btn, self.sidebar.rename_btn
        self.delete_btn, self.export_btn = self.sidebar.delete_btn, self.sidebar.export_btn
        self.model_label, self.save_label = self.header.model_label, self.header.save_label
        self.mode_label = self.header.mode_label
        self.input = self.composer.box
        self.send_btn, self.stop_btn = self.composer.send_btn, self.composer.stop_btn

        self.center = center = QWidget()  # header, banner, chat, composer
        center.setMinimumWidth(300)
        cl = QVBoxLayout(center)
        cl.addWidget(self.header)
        cl.addWidget(self.banner)
        cl.addWidget(self.chat, 1)
        cl.addWidget(self.composer)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        for part in (self.sidebar, center, self.gauges):
            self.splitter.addWidget(part)
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
        self.mcp_action = QAction("MCP servers…", self)
        self.mcp_action.setToolTip("Tools for the model from MCP servers: add them, turn them on or off here")
        for a in (self.model_action, self.settings_action, self.conv_settings_action, self.mcp_action):
            tb.addAction(a)
        self._build_menus()
        from ggufdesk.ui import server_panel  # the "Local server" dock (off by default)
        self.server_panel = server_panel.attach(
            self, tb, lambda: (self.model_path, self.model_settings().load) if self.model_path else None,
            settings_source=lambda: self.settings, make_room=self._make_room_for_the_server)
        self._gauges_folded = False
        self.sampler = SystemSampler(lambda: self.engine.pid, parent=self)
        from ggufdesk.ui import docs_attach  # attach files or folders to answer from (issue 32)
        self.docs = docs_attach.attach(self)
        self.show_mode()
        self.resize(1180, 760)

    def _build_menus(self) -> None:
        """The chat apps' keyboard habits, each also a menu entry (so they can be found)."""
        def action(text: str, keys: QKeySequence | str, slot: Callable[[], object], *,
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
        self._build_theme_menu(self.menuBar().addMenu("&View").addMenu("Theme"))
        self.menuBar().addMenu("&Tools").addAction(self.mcp_action)

    def _build_theme_menu(self, menu: QMenu) -> None:
        """System / Light / Dark, applied at once and remembered (ui/theme.py)."""
        group = QActionGroup(self)
        forced = bool(os.environ.get("GGUFDESK_THEME"))
        self.theme_actions: dict[str, QAction] = {}
        for choice, text in (("system", "System"), ("light", "Light"), ("dark", "Dark")):
            a = QAction(text, self, checkable=True)
            a.setChecked(theme.preference() == choice)
            a.setEnabled(not forced)
            a.setToolTip("set by GGUFDESK_THEME" if forced else f"{text} theme")
            a.triggered.connect(lambda _checked=False, c=choice: theme.choose(c))
            group.addAction(a)
            menu.addAction(a)
            self.theme_actions[choice] = a

    def _wire(self) -> None:
        e = self.engine
        e.engine_event.connect(self.session.on_event)
        e.engine_event.connect(self.models.on_event)
        e.loaded.connect(self.gauges.on_loaded)
        e.unloaded.connect(self.gauges.on_unloaded)
        e.stats.connect(self.gauges.on_stats)
        e.progress.connect(self.gauges.on_progress)
        e.done.connect(self.gauges.on_done)  # (first: it reads a final report on_ended may make)
        for ended in (e.done, e.error, e.crashed):
            ended.connect(self.gauges.on_ended)
        self.sampler.sampled.connect(self.gauges.on_sample)
        self._draft_timer = QTimer(self, singleShot=True, interval=500)
        self._draft_timer.timeout.connect(lambda: self.save_draft())
        self.composer.send_requested.connect(lambda text: self.send(text))
        self.composer.stop_requested.connect(lambda: self.stop())
        self.composer.draft_changed.connect(lambda: self._draft_timer.start())
        self.composer.image_refused.connect(lambda why: self.banner.notify(why, "warning"))
        s = self.sidebar
        s.new_requested.connect(lambda: self.new_conversation())
        s.rename_requested.connect(lambda: self.rename_current())
        s.delete_requested.connect(lambda: self.delete_current())
        s.export_requested.connect(lambda: self.export_current())
        s.conversation_chosen.connect(self._on_conversation_chosen)
        s.search_changed.connect(lambda _text: self.refresh_conversations())
        self.chat.edit_requested.connect(self.edit_message)
        self.chat.regenerate_requested.connect(self.regenerate)
        self.chat.version_requested.connect(self.step_version)
        self.chat.copied.connect(lambda: self.banner.notify("copied to the clipboard"))
        self.chat.tool_decided.connect(lambda key, decision: self.session.decide(key, decision))
        self.mcp_action.triggered.connect(lambda: self.open_mcp_servers())
        self.model_action.triggered.connect(lambda: self._choose_model and self._choose_model())
        self.switcher.chosen.connect(lambda path, model_id: self.switch_model(path, model_id))
        self.switcher.choose_other.connect(lambda: self._choose_model and self._choose_model())
        self.settings_action.triggered.connect(lambda: self.open_settings())
        self.conv_settings_action.triggered.connect(lambda: self.open_conversation_settings())

    def _make_room_for_the_server(self, showing: bool) -> None:
        """On a narrow window the Local server panel takes the gauges' place (they come back when
        it closes) instead of widening the window past the screen and squeezing the gauges."""
        if showing and self.gauges.isVisible():
            need = sum(w.minimumWidth() for w in (self.sidebar, self.center, self.gauges))
            need += self.server_panel.minimumSizeHint().width() + 4 * self.splitter.handleWidth() + 16
            if self.width() < need:
                self.gauges.hide()
                self._gauges_folded = True
                # the splitter's smaller minimum must be known before the dock's layout asks
                QApplication.sendPostedEvents(None, QEvent.Type.LayoutRequest)
        elif not showing and self._gauges_folded:
            self.gauges.show()
            self._gauges_folded = False

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        self.sampler.start()

    # ---- keyboard -----------------------------------------------------------------------------

    def focus_search(self) -> None:
        self.search.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.search.selectAll()

    def focus_input(self) -> None:
        self.input.setFocus(Qt.FocusReason.ShortcutFocusReason)

    def set_enter_sends(self, on: bool) -> None:
        self.input.enter_sends = bool(on)
        QSettings().setValue(ENTER_SENDS_KEY, bool(on))
        self.show_mode()

    def show_mode(self) -> None:
        """The conversation's mode in the header and on the Send button (chat or continue-text)."""
        conv = self.conv if hasattr(self, "session") else None
        completion = conv is not None and conv.mode == "completion"
        if completion:
            from ggufdesk.core.starter import EXAMPLE_PROMPT

            self.composer.set_send_words("Continue", "The model continues your text",
                                         f"Write the beginning of a text, e.g. “{EXAMPLE_PROMPT}”")
        else:
            self.composer.set_send_words("Send", "Send the message", "Write a message…")
        self._images_allowed(completion)
        self.chat.set_mode(conv.mode if conv else "chat")
        text = "" if conv is None else "continue-text mode" if completion else "chat mode"
        loaded = self.session.model.model if conv is not None and self.session.model else ""
        if conv is not None and conv.model and loaded and conv.model != loaded:
            self.header.set_mode(f"{text} · written with {Path(conv.model).name}",
                                 f"This conversation was written with {conv.model}; "
                                 f"{Path(loaded).name} is loaded now (Model ▸ Choose model…)")
        else:
            self.header.set_mode(text)

    def _images_allowed(self, completion: bool) -> None:
        """Attach, paste and drop images while the loaded model sees and the conversation is a chat."""
        model = self.session.model if hasattr(self, "session") else None
        if model is None or not model.mmproj:
            name = Path(model.model).name if model is not None else "The model"
            self.composer.set_images_allowed(False, f"{name} reads text only: images need a vision model "
                                                    "with its projector (mmproj) beside it")
        elif completion:
            self.composer.set_images_allowed(False, "Images go in a chat, not in continue-text mode")
        else:
            self.composer.set_images_allowed(True)

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
        qs.setValue("chat/draft", self.composer.text())
        qs.setValue("chat/last_conversation", self.conv.id if self.conv and self.conv.id else 0)

    def restore_state(self, qs: QSettings | None = None) -> None:
        """Reopen the conversation that was open last time and put the unsent draft back."""
        qs = qs or QSettings()
        draft = str(qs.value("chat/draft", "", type=str) or "")
        stored = qs.value("chat/last_conversation", 0, type=int)
        last = stored if isinstance(stored, int) else 0
        if draft and not self.composer.text():
            self.composer.set_text(draft)
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

    # ---- model (ModelSession does the work) ---------------------------------------------------

    def load_model(self, path: str, load: LoadSettings | None = None,
                   speculation: SpeculationSettings | None = None) -> None:
        """Load `path` (new default settings, if given), with the model's preset over them."""
        self.models.load(path, load, speculation, preset=self.switcher.model_id(path))

    def switch_model(self, path: str, model_id: str = "") -> None:
        """Load another model from the switcher; the conversation stays (its next answer comes from
        the new model). A starter's file is checked or assembled first, off the GUI thread."""
        from ggufdesk.core import library

        entry = next((m for m in self.switcher.models if m.id == model_id), None)

        def done(fut: Future[Path]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                return
            self.models.load(str(fut.result()), preset=model_id or self.switcher.model_id(path))

        run_in_background(lambda: library.file_for(entry) if entry is not None else Path(path), done, owner=self)

    @property
    def model_id(self) -> str:
        """The library id of the window's model ("" when none): what its preset is keyed by."""
        return self.switcher.model_id(self.model_path)

    def model_settings(self) -> Settings:
        """The settings with the window's model's preset over them (the defaults when it has none)."""
        try:
            return self.settings.for_model(self.model_id)
        except SettingsError:
            return self.settings

    def _server_models(self) -> list[ServerModel]:
        panel = getattr(self, "server_panel", None)
        service = panel.service if panel is not None else None
        return list(service.snapshot()["models"]) if service is not None else []

    # ---- conversations ------------------------------------------------------------------------

    def refresh_conversations(self, select_id: int | None = None) -> None:
        query = self.sidebar.query()

        def done(fut: Future[list[Conversation]]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                return
            self.sidebar.set_conversations(fut.result(),
                                           select_id or (self.conv.id if self.conv else None))

        run_in_background(lambda: self.history.list_conversations(query), done)

    def new_conversation(self, title: str = "New chat") -> Conversation | None:
        try:
            ms = self.model_settings()
            return self.session.new_conversation(title=title, system_prompt=ms.system_prompt,
                                                 sampling=ms.sampling)
        except Refused as e:
            self.banner.notify(str(e), "warning")
            return None

    def _on_conversation_chosen(self, conversation_id: int) -> None:
        if not (self.conv and conversation_id == self.conv.id):
            self.open_conversation(conversation_id)

    def open_conversation(self, conversation_id: int) -> None:
        def done(fut: Future[_Read]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                return
            self.session.open(*fut.result())

        def read() -> _Read:
            self.writer.flush(2.0)  # what this window wrote comes back with it
            return (self.history.get_conversation(conversation_id),
                    self.history.messages(conversation_id), self.history.versions(conversation_id))

        run_in_background(read, done)

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
        self.sidebar.remove(conv.id)

    def export_current(self, path: str | None = None) -> None:
        """Export the open conversation (after pending writes land, off the GUI thread); `exported`
        tells the path, or None."""
        conv = self.conv
        if not conv:
            return
        if path is None:
            path, _ = QFileDialog.getSaveFileName(
                self, "Export conversation", str(export_dir() / f"{file_name(conv.title)}.md"),
                "Markdown (*.md);;JSON (*.json)")
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
                else:  # the images go into a folder beside the file
                    md = self.history.export_markdown(conv_id, image_dir=out.with_name(out.stem + "_images"))
                    out.write_text(md, encoding="utf-8")
            except OSError as e:
                raise KnownError(f"could not export to {out}: {e.strerror or e}") from e
            return out

        def done(fut: Future[Path]) -> None:
            if (msg := describe_failure(fut)) is not None:
                self.banner.notify(msg, "error")
                self.exported.emit(None)
                return
            self.banner.notify(f"exported to {out}")
            QSettings().setValue(EXPORT_DIR_KEY, str(out.parent))  # the next export starts there
            self.exported.emit(out)

        run_in_background(export, done)

    # ---- sending (the session does the work) --------------------------------------------------

    def send(self, text: str | None = None) -> bool:
        """Send what the box holds; in continue-text mode an empty box means "go on writing"."""
        text = (self.composer.text() if text is None else text).strip()
        images = self.composer.images()
        completion = self.conv is not None and self.conv.mode == "completion"
        if not text and not images and not completion:
            return False
        try:
            if text or images:
                ms = self.model_settings()
                self.session.send(text, system_prompt=ms.system_prompt, sampling=ms.sampling, images=images)
            else:
                self.session.continue_text()
        except Refused as e:
            self.banner.notify(str(e), "warning")
            return False
        self.composer.clear()
        self.composer.clear_images()
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
        self.composer.set_text(text)
        self.composer.clear_images()
        self.composer.attach(self.session.images_of(key))
        self.input.setFocus()
        self.banner.notify("editing: sending replaces that message and what follows; the current "
                           "ones stay as an earlier version (‹ ›)")

    # ---- dialogs ------------------------------------------------------------------------------

    def _estimate(self, load: LoadSettings) -> ContextEstimate | None:
        if self._estimate_for is None or not self.model_path:
            return None
        return self._estimate_for(self.model_path, load)

    def open_settings(self) -> None:
        """Engine settings: the defaults, or (a model loaded) this model's own preset."""
        loaded = self.engine.loaded_event
        model_id = self.model_id
        ms = self.model_settings()
        preset = self.settings.presets.get(model_id)
        dlg = SettingsDialog(ms.load, ms.speculation, recommended=self._recommended,
                             n_ctx_train=loaded.n_ctx_train if loaded else 0,
                             estimate=self._estimate if self.model_path else None, parent=self,
                             model_id=model_id or None, for_model=bool(preset and (preset.load or preset.speculation)))
        if dlg.exec():
            load, spec = dlg.values()
            if model_id and dlg.scope() == "model":
                self._set_preset(model_id, load, spec)
                if self.model_path:
                    self.models.load(self.model_path, preset=model_id)
                return
            if preset:  # "for every model": this model follows the defaults again
                self._set_preset(model_id, self.settings.load, self.settings.speculation)
            if self.model_path:
                self.load_model(self.model_path, load, spec)
            else:
                self.settings.load, self.settings.speculation = load, spec

    def _set_preset(self, model_id: str, load: LoadSettings, spec: SpeculationSettings) -> None:
        """The model's preset with what `load`/`spec` change of the defaults (its sampling and system
        prompt kept), saved."""
        old = self.settings.presets.get(model_id) or Preset()
        diff = Preset.between(self.settings, dataclasses.replace(self.settings, load=load, speculation=spec))
        self.settings.set_preset(model_id, Preset(load=diff.load, speculation=diff.speculation,
                                                  sampling=old.sampling, system_prompt=old.system_prompt))
        try:
            self._save_settings(self.settings)
        except OSError as e:
            self.banner.notify(f"could not save settings: {e}", "error")

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
            self.show_mode()

    def open_mcp_servers(self) -> None:
        """The MCP servers page; the ticks turn servers on or off for the open conversation."""
        from ggufdesk.core.mcp.config import import_sources, save_mcp_config
        from ggufdesk.ui.mcp_dialog import McpServersDialog

        conv = self.conv
        dlg = McpServersDialog(self.mcp_host, save=lambda config: save_mcp_config(config), signals=self.mcp_signals,
                               conversation_off=conv.mcp_off if conv is not None else None,
                               sources=import_sources(), parent=self)
        dlg.conversation_changed.connect(lambda off: self.session.update_conversation(mcp_off=tuple(off)))
        dlg.exec()

    # ---- drag and drop a .gguf onto the window: remember it in the library and load it ----------

    @staticmethod
    def _dropped_gguf(mime: QMimeData) -> str | None:
        for url in mime.urls() if mime.hasUrls() else []:
            if url.isLocalFile() and url.toLocalFile().lower().endswith(".gguf"):
                return str(url.toLocalFile())
        return None

    def _dropped_images(self, mime: QMimeData) -> bool:
        """Image files dropped anywhere on the window go to the message box (while the model sees)."""
        from ggufdesk.ui.image_views import is_image_path

        return self.input.takes_images and any(
            u.isLocalFile() and is_image_path(u.toLocalFile()) for u in (mime.urls() if mime.hasUrls() else []))

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt API
        if self._dropped_gguf(event.mimeData()) or self._dropped_images(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt API
        if self._dropped_images(event.mimeData()):
            event.acceptProposedAction()
            self.input.insertFromMimeData(event.mimeData())
            return
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
        self.session.close()  # an answer in progress is kept as a partial one; a running tool is stopped
        if not self.writer.close(timeout=3.0):
            log.error("some of the chat history could not be saved: %s", self.writer.state.reason)
        self.mcp_host.close()  # every MCP server this window started stops with it
        self.sampler.stop()
        super().closeEvent(event)
