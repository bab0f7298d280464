"""The message box and its Send / Stop buttons: Enter sends and Shift+Enter starts a new line (or
the other way round), Tab leaves the box.

Images for a vision model: the Attach image… button under the box, a paste (Ctrl+V of an image or
of image files) or a drop onto the box; each shows as a thumbnail above the box with a × to remove
it (`images()`). `add_tool()` puts a control in the row under the box, `add_attachment()` one above.
"""
from __future__ import annotations

from PySide6.QtCore import QMimeData, QSettings, Qt, Signal
from PySide6.QtGui import QKeyEvent, QResizeEvent
from PySide6.QtWidgets import (QAbstractButton, QFileDialog, QHBoxLayout, QPlainTextEdit, QPushButton,
                               QVBoxLayout, QWidget)

from ggufdesk.core import images as img
from ggufdesk.ui.image_views import COMPOSER_SIDE, FILE_FILTER, Thumbnail, mime_images, read_image_file

ENTER_SENDS_KEY = "chat/enter_sends"
BOX_HEIGHT = 84


def enter_sends(settings: QSettings | None = None) -> bool:
    """The user's choice (QSettings), Enter sends by default as in every chat app."""
    return bool((settings or QSettings()).value(ENTER_SENDS_KEY, True, type=bool))


class MessageBox(QPlainTextEdit):
    """`submitted` fires on Enter (or Ctrl+Enter when Enter makes new lines); Tab moves focus."""

    submitted = Signal()
    images_given = Signal(list)  # a paste or a drop of images: bytes each, or a reason it failed (str)

    def __init__(self, parent: QWidget | None = None, *, enter_sends: bool = True) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)  # Tab / Shift+Tab leave the box, like any other field
        self.enter_sends = enter_sends
        self.takes_images = False  # set by the composer while the model can see

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 - Qt API
        if self.takes_images and (source.hasImage() or any(u.isLocalFile() for u in source.urls())):
            return True
        return super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 - Qt API
        """A paste or a drop: images become attachments, text stays text."""
        found = mime_images(source) if self.takes_images else []
        if found:
            self.images_given.emit(found)
            return
        super().insertFromMimeData(source)

    def hint(self) -> str:
        return ("Enter sends · Shift+Enter for a new line" if self.enter_sends
                else "Ctrl+Enter sends · Enter for a new line")

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt API
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers()
            shift = bool(mods & Qt.KeyboardModifier.ShiftModifier)
            ctrl = bool(mods & Qt.KeyboardModifier.ControlModifier)
            if ctrl or (self.enter_sends and not shift):
                event.accept()
                self.submitted.emit()
                return
            if shift:
                self.insertPlainText("\n")  # Shift+Enter: a plain new line, not a paragraph break
                event.accept()
                return
        super().keyPressEvent(event)


class ToolRow(QWidget):
    """The row of buttons under the box. Its buttons say "Attach files…" while the row is wide enough
    for every long label, and "Files…" when it is not: in an 800 px window the three long labels were
    cut to "Attac…lder…" (each button keeps its tooltip)."""

    PREFIX = "Attach "

    def __init__(self, layout: QHBoxLayout) -> None:
        super().__init__()
        self.setLayout(layout)
        self.lay = layout

    def buttons(self) -> list[QAbstractButton]:
        return [b for b in self.findChildren(QAbstractButton) if b.property("long_text")]

    def add(self, widget: QWidget) -> None:
        if isinstance(widget, QAbstractButton) and widget.text().startswith(self.PREFIX):
            widget.setProperty("long_text", widget.text())
        self.fit()

    def label(self, b: QAbstractButton, short: bool) -> str:
        long = str(b.property("long_text"))
        text = long[len(self.PREFIX):] if short else long
        return text[:1].upper() + text[1:]

    def width_for(self, short: bool) -> int:
        """What the row needs with every label long (or short): each shown widget's width for it."""
        lay, mine = self.lay, self.buttons()
        need, n = 0, 0
        for i in range(lay.count()):
            item = lay.itemAt(i)
            w = item.widget() if item is not None else None
            if w is None or w.isHidden():
                continue
            n += 1
            need += w.sizeHint().width()
            if w in mine:
                fm = w.fontMetrics()
                need += fm.horizontalAdvance(self.label(w, short)) - fm.horizontalAdvance(w.text())
        m = lay.contentsMargins()
        return need + max(n - 1, 0) * max(lay.spacing(), 0) + m.left() + m.right()

    def fit(self) -> None:
        """Long labels where they fit, else short ones; the row may shrink to what the short ones need
        (its buttons' own minimum would otherwise hold the window's middle column at the long width)."""
        self.setMinimumWidth(self.width_for(True))
        short = self.width_for(False) > self.width()
        for b in self.buttons():
            text = self.label(b, short)
            if b.text() != text:
                b.setText(text)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        self.fit()


