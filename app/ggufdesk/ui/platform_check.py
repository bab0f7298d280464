"""Before Qt starts on Linux: does its X11 (xcb) platform plugin find every library it links to?

Qt aborts with a core dump when `libqxcb.so` cannot be loaded, naming at best one library. We ask
the plugin itself (`ldd` on the libqxcb.so of the installed PySide6: every library it and its Qt
dependencies need, transitively) and print one plain line with the Debian/Ubuntu package names.
No Qt import here: this runs first. `python -m ggufdesk.ui.platform_check` exits 1 when something
is missing (the Makefile's `run` target calls it).
"""
from __future__ import annotations

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
    pkgs = " ".join(dict.fromkeys(debian_package(s) for s in missing))
    return (f"ggufdesk cannot open its window: Qt's X11 support needs {', '.join(missing)}, which "
            f"this system lacks. On Debian/Ubuntu: sudo apt-get install {pkgs}")


def check(env: dict[str, str] | None = None, plugin: Path | None = None) -> str | None:
    """The one plain line to print when Qt's xcb plugin would fail to load, else None."""
    if plugin is None:
        if not wants_xcb(env):
            return None
        plugin = xcb_plugin()
        if plugin is None:
            return None
    missing = missing_libraries(plugin)
    return message(missing) if missing else None


def main() -> int:
    line = check()
    if line:
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
