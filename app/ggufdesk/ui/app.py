"""The `ggufdesk-gui` entry point: single instance, icon, remembered geometry, first-run wizard."""
from __future__ import annotations

import logging
import sys
from importlib import resources
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtGui import QIcon
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QApplication, QMessageBox

from ggufdesk import __version__
from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.ui")

SERVER_NAME = "ggufdesk-single-instance"


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

    def __init__(self, name: str = SERVER_NAME) -> None:
        self.name = name
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

    def listen(self, on_raise) -> bool:
        QLocalServer.removeServer(self.name)  # a stale socket from a crashed instance
        self.server = QLocalServer()
        self.server.newConnection.connect(lambda: self._accept(on_raise))
        return self.server.listen(self.name)

    def _accept(self, on_raise) -> None:
        while self.server and (conn := self.server.nextPendingConnection()):
            conn.readyRead.connect(lambda c=conn: c.readAll())
            conn.disconnected.connect(conn.deleteLater)
            on_raise()


def raise_window(win) -> None:
    win.showNormal()
    win.raise_()
    win.activateWindow()


def build_main_window(*, engine_command: list[str] | None = None, services=None):
    """Everything main() builds, also used by benches and tests: (window, engine, history)."""
    from ggufdesk.core.history import History
    from ggufdesk.core.settings import Settings, load_settings
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow
    from ggufdesk.ui.services import ModelServices
    from ggufdesk.ui.wizard import ModelWizard

    try:
        settings = load_settings()
    except KnownError as e:
        log.warning("%s; using defaults", e)
        settings = Settings()
    history = History()
    engine = EngineBridge(command=engine_command)
    services = services or ModelServices(engine_devices=engine.devices)
    win = MainWindow(engine=engine, history=history, settings=settings,
                     recommended=lambda: services.recommended_settings(win.model_path))

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


def load_starter(win) -> None:
    """Nothing chosen and nothing loaded: open the offline starter model, so the first run can chat."""
    from ggufdesk.core.starter import starter_available, starter_model_path

    if not starter_available():
        return
    try:
        win.load_model(str(starter_model_path()))
    except KnownError as e:
        log.warning("starter model: %s", e)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = QApplication.instance() or QApplication(sys.argv if argv is None else argv)
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
    model = win.settings.model
    if model and Path(model).is_file():
        win.load_model(model)
    else:
        from PySide6.QtCore import QTimer

        QTimer.singleShot(0, choose_model)
    rc = app.exec()
    win.save_geometry(qs)
    engine.shutdown()
    history.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
