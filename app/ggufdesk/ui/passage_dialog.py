"""A cited passage where it is: its text, and for a PDF the page itself, with a button to open the file."""
from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QImage, QPixmap
from PySide6.QtWidgets import (QDialog, QDialogButtonBox, QLabel, QPushButton, QScrollArea, QSplitter, QTextBrowser,
                               QVBoxLayout, QWidget)

from ggufdesk.core.errors import KnownError
from ggufdesk.ui.message_widget import Citation, citation_words, figure


def file_url(c: Citation) -> QUrl:
    """The file, at its page for a PDF (viewers that read '#page=N' open it there)."""
    url = QUrl.fromLocalFile(str(c.get("source", "")))
    if c.get("page"):
        url.setFragment(f"page={int(figure(c['page']))}")
    return url


class PassageDialog(QDialog):
    """Shows citation `c` (a dict as session/docs.Citation.as_dict() keeps it with the answer)."""

    def __init__(self, c: Citation, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.citation = c
        self.setWindowTitle(citation_words(c))
        self.resize(760, 820 if c.get("page") else 420)
        self.where = QLabel(html.escape(str(c.get("source", ""))))
        self.where.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text = QTextBrowser()
        self.text.setPlainText(str(c.get("text", "")))
        self.page = QLabel()
        self.page.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.page_area = QScrollArea()
        self.page_area.setWidget(self.page)
        self.page_area.setWidgetResizable(True)
        self.page_area.setVisible(False)
        self.open_btn = QPushButton("Open the file")
        self.open_btn.setToolTip("Open it in your viewer" + (f" at page {c['page']}" if c.get("page") else ""))
        self.open_btn.clicked.connect(self.open_file)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.addButton(self.open_btn, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.text)
        split.addWidget(self.page_area)
        lay = QVBoxLayout(self)
        lay.addWidget(self.where)
        lay.addWidget(split, 1)
        lay.addWidget(buttons)
        if c.get("page"):
            self.show_page()

    def show_page(self) -> None:
        from ggufdesk.core.docs.extract import render_pdf_page

        try:
            w, h, data = render_pdf_page(Path(str(self.citation["source"])), int(figure(self.citation["page"])),
                                         width=700)
        except (KnownError, OSError) as e:
            self.page.setText(f"the page cannot be shown: {e}")
            self.page_area.setVisible(True)
            return
        image = QImage(data, w, h, w * 4, QImage.Format.Format_RGBA8888).copy()
        self.page.setPixmap(QPixmap.fromImage(image))
        self.page_area.setVisible(True)

    def open_file(self) -> bool:
        return QDesktopServices.openUrl(file_url(self.citation))
