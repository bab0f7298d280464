"""The window opens with a banner (no traceback) when the settings file or the history is broken."""
from __future__ import annotations

import sqlite3

from ggufdesk.core.history import history_path
from ggufdesk.core.settings import settings_path


def _build(qtbot, fake_command):
    from ggufdesk.ui.app import build_main_window

    win, engine, history, _ = build_main_window(engine_command=fake_command)
    qtbot.addWidget(win)
    return win, engine, history


def test_corrupt_history_and_broken_settings(qtbot, fake_command):
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text('{"sampling": {"temperature": 0.3,,}}')
    history_path().parent.mkdir(parents=True, exist_ok=True)
    history_path().write_bytes(b"garbage, not sqlite" * 50)
    win, engine, history = _build(qtbot, fake_command)
    try:
        texts = [t for _, level, t in win.banner.messages if level == "warning"]
        assert any("settings file could not be used" in t for t in texts)
        assert any("history was damaged" in t and ".broken-" in t for t in texts)
        assert list(history_path().parent.glob("history.sqlite3.broken-*"))
        assert list(settings_path().parent.glob("settings.json.broken-*"))
    finally:
        engine.shutdown()
        history.close()


def test_locked_history_opens_read_only(qtbot, fake_command, monkeypatch):
    from ggufdesk.core.history import History

    h = History()
    h.new_conversation("old chat")
    h.close()
    real_open = History.open.__func__
    monkeypatch.setattr(History, "open", classmethod(lambda cls, path=None, **kw: real_open(cls, path, timeout=0.05)))
    other = sqlite3.connect(history_path(), isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        win, engine, history = _build(qtbot, fake_command)
        try:
            assert history.read_only
            assert any("locked" in t for _, _, t in win.banner.messages)
        finally:
            engine.shutdown()
            history.close()
    finally:
        other.execute("ROLLBACK")
        other.close()