class Composer(QWidget):
    """The box, Send and Stop. `send_requested` carries the text as typed (the window decides what
    an empty box means); `stop_requested` the Stop button; `draft_changed` every edit. images: the
    Attach image… button under the box (paste and drop take images whenever `set_images_allowed`)."""

    send_requested = Signal(str)
    stop_requested = Signal()
    draft_changed = Signal()
    image_refused = Signal(str)  # an image that cannot be attached, and why

    def __init__(self, parent: QWidget | None = None, *, enter_sends: bool = True, images: bool = False) -> None:
        super().__init__(parent)
        self.box = MessageBox(enter_sends=enter_sends)
        self.box.setFixedHeight(BOX_HEIGHT)
        self.send_btn = QPushButton("Send")
        self.send_btn.setDefault(True)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setEnabled(False)
        self.attachments = QHBoxLayout()  # attached files, shown above the box
        self.attachments.setContentsMargins(0, 0, 0, 0)
        self.attachments.setAlignment(Qt.AlignmentFlag.AlignLeft)
        self.tools = QHBoxLayout()  # buttons that add to the message (Attach…), under the box
        self.tools.setContentsMargins(0, 0, 0, 0)
        self.tools.addStretch(1)
        self._attach_row = self._row(self.attachments)
        self._tool_row = ToolRow(self.tools)
        self._tool_row.hide()
        column = QVBoxLayout()
        column.addWidget(self._attach_row)
        column.addWidget(self.box)
        column.addWidget(self._tool_row)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_btn)
        buttons.addWidget(self.stop_btn)
        buttons.addStretch(1)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(column, 1)
        lay.addLayout(buttons)
        self.box.submitted.connect(self._send)
        self.send_btn.clicked.connect(self._send)
        self.stop_btn.clicked.connect(lambda: self.stop_requested.emit())
        self.box.textChanged.connect(lambda: self.draft_changed.emit())
        self.thumbnails: list[Thumbnail] = []
        self.attach_btn = QPushButton("Attach image…")  # (a button like the documents' Attach files…)
        self.attach_btn.clicked.connect(lambda: self.choose_images())
        if images:  # (the window's composer: the button is there, greyed, while the model reads text only)
            self.add_tool(self.attach_btn)
        self.box.images_given.connect(self.attach)
        self.set_images_allowed(False, "Load a vision model (one with its projector, mmproj) to attach images")

    @staticmethod
    def _row(layout: QHBoxLayout) -> QWidget:
        row = QWidget()
        row.setLayout(layout)
        row.hide()
        return row

    def _send(self) -> None:
        self.send_requested.emit(self.box.toPlainText())

    # ---- what the window sets -------------------------------------------------------------------

    def text(self) -> str:
        return self.box.toPlainText()

    def set_text(self, text: str) -> None:
        self.box.setPlainText(text)

    def clear(self) -> None:
        self.box.clear()

    def set_busy(self, busy: bool) -> None:
        """While an answer is written, Send waits and Stop works."""
        self.send_btn.setEnabled(not busy)
        self.stop_btn.setEnabled(busy)

    def set_send_words(self, text: str, tooltip: str, placeholder: str) -> None:
        """Chat mode: "Send"; completion mode: "Continue" (the model continues the box's text)."""
        self.send_btn.setText(text)
        self.send_btn.setToolTip(tooltip)
        self.box.setPlaceholderText(f"{placeholder} ({self.box.hint()})")

    # ---- images ---------------------------------------------------------------------------------

    def set_images_allowed(self, allowed: bool, why_not: str = "") -> None:
        """Images can be attached while the model sees (and the conversation is a chat)."""
        self.attach_btn.setEnabled(allowed)
        self.attach_btn.setToolTip("Attach images (or paste or drop them into the box)" if allowed else why_not)
        self.box.takes_images = allowed

    def choose_images(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach images", "", FILE_FILTER)
        found: list[bytes | str] = []
        for path in paths:
            try:
                found.append(read_image_file(path))
            except OSError as e:
                found.append(f"could not read {path}: {e.strerror or e}")
        self.attach(found)

    def attach(self, found: list) -> None:
        """Attach images (bytes), each checked first; a refused one is said (image_refused), not kept."""
        for data in found:
            if isinstance(data, str):
                self.image_refused.emit(data)
                continue
            try:
                img.check(data)
            except img.ImageError as e:
                self.image_refused.emit(str(e))
                continue
            if len(self.thumbnails) >= img.MAX_IMAGES:
                self.image_refused.emit(f"at most {img.MAX_IMAGES} images in one message")
                return
            if any(t.data == data for t in self.thumbnails):
                continue
            t = Thumbnail(data, side=COMPOSER_SIDE, removable=True)
            t.removed.connect(lambda t=t: self._remove(t))
            self.thumbnails.append(t)
            self.add_attachment(t)

    def _remove(self, t: Thumbnail) -> None:
        if t in self.thumbnails:
            self.thumbnails.remove(t)
            self.remove_attachment(t)

    def images(self) -> list[bytes]:
        return [t.data for t in self.thumbnails]

    def clear_images(self) -> None:
        for t in list(self.thumbnails):
            self._remove(t)

    # ---- room to grow ---------------------------------------------------------------------------

    def add_tool(self, widget: QWidget) -> None:
        """A control that adds to the message (Attach an image…), in the row under the box."""
        self.tools.insertWidget(self.tools.count() - 1, widget)
        self._tool_row.add(widget)
        self._tool_row.show()

    def add_attachment(self, widget: QWidget) -> None:
        """Show an attached file (a chip with a remove button) above the box."""
        self.attachments.addWidget(widget)
        self._attach_row.show()

    def remove_attachment(self, widget: QWidget) -> None:
        self.attachments.removeWidget(widget)
        widget.deleteLater()
        self._attach_row.setVisible(self.attachments.count() > 0)
