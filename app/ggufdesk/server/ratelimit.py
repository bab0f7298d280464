"""Token buckets per caller (API key or client address), in prompt + generated tokens per minute."""
from __future__ import annotations

import math
import threading
import time
from typing import Callable


class RateLimiter:
    """A bucket per caller holding up to `tokens_per_min`, refilled continuously.

    A request may start while the caller's bucket is above zero; what it really used is charged when
    it ends, so the level can go negative and the caller then waits until it refills past zero.
    `tokens_per_min` 0 means no limit.
    """

    def __init__(self, tokens_per_min: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if tokens_per_min < 0:
            raise ValueError("the rate limit must be 0 (off) or a positive number of tokens per minute")
        self.capacity = float(tokens_per_min)
        self.rate = tokens_per_min / 60.0  # tokens per second
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # caller -> (level, when)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.capacity > 0

    def _level(self, caller: str, now: float) -> float:
        level, when = self._buckets.get(caller, (self.capacity, now))
        return min(self.capacity, level + (now - when) * self.rate)

    def retry_after(self, caller: str) -> int | None:
        """None when the caller may start a request now, else whole seconds to wait."""
        if not self.enabled:
            return None
        with self._lock:
            now = self._clock()
            level = self._level(caller, now)
            self._buckets[caller] = (level, now)
            if level > 0:
                return None
            return max(1, math.ceil((1.0 - level) / self.rate))

    def charge(self, caller: str, tokens: int) -> None:
        if not self.enabled or tokens <= 0:
            return
        with self._lock:
            now = self._clock()
            self._buckets[caller] = (self._level(caller, now) - tokens, now)
            if len(self._buckets) > 10_000:  # forget callers whose buckets are full again
                full = [k for k, (lv, t) in self._buckets.items() if lv + (now - t) * self.rate >= self.capacity]
                for k in full:
                    del self._buckets[k]
