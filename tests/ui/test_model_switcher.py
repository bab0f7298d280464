"""The header's model switcher, per-model presets in the window, and the server dock loading other models."""
from __future__ import annotations

import httpx
import pytest

from ggufdesk.core.library import LocalModel
from ggufdesk.core.settings import Preset
from ggufdesk.server.budget import Need
from tests.server.serving import fake_pool


@pytest.fixture
def library_models(monkeypatch, tmp_path) -> list[LocalModel]:
    from ggufdesk.ui import model_switcher

    out = []
    for name, size in (("alpha-chat", 120_000_000), ("beta-base", 40_000_000)):
        f = tmp_path / f"{name}.gguf"
        f.write_bytes(b"GGUF" + b"\0" * 64)
        out.append(LocalModel(f, f.name, size, "user", "Q4_K_M", id=name))
    monkeypatch.setattr(model_switcher, "list_library", lambda: list(out))
    return out


@pytest.fixture
def win(qtbot, bridge, history, library_models):
    from ggufdesk.ui.main_window import MainWindow

    w = MainWindow(engine=bridge, history=history, persist_settings=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: len(w.switcher.models) == 2, timeout=10_000)
    return w


def menu_texts(w) -> list[str]:
    return [a.text() for a in w.switcher.menu_.actions() if a.text()]


def load(qtbot, w, path) -> None:
    with qtbot.waitSignal(w.engine.loaded, timeout=15_000):
        w.load_model(str(path))


def test_the_header_name_is_a_drop_down_of_loaded_and_available_models_with_memory(qtbot, win, library_models):
    assert win.header.switcher is win.switcher and win.switcher.text() == "Choose a model ▾"
    load(qtbot, win, library_models[0].path)
    assert win.switcher.text().startswith("alpha-chat")
    texts = menu_texts(win)
    here = next(t for t in texts if t.startswith("alpha-chat"))
    assert "in use" in here and ("MB" in here or "GB" in here)  # the engine's memory
    assert any(t.startswith("beta-base") and "0.04 GB on disk" not in t and "on disk" in t for t in texts)
    assert [a.isChecked() for a in win.switcher.menu_.actions() if a.text().startswith("alpha-chat")] == [True]
    assert "Choose or download a model…" in texts


def test_switching_keeps_the_conversation(qtbot, win, library_models):
    load(qtbot, win, library_models[0].path)
    with qtbot.waitSignal(win.answer_finished, timeout=15_000):
        win.send("hello from alpha")
    conv, turns = win.conv.id, len(win.session.turns)
    action = next(a for a in win.switcher.menu_.actions() if a.text().startswith("beta-base"))
    with qtbot.waitSignal(win.engine.loaded, timeout=15_000):
        action.trigger()
    assert win.model_path == str(library_models[1].path) and win.switcher.text().startswith("beta-base")
    assert win.conv.id == conv and len(win.session.turns) == turns  # the same conversation
    assert "written with alpha-chat.gguf" in win.mode_label.text()
    with qtbot.waitSignal(win.answer_finished, timeout=15_000):
        win.send("and now beta")
    assert win.conv.id == conv and len(win.session.turns) == turns + 2


def test_a_models_preset_applies_to_the_window_and_leaves_the_defaults(qtbot, win, library_models):
    win.settings.set_preset("beta-base", Preset(load={"n_ctx": 1024}, sampling={"temperature": 0.1},
                                                system_prompt="Be terse."))
    load(qtbot, win, library_models[1].path)
    assert win.engine.loaded_event.n_ctx == 1024 and win.settings.load.n_ctx == 4096
    assert win.model_settings().sampling.temperature == 0.1
    conv = win.new_conversation()
    assert conv.system_prompt == "Be terse." and conv.sampling.temperature == 0.1
    load(qtbot, win, library_models[0].path)  # no preset: the defaults
    assert win.engine.loaded_event.n_ctx == 4096


def test_engine_settings_save_for_this_model_or_as_the_defaults(qtbot, win, library_models, monkeypatch):
    from ggufdesk.ui import settings_dialog

    load(qtbot, win, library_models[0].path)
    choice = {"scope": "model", "n_ctx": 2048}

    def fake_exec(dlg) -> int:
        assert dlg.scope_box.isVisible() or not dlg.isVisible()
        dlg.w["n_ctx"].setValue(choice["n_ctx"])
        dlg.scope_box.setCurrentIndex(dlg.scope_box.findData(choice["scope"]))
        return 1

    monkeypatch.setattr(settings_dialog.SettingsDialog, "exec", fake_exec)
    with qtbot.waitSignal(win.engine.loaded, timeout=15_000):
        win.open_settings()
    assert win.settings.presets["alpha-chat"].load == {"n_ctx": 2048} and win.settings.load.n_ctx == 4096
    assert win.engine.loaded_event.n_ctx == 2048
    choice.update(scope="defaults", n_ctx=3072)
    with qtbot.waitSignal(win.engine.loaded, timeout=15_000):
        win.open_settings()
    assert "alpha-chat" not in win.settings.presets and win.settings.load.n_ctx == 3072
    assert win.engine.loaded_event.n_ctx == 3072


def test_the_server_dock_loads_other_models_without_taking_the_windows(qtbot, win, library_models):
    panel = win.server_panel
    panel._pool_factory = lambda model, load: fake_pool(model)
    panel._need = lambda path, entry: Need(100 << 20)
    panel.port.setValue(0)
    load(qtbot, win, library_models[0].path)
    with qtbot.waitSignals([panel.state_changed, panel.state_changed], timeout=30_000):
        panel.toggle.setChecked(True)
    assert panel.state == "ready"
    assert [panel.load_box.itemData(i) for i in range(panel.load_box.count())] == ["alpha-chat", "beta-base"]
    panel.load_box.setCurrentIndex(1)
    panel.load_btn.click()
    qtbot.waitUntil(lambda: "beta-base is loaded in the server" in panel.status.text(), timeout=30_000)
    panel.refresh()
    assert "alpha-chat (ready" in panel.loaded_label.text() and "beta-base (ready" in panel.loaded_label.text()
    assert win.model_path == str(library_models[0].path) and win.engine.loaded_event is not None  # untouched
    r = httpx.post(panel.url + "/v1/chat/completions", timeout=60,
                   json={"model": "beta-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "beta-base"
    win.switcher.refresh()
    qtbot.waitUntil(lambda: any("Loaded in the local server" == a.text() for a in win.switcher.menu_.actions()),
                    timeout=10_000)
    assert any(t.startswith("beta-base") and "ready" in t for t in menu_texts(win))
    panel.toggle.setChecked(False)
    assert panel.state == "off"
