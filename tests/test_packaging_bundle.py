"""The bundle's pieces that run without building it: build facts, the GPU hint, `-m`, the smoke harness."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import ggufdesk
from ggufdesk.core import bundle
from ggufdesk.core.bundle import BuildInfo

ROOT = Path(__file__).resolve().parents[1]
CPU = BuildInfo(version="9.9.9", variant="cpu", platform="linux-x86_64")
NVIDIA = [("nvidia", "NVIDIA GeForce RTX 4090")]


def write_build(dirpath: Path, **fields) -> Path:
    dirpath.mkdir(parents=True, exist_ok=True)
    exe = dirpath / "ggufdesk"
    exe.write_text("")
    (dirpath / bundle.BUILD_FILE).write_text(json.dumps(fields))
    return exe


def test_build_info_reads_build_json_beside_the_executable(tmp_path):
    exe = write_build(tmp_path / "b", version="1.2.3", variant="cuda", platform="linux-x86_64")
    assert bundle.build_info(str(exe)) == BuildInfo(version="1.2.3", variant="cuda", platform="linux-x86_64")


def test_build_info_is_none_outside_a_bundle_and_on_a_broken_file(tmp_path, monkeypatch):
    monkeypatch.delattr(sys, "frozen", raising=False)
    assert bundle.build_info() is None
    (tmp_path / bundle.BUILD_FILE).write_text("{not json")
    assert bundle.build_info(str(tmp_path / "ggufdesk")) is None
    (tmp_path / bundle.BUILD_FILE).write_text('{"version": "1"}')
    assert bundle.build_info(str(tmp_path / "ggufdesk")) is None
    assert bundle.build_info(str(tmp_path / "missing" / "ggufdesk")) is None


def test_build_info_when_frozen_follows_sys_executable(tmp_path, monkeypatch):
    exe = write_build(tmp_path, version="2.0", variant="cpu", platform="linux-x86_64")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(exe))
    assert bundle.build_info().version == "2.0"


def test_gpu_hint_names_the_gpu_and_what_to_install():
    msg = bundle.gpu_hint(CPU, NVIDIA)
    assert "CPU build" in msg and "RTX 4090" in msg and "cuda" in msg and "NVIDIA driver" in msg
    assert "vulkan" in bundle.gpu_hint(CPU, [("amd", "AMD Radeon GPU")])


@pytest.mark.parametrize("info,gpus", [
    (CPU, []),
    (BuildInfo(version="1", variant="cuda", platform="linux-x86_64"), NVIDIA),
    (None, NVIDIA),
])
def test_no_gpu_hint_without_a_gpu_or_on_a_gpu_build_or_outside_a_bundle(info, gpus):
    assert bundle.gpu_hint(info, gpus) is None


def test_gpu_hint_is_shown_once_per_version(tmp_path):
    assert bundle.hint_once(tmp_path, CPU, NVIDIA) is not None
    assert bundle.hint_once(tmp_path, CPU, NVIDIA) is None
    newer = BuildInfo(version="10.0", variant="cpu", platform="linux-x86_64")
    assert bundle.hint_once(tmp_path, newer, NVIDIA) is not None


def test_gpu_hint_survives_an_unwritable_state_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert bundle.hint_once(blocker / "state", CPU, NVIDIA) is not None  # said; could not remember it


def test_gpus_here_without_nvml_finds_nothing_nvidia(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert all(kind != "nvidia" for kind, _ in bundle.gpus_here())


def test_bundle_entry_runs_modules_like_python(tmp_path):
    """The engine client starts `sys.executable -m ggufdesk.engine.runtime.worker`; the frozen entry honours -m."""
    r = subprocess.run([sys.executable, str(ROOT / "installer" / "bundle_main.py"), "-m", "ggufdesk", "--version"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"ggufdesk {ggufdesk.__version__}", r.stderr


def test_bundle_entry_passes_arguments_to_the_cli(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GGUFDESK_NO_GPU_HINT": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "installer" / "bundle_main.py"), "no-such-command"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "invalid choice" in r.stderr


# ------------------------------------------------------------------ the smoke harness, on fake bundles

FAKE = """#!/bin/sh
case "$1" in
  --version) echo "{version}" ;;
  probe) echo '{probe}' ;;
  *) exit 3 ;;
esac
"""


def fake_archive(tmp_path: Path, *, version: str = "ggufdesk 0.1.0", probe: str = '{"gpus": []}') -> Path:
    d = tmp_path / "fake" / "ggufdesk-0.1.0-linux-x86_64"
    d.mkdir(parents=True)
    exe = d / "ggufdesk"
    exe.write_text(FAKE.format(version=version, probe=probe))
    exe.chmod(0o755)
    out = tmp_path / "ggufdesk-0.1.0-linux-x86_64.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(d, arcname=d.name)
    return out


def smoke(target: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(scratch)}
    return subprocess.run(["bash", str(ROOT / "installer" / "smoke.sh"), str(target)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_smoke_fails_on_a_wrong_version_and_cleans_up(tmp_path):
    r = smoke(fake_archive(tmp_path, version="something else"), tmp_path)
    assert r.returncode == 1 and "--version printed: something else" in r.stderr
    assert list((tmp_path / "scratch").iterdir()) == []


def test_smoke_fails_when_probe_json_lacks_fields(tmp_path):
    r = smoke(fake_archive(tmp_path), tmp_path)
    assert r.returncode == 1 and "probe --json" in r.stderr and "FAILED" in r.stderr
    assert list((tmp_path / "scratch").iterdir()) == []


def test_smoke_refuses_what_it_cannot_test(tmp_path):
    bogus = tmp_path / "x.rpm"
    bogus.write_text("")
    assert smoke(bogus, tmp_path).returncode == 1
    assert smoke(tmp_path / "missing.tar.gz", tmp_path).returncode == 2


# ------------------------------------------------------------------ the hint as the bundle's entry shows it

def load_entry():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bundle_main", ROOT / "installer" / "bundle_main.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_entry_prints_the_hint_for_the_cli(monkeypatch, capsys):
    entry = load_entry()
    monkeypatch.delenv("GGUFDESK_NO_GPU_HINT", raising=False)
    monkeypatch.setattr(bundle, "hint_once", lambda state_dir: "use the cuda build")
    monkeypatch.setattr(sys, "argv", ["ggufdesk", "no-such-command"])
    with pytest.raises(SystemExit):
        entry.main()
    assert "ggufdesk: use the cuda build" in capsys.readouterr().err


@pytest.mark.qt_log_ignore("does not support propagateSizeHints")  # the offscreen platform's note
def test_entry_shows_the_hint_in_a_window_that_does_not_block(qtbot):
    from PySide6.QtWidgets import QApplication

    entry = load_entry()
    entry.show_hint_in_gui("use the cuda build")
    box = QApplication.instance()._gpu_hint
    qtbot.waitUntil(box.isVisible)
    assert box.text() == "use the cuda build" and not box.isModal()
    box.close()
