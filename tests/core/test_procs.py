"""core/procs.terminate: SIGTERM, then SIGKILL after the grace period; always reaped."""
from __future__ import annotations

import subprocess
import sys
import time

from ggufdesk.core import procs

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def test_a_child_that_stops_on_sigterm_is_reaped():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs.terminate(p, 10)
    assert p.returncode == -15


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period():
    p = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "up\n"  # its handler is in place
    t = time.monotonic()
    procs.terminate(p, 0.5)
    assert p.returncode == -9 and time.monotonic() - t >= 0.5


def test_an_ended_child_is_left_alone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    procs.terminate(p, 10)
    assert p.returncode == 0
