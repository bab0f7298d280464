"""Light or dark, as the system says: every colour the app paints is derived from the QPalette.

Linux desktops hand Qt their palette through the platform theme (GTK, KDE). Windows and macOS report
dark mode through `QStyleHints.colorScheme()`; when the style still paints light (Windows' classic
style cannot do dark) we switch to Fusion and, if the platform offers no dark palette, derive one by
mirroring the light palette's lightness. The user picks System, Light or Dark in View ▸ Theme
(remembered); `GGUFDESK_THEME=light|dark` forces either (screenshots).

Semantic colours that no palette role carries (a warning's amber, an error's red, the memory bar's
series) are built here from a hue plus the palette's own lightness, so they read on either theme.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

if TYPE_CHECKING:
    from PySide6.QtWidgets import QApplication, QWidget

log = logging.getLogger("ggufdesk.ui.theme")

# What a widget restyles on: a window gets ApplicationPaletteChange, its children PaletteChange.
PALETTE_EVENTS = (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange)

WARNING_HUE = 38  # amber
ERROR_HUE = 0  # red
SUCCESS_HUE = 140  # green


def palette() -> QPalette:
    app = QGuiApplication.instance()
    return app.palette() if isinstance(app, QGuiApplication) else QPalette()


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


def restyle(widget: QWidget, sheet: str) -> None:
    """Set a style sheet only when it changes: setting one changes the widget's palette, which
    would restyle it again, and again."""
    if widget.styleSheet() != sheet:
        widget.setStyleSheet(sheet)


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
            h, s, lig, a = c.hslHueF(), c.hslSaturationF(), c.lightnessF(), c.alphaF()
            out.setColor(group, cr, QColor.fromHslF(max(h, 0.0), s, 1.0 - lig * 0.92, a))
    return out


THEME_KEY = "ui/theme"  # the user's choice in View ▸ Theme (QSettings)
CHOICES = ("system", "light", "dark")


def preference() -> str:
    """system | light | dark: GGUFDESK_THEME (screenshots, tests) over the user's choice."""
    forced = os.environ.get("GGUFDESK_THEME", "").strip().lower()
    if forced in CHOICES:
        return forced
    from PySide6.QtCore import QSettings

    chosen = str(QSettings().value(THEME_KEY, "system", type=str) or "system")
    return chosen if chosen in CHOICES else "system"


def wanted_scheme() -> Qt.ColorScheme:
    choice = preference()
    if choice == "dark":
        return Qt.ColorScheme.Dark
    if choice == "light":
        return Qt.ColorScheme.Light
    app = QGuiApplication.instance()
    return app.styleHints().colorScheme() if isinstance(app, QGuiApplication) else Qt.ColorScheme.Unknown


class ThemeFollower(QObject):
    """Applies the chosen scheme now, when the user picks another (choose) and when the system's
    changes (macOS/Windows dark mode toggles). "System" on a desktop that reports no scheme means
    the palette the platform handed Qt at start."""

    def __init__(self, app: QApplication) -> None:
        super().__init__(app)
        self.app = app
        self._original = QPalette(app.palette())
        self._original_style = app.style().name()
        app.styleHints().colorSchemeChanged.connect(lambda _s: self.apply())
        self.apply()

    def apply(self) -> None:
        want = wanted_scheme()
        if want == Qt.ColorScheme.Dark:
            self._dark()
        elif want == Qt.ColorScheme.Light:
            self._light()
        elif self.app.palette() != self._original:
            self.app.setStyle(self._original_style)
            self.app.setPalette(self._original)
        # Style sheets resolve palette() when polished: polish again so they follow the change.
        self.app.setStyleSheet(self.app.styleSheet())
        log.info("theme: %s (%s)", "dark" if is_dark() else "light", preference())

    def _dark(self) -> None:
        if is_dark(self.app.palette()):
            return
        if is_dark(self._original):
            self.app.setStyle(self._original_style)
            self.app.setPalette(self._original)
            return
        pal = self._original
        if self.app.style().name().lower() != "fusion":
            self.app.setStyle("Fusion")  # the classic Windows style cannot paint dark
            pal = self.app.style().standardPalette()
        self.app.setPalette(pal if is_dark(pal) else mirrored(self._original))

    def _light(self) -> None:
        if not is_dark(self.app.palette()):
            return
        self.app.setStyle(self._original_style)
        self.app.setPalette(self._original if not is_dark(self._original) else mirrored(self._original))


_follower: ThemeFollower | None = None


def follow_system(app: QApplication) -> ThemeFollower:
    global _follower
    _follower = ThemeFollower(app)
    return _follower


def choose(choice: str) -> None:
    """The user picked system, light or dark: remembered, and applied at once."""
    from PySide6.QtCore import QSettings

    if choice not in CHOICES:
        raise ValueError(f"theme must be one of {', '.join(CHOICES)}, not {choice!r}")
    QSettings().setValue(THEME_KEY, choice)
    if _follower is not None:
        _follower.apply()
