"""Runs last in `make test` (tests/ui sorts last, this file last in it): no thread that an earlier test left
behind in this process still burns CPU. A fake RPC worker's loop on a closed socket once spun both cores
for the rest of the run, and every later test ran at a fraction of its speed (the suite took 25 minutes
instead of 12). CPU time, not wall time: a busy machine slows a spinning thread, it does not hide it."""
from __future__ import annotations

import sys
import threading
import time
import traceback

import psutil

IDLE_S = 2.0
SPINNING_S = 0.5  # of CPU in IDLE_S seconds of sleep: a thread in a busy loop gets far more, even on a busy machine


def thread_cpu() -> dict[int, float]:
    """Seconds of CPU per thread of this process (psutil: the OS's thread ids, Linux's as threading's native_id)."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def test_no_thread_left_behind_is_spinning():
    before = thread_cpu()
    time.sleep(IDLE_S)
    after = thread_cpu()
    me = threading.get_native_id()
    busy = {tid: cpu - before.get(tid, 0.0) for tid, cpu in after.items() if tid != me}
    busy = {tid: s for tid, s in busy.items() if s > SPINNING_S}
    frames = sys._current_frames()
    named = {t.native_id: t for t in threading.enumerate()}
    report = []
    for tid, s in busy.items():
        t = named.get(tid)
        stack = "".join(traceback.format_stack(frames[t.ident])) if t is not None and t.ident in frames else "(native)"
        report.append(f"thread {tid} {t.name if t else '?'}: {s:.2f} s of CPU in {IDLE_S} s idle\n{stack}")
    assert not busy, "\n".join(report)
