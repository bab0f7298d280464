"""Hand callables to one owner thread without Qt: the terminal chat's and the tests' `post`."""
from __future__ import annotations

import queue
import time
from typing import Callable


class Inbox:
    """`post(fn)` from any thread; the owner runs what was posted with `run_pending` / `run_until`."""

    def __init__(self) -> None:
        self._q: queue.Queue[Callable[[], None]] = queue.Queue()

    def post(self, fn: Callable[[], None]) -> None:
        self._q.put(fn)

    def run_pending(self, timeout: float = 0.0) -> int:
        """Run what is queued (waiting up to `timeout` for the first one); how many ran."""
        n = 0
        try:
            fn = self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
            while True:
                fn()
                n += 1
                fn = self._q.get_nowait()
        except queue.Empty:
            return n

    def run_until(self, done: Callable[[], bool], timeout: float = 10.0) -> bool:
        """Run posted callables until `done()` is true; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.run_pending(timeout=min(left, 0.1))
        return True
