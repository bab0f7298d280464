"""The `ggufdesk-gui` entry point: single instance, icon, remembered geometry, first-run wizard."""
from __future__ import annotations

import getpass
import hashlib
import logging
import os
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from PySide6.QtCore import QSettings
from PySide6.QtGui import QIcon
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from ggufdesk import __version__
from ggufdesk.core.errors import KnownError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from ggufdesk.core.history import History
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow
    from ggufdesk.ui.services import ModelServices

log = logging.getLogger("ggufdesk.ui")

SERVER_NAME = "ggufdesk-single-instance"


def instance_name(env: dict[str, str] | None = None) -> str:
    """One instance per user and display: another user, or another X/Wayland display, gets its own."""
    env = dict(os.environ if env is None else env)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    display = env.get("WAYLAND_DISPLAY") or env.get("DISPLAY") or ""
    tag = hashlib.sha1(f"{user}\0{display}".encode()).hexdigest()[:12]
    return f"{SERVER_NAME}-{tag}"


def resources_dir() -> Path:
    """resources/ inside the package (icons, .desktop file), found through importlib.resources."""
    return Path(str(resources.files("ggufdesk") / "resources"))


def app_icon() -> QIcon:
    icon = QIcon()
    res = resources_dir()
    for size in (16, 32, 48, 64, 128, 256):
        png = res / "icons" / f"ggufdesk-{size}.png"
        if png.exists():
            icon.addFile(str(png))
    if icon.isNull() and (res / "ggufdesk.svg").exists():
        icon = QIcon(str(res / "ggufdesk.svg"))
    return icon


class SingleInstance:
    """The first instance listens on a local socket; a second one pokes it and exits."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or instance_name()
        self.server: QLocalServer | None = None

    def another_is_running(self) -> bool:
        sock = QLocalSocket()
        sock.connectToServer(self.name)
        if sock.waitForConnected(300):
            sock.write(b"raise\n")
            sock.flush()
            sock.waitForBytesWritten(300)
            sock.disconnectFromServer()
            return True
        return False

    def listen(self, on_raise: Callable[[], object]) -> bool:
        QLocalServer.removeServer(self.name)  # a stale socket from a crashed instance
        self.server = QLocalServer()
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self.server.newConnection.connect(lambda: self._accept(on_raise))
        return self.server.listen(self.name)

    def _accept(self, on_raise: Callable[[], object]) -> None:
        while self.server and (conn := self.server.nextPendingConnection()):
            conn.readyRead.connect(lambda c=conn: c.readAll())
            conn.disconnected.connect(conn.deleteLater)
            on_raise()


def raise_window(win: QWidget) -> None:
    win.showNormal()
    win.raise_()
    win.activateWindow()


def build_main_window(*, engine_command: list[str] | None = None, services: ModelServices | None = None,
                      ) -> tuple[MainWindow, EngineBridge, History, Callable[[], None]]:
    """Everything main() builds, also used by benches and tests: (window, engine, history)."""
    from ggufdesk.core.history import History
    from ggufdesk.core.settings import open_settings
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow
    from ggufdesk.ui.services import ModelServices
    from ggufdesk.ui.wizard import ModelWizard

    opened_settings = open_settings()  # a broken file is kept aside, never silently replaced
    opened_history = History.open()  # locked, read-only or damaged: a mode and a warning, no traceback
    settings, history = opened_settings.settings, opened_history.history
    engine = EngineBridge(command=engine_command)
    services = services or ModelServices(engine_devices=engine.devices, decode_probe=True)
    win = MainWindow(engine=engine, history=history, settings=settings,
                     recommended=lambda: services.recommended_settings(win.model_path),
                     estimate=services.context_estimate)
    for warning in (opened_settings.warning, opened_history.warning):
        if warning:
            win.banner.notify(warning, "warning")

    def choose_model() -> None:
        wiz = ModelWizard(services, parent=win)
        if wiz.exec() and wiz.selection is not None:
            sel = wiz.selection
            win.load_model(str(sel.path), sel.load, sel.speculation)
        elif not win.model_path:
            load_starter(win)

    win._choose_model = choose_model
    engine.start()
    return win, engine, history, choose_model


def load_starter(win: MainWindow) -> None:
    """Nothing chosen and nothing loaded: open the offline starter model, so the first run can chat.

    The chat starter when installed, else the base one. Checking or assembling it the first time
    reads and hashes 98-253 MB: off the GUI thread."""
    from ggufdesk.core.starter import default_model_path, default_starter
    from ggufdesk.ui.tasks import describe_failure, run_in_background

    if default_starter() is None:
        return

    def done(fut: Future[Path]) -> None:
        if (msg := describe_failure(fut)) is not None:
            log.warning("starter model: %s", msg)
            return
        if not win.model_path:
            win.load_model(str(fut.result()))

    run_in_background(default_model_path, done, owner=win)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("huggingface_hub").propagate = False  # it has its own handler: once, not twice
    from ggufdesk.ui import platform_check, theme

    if QApplication.instance() is None and (line := platform_check.check()):
        print(line, file=sys.stderr)  # Qt itself would abort with a core dump and one name
        return 1
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv if argv is None else argv)
    theme.follow_system(app)  # light or dark as the system says, and when it changes (parented to app)
    app.setApplicationName("ggufdesk")
    app.setOrganizationName("ggufdesk")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("ggufdesk")
    app.setWindowIcon(app_icon())
    single = SingleInstance()
    if single.another_is_running():
        log.info("ggufdesk is already running; raised its window")
        return 0
    try:
        win, engine, history, choose_model = build_main_window()
    except KnownError as e:
        QMessageBox.critical(None, "ggufdesk", str(e))
        return 1
    single.listen(lambda: raise_window(win))
    qs = QSettings()
    win.restore_geometry(qs)
    win.show()
    win.restore_state(qs)  # the last conversation and the unsent draft
    model = win.settings.model
    if model and Path(model).is_file():
        win.load_model(model)
    else:
        from PySide6.QtCore import QTimer

        QTimer.singleShot(0, choose_model)
    rc = app.exec()
    win.save_geometry(qs)
    from ggufdesk.ui import tasks

    tasks.manager().shutdown()  # a late background result must not reach a closing app
    engine.shutdown()
    history.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
