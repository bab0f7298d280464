"""MCP servers: add, edit and remove them (validated as you type), turn them on or off for the open
conversation, see each one's state, tools and last calls, import another app's servers."""
from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
    QLineEdit, QListWidget, QListWidgetItem, QMessageBox, QPlainTextEdit, QPushButton, QSpinBox,
    QSplitter, QVBoxLayout, QWidget,
)

from ggufdesk.core.mcp.config import (CALL_TIMEOUT_S, McpConfig, McpConfigError, ServerConfig, import_servers,
                                      parse_server)
from ggufdesk.core.mcp.host import McpHost, ServerStatus
from ggufdesk.ui import theme

KINDS = (("stdio", "Command (stdio)"), ("http", "URL (streamable HTTP)"), ("sse", "URL (SSE, older servers)"))
STATE_WORDS = {"stopped": "not started (starts when a message needs it)", "starting": "starting…",
               "ready": "running", "failed": "failed"}


class McpSignals(QObject):
    """The host's status callback, delivered on the GUI thread (host.on_change = signals.changed.emit)."""

    changed = Signal(str)


def dot_colour(state: str) -> QColor:
    """The status dot: green running, amber starting, red failed, grey not started."""
    hue = {"starting": theme.WARNING_HUE, "ready": theme.SUCCESS_HUE, "failed": theme.ERROR_HUE}.get(state)
    return theme.muted() if hue is None else theme.tone(hue, strong=True)


def _dot(state: str) -> QIcon:
    pix = QPixmap(12, 12)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setBrush(dot_colour(state))
    p.setPen(Qt.PenStyle.NoPen)
    p.drawEllipse(1, 1, 10, 10)
    p.end()
    return QIcon(pix)


