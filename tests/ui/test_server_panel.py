"""The "Local server" dock: off by default, serves the loaded model on a thread, stops cleanly."""
from __future__ import annotations

import httpx
import pytest

from ggufdesk.core.settings import LoadSettings
from tests.server.serving import fake_pool


@pytest.fixture
def panel(qtbot):
    from ggufdesk.ui.server_panel import ServerPanel

    source = {"value": None}
    p = ServerPanel(model_source=lambda: source["value"], pool_factory=lambda model, load: fake_pool(model))
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
    assert panel.counts.text() == "1 clients · 0 running · 0 queued"
    url = panel.url
    panel.toggle.setChecked(False)
    assert panel.state == "off" and panel.key.isEnabled()
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health")


def test_the_main_window_has_it_hidden_and_off(window):
    assert window.server_panel.isHidden() and window.server_panel.state == "off"
    assert not window.server_panel.toggle.isChecked()
