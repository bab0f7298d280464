"""The "Local server" dock: off by default, serves the loaded model on a thread, stops cleanly."""
from __future__ import annotations

import httpx
import pytest

from ggufdesk.core.settings import LoadSettings
from ggufdesk.server.budget import Need
from tests.server.serving import fake_pool


@pytest.fixture
def panel(qtbot):
    from ggufdesk.ui.server_panel import ServerPanel

    source = {"value": None}
    p = ServerPanel(model_source=lambda: source["value"], pool_factory=lambda model, load: fake_pool(model),
                    need=lambda path, entry: Need(100 << 20))
    p.port.setValue(0)
    p.source = source
    qtbot.addWidget(p)
    yield p
    p.stop()


def test_without_a_model_the_toggle_explains_and_stays_off(panel):
    panel.toggle.setChecked(True)
    assert not panel.toggle.isChecked() and panel.runner is None
    assert "Load a model first" in panel.status.text()


def test_serves_the_loaded_model_and_stops(qtbot, panel):
    panel.source["value"] = ("/models/fake-model.gguf", LoadSettings(n_ctx=512))
    panel.key.setText("k1")
    with qtbot.waitSignals([panel.state_changed, panel.state_changed], timeout=30_000):
        panel.toggle.setChecked(True)  # loading, then ready
    assert panel.state == "ready" and panel.url.startswith("http://127.0.0.1:")
    assert panel.url in panel.snippet.toPlainText() and "fake-model" in panel.snippet.toPlainText()
    assert "Bearer k1" in panel.snippet.toPlainText() and not panel.key.isEnabled()
    r = httpx.post(panel.url + "/v1/chat/completions", headers={"Authorization": "Bearer k1"},
                   json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert r.status_code == 200
    panel.refresh()
    assert panel.counts.text() == "1 client · 0 running · 0 queued"
    url = panel.url
    panel.toggle.setChecked(False)
    assert panel.state == "off" and panel.key.isEnabled()
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health")


def test_the_main_window_has_it_hidden_and_off(window):
    assert window.server_panel.isHidden() and window.server_panel.state == "off"
    assert not window.server_panel.toggle.isChecked()


def test_the_chat_keeps_answering_while_the_server_is_busy(qtbot, loaded_window, monkeypatch):
    import threading

    w = loaded_window
    panel = w.server_panel
    panel._pool_factory = lambda model, load: fake_pool(model, env={"FAKE_ENGINE_TOKENS_PER_S": "20"})
    panel._need = lambda path, entry: Need(100 << 20)
    panel.port.setValue(0)
    with qtbot.waitSignals([panel.state_changed, panel.state_changed], timeout=30_000):
        panel.toggle.setChecked(True)
    assert panel.state == "ready"
    busy = threading.Event()

    def long_request() -> None:  # about 20 s of tokens: the server stays busy for the whole test
        body = {"model": "model-instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400,
                "stream": True}
        with httpx.stream("POST", panel.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if '"content"' in line:
                    busy.set()
                if done.is_set():
                    return

    done = threading.Event()
    t = threading.Thread(target=long_request, daemon=True)
    t.start()
    assert busy.wait(30)
    with qtbot.waitSignal(w.answer_finished, timeout=15_000) as blocker:
        assert w.send("hello while the server works")
    assert blocker.args[0] == "done"
    assert panel.service.snapshot()["running"] == 1  # the server's request is still going
    done.set()
    w.close()  # closing the window stops the server
    assert panel.state == "off"
    t.join(30)


def test_the_port_that_worked_is_remembered(qtbot, panel):
    import socket

    from ggufdesk.ui.server_panel import ServerPanel

    with socket.socket() as s:  # a port that is free now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    panel.source["value"] = ("/models/fake-model.gguf", LoadSettings(n_ctx=512))
    panel.port.setValue(port)
    with qtbot.waitSignals([panel.state_changed, panel.state_changed], timeout=30_000):
        panel.toggle.setChecked(True)
    panel.toggle.setChecked(False)
    again = ServerPanel(model_source=lambda: None)
    qtbot.addWidget(again)
    assert again.port.value() == port


def test_at_800_by_600_the_server_panel_takes_the_gauges_place(qtbot, window):
    from PySide6.QtCore import QRect

    w = window
    w.resize(800, 600)
    qtbot.waitUntil(lambda: w.width() == 800, timeout=3000)
    w.server_panel.view_action.trigger()
    qtbot.waitUntil(lambda: w.server_panel.isVisible(), timeout=3000)
    assert w.width() == 800  # it had grown to 926 px
    area = QRect(0, 0, w.width(), w.height())
    dock = QRect(w.server_panel.mapTo(w, w.server_panel.rect().topLeft()), w.server_panel.size())
    assert area.contains(dock) and not w.gauges.isVisible()
    w.server_panel.view_action.trigger()  # closed: the gauges come back
    qtbot.waitUntil(lambda: w.gauges.isVisible(), timeout=3000)
    w.resize(1400, 800)
    qtbot.waitUntil(lambda: w.width() == 1400, timeout=3000)
    w.server_panel.view_action.trigger()  # room for both: nothing folds
    assert w.gauges.isVisible() and w.server_panel.isVisible()
