"""installer/llama_wheel.sh: a caller that waits for another build says so; a cached wheel needs no wait."""
from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "installer" / "llama_wheel.sh"
DEADLINE_S = 60  # only to catch a hang

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="needs flock(1)")


def start(cache: Path) -> subprocess.Popen[str]:
    # A build, should one start, fails at once: no sdist there (tests never build the real wheel).
    env = {**os.environ, "GGUFDESK_WHEEL_CACHE": str(cache), "GGUFDESK_VARIANT": "cpu",
           "LLAMA_CPP_PYTHON_SDIST": str(cache.parent / "no-such-sdist.tar.gz"),
           "GGUFDESK_NO_BUILD_ISOLATION": "1"}
    return subprocess.Popen(["bash", str(SCRIPT), sys.executable], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def kill(proc: subprocess.Popen[str]) -> None:
    """The script and its children (a waiting flock(1) holds the pipes open)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=DEADLINE_S)


def first_line(stream) -> str:
    ready, _, _ = select.select([stream], [], [], DEADLINE_S)
    assert ready, f"nothing said on screen within {DEADLINE_S} s"
    return stream.readline()


def test_a_caller_waiting_for_another_build_says_so_then_uses_its_wheel(tmp_path):
    cache = tmp_path / "wheels"
    with open(f"{cache}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build of the wheel holds the lock
        proc = start(cache)
        try:
            line = first_line(proc.stderr)
        except AssertionError:
            kill(proc)
            raise
        try:
            m = re.match(r"waiting for another build of llama-cpp-python \(cached in (\S+);", line)
            assert m, line
            wheel = Path(m.group(1)) / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl"
            wheel.parent.mkdir(parents=True)
            wheel.write_bytes(b"built by the other one")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err
    assert out.strip() == str(wheel) and "building" not in err  # no second build


def test_a_cached_wheel_is_used_without_waiting_for_the_lock(tmp_path):
    cache = tmp_path / "wheels"
    with open(f"{cache}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = start(cache)
        line = first_line(proc.stderr)  # learn where the wheel goes, as the waiting line says
        kill(proc)
        wheel = Path(re.search(r"cached in (\S+);", line).group(1)) / "llama_cpp_python-x.whl"
        wheel.parent.mkdir(parents=True)
        wheel.write_bytes(b"cached")
        proc = start(cache)  # the lock is still held by a build of something else
        out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0 and out.strip() == str(wheel) and err == ""
