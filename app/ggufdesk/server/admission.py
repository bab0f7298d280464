"""Admission control: a fixed number of running requests, a bounded FIFO queue behind them, and a memory guard."""
from __future__ import annotations

import asyncio
import collections
import math
import time
from typing import Callable

import psutil

from ggufdesk.server.errors import ApiError


def low_memory(*, gpu: bool = False) -> str | None:
    """A reason to refuse new work when free RAM (or VRAM) is under the planner's margin, else None."""
    from ggufdesk.core.planner import RAM_MARGIN, VRAM_MARGIN

    vm = psutil.virtual_memory()
    margin = max(RAM_MARGIN[0], int(vm.total * RAM_MARGIN[1]))
    if vm.available < margin:
        return (f"the server is low on memory ({vm.available / 2**30:.1f} GiB free, "
                f"keeping {margin / 2**30:.1f} GiB in reserve); try again later")
    if gpu:
        from ggufdesk.core.hardware import probe_nvidia

        for g in probe_nvidia()[0]:
            margin = max(VRAM_MARGIN[0], int(g.vram_total * VRAM_MARGIN[1]))
            if g.vram_free < margin:
                return (f"GPU {g.index} is low on memory ({g.vram_free / 2**30:.1f} GiB free, "
                        f"keeping {margin / 2**30:.1f} GiB in reserve); try again later")
    return None


class MemoryGuard:
    """low_memory(), asked at most once per `interval` seconds (NVML is too slow to ask per request)."""

    def __init__(self, *, gpu: bool = False, interval: float = 1.0) -> None:
        self.gpu = gpu
        self.interval = interval
        self._at = -1e9
        self._answer: str | None = None

    def __call__(self) -> str | None:
        now = time.monotonic()
        if now - self._at >= self.interval:
            self._answer, self._at = low_memory(gpu=self.gpu), now
        return self._answer


class Admission:
    """`slots` requests run at once; up to `max_queue` more wait in arrival order; beyond that, 503.

    Used from one event loop. `retry_after` for a refused request is a guess from the recent mean
    request time and the number ahead of it.
    """

    def __init__(self, *, slots: int, max_queue: int,
                 memory_check: Callable[[], str | None] | None = None) -> None:
        if slots < 1 or max_queue < 0:
            raise ValueError("slots must be at least 1 and the queue cannot be negative")
        self.slots = slots
        self.max_queue = max_queue
        self.memory_check = memory_check or MemoryGuard()
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._mean_s = 5.0  # running mean of request time, for Retry-After

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def retry_after(self) -> int:
        ahead = self.running + self.queued
        return max(1, min(60, math.ceil(self._mean_s * ahead / self.slots)))

    async def acquire(self) -> None:
        """Wait for a slot, in order; raises ApiError(503) when the queue is full or memory is low."""
        why = self.memory_check()
        if why:
            raise ApiError(503, why, code="low_memory", retry_after=self.retry_after(), reason="low_memory")
        if self.running < self.slots and not self._waiters:
            self.running += 1
            return
        if len(self._waiters) >= self.max_queue:
            raise ApiError(503, f"the server is busy ({self.running} running, {self.queued} waiting); "
                                "try again later", code="overloaded", retry_after=self.retry_after(),
                           reason="overloaded")
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # release() hands its slot over by resolving us
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot arrived as we gave up: pass it on
            else:
                self._waiters.remove(fut)
            raise

    def release(self, seconds: float | None = None) -> None:
        if seconds is not None:
            self._mean_s = 0.8 * self._mean_s + 0.2 * seconds
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes straight to the next in line
                return
        self.running = max(0, self.running - 1)
