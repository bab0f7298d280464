"""Entry point of the frozen bundle: `ggufdesk [ARGS]`, `ggufdesk-gui`, and `-m MODULE` for the engine process."""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


def run_module(argv: list[str]) -> int:
    """`ggufdesk -m ggufdesk.engine.runtime.worker`: the engine client starts `sys.executable -m ...`, as with Python."""
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    return 0


def show_hint_in_gui(msg: str) -> None:
    """The GUI's QApplication, made first, shows the hint once the window is up (not modal)."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    app = QApplication.instance() or QApplication(sys.argv)
    box = QMessageBox(QMessageBox.Icon.Information, "ggufdesk", msg)
    box.setModal(False)
    app._gpu_hint = box  # keep a reference until the app ends
    QTimer.singleShot(500, box.show)


def report_first_paint() -> None:
    """GGUFDESK_STARTUP_T0 set (bench/dist.py): print `SHOWN <s>` at the main window's first paint, then quit.

    The same hook runs from the venv (`python installer/bundle_main.py`) and from the bundle, so the two
    start-up times are measured the same way."""
    import time

    from PySide6.QtCore import QEvent, QObject, QTimer
    from PySide6.QtWidgets import QApplication, QMainWindow

    t0 = float(os.environ["GGUFDESK_STARTUP_T0"])
    app = QApplication.instance() or QApplication(sys.argv)

    class FirstPaint(QObject):
        def eventFilter(self, obj, ev):  # noqa: N802 - Qt's name
            if ev.type() == QEvent.Type.Paint and isinstance(obj, QMainWindow):
                print(f"SHOWN {time.time() - t0:.3f}", flush=True)
                app.removeEventFilter(self)
                QTimer.singleShot(0, app.quit)
            return False

    app._first_paint = FirstPaint()
    app.installEventFilter(app._first_paint)


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) >= 2 and argv[0] == "-m":
        return run_module(argv[1:])
    gui = Path(sys.argv[0]).name.startswith("ggufdesk-gui") or not argv
    if not os.environ.get("GGUFDESK_NO_GPU_HINT"):
        from platformdirs import user_state_dir

        from ggufdesk.core.bundle import hint_once

        msg = hint_once(Path(user_state_dir("ggufdesk")))
        if msg:
            print(f"ggufdesk: {msg}", file=sys.stderr)
            if gui:
                show_hint_in_gui(msg)
    if gui:
        from ggufdesk.ui.app import main as gui_main

        if os.environ.get("GGUFDESK_STARTUP_T0"):
            report_first_paint()

        return gui_main()
    from ggufdesk.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
