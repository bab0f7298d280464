"""Before Qt starts on Linux: does its X11 (xcb) platform plugin find every library it links to?

Qt aborts with a core dump when `libqxcb.so` cannot be loaded, naming at best one library. We ask
the plugin itself (`ldd` on the libqxcb.so of the installed PySide6: every library it and its Qt
dependencies need, transitively) and print one plain line with the Debian/Ubuntu package names.
No Qt import here: this runs first. `python -m ggufdesk.ui.platform_check` exits 1 when something
is missing. Before PySide6 is installed (the Makefile's `run` target calls this file with the
system's python3 before the long set-up) it checks the libraries PySide6 6's xcb plugin is known to
need instead (`XCB_LIBRARIES`), so a missing one is named in seconds, not after the build.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Debian names a library package after its soname (libfoo.so.3 -> libfoo3, libfoo-2.so.1 ->
# libfoo-2-1); only a few well-known packages break that rule.
DEBIAN_EXCEPTIONS = {"libglib-2.0.so.0": "libglib2.0-0", "libgobject-2.0.so.0": "libglib2.0-0",
                     "libgthread-2.0.so.0": "libglib2.0-0"}

# What libqxcb.so of PySide6 6.x links to outside Qt (`ldd` on it, transitively). The README's
# package list for the window is these libraries' packages (tests/ui/test_platform_check.py).
XCB_LIBRARIES = (
    "libxcb.so.1", "libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-image.so.0",
    "libxcb-keysyms.so.1", "libxcb-randr.so.0", "libxcb-render.so.0", "libxcb-render-util.so.0",
    "libxcb-shape.so.0", "libxcb-shm.so.0", "libxcb-sync.so.1", "libxcb-util.so.1",
    "libxcb-xfixes.so.0", "libxcb-xkb.so.1", "libxkbcommon.so.0", "libxkbcommon-x11.so.0",
    "libX11.so.6", "libX11-xcb.so.1", "libEGL.so.1", "libfontconfig.so.1", "libdbus-1.so.3",
)


def xcb_plugin() -> Path | None:
    """libqxcb.so of the PySide6 this interpreter would import (without importing it)."""
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        for rel in ("Qt/plugins/platforms/libqxcb.so", "plugins/platforms/libqxcb.so"):
            if (p := Path(root) / rel).is_file():
                return p
    return None


def wants_xcb(env: dict[str, str] | None = None) -> bool:
    """Will Qt try the xcb plugin? (Linux, an X display, not forced elsewhere, not a Wayland session.)"""
    env = dict(os.environ if env is None else env)
    if not sys.platform.startswith("linux"):
        return False
    forced = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if forced:
        return forced == "xcb"
    if not env.get("DISPLAY"):
        return False
    return not (env.get("WAYLAND_DISPLAY") and env.get("XDG_SESSION_TYPE") == "wayland")


def missing_libraries(plugin: Path) -> list[str]:
    """Sonames `ldd` cannot resolve for the plugin (empty when all are there or ldd is absent)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return []
    try:
        out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = re.findall(r"^\s*(\S+)\s+=>\s+not found", out, flags=re.MULTILINE)
    return list(dict.fromkeys(found))  # once each, in ldd's order


def unloadable(sonames: tuple[str, ...] = XCB_LIBRARIES) -> list[str]:
    """The sonames the dynamic loader cannot find (PySide6 not installed yet: no plugin to ask)."""
    missing = []
    for soname in sonames:
        try:
            ctypes.CDLL(soname)
        except OSError:
            missing.append(soname)
    return missing


def packages(sonames: tuple[str, ...] | list[str] = XCB_LIBRARIES) -> list[str]:
    return list(dict.fromkeys(debian_package(s) for s in sonames))


def debian_package(soname: str) -> str:
    """libxcb-icccm.so.4 -> libxcb-icccm4; libxkbcommon-x11.so.0 -> libxkbcommon-x11-0."""
    if soname in DEBIAN_EXCEPTIONS:
        return DEBIAN_EXCEPTIONS[soname]
    m = re.match(r"^(.+?)\.so\.(\d+)", soname)
    if m is None:
        return soname
    base, major = m.group(1).lower(), m.group(2)
    return f"{base}-{major}" if base[-1].isdigit() else f"{base}{major}"


def message(missing: list[str]) -> str:
    pkgs = " ".join(packages(missing))
    return (f"ggufdesk cannot open its window: Qt's X11 support needs {', '.join(missing)}, which "
            f"this system lacks. On Debian/Ubuntu: sudo apt-get install {pkgs}")


def check(env: dict[str, str] | None = None, plugin: Path | None = None) -> str | None:
    """The one plain line to print when Qt's xcb plugin would fail to load, else None."""
    if plugin is None:
        if not wants_xcb(env):
            return None
        plugin = xcb_plugin()
    missing = missing_libraries(plugin) if plugin is not None else unloadable()
    return message(missing) if missing else None


def main() -> int:
    line = check()
    if line:
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
