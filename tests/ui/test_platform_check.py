"""Start-up on a minimal Linux: every library Qt's xcb plugin lacks is named, with package names, before Qt aborts."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ggufdesk.ui import platform_check as pc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def test_debian_package_names_follow_the_soname_rule():
    assert pc.debian_package("libxcb-icccm.so.4") == "libxcb-icccm4"
    assert pc.debian_package("libxcb-keysyms.so.1") == "libxcb-keysyms1"
    assert pc.debian_package("libxcb-cursor.so.0") == "libxcb-cursor0"
    assert pc.debian_package("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    assert pc.debian_package("libX11-xcb.so.1") == "libx11-xcb1"
    assert pc.debian_package("libglib-2.0.so.0") == "libglib2.0-0"


def test_the_real_plugin_is_asked_and_only_truly_missing_libraries_are_named():
    plugin = pc.xcb_plugin()
    assert plugin is not None and plugin.name == "libqxcb.so"
    missing = pc.missing_libraries(plugin)
    known = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for soname in missing:
        assert f"{soname} " not in known  # each one named really is absent here


def test_which_platform_qt_will_use():
    assert pc.wants_xcb({"DISPLAY": ":0"})
    assert pc.wants_xcb({"QT_QPA_PLATFORM": "xcb"})
    assert not pc.wants_xcb({"QT_QPA_PLATFORM": "offscreen", "DISPLAY": ":0"})
    assert not pc.wants_xcb({})
    assert not pc.wants_xcb({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0",
                             "XDG_SESSION_TYPE": "wayland"})


def fake_ldd(tmp_path: Path, missing: list[str]) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lines = "".join(f"\\t{s} => not found\\n" for s in missing)
    script = bin_dir / "ldd"
    script.write_text("#!/bin/sh\nprintf '\\tlibxcb.so.1 => /lib/libxcb.so.1 (0x1)\\n"
                      f"{lines}\\tlibxcb-icccm.so.4 => not found\\n'\n")
    script.chmod(0o755)
    return bin_dir


def test_gui_start_prints_one_plain_line_instead_of_a_core_dump(tmp_path):
    bin_dir = fake_ldd(tmp_path, ["libxcb-keysyms.so.1"])
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", QT_QPA_PLATFORM="xcb",
               DISPLAY=":987")
    r = subprocess.run([sys.executable, "-c", "import sys; from ggufdesk.ui.app import main; "
                        "sys.exit(main([]))"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "ggufdesk cannot open its window" in ln]
    assert len(lines) == 1
    assert "libxcb-keysyms.so.1, libxcb-icccm.so.4" in lines[0]
    assert lines[0].endswith("sudo apt-get install libxcb-keysyms1 libxcb-icccm4")


def test_make_run_uses_the_same_check():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    run = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "ggufdesk.ui.platform_check" in run and "libxcb-cursor" not in run


def test_without_pyside6_the_known_libraries_are_checked(monkeypatch):
    """`make run` checks before the set-up has installed PySide6: no plugin to ask yet."""
    monkeypatch.setattr(pc, "xcb_plugin", lambda: None)
    real = pc.ctypes.CDLL

    def load(name, *a, **k):
        if name in ("libxcb-icccm.so.4", "libxcb-keysyms.so.1"):
            raise OSError(f"{name}: cannot open shared object file")
        return real(name, *a, **k) if name not in pc.XCB_LIBRARIES else object()

    monkeypatch.setattr(pc.ctypes, "CDLL", load)
    line = pc.check({"DISPLAY": ":0"})
    assert line is not None and line.endswith("sudo apt-get install libxcb-icccm4 libxcb-keysyms1")
    monkeypatch.setattr(pc.ctypes, "CDLL", lambda name, *a, **k: object())
    assert pc.check({"DISPLAY": ":0"}) is None


def test_the_readme_lists_every_package_the_check_can_ask_for():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = set(readme.split("sudo apt-get install", 1)[1].split("```", 1)[0].split())
    assert set(pc.packages()) <= listed, set(pc.packages()) - listed


def test_the_known_libraries_are_what_the_plugin_links_to():
    """XCB_LIBRARIES follows PySide6: every X11/xcb/EGL library its plugin links to is listed."""
    plugin = pc.xcb_plugin()
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True).stdout
    linked = {line.split()[0] for line in out.splitlines() if "=>" in line}
    system = {s for s in linked if s.startswith(("libxcb", "libxkb", "libX11", "libEGL"))}
    assert system <= set(pc.XCB_LIBRARIES), system - set(pc.XCB_LIBRARIES)


def test_make_run_checks_the_libraries_before_the_long_set_up():
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["make", "-n", "-B", "run"], cwd=root, capture_output=True, text=True,
                         timeout=60).stdout.splitlines()
    first = next(i for i, line in enumerate(out) if "platform_check" in line)
    setup = [i for i, line in enumerate(out) if "llama_wheel.sh" in line or "pip install" in line]
    assert all(first < i for i in setup), out
