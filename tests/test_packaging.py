"""The wheel: package data inside, found through importlib.resources from a non-editable install; --version."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ggufdesk
from ggufdesk.cli import main
from ggufdesk.ui.icons import SIZES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tree (the build never writes into the checkout)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "app", src / "app", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        str(src), "-w", str(out)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    (whl,) = out.glob("ggufdesk-*.whl")
    return whl


def test_wheel_carries_catalog_icons_and_desktop_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"ggufdesk/catalog/catalog.toml", "ggufdesk/resources/ggufdesk.desktop",
            "ggufdesk/resources/ggufdesk.svg"} <= names
    assert {f"ggufdesk/resources/icons/ggufdesk-{n}.png" for n in SIZES} <= names
    meta = zipfile.ZipFile(wheel).read(f"ggufdesk-{ggufdesk.__version__}.dist-info/METADATA").decode()
    assert "Requires-Python: >=3.11" in meta and f"Version: {ggufdesk.__version__}" in meta


CHECK = """
import sys
from pathlib import Path
site = Path(sys.argv[1]).resolve()
import ggufdesk
assert Path(ggufdesk.__file__).resolve().is_relative_to(site), ggufdesk.__file__
from ggufdesk.core import catalog
c = catalog.load()
assert c.entries and not c.warnings and catalog.default_path().resolve().is_relative_to(site)
from PySide6.QtWidgets import QApplication
app = QApplication([])
from ggufdesk.ui.app import app_icon, resources_dir
assert resources_dir().resolve().is_relative_to(site)
assert not app_icon().isNull()
print("ok")
"""


def test_non_editable_install_finds_its_data(wheel, tmp_path):
    """Installed from the wheel (not the source tree): the catalog and icons come from the install."""
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                        "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "PYTHONPATH": str(site), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-c", CHECK, str(site)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    r = subprocess.run([sys.executable, "-m", "ggufdesk", "--version"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"ggufdesk {ggufdesk.__version__}", r.stderr


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"ggufdesk {ggufdesk.__version__}"


def test_version_matches_the_package_metadata():
    from importlib.metadata import version

    assert version("ggufdesk") == ggufdesk.__version__
