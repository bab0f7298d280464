"""The wizard as a new user meets it: the file button, Enter in the repo box, offline look-up, the ★ pick."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from tests.fixtures.ggufs import write_tiny_llama
from tests.ui.test_wizard import FakeServices, to_model_page
from ggufdesk.ui.wizard import DOWNLOAD_PAGE, FINISH_PAGE, MODEL_PAGE


class CountingServices(FakeServices):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.lookups = 0
        self.reach_checks = 0

    def hub_reachable(self):
        self.reach_checks += 1
        return self.online

    def lookup_repo(self, repo, hw):
        self.lookups += 1
        return super().lookup_repo(repo, hw)


def test_open_a_gguf_file_button_opens_the_picked_file(qtbot, wizard, tmp_path, monkeypatch):
    local = tmp_path / "mine.gguf"
    write_tiny_llama(local)
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a, **k: (str(local), "GGUF models (*.gguf)")))
    wiz = wizard(FakeServices(tmp_path, online=False))
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    page.file_btn.click()  # clicked(bool) once landed in pick_file(path=False)
    assert page.current() is not None and page.current().path == local
    assert "expected str" not in page.status.text()


def test_enter_in_the_repo_box_looks_up_and_never_presses_next(qtbot, wizard, tmp_path):
    svc = CountingServices(tmp_path)
    wiz = wizard(svc)
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    page.repo.setText("someone/thing-GGUF")
    page.repo.setFocus()
    with qtbot.waitSignal(wiz.choices_loaded, timeout=5000):
        qtbot.keyClick(page.repo, Qt.Key.Key_Return)
    assert wiz.currentId() == MODEL_PAGE  # Enter did not start a download
    assert svc.lookups == 1 and svc.downloads == []
    qtbot.keyClick(page.repo, Qt.Key.Key_Enter)  # the keypad's Enter too
    qtbot.waitUntil(lambda: svc.lookups == 2, timeout=5000)
    assert wiz.currentId() == MODEL_PAGE


def test_offline_look_up_answers_at_once_in_plain_words(qtbot, wizard, tmp_path):
    svc = CountingServices(tmp_path, online=False)
    wiz = wizard(svc)
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    page.repo.setText("unsloth/gemma-3-1b-it-GGUF")
    with qtbot.waitSignal(wiz.choices_loaded, timeout=5000):
        page.lookup_btn.click()
    assert svc.lookups == 0  # no retrying library call while offline
    text = page.status.text()
    assert "offline" in text and "Errno" not in text and "internal error" not in text
    assert page.lookup_btn.isEnabled()


def test_network_errors_during_look_up_are_plain(qtbot, wizard, tmp_path):
    class Flaky(CountingServices):
        def lookup_repo(self, repo, hw):
            raise OSError("[Errno -2] Name or service not known")

    wiz = wizard(Flaky(tmp_path))
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    page.repo.setText("org/x-GGUF")
    with qtbot.waitSignal(wiz.choices_loaded, timeout=5000):
        page.lookup_btn.click()
    assert "cannot be reached" in page.status.text() and "Errno" not in page.status.text()


def test_offline_the_promised_star_pick_is_shown(qtbot, wizard, tmp_path):
    wiz = wizard(FakeServices(tmp_path, online=False))
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    assert "★" in page.subTitle()
    labels = [page.model.data(page.model.index(r, 0)) for r in range(page.model.rowCount())]
    assert any(lbl.startswith("★ ") for lbl in labels)
    assert page.current().recommended


def test_unpacking_is_said_only_the_first_time(qtbot, wizard, tmp_path, monkeypatch):
    from ggufdesk.core import starter

    wiz = wizard(FakeServices(tmp_path, online=False))
    to_model_page(qtbot, wiz)
    assert wiz.model_page.current().source == "starter"
    monkeypatch.setattr(starter, "ready", lambda s=None: False)
    with qtbot.waitSignal(wiz.download_finished, timeout=5000):
        wiz.next()
    assert "Unpacking" in wiz.download_page.what.text()
    assert wiz.currentId() == FINISH_PAGE
    wiz.back()
    wiz.back()
    assert wiz.currentId() == MODEL_PAGE
    monkeypatch.setattr(starter, "ready", lambda s=None: True)
    wiz.download_page.state = "idle"
    with qtbot.waitSignal(wiz.download_finished, timeout=5000):
        wiz.next()
    assert "Unpacking" not in wiz.download_page.what.text()
    assert "Opening" in wiz.download_page.what.text()


def test_a_late_background_result_never_reaches_a_closed_wizard(qtbot, tmp_path):
    import threading

    from ggufdesk.ui.tasks import run_in_background
    from ggufdesk.ui.wizard import ModelWizard

    wiz = ModelWizard(FakeServices(tmp_path))
    gate = threading.Event()
    got = []
    fut = run_in_background(lambda: gate.wait(5), lambda f: got.append(f), owner=wiz.model_page)
    wiz.deleteLater()
    qtbot.waitUntil(lambda: not __import__("shiboken6").isValid(wiz), timeout=3000)
    gate.set()
    fut.result(timeout=5)
    done = []
    run_in_background(lambda: None, lambda f: done.append(1))  # queued after the first callback
    qtbot.waitUntil(lambda: bool(done), timeout=3000)
    assert got == []


def test_download_page_is_skipped_when_everything_is_on_disk(qtbot, wizard, tmp_path):
    wiz = wizard(FakeServices(tmp_path, online=False))
    to_model_page(qtbot, wiz)
    local = tmp_path / "here.gguf"
    write_tiny_llama(local)
    wiz.model_page.pick_file(str(local))
    assert wiz.model_page.nextId() == FINISH_PAGE != DOWNLOAD_PAGE


def test_a_file_that_is_not_a_gguf_is_refused_with_the_readers_reason(qtbot, wizard, tmp_path):
    """A text file named .gguf was listed as '12 B · runs on the CPU · ~2312000000 tok/s'."""
    text = tmp_path / "notes.gguf"
    text.write_text("hello world, this is a text file\n" * 10)
    wiz = wizard(FakeServices(tmp_path, online=False))  # its choice_for_file is the real one
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    rows = page.model.rowCount()
    page.pick_file(str(text))
    assert page.model.rowCount() == rows  # not listed
    assert page.status.text().startswith("notes.gguf cannot be opened as a model: ")
    assert "not a GGUF file (it starts with b'hell', not b'GGUF')" in page.status.text()


def test_a_repo_is_listed_unplanned_when_the_probe_failed(monkeypatch):
    # The hardware page said "Could not look at this computer" (hw None): a repo looked up then is
    # listed with its files and sizes, fit unknown; the planner, which needs the machine, is not asked.
    from ggufdesk.core import downloads, gguf_meta
    from ggufdesk.core.downloads import RemoteFile, RemoteModel
    from ggufdesk.ui.services import ModelServices

    models = [RemoteModel(name="m-Q4_K_M", quant="Q4_K_M", files=(RemoteFile("m-Q4_K_M.gguf", 700, None),)),
              RemoteModel(name="m-Q8_0", quant="Q8_0", files=(RemoteFile("m-Q8_0.gguf", 1200, None),))]
    monkeypatch.setattr(downloads, "list_gguf", lambda repo: models)

    def no_header(*_a, **_k):
        raise AssertionError("no header is read without a machine to plan for")

    monkeypatch.setattr(gguf_meta, "read_gguf", no_header)
    rows = ModelServices().lookup_repo("org/m-GGUF", None)
    assert [(r.label, r.filename, r.size_bytes, r.fit, r.repo) for r in rows] == [
        ("m-GGUF Q4_K_M", "m-Q4_K_M.gguf", 700, "unknown", "org/m-GGUF"),
        ("m-GGUF Q8_0", "m-Q8_0.gguf", 1200, "unknown", "org/m-GGUF")]
