"""UI fixtures: an engine bridge over the fake engine, a history in tmp, the main window."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAKE_ENGINE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_engine.py"


@pytest.fixture(autouse=True)
def _window_choices_forgotten():
    """A test that presses View ▸ Theme ▸ Dark or Chat ▸ Enter sends must not leave later tests
    dark or making new lines on Enter (Qt keeps one settings file per process)."""
    yield
    from PySide6.QtCore import QSettings

    from ggufdesk.ui import theme
    from ggufdesk.ui.composer import ENTER_SENDS_KEY

    for key in (theme.THEME_KEY, ENTER_SENDS_KEY):
        QSettings().remove(key)


@pytest.fixture(autouse=True)
def _no_mcp_imports_from_home(monkeypatch):
    """The MCP page offers to import other apps' servers found in the home folder: not the developer's."""
    monkeypatch.setattr("ggufdesk.core.mcp.config.import_sources", lambda *a, **k: [])


@pytest.fixture(autouse=True)
def _fresh_qsettings():
    """QSettings keeps the file of the first test that used it (Qt reads XDG_CONFIG_HOME once), so what
    one test toggles (press-everything flips "Enter sends") would reach the next: cleared after each."""
    yield
    from PySide6.QtCore import QSettings

    QSettings().clear()


@pytest.fixture
def fake_command() -> list[str]:
    return [sys.executable, str(FAKE_ENGINE)]


@pytest.fixture
def history(tmp_path):
    from ggufdesk.core.history import History

    h = History(tmp_path / "history.sqlite3")
    yield h
    h.close()


@pytest.fixture
def bridge(qtbot, fake_command):
    from ggufdesk.ui.engine_adapter import EngineBridge

    b = EngineBridge(command=fake_command)
    yield b
    b.shutdown(timeout=3)


@pytest.fixture
def window(qtbot, bridge, history):
    from ggufdesk.ui.main_window import MainWindow

    w = MainWindow(engine=bridge, history=history, persist_settings=False)
    qtbot.addWidget(w)
    w.show()
    return w


@pytest.fixture
def loaded_window(qtbot, window, tmp_path):
    with qtbot.waitSignal(window.engine.loaded, timeout=15000):
        window.load_model(str(tmp_path / "model-instruct.gguf"))
    return window


@pytest.fixture
def wizard(qtbot):
    """Makes ModelWizards over the given services; each is closed (downloads cancelled) after."""
    from ggufdesk.ui.wizard import ModelWizard

    made = []

    def make(services):
        wiz = ModelWizard(services)
        qtbot.addWidget(wiz)
        made.append(wiz)
        return wiz

    yield make
    for w in made:
        w.reject()


def pytest_collection_modifyitems(config, items):
    """The offscreen platform warns about window-manager features it lacks (size hints; raising a
    floating window such as the Local server dock when the press-everything test floats it; the
    keyboard grab of a popup menu such as the model switcher's); that is not our bug."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.qt_log_ignore("does not support propagateSizeHints",
                                                      "does not support raise",
                                                      "does not support grabbing the keyboard"))
