"""Light or dark, as the system says: every colour the app paints is derived from the QPalette.

Linux desktops hand Qt their palette through the platform theme (GTK, KDE). Windows and macOS report
dark mode through `QStyleHints.colorScheme()`; when the style still paints light (Windows' classic
style cannot do dark) we switch to Fusion and, if the platform offers no dark palette, derive one by
mirroring the light palette's lightness. `GGUFDESK_THEME=light|dark` forces either (screenshots).

Semantic colours that no palette role carries (a warning's amber, an error's red, the memory bar's
series) are built here from a hue plus the palette's own lightness, so they read on either theme.
"""
from __future__ import annotations

import logging
import os

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

log = logging.getLogger("ggufdesk.ui.theme")

WARNING_HUE = 38  # amber
ERROR_HUE = 0  # red
SUCCESS_HUE = 140  # green


def palette() -> QPalette:
    app = QGuiApplication.instance()
    return app.palette() if app is not None else QPalette()


def is_dark(pal: QPalette | None = None) -> bool:
    """The palette is dark when its window background is darker than its text."""
    pal = pal or palette()
    return pal.color(QPalette.ColorRole.Window).lightness() < pal.color(
        QPalette.ColorRole.WindowText).lightness()


def mix(a: QColor, b: QColor, t: float) -> QColor:
    """`t` of the way from a to b."""
    return QColor.fromRgbF(a.redF() + (b.redF() - a.redF()) * t,
                           a.greenF() + (b.greenF() - a.greenF()) * t,
                           a.blueF() + (b.blueF() - a.blueF()) * t)


def role(name: QPalette.ColorRole, pal: QPalette | None = None) -> QColor:
    return QColor((pal or palette()).color(name))


def muted(pal: QPalette | None = None) -> QColor:
    """Secondary text: the text colour half-way to the background."""
    pal = pal or palette()
    return mix(role(QPalette.ColorRole.WindowText, pal), role(QPalette.ColorRole.Window, pal), 0.4)


def tone(hue: int, *, strong: bool, pal: QPalette | None = None) -> QColor:
    """A hue readable on this palette: `strong` for text and borders, else a soft background tint."""
    dark = is_dark(pal)
    if strong:
        return QColor.fromHsl(hue, 170, 185 if dark else 80)
    base = role(QPalette.ColorRole.Base, pal)
    return mix(base, QColor.fromHsl(hue, 200, 128), 0.22 if dark else 0.14)


def series(i: int, pal: QPalette | None = None) -> QColor:
    """The i-th colour of a chart: the palette's highlight, then its hue turned around the wheel."""
    hi = role(QPalette.ColorRole.Highlight, pal)
    h = hi.hslHue() if hi.hslHue() >= 0 else 210
    s = max(hi.hslSaturation(), 120)
    lightness = 150 if is_dark(pal) else 115
    return QColor.fromHsl((h + i * 97) % 360, s, lightness)


def css(c: QColor) -> str:
    return c.name(QColor.NameFormat.HexRgb)


def mirrored(pal: QPalette) -> QPalette:
    """The same palette with every colour's lightness flipped: a dark twin of a light palette."""
    out = QPalette(pal)
    for group in (QPalette.ColorGroup.Active, QPalette.ColorGroup.Inactive,
                  QPalette.ColorGroup.Disabled):
        for r in range(QPalette.ColorRole.NColorRoles.value):
            cr = QPalette.ColorRole(r)
            if cr in (QPalette.ColorRole.Highlight, QPalette.ColorRole.Link,
                      QPalette.ColorRole.LinkVisited, QPalette.ColorRole.Accent):
                continue  # the accent keeps its colour; only its neighbours turn dark
            c = pal.color(group, cr)
            h, s, lig, a = c.getHslF()
            out.setColor(group, cr, QColor.fromHslF(max(h, 0.0), s, 1.0 - lig * 0.92, a))
    return out


def wanted_scheme() -> Qt.ColorScheme:
    forced = os.environ.get("GGUFDESK_THEME", "").strip().lower()
    if forced == "dark":
        return Qt.ColorScheme.Dark
    if forced == "light":
        return Qt.ColorScheme.Light
    app = QGuiApplication.instance()
    return app.styleHints().colorScheme() if app is not None else Qt.ColorScheme.Unknown


class ThemeFollower(QObject):
    """Applies the system's scheme now and whenever it changes (macOS/Windows dark mode toggles)."""

    def __init__(self, app) -> None:  # app: QApplication
        super().__init__(app)
        self.app = app
        self._light = QPalette(app.palette())
        app.styleHints().colorSchemeChanged.connect(lambda _s: self.apply())
        self.apply()

    def apply(self) -> None:
        want = wanted_scheme()
        pal = self.app.palette()
        if want == Qt.ColorScheme.Dark and not is_dark(pal):
            if self.app.style().name().lower() not in ("fusion",):
                self.app.setStyle("Fusion")  # the classic Windows style cannot paint dark
                pal = self.app.style().standardPalette()
            if not is_dark(pal):
                pal = mirrored(self._light if not is_dark(self._light) else pal)
            self.app.setPalette(pal)
        elif want == Qt.ColorScheme.Light and is_dark(pal) and not is_dark(self._light):
            self.app.setPalette(self._light)
        # Style sheets resolve palette() when polished: polish again so they follow the change.
        self.app.setStyleSheet(self.app.styleSheet())
        log.info("theme: %s", "dark" if is_dark() else "light")


def follow_system(app) -> ThemeFollower:
    return ThemeFollower(app)
