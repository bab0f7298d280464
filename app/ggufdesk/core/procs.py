"""Ending a child process: SIGTERM, then SIGKILL if it has not gone within a grace period."""
from __future__ import annotations

import subprocess
from typing import Any


def terminate(popen: subprocess.Popen[Any], grace: float) -> None:
    """Ask a running child to stop, wait up to `grace` seconds, then kill it; it is reaped either way."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
