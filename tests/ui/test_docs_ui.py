"""Documents in the window: attach by button and by drop, the progress bar with count and ETA, cancel,
citations under the answer whose hover shows the passage and whose click opens it (a PDF at its page)."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog

from tests.fixtures import corpus


@pytest.fixture
def papers(tmp_path) -> Path:
    root = tmp_path / "papers"
    root.mkdir()
    corpus.write_pdf(root / "otters.pdf", "Otters", ["Preface words.", "River otters eat mostly fish and crayfish."],
                     pages_per_para=1)
    (root / "herons.md").write_text("# Herons\n\nGrey herons nest in colonies.\n", encoding="utf-8")
    return root


def wait_indexed(qtbot, win, timeout: int = 30000):
    with qtbot.waitSignal(win.docs.indexing_done, timeout=timeout) as blocker:
        pass
    return blocker.args[0]


def test_attach_a_folder_then_ask_and_open_the_cited_page(qtbot, loaded_window, papers, monkeypatch):
    win = loaded_window
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(papers)))
    with qtbot.waitSignal(win.docs.indexing_done, timeout=30000) as done:
        win.docs.folder_btn.click()
    report = done.args[0]
    assert report.added == 2 and not report.cancelled
    chip = win.docs.chip
    assert chip.isVisible() and "2 files" in chip.label.text()
    assert "keyword (BM25) search only" in chip.label.text()  # no embedding model: the window says so
    assert win.session.docs is not None
    with qtbot.waitSignal(win.answer_finished, timeout=15000):
        win.send("What do river otters eat?")
    answer = win.chat.widget_for(win.session.turns[-1].key)
    cites = answer.citations()
    assert [Path(c["source"]).name for c in cites][:1] == ["otters.pdf"] and cites[0]["page"] == 3
    assert answer.sources.isVisible() and "otters.pdf, page 3" in answer.sources.text()
    answer._hover_source("cite:1")  # the tooltip with the passage; must not fail
    opened = []
    win.chat.citation_requested.connect(opened.append)
    answer.sources.linkActivated.emit("cite:1")
    assert opened and opened[0]["page"] == 3
    from ggufdesk.ui.passage_dialog import PassageDialog

    qtbot.waitUntil(lambda: any(isinstance(w, PassageDialog) and w.isVisible() for w in QApplication.topLevelWidgets()))
    dialog = next(w for w in QApplication.topLevelWidgets() if isinstance(w, PassageDialog) and w.isVisible())
    assert "crayfish" in dialog.text.toPlainText()
    pix = dialog.page.pixmap()
    assert pix is not None and not pix.isNull() and pix.width() > 100  # page 3 of the PDF, drawn
    assert dialog.windowTitle() == "[1] otters.pdf, page 3, lines 1-1"
    dialog.close()


def test_drop_files_on_the_window_attaches_them_and_gguf_drops_still_load_models(qtbot, window, papers):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(papers / "herons.md"))])
    target = window.chat.viewport()
    assert target.acceptDrops() and window.composer.box.acceptDrops()
    enter = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                            Qt.KeyboardModifier.NoModifier)
    # Qt delivers synthetic drops to no one outside a real drag: call the filter as Qt would
    assert window.docs.eventFilter(target, enter) and enter.isAccepted()
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                       Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(window.docs.indexing_done, timeout=30000) as done:
        assert window.docs.eventFilter(target, event)
    assert done.args[0].added == 1
    gguf = QMimeData()
    gguf.setUrls([QUrl.fromLocalFile("/models/x.gguf")])
    from ggufdesk.ui.docs_attach import dropped_documents

    assert dropped_documents(gguf) == []  # the window's own drop handler loads models


def test_progress_bar_counts_with_an_eta_and_cancel_keeps_what_was_done(qtbot, window, tmp_path, monkeypatch):
    from ggufdesk.core.docs import indexer as I
    from ggufdesk.core.docs.indexer import Progress

    root = tmp_path / "many"
    root.mkdir()
    for i in range(40):
        (root / f"n{i}.md").write_text(f"note {i} about badgers\n", encoding="utf-8")
    monkeypatch.setattr(I, "PROGRESS_EVERY_S", 0.0)
    chip = window.docs.chip
    seen: list[str] = []
    real = chip.show_progress

    def show(p: Progress) -> None:
        real(p)
        seen.append(chip.bar.format())
        if p.files_done == 10:
            chip.cancel_btn.click()

    monkeypatch.setattr(chip, "show_progress", show)
    real_one = I.Indexer._one

    def one(self, item, row):  # after ten files the indexer waits for the window's cancel (on a
        if self.report.added >= 10:  # loaded machine it once finished all 40 before the click)
            self.cancel.wait(60)
        return real_one(self, item, row)

    monkeypatch.setattr(I.Indexer, "_one", one)
    monkeypatch.setattr(window.docs, "_last_progress", 0.0)
    monkeypatch.setattr("ggufdesk.ui.docs_attach.time.monotonic", iter(range(0, 100000, 1)).__next__)
    with qtbot.waitSignal(window.docs.indexing_done, timeout=30000) as done:
        window.docs.attach_paths([root])
    report = done.args[0]
    assert report.cancelled and 10 <= report.added < 40
    assert any("/40 files" in s for s in seen)
    assert any("left" in s or "almost done" in s for s in seen)  # an ETA once there is a rate


def test_detach_stops_answering_from_documents(qtbot, window, papers):
    with qtbot.waitSignal(window.docs.indexing_done, timeout=30000):
        window.docs.attach_paths([papers])
    window.docs.chip.detach_btn.click()
    assert window.session.docs is None and not window.docs.chip_shown


def test_an_attached_folder_is_watched_and_a_changed_file_indexed_again(qtbot, window, papers):
    window.docs._changed.setInterval(50)
    with qtbot.waitSignal(window.docs.indexing_done, timeout=30000):
        window.docs.attach_paths([papers])
    assert str(papers) in window.docs.watcher.directories()
    with qtbot.waitSignal(window.docs.indexing_done, timeout=30000) as again:
        (papers / "new.md").write_text("Kingfishers dive for fish.\n", encoding="utf-8")
    assert again.args[0].added == 1
    hits = window.session.docs.retriever.search("kingfishers", 5)
    assert Path(hits[0].source).name == "new.md"


def test_a_bad_embedding_model_is_forgotten_and_search_stays_bm25(qtbot, window, papers, tmp_path, monkeypatch):
    with qtbot.waitSignal(window.docs.indexing_done, timeout=30000):
        window.docs.attach_paths([papers])
    chip = window.docs.chip
    assert chip.model_btn.isVisible()  # BM25 only: the chip offers an embedding model
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(bad), "")))
    with qtbot.waitSignal(window.docs.indexing_done, timeout=120000) as done:
        chip.model_btn.click()
    assert done.args[0] is None
    from PySide6.QtCore import QSettings

    from ggufdesk.ui.docs_attach import EMBED_MODEL_KEY

    assert not QSettings().value(EMBED_MODEL_KEY, "")
    assert window.session.docs is not None and window.session.docs.retriever.mode == "bm25"
    assert "BM25" in chip.label.text()