def _pairs(text: str, sep: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if sep not in line:
            raise McpConfigError(f"{what}, line {n}: write NAME{sep}VALUE")
        key, value = line.split(sep, 1)
        if not key.strip():
            raise McpConfigError(f"{what}, line {n}: the name is empty")
        out[key.strip()] = value.strip() if sep == ":" else value
    return out


FIELDS = {"command": "Command", "args": "Arguments", "env": "Environment", "cwd": "Working folder", "url": "URL",
          "headers": "Headers", "type": "Kind", "timeout": "Call time limit"}


def plain_error(text: str, name: str) -> str:
    """A config error as the form says it: 'URL must be …' rather than 'mcpServers.web.url must be …'."""
    text = text.removeprefix(f"mcpServers.{name}").removeprefix(": ").lstrip(".")
    field, _, rest = text.partition(" ")
    return f"{FIELDS[field]} {rest}" if field in FIELDS else text[:1].upper() + text[1:]


def log_text(status: ServerStatus) -> str:
    """The server's last calls, newest first, and what it said on stderr lately."""
    lines = [f"{STATE_WORDS.get(status.state, status.state)}" + (f": {status.message}" if status.message else "")]
    if status.garbage_lines:
        lines.append(f"it wrote {status.garbage_lines} line(s) on stdout that are not MCP messages (ignored)")
    for c in reversed(status.calls):
        when = time.strftime("%H:%M:%S", time.localtime(c.started))
        lines.append(f"{when}  {c.tool} {c.arguments}  → {c.outcome} in {c.seconds:.2f} s: {c.summary}")
    if status.stderr is not None and status.stderr.is_file():
        try:
            tail = status.stderr.read_bytes()[-3000:].decode("utf-8", "replace")
        except OSError:
            tail = ""
        if tail.strip():
            lines += ["", f"— its messages ({status.stderr}):", tail.rstrip()]
    return "\n".join(lines)


def _line(placeholder: str) -> QLineEdit:
    edit = QLineEdit()
    edit.setPlaceholderText(placeholder)
    return edit


def _lines(placeholder: str) -> QPlainTextEdit:
    edit = QPlainTextEdit()
    edit.setPlaceholderText(placeholder)
    edit.setFixedHeight(54)
    return edit


class ServerEditor(QGroupBox):
    """The form for one server; `entry()` is what it says, `check()` the server or why not."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Server", parent)
        self.name = _line("files")
        self.kind = QComboBox()
        for key, label in KINDS:
            self.kind.addItem(label, key)
        self.command = _line("npx")
        self.args = _line("-y @modelcontextprotocol/server-filesystem ~/Documents")
        self.env = _lines("API_KEY=…  (one per line)")
        self.cwd = _line("")
        self.url = _line("http://127.0.0.1:8000/mcp")
        self.headers = _lines("Authorization: Bearer …  (one per line)")
        self.timeout = QSpinBox()
        self.timeout.setRange(1, 86400)
        self.timeout.setSuffix(" s")
        self.enabled = QCheckBox("offer its tools to the model")
        self.allowed = QLabel()
        self.allowed.setWordWrap(True)
        self.forget_btn = QPushButton("&Forget permissions")
        self.forget_btn.setToolTip("Ask again before every call of this server's tools")
        self.forget_btn.clicked.connect(lambda _checked=False: self._forget())
        self._always: tuple[str, ...] = ()
        self._extra: dict[str, object] = {}
        form = QFormLayout(self)
        self.rows: dict[str, QWidget] = {}
        for label, widget in (("&Name", self.name), ("&Kind", self.kind), ("&Command", self.command),
                              ("A&rguments", self.args), ("&Environment", self.env), ("&Working folder", self.cwd),
                              ("&URL", self.url), ("&Headers", self.headers), ("Call &time limit", self.timeout),
                              ("", self.enabled), ("Runs without asking", self.allowed), ("", self.forget_btn)):
            form.addRow(label, widget)
            self.rows[label] = widget
        self._form = form
        for sig in (self.name.textChanged, self.command.textChanged, self.args.textChanged, self.cwd.textChanged,
                    self.url.textChanged, self.env.textChanged, self.headers.textChanged, self.timeout.valueChanged,
                    self.enabled.toggled):
            sig.connect(lambda *_: self.changed.emit())
        self.kind.currentIndexChanged.connect(lambda *_: self._kind_changed())
        self.load(None)

    def _kind_changed(self) -> None:
        stdio = self.kind.currentData() == "stdio"
        for w in (self.command, self.args, self.env, self.cwd):
            self._form.setRowVisible(w, stdio)
        for w in (self.url, self.headers):
            self._form.setRowVisible(w, not stdio)
        self.changed.emit()

    def _forget(self) -> None:
        self._always = ()
        self._show_allowed()
        self.changed.emit()

    def _show_allowed(self) -> None:
        self.allowed.setText(", ".join(self._always) or "nothing: every call asks first")
        self.forget_btn.setEnabled(bool(self._always))

    def load(self, server: ServerConfig | None) -> None:
        s = server or ServerConfig(name="")
        self.name.setText(s.name)
        self.kind.setCurrentIndex([k for k, _ in KINDS].index(s.transport))
        self.command.setText(s.command)
        self.args.setText(shlex.join(s.args))
        self.env.setPlainText("\n".join(f"{k}={v}" for k, v in s.env.items()))
        self.cwd.setText(s.cwd)
        self.url.setText(s.url)
        self.headers.setPlainText("\n".join(f"{k}: {v}" for k, v in s.headers.items()))
        self.timeout.setValue(int(s.timeout))
        self.enabled.setChecked(not s.disabled)
        self._always, self._extra = s.always_allow, dict(s.extra)
        self._show_allowed()
        self._kind_changed()

    def entry(self) -> tuple[str, dict[str, object]]:
        """(name, the mcpServers entry) as typed; raises McpConfigError for a field that cannot be read."""
        entry: dict[str, object] = dict(self._extra)
        kind = self.kind.currentData()
        if kind == "stdio":
            try:
                args = shlex.split(self.args.text())
            except ValueError as e:
                raise McpConfigError(f"arguments: {e}") from None
            entry |= {"command": self.command.text().strip(), "args": args,
                      "env": _pairs(self.env.toPlainText(), "=", "environment")}
            if self.cwd.text().strip():
                entry["cwd"] = self.cwd.text().strip()
        else:
            entry |= {"url": self.url.text().strip(), "headers": _pairs(self.headers.toPlainText(), ":", "headers")}
            if kind == "sse":
                entry["type"] = "sse"
        if self.timeout.value() != int(CALL_TIMEOUT_S):
            entry["timeout"] = self.timeout.value()
        if not self.enabled.isChecked():
            entry["disabled"] = True
        if self._always:
            entry["alwaysAllow"] = list(self._always)
        return self.name.text().strip(), entry

    def check(self) -> ServerConfig:
        name, entry = self.entry()
        return parse_server(name, entry)


class McpServersDialog(QDialog):
    """The MCP servers page. Changes are written to mcp.json with `save` (and given to the host);
    `conversation_off` is the open conversation's servers turned off (None: no conversation)."""

    conversation_changed = Signal(object)  # tuple[str, ...]: the servers turned off in this conversation

    def __init__(self, host: McpHost, *, save: Callable[[McpConfig], object], signals: McpSignals | None = None,
                 conversation_off: tuple[str, ...] | None = None,
                 sources: list[tuple[str, Path]] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("MCP servers")
        self.resize(960, 640)
        self.host = host
        self._save = save
        self.off = conversation_off
        self.editing: str | None = None  # the name of the server in the form; None: a new one
        intro = QLabel("MCP servers give the model tools: files, a browser, a database, your own scripts. "
                       "A server starts when a message first needs it; every call asks you first unless you "
                       "chose “Always” for that tool. The tick says whether the open conversation uses it.")
        intro.setWordWrap(True)
        self.list = QListWidget()
        self.list.setAccessibleName("MCP servers")
        self.list.currentItemChanged.connect(lambda *_: self._selected())
        self.list.itemChanged.connect(self._ticked)
        self.restart_btn = QPushButton("&Start / restart")
        self.restart_btn.setToolTip("Start the server now (again, if it failed) and list its tools")
        self.restart_btn.clicked.connect(lambda _checked=False: self.restart())
        self.remove_btn = QPushButton("Re&move")
        self.remove_btn.clicked.connect(lambda _checked=False: self.remove_server())
        self.add_btn = QPushButton("&Add")
        self.add_btn.clicked.connect(lambda _checked=False: self.add_server())
        # One button per other app whose MCP file exists (LM Studio, Claude Desktop, Cursor): it
        # shows what would be added and asks first.
        self.import_btns: list[QPushButton] = []
        for label, path in (sources or []):
            b = QPushButton(f"Import from {label}…")
            b.setToolTip(f"Add the servers of {path} (you see them and confirm first)")
            b.clicked.connect(lambda _checked=False, p=path, lb=label: self.import_from(lb, p))
            self.import_btns.append(b)
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.list, 1)
        ll.addWidget(self.restart_btn)  # first: what acts on the selected server, then Add
        row = QHBoxLayout()
        for b in (self.remove_btn, self.add_btn):
            row.addWidget(b)
        ll.addLayout(row)
        for b in self.import_btns:
            ll.addWidget(b)
        self.editor = ServerEditor()
        self.editor.changed.connect(self.validate)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet(f"color: {theme.css(theme.tone(theme.ERROR_HUE, strong=True))}; font-weight: 600;")
        self.save_btn = QPushButton("Sa&ve server")
        self.save_btn.setDefault(False)
        self.save_btn.clicked.connect(lambda _checked=False: self.save_server())
        self.revert_btn = QPushButton("Revert")
        self.revert_btn.clicked.connect(lambda _checked=False: self._selected())
        self.tools = QListWidget()
        self.tools.setAccessibleName("Tools of this server")
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setAccessibleName("Last calls and messages of this server")
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.editor)
        rl.addWidget(self.error)
        brow = QHBoxLayout()
        brow.addStretch(1)
        brow.addWidget(self.revert_btn)
        brow.addWidget(self.save_btn)
        rl.addLayout(brow)
        tools_box = QGroupBox("Tools")
        QVBoxLayout(tools_box).addWidget(self.tools)
        log_box = QGroupBox("Last calls and log")
        QVBoxLayout(log_box).addWidget(self.log)
        info = QSplitter(Qt.Orientation.Horizontal)
        info.addWidget(tools_box)
        info.addWidget(log_box)
        rl.addWidget(info, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(1, 3)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addWidget(split, 1)
        lay.addWidget(buttons)
        if signals is not None:
            signals.changed.connect(self._status_changed)
        self.refresh()

    # ---- the list -------------------------------------------------------------------------------

    def refresh(self, select: str | None = None) -> None:
        item = self.list.currentItem()
        current = select or (item.data(Qt.ItemDataRole.UserRole) if item is not None else None)
        self.list.blockSignals(True)
        self.list.clear()
        for s in self.host.config.servers.values():
            item = QListWidgetItem()
            item.setData(Qt.ItemDataRole.UserRole, s.name)
            self._paint(item, s)
            if self.off is not None:
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(Qt.CheckState.Unchecked if s.name in self.off or s.disabled
                                   else Qt.CheckState.Checked)
            self.list.addItem(item)
            if s.name == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        if self.list.currentItem() is None and self.list.count():
            self.list.setCurrentRow(0)
        self._selected()

    def _paint(self, item: QListWidgetItem, s: ServerConfig) -> None:
        status = self.host.status(s.name)
        tools = f" · {len(status.tools)} tools" if status.state == "ready" else ""
        off = " (off)" if s.disabled else ""
        item.setText(f"{s.name}{off}{tools}")
        item.setIcon(_dot(status.state))
        item.setToolTip(f"{s.describe()}\n{STATE_WORDS.get(status.state, status.state)}"
                        + (f": {status.message}" if status.message else ""))

    def _status_changed(self, name: str) -> None:
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == name and name in self.host.config.servers:
                self.list.blockSignals(True)
                self._paint(item, self.host.config.servers[name])
                self.list.blockSignals(False)
        if self.editing == name:
            self._show_status(name)

    def _ticked(self, item: QListWidgetItem) -> None:
        if self.off is None:
            return
        name = item.data(Qt.ItemDataRole.UserRole)
        off = set(self.off)
        if item.checkState() == Qt.CheckState.Checked:
            off.discard(name)
        else:
            off.add(name)
        self.off = tuple(n for n in self.host.config.servers if n in off)
        self.conversation_changed.emit(self.off)

    def _selected(self) -> None:
        item = self.list.currentItem()
        name = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        server = self.host.config.servers.get(name) if name else None
        self.editing = server.name if server else None
        self.editor.load(server)
        self.remove_btn.setEnabled(server is not None)
        self.restart_btn.setEnabled(server is not None and not server.disabled)
        self._show_status(self.editing)
        self.validate()

    def _show_status(self, name: str | None) -> None:
        self.tools.clear()
        if name is None:
            self.log.setPlainText("")
            return
        status = self.host.status(name)
        for t in status.tools:
            item = QListWidgetItem(f"{t.name} — {t.description}" if t.description else t.name)
            item.setToolTip(t.description)
            self.tools.addItem(item)
        if not status.tools:
            self.tools.addItem("(listed once the server has started)")
        self.log.setPlainText(log_text(status))

    # ---- editing --------------------------------------------------------------------------------

    def validate(self) -> bool:
        """Check the form as it is typed; Save only when it makes a server that can work."""
        try:
            server = self.editor.check()
            if server.name != self.editing and server.name in self.host.config.servers:
                raise McpConfigError(f"a server named {server.name!r} exists already")
        except McpConfigError as e:
            self.error.setText(plain_error(str(e), self.editor.name.text().strip()))
            self.save_btn.setEnabled(False)
            self.revert_btn.setEnabled(self.editing is not None)
            return False
        self.error.setText("")
        unchanged = self.editing is not None and self.host.config.servers.get(self.editing) == server
        self.save_btn.setEnabled(not unchanged)
        self.revert_btn.setEnabled(not unchanged and self.editing is not None)
        return True

    def _write(self, config: McpConfig) -> bool:
        try:
            self._save(config)
        except OSError as e:
            self.error.setText(f"could not save mcp.json: {e}")
            return False
        self.host.update_config(config)
        return True

    def add_server(self) -> None:
        self.list.setCurrentRow(-1)  # no item is current: the form is a new server
        self.editing = None
        base, n = "server", 1
        name = base
        while name in self.host.config.servers:
            n += 1
            name = f"{base}-{n}"
        self.editor.load(ServerConfig(name=name))
        self.remove_btn.setEnabled(False)
        self.restart_btn.setEnabled(False)
        self._show_status(None)
        self.editor.command.setFocus()
        self.validate()

    def save_server(self) -> None:
        if not self.validate():
            return
        server = self.editor.check()
        config = self.host.config.with_server(server, replacing=self.editing)
        if self._write(config):
            if self.off is not None and self.editing and self.editing != server.name and self.editing in self.off:
                self.off = tuple(server.name if n == self.editing else n for n in self.off)
                self.conversation_changed.emit(self.off)
            self.refresh(select=server.name)

    def remove_server(self) -> None:
        name = self.editing
        if name is None:
            return
        answer = QMessageBox.question(self, "Remove MCP server",
                                      f"Remove {name}? Its tools are no longer offered (the server itself is "
                                      "not uninstalled).")
        if answer == QMessageBox.StandardButton.Yes and self._write(self.host.config.without(name)):
            self.refresh()

    def restart(self) -> None:
        if self.editing is None:
            return
        name = self.editing
        self.host.stop(name)
        self.host.list_tools([name], retry=True)  # the status callback shows how it goes

    def import_from(self, label: str, path: Path) -> None:
        try:
            result = import_servers(self.host.config, path)
        except McpConfigError as e:
            QMessageBox.warning(self, "Import MCP servers", str(e))
            return
        if not result.added:
            QMessageBox.information(self, "Import MCP servers", f"Nothing to add from {label}."
                                    + ("\n\nLeft out: " + "; ".join(result.skipped) if result.skipped else ""))
            return
        text = (f"Add these servers from {label}?\n\n" + "\n".join(
            f"• {n}: {result.config.servers[n].describe()}" for n in result.added)
            + ("\n\nLeft out: " + "; ".join(result.skipped) if result.skipped else "")
            + "\n\nEach of them runs on this computer when a message needs its tools.")
        if QMessageBox.question(self, "Import MCP servers", text) == QMessageBox.StandardButton.Yes \
                and self._write(result.config):
            self.refresh(select=result.added[0])
