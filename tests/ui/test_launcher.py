"""The launcher: .desktop file, icons, installer script, the gui entry point."""
from __future__ import annotations

import configparser
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "app" / "ggufdesk" / "resources"


def test_desktop_file_is_valid_and_points_at_the_gui_script():
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str
    cp.read(RES / "ggufdesk.desktop")
    e = cp["Desktop Entry"]
    assert e["Type"] == "Application" and e["Exec"] == "ggufdesk-gui" and e["Icon"] == "ggufdesk"
    assert e["Terminal"] == "false" and e["Categories"].endswith(";")


def test_icons_exist_in_every_size():
    from ggufdesk.ui.icons import SIZES

    for n in SIZES:
        assert (RES / "icons" / f"ggufdesk-{n}.png").stat().st_size > 100


def test_app_icon_loads(qtbot):
    from ggufdesk.ui.app import app_icon

    icon = app_icon()
    assert not icon.isNull() and 256 in [s.width() for s in icon.availableSizes()]


def test_installer_installs_into_xdg_data_home(tmp_path):
    data = tmp_path / "share"
    r = subprocess.run([str(ROOT / "installer" / "install_desktop.sh"), ".venv"], cwd=ROOT,
                       env={"XDG_DATA_HOME": str(data), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    desktop = (data / "applications" / "ggufdesk.desktop").read_text()
    assert "Exec=" in desktop and "ggufdesk-gui" in desktop
    assert (data / "icons" / "hicolor" / "48x48" / "apps" / "ggufdesk.png").exists()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "ggufdesk.svg").exists()


def test_installer_never_fails(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    r = subprocess.run([str(ROOT / "installer" / "install_desktop.sh"), "/no/such/venv"], cwd=ROOT,
                       env={"XDG_DATA_HOME": "/proc/not-writable", "PATH": "/usr/bin:/bin",
                            "HOME": str(ro)}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "skipping" in r.stdout
