"""Token buckets per caller (API key or client address), in prompt + generated tokens per minute."""
from __future__ import annotations

import math
import threading
import time
from typing import Callable


class RateLimiter:
    """A bucket per caller holding up to `tokens_per_min`, refilled continuously.

    A request reserves what it may use when it is admitted (its prompt, estimated, plus max_tokens) and
    is refused while the bucket holds less; when it ends, what it did not use is given back and what it
    used beyond the estimate is taken. (Charging only at the end let 60 concurrent requests through a
    100-token limit: none had ended when the others were admitted, issue 34.) A request larger than the
    whole bucket runs only on a full one, and the caller is then in debt until it refills.
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

    def reserve(self, caller: str, tokens: int) -> int | None:
        """Take `tokens` from the caller's bucket and return None, or return the whole seconds to wait
        (nothing taken) while it holds less than min(tokens, the whole bucket)."""
        if not self.enabled:
            return None
        need = min(float(max(tokens, 1)), self.capacity)
        with self._lock:
            now = self._clock()
            level = self._level(caller, now)
            if level < need:
                self._buckets[caller] = (level, now)
                return max(1, math.ceil((need - level) / self.rate))
            self._buckets[caller] = (level - tokens, now)
            self._forget_full(now)
        return None

    def settle(self, caller: str, reserved: int, used: int) -> None:
        """A request that reserved `reserved` tokens used `used`: give back the difference (or take it)."""
        self._adjust(caller, reserved - used)

    def retry_after(self, caller: str) -> int | None:
        """None when the caller's bucket is above zero, else whole seconds until it is."""
        if not self.enabled:
            return None
        with self._lock:
            now = self._clock()
            level = self._level(caller, now)
            self._buckets[caller] = (level, now)
            return None if level > 0 else max(1, math.ceil((1.0 - level) / self.rate))

    def charge(self, caller: str, tokens: int) -> None:
        """Take `tokens` with no reservation (the level may go below zero)."""
        self._adjust(caller, -tokens)

    def _adjust(self, caller: str, delta: int) -> None:
        if not self.enabled or delta == 0:
            return
        with self._lock:
            now = self._clock()
            self._buckets[caller] = (min(self.capacity, self._level(caller, now) + delta), now)

    def _forget_full(self, now: float) -> None:
        if len(self._buckets) > 10_000:  # forget callers whose buckets are full again
            full = [k for k, (lv, t) in self._buckets.items() if lv + (now - t) * self.rate >= self.capacity]
            for k in full:
                del self._buckets[k]
