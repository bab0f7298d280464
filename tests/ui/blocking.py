"""How long the GUI thread is blocked (asleep, not merely waiting for a CPU) during a call or a tick.

Wall time minus the thread's own CPU time minus its time queued for a CPU (Linux schedstat): what
is left is time the thread slept on a lock, a pipe or a condition. A busy machine preempting the
thread does not count, so the figures hold on a loaded CI box.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _sched_ns() -> int:
    """CPU time + run-queue wait of the calling thread, in ns (0 where the kernel does not say)."""
    try:
        cpu, wait, _ = _SCHEDSTAT.read_text().split()
        return int(cpu) + int(wait)
    except (OSError, ValueError):
        return 0


class Clock:
    """Marks points on one thread; `blocked_since_mark()` is the sleep time since the last mark."""

    def __init__(self) -> None:
        self.mark()

    def mark(self) -> None:
        self._wall, self._sched = time.perf_counter_ns(), _sched_ns()

    def blocked_since_mark(self) -> float:
        wall, sched = time.perf_counter_ns(), _sched_ns()
        return max(0, (wall - self._wall) - (sched - self._sched)) / 1e9


class TimedCalls:
    """Wraps an object: every method call made through it records how long the caller was blocked."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self.calls: list[tuple[str, float]] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            clock = Clock()
            try:
                return value(*args, **kwargs)
            finally:
                self.calls.append((name, clock.blocked_since_mark()))

        return timed


class LoopGaps:
    """A timer on the event loop; the longest blocked stretch between two of its ticks."""

    def __init__(self, interval_ms: int = 10) -> None:
        from PySide6.QtCore import QTimer

        self.worst = 0.0
        self.ticks = 0
        self._clock = Clock()
        self._timer = QTimer(interval=interval_ms)
        self._timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        self.worst = max(self.worst, self._clock.blocked_since_mark())
        self.ticks += 1
        self._clock.mark()

    def start(self) -> None:
        self._clock.mark()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

