"""Light and dark themes: every colour comes from the palette, and text stays readable on both."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from ggufdesk.ui import theme

UI = Path(__file__).resolve().parents[2] / "app" / "ggufdesk" / "ui"
HEX = re.compile(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b")


def luminance(c: QColor) -> float:
    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    return 0.2126 * lin(c.redF()) + 0.7152 * lin(c.greenF()) + 0.0722 * lin(c.blueF())


def contrast(a: QColor, b: QColor) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@pytest.fixture(params=["light", "dark"])
def scheme(request, qapp):
    """The application palette as a light or a dark system would hand it over."""
    original = QPalette(qapp.palette())
    pal = original if not theme.is_dark(original) else theme.mirrored(original)
    if request.param == "dark":
        pal = theme.mirrored(pal)
    qapp.setPalette(pal)
    assert theme.is_dark() == (request.param == "dark")
    yield request.param
    qapp.setPalette(original)


def test_no_hard_coded_colours_in_the_ui_code():
    offenders = []
    for path in UI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and HEX.search(node.value):
                offenders.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    assert offenders == []


def test_message_text_and_buttons_are_readable(qtbot, scheme):
    from ggufdesk.ui.message_widget import MessageWidget

    for role in ("user", "assistant"):
        w = MessageWidget(message_id=1, role=role, text="**Paris** is the capital.")
        qtbot.addWidget(w)
        w.resize(500, 120)
        w.show()
        img = w.body.grab().toImage()
        bg = img.pixelColor(img.width() - 3, img.height() - 3)
        text = theme.role(QPalette.ColorRole.Text)
        assert contrast(bg, text) >= 4.5, (scheme, role, bg.name(), text.name())
        # the buttons' text colour is the palette's text colour too
        assert theme.role(QPalette.ColorRole.Text).name() in w.styleSheet()
        if scheme == "dark":
            assert bg.lightness() < 128  # no white bubble on a dark desktop


def test_banner_levels_are_readable(qtbot, scheme):
    from ggufdesk.ui.notify import level_colours

    for level in ("info", "warning", "error"):
        bg, fg = level_colours(level)
        assert contrast(bg, fg) >= 4.5, (scheme, level, bg.name(), fg.name())


def test_chart_series_stand_out_from_the_background(scheme):
    base = theme.role(QPalette.ColorRole.Base)
    colours = [theme.series(i) for i in range(4)]
    assert len({c.name() for c in colours}) == 4
    assert all(contrast(c, base) >= 1.8 for c in colours)


def test_dark_mode_from_the_system_colour_scheme(qapp, monkeypatch):
    """Windows/macOS report dark mode through styleHints().colorScheme(): we follow it."""
    original = QPalette(qapp.palette())
    monkeypatch.setenv("GGUFDESK_THEME", "dark")
    try:
        follower = theme.follow_system(qapp)
        assert theme.is_dark()
        monkeypatch.setenv("GGUFDESK_THEME", "light")
        follower.apply()
        assert not theme.is_dark()
        follower.setParent(None)
    finally:
        QApplication.setPalette(original)


def test_wanted_scheme_reads_the_style_hints(qapp, monkeypatch):
    from PySide6.QtCore import Qt

    monkeypatch.delenv("GGUFDESK_THEME", raising=False)
    hints = type("H", (), {"colorScheme": staticmethod(lambda: Qt.ColorScheme.Dark)})()
    app_class = type("G", (), {"styleHints": staticmethod(lambda: hints)})
    app_class.instance = staticmethod(lambda: app_class())  # a GUI application: an instance of the class
    monkeypatch.setattr(theme, "QGuiApplication", app_class)
    assert theme.wanted_scheme() == Qt.ColorScheme.Dark


@pytest.fixture
def follower(qapp, monkeypatch):
    """The app's theme follower, as main() makes it; the palette and the choice are put back after."""
    from PySide6.QtCore import QSettings

    monkeypatch.delenv("GGUFDESK_THEME", raising=False)
    original, style = QPalette(qapp.palette()), qapp.style().name()
    made = []

    def make():
        f = theme.follow_system(qapp)
        made.append(f)
        return f

    yield make
    QSettings().remove(theme.THEME_KEY)
    theme._follower = None
    for f in made:
        f.deleteLater()
    qapp.setStyle(style)
    qapp.setPalette(original)


def test_the_theme_is_chosen_in_the_window_applied_at_once_and_remembered(qtbot, window, qapp, follower):
    from PySide6.QtCore import QSettings

    light = QPalette(qapp.palette())
    assert not theme.is_dark(light)
    follower()
    assert window.theme_actions["system"].isChecked()
    window.theme_actions["dark"].trigger()
    assert theme.is_dark() and QSettings().value(theme.THEME_KEY) == "dark"
    assert window.theme_actions["dark"].isChecked()
    QApplication.processEvents()
    muted = window.mode_label.styleSheet()
    window.theme_actions["light"].trigger()
    QApplication.processEvents()
    assert not theme.is_dark() and window.mode_label.styleSheet() != muted  # restyled live
    assert theme.css(theme.muted()) in window.gauges.decode_note.styleSheet()
    window.banner.notify("x", "error")
    assert theme.css(theme.tone(theme.ERROR_HUE, strong=True)) in window.banner.styleSheet()
    window.theme_actions["dark"].trigger()
    window.theme_actions["system"].trigger()  # this desktop reports no scheme: its own palette
    assert qapp.palette() == light and QSettings().value(theme.THEME_KEY) == "system"


def test_the_chosen_theme_comes_back_at_the_next_start(qapp, follower):
    theme.choose("dark")
    assert not theme.is_dark()  # chosen before any follower exists: nothing applied yet
    follower()  # the next start
    assert theme.is_dark()
    with pytest.raises(ValueError):
        theme.choose("purple")
