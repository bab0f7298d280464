"""Background tasks: callbacks always queued on the GUI thread, dropped for dead owners and at exit."""
from __future__ import annotations

import threading

from ggufdesk.ui.tasks import TaskManager


def test_a_callback_never_runs_inside_the_call_that_scheduled_it(qtbot):
    tm = TaskManager(max_workers=1)
    order: list[str] = []
    fut = tm.run_in_background(lambda: 1)
    fut.result(timeout=5)  # done before the next call adds its callback
    tm.run_in_background(lambda: 2, lambda f: order.append("callback"))
    order.append("after scheduling")
    qtbot.waitUntil(lambda: tm.idle, timeout=5000)
    assert order == ["after scheduling", "callback"]


def test_results_are_not_delivered_after_shutdown(qtbot):
    tm = TaskManager(max_workers=1)
    gate = threading.Event()
    got: list[object] = []
    fut = tm.run_in_background(lambda: gate.wait(5), lambda f: got.append(f))
    tm.shutdown()
    gate.set()
    fut.result(timeout=5)
    marker = TaskManager(max_workers=1)  # a live manager: its callback proves events were processed
    seen: list[int] = []
    marker.run_in_background(lambda: None, lambda f: seen.append(1))
    qtbot.waitUntil(lambda: bool(seen), timeout=5000)
    assert got == []
