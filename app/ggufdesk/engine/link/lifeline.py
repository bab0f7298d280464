"""The engine never outlives its client: parent-death signal, a parent-pid check, exit on stdin EOF."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger("ggufdesk.engine")

PARENT_ENV = "GGUFDESK_PARENT_PID"  # set by the client: the pid the engine must outlive no longer
PR_SET_PDEATHSIG = 1  # linux/prctl.h
EXIT_GRACE_S = 3.0  # after stdin closes: time for a clean shutdown before a hard exit


def set_parent_death_signal() -> bool:
    """Linux: SIGKILL this process when the thread that started it exits (the client keeps that
    thread alive for its whole life). True when the kernel accepted it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # the process's own symbols (libc is loaded): ctypes.util.find_library would run
        # `ldconfig -p` as a child at every engine start (seen by the router's storm test as a
        # third engine beside two)
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError) as e:
        log.warning("could not set the parent-death signal: %s", e)
        return False


def parent_is_gone(environ: dict[str, str] | None = None) -> bool:
    """True when the client that started us has already exited (we were re-parented)."""
    want = (os.environ if environ is None else environ).get(PARENT_ENV, "")
    return want.isdigit() and os.getppid() != int(want)


def guard(exit_now: bool = True) -> None:
    """Call first thing in the engine process: exit at once if the client is already gone."""
    set_parent_death_signal()
    if parent_is_gone() and exit_now:
        os._exit(0)


def exit_soon(grace_s: float = EXIT_GRACE_S) -> None:
    """stdin closed: the client is gone. Give the main loop `grace_s` to shut down cleanly, then
    leave even if it is stuck in a decode or a runaway template render."""

    def later() -> None:
        time.sleep(grace_s)
        os._exit(0)

    threading.Thread(target=later, name="engine-exit", daemon=True).start()
