"""Presses every button, action and menu entry of a window (the press-everything tests' helper).

Modal dialogs never block: the static QMessageBox / QFileDialog / QInputDialog helpers are replaced
by answers, and `QDialog.exec` shows the dialog, presses everything inside it, and closes it.
Anything that goes wrong is a test failure: pytest-qt fails on exceptions in slots and on Qt
warnings (qt_log_level_fail), and `errors` collects what our own callbacks logged as bugs.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import shiboken6
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractButton, QApplication, QDialog, QDialogButtonBox, QFileDialog, QInputDialog, QMenu,
    QMessageBox, QWidget, QWizard,
)

from ggufdesk.ui import tasks
from tests.fixtures.ggufs import write_tiny_llama


class BugLog(logging.Handler):
    """Records ERROR lines of our loggers: callbacks catch exceptions and log them as bugs."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def control_name(c: QAbstractButton | QAction) -> str:
    text = c.text().replace("&", "") or c.toolTip() or c.objectName() or type(c).__name__
    owner = c.window() if isinstance(c, QWidget) else c.parent()
    where = type(owner).__name__ if owner is not None else "?"
    return f"{where}:{text}"


class Presser:
    def __init__(self, qtbot, monkeypatch, tmp_path: Path, *, settle: Callable[[], None] | None = None,
                 skip: Callable[[QAbstractButton | QAction], bool] | None = None) -> None:
        self.qtbot = qtbot
        self.tmp = tmp_path
        self.pressed: list[str] = []
        self.dialogs: list[str] = []
        self.extra_settle = settle
        self.skip = skip or (lambda c: False)
        self.open_file = tmp_path / "picked-model.gguf"
        write_tiny_llama(self.open_file)
        self.depth = 0
        self.bugs = BugLog()
        logging.getLogger("ggufdesk").addHandler(self.bugs)
        mp = monkeypatch
        for name in ("question", "information", "warning", "critical"):
            mp.setattr(QMessageBox, name, staticmethod(self._message_box(name)))
        mp.setattr(QFileDialog, "getOpenFileName",
                   staticmethod(lambda *a, **k: (str(self.open_file), "GGUF models (*.gguf)")))
        self.docs_dir = tmp_path / "picked-docs"  # Attach files… / Attach folder… (ui/docs_attach.py)
        self.docs_dir.mkdir(exist_ok=True)
        (self.docs_dir / "note.md").write_text("# Note\n\nOtters eat fish.\n", encoding="utf-8")
        mp.setattr(QFileDialog, "getOpenFileNames",
                   staticmethod(lambda *a, **k: ([str(self.docs_dir / "note.md")], "Documents")))
        mp.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(self.docs_dir)))
        mp.setattr(QFileDialog, "getSaveFileName",
                   staticmethod(lambda *a, **k: (str(self.tmp / "export.md"), "Markdown (*.md)")))
        mp.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("Renamed by the test", True)))
        presser = self

        def fake_exec(dialog: QDialog) -> int:
            presser.dialogs.append(type(dialog).__name__)
            dialog.show()
            presser.settle()
            if presser.depth < 2:
                presser.depth += 1
                try:
                    presser.press_all(dialog)
                finally:
                    presser.depth -= 1
            if shiboken6.isValid(dialog) and dialog.isVisible():
                dialog.reject()
            return int(dialog.result()) if shiboken6.isValid(dialog) else 0

        mp.setattr(QDialog, "exec", fake_exec)

    def close(self) -> None:
        logging.getLogger("ggufdesk").removeHandler(self.bugs)

    def _message_box(self, name: str):
        def answer(*a, **k):
            self.dialogs.append(f"QMessageBox.{name}")
            return QMessageBox.StandardButton.Yes if name == "question" else QMessageBox.StandardButton.Ok
        return answer

    def settle(self) -> None:
        """Wait until background tasks have delivered and the window says it is idle."""
        QApplication.processEvents()
        self.qtbot.waitUntil(lambda: tasks.manager().idle, timeout=15000)
        if self.extra_settle is not None:
            self.extra_settle()
        QApplication.processEvents()

    def controls(self, root: QWidget) -> list[QAbstractButton | QAction]:
        found: list[QAbstractButton | QAction] = list(root.findChildren(QAbstractButton))
        actions = list(root.findChildren(QAction)) + list(root.actions())
        for menu in root.findChildren(QMenu):
            actions += menu.actions()
        seen: set[int] = set()
        for a in actions:
            if id(a) in seen or a.isSeparator() or a.menu() is not None:
                continue
            seen.add(id(a))
            found.append(a)
        return found

    def usable(self, c: QAbstractButton | QAction) -> bool:
        if not shiboken6.isValid(c) or not c.isEnabled() or self.skip(c):
            return False
        if isinstance(c, QAbstractButton):
            return c.isVisible()
        return c.isVisible() and c.objectName() != "_q_qlineeditclearaction"

    def press(self, c: QAbstractButton | QAction) -> None:
        self.pressed.append(control_name(c))
        if isinstance(c, QAbstractButton):
            c.click()
        else:
            c.trigger()
        self.settle()

    @staticmethod
    def closes(c: QAbstractButton | QAction) -> bool:
        """Buttons that end a dialog (OK, Cancel, a wizard's Cancel/Finish) are pressed last."""
        if not isinstance(c, QAbstractButton):
            return c.shortcut() == QKeySequence("Ctrl+Q")  # Quit closes the window: last
        box = c.parent()
        if isinstance(box, QDialogButtonBox):
            return box.buttonRole(c) in (QDialogButtonBox.ButtonRole.AcceptRole,
                                         QDialogButtonBox.ButtonRole.RejectRole)
        wiz = c.window()
        if isinstance(wiz, QWizard):
            return c in (wiz.button(QWizard.WizardButton.CancelButton),
                         wiz.button(QWizard.WizardButton.FinishButton),
                         wiz.button(QWizard.WizardButton.BackButton),
                         wiz.button(QWizard.WizardButton.NextButton))
        return False

    @staticmethod
    def path(c: QAbstractButton | QAction) -> str:
        """Where a control sits (class names and sibling indexes up to its window): a message's Copy
        button keeps its path when the conversation is redrawn, so it is not pressed again."""
        parts = []
        obj = c
        while obj is not None and not (isinstance(obj, QWidget) and obj.isWindow()):
            parent = obj.parent()
            siblings = [x for x in (parent.children() if parent is not None else [])
                        if type(x) is type(obj)]
            parts.append(f"{type(obj).__name__}[{siblings.index(obj) if obj in siblings else 0}]")
            obj = parent
        return "/".join(reversed(parts)) + "|" + control_name(c)

    def press_all(self, root: QWidget, rounds: int = 2, limit: int = 300) -> list[str]:
        """Press each control once, looking again after every press: controls that appear meanwhile
        (new messages, version arrows) are pressed too; closing buttons come last."""
        done: set[str] = set()
        start = len(self.pressed)
        for _ in range(limit):
            if not shiboken6.isValid(root) or not root.isVisible():
                break  # closed (Quit, OK, Cancel): nothing left to press
            fresh = [c for c in self.controls(root) if self.usable(c) and self.path(c) not in done]
            if not fresh:
                break
            fresh.sort(key=self.closes)
            c = fresh[0]
            done.add(self.path(c))
            self.press(c)
        return self.pressed[start:]

    def assert_clean(self) -> None:
        bugs = [f"{r.name}: {r.getMessage()}" for r in self.bugs.records]
        assert bugs == [], "callbacks logged bugs:\n" + "\n".join(bugs)
