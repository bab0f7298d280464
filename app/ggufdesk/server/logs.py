"""Rate-limited logging for the server: a hostile client must not be able to fill the disk with our log lines.

1,100 half-open connections wrote 86 MB of `Too many open files` lines in 50 s (issue 34). Every line a
client can provoke (uvicorn's "Invalid HTTP request received.", asyncio's accept errors, our own
warnings and tracebacks) goes through one filter on the log handlers: at most BURST lines per WINDOW_S
seconds with the same logger, level and message template; the next one that gets through says how
many were left out.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

BURST = 5
WINDOW_S = 10.0
MAX_KEYS = 1000  # distinct templates remembered (a client cannot grow this without bound either)


class RepeatLimit(logging.Filter):
    """At most `burst` records per `window` seconds for each (logger, level, template)."""

    def __init__(self, *, burst: int = BURST, window: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self._seen: dict[tuple[str, int, str], list[float]] = {}  # key -> [window start, shown, dropped]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = self.clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is None or now - entry[0] >= self.window:
                dropped = int(entry[2]) if entry is not None else 0
                if len(self._seen) >= MAX_KEYS:
                    self._forget(now)
                self._seen[key] = [now, 1, 0]
                if dropped:
                    record.msg = f"{record.getMessage()} [{dropped} more like this in {self.window:g} s not shown]"
                    record.args = None
                return True
            if entry[1] < self.burst:
                entry[1] += 1
                return True
            entry[2] += 1
            return False

    def _forget(self, now: float) -> None:
        for k in [k for k, e in self._seen.items() if now - e[0] >= self.window] or list(self._seen)[:MAX_KEYS // 2]:
            del self._seen[k]


_limit = RepeatLimit()


def limit_server_logs() -> None:
    """Put the filter on every handler that server lines reach: the root logger's (our loggers, asyncio's)
    and uvicorn's own (it does not propagate). Call after uvicorn has configured its logging."""
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access"):
        for handler in logging.getLogger(name).handlers:
            if _limit not in handler.filters:
                handler.addFilter(_limit)
