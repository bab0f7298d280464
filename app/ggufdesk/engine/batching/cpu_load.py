"""The cores other programs keep busy, read from CPU times: the thread tuner's ceiling (threads.py).

Step times alone react too late: beside one busy loop on the 2-core test machine a 2-thread decode
step of the starter takes ~1.25 s, so a tuner that needs windows of steps to notice spends seconds
there, and within a 128-token answer even one such step costs more than the whole answer at 1 thread
(~3 s). This reads the cause instead: the system's busy CPU time minus this process's own (which
includes llama.cpp's spinning threads), over the wall time since the last sample, is the cores the
others take. Sampled at step boundaries, at most every PERIOD; the first interval runs from the
start of the model's load (or the engine's last step), so a neighbour that was there all along is
seen before the first step of a request, and before the verification cost is measured
(engine/speculation/verify_cost.py).
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

from ggufdesk.core.cpus import affinity

log = logging.getLogger("ggufdesk.engine")

# seconds of wall time between samples: the system's CPU times count in 10 ms ticks, so a quarter
# second on 2 cores reads to within ~0.05 core; a collapsed step lasts ~1.25 s, so it is seen at its end
PERIOD = 0.25
# hysteresis: others take the k-th core at k - 1 + TAKE cores and give it back below k - 1 + FREE.
# A neighbour that owns a core reads 0.67-1.0 beside 2 spinning threads (the scheduler shares 2 cores
# among 3 threads), so TAKE must be under 0.67; at half a core it deschedules one of our threads half
# the time, which already costs about what the second thread gains (47 vs 25 tok/s quiet), so TAKE
# is 0.5; the 0.2 band keeps a neighbour wandering around half a core from switching us every sample
TAKE = 0.5
FREE = 0.3
NEGATIVE = -0.5  # a reading below this is inconsistent (counters reset, a clock jumped): ignored

Reader = Callable[[], float]


def busy_cpu_reader(cpus: frozenset[int] | None = None) -> Reader | None:
    """The busy CPU seconds of the CPUs in `cpus` (None: all of them), or None where psutil cannot
    read them.

    Busy is everything but idle and I/O wait; time of niced processes ("nice") counts only while this
    process is niced too: a niced neighbour yields its core to us, so it soaks up only what we leave
    (read as taken, it would keep us at 1 thread forever beside a nice 19 build). Only the CPUs this
    process may run on (`taskset`, a container's cpuset): a neighbour on the others takes nothing
    from us, and counted against ours it would drop threads we can keep."""
    try:
        import psutil

        per_cpu = len(psutil.cpu_times(percpu=True))
        niced = psutil.Process().nice() > 0
    except Exception as e:  # noqa: BLE001 - no psutil, or a platform it cannot read
        log.debug("no CPU load reading (%s): threads follow step times only", e)
        return None
    skip = {"idle", "iowait", "guest", "guest_nice"} | (set() if niced else {"nice"})  # guest: inside user
    # psutil lists online CPUs in order; where some are offline an index is not a CPU's number, and
    # the whole machine is read instead
    ours = sorted(cpus) if cpus and max(cpus) < per_cpu and len(cpus) < per_cpu else None

    def busy() -> float:
        if ours is None:
            t = [psutil.cpu_times()._asdict()]
        else:
            every = psutil.cpu_times(percpu=True)
            t = [every[i]._asdict() for i in ours]
        return float(sum(v for d in t for k, v in d.items() if k not in skip))
    return busy


def logical_cpus(cpus: frozenset[int] | None = None) -> int:
    """The CPUs the scheduler shares among everyone, which the busy time is measured against.

    Logical, not the physical cores the engine's thread count starts from: spinning threads collapse
    when they are descheduled, which happens only when busy threads outnumber logical CPUs; a
    neighbour on an idle SMT sibling slows one of ours without descheduling it (the step times see
    that). On a machine without SMT, as the 2-core one measured, the two are the same. Only those
    this process may run on (`cpus`, its affinity) where it is restricted."""
    return max(1, len(cpus) if cpus else os.cpu_count() or 1)


class CpuLoad:
    """Cores taken by other programs, from injected readers: busy() the system's busy CPU seconds,
    own() this process's CPU seconds, clock() wall seconds."""

    def __init__(self, cpus: int, busy: Reader, *, own: Reader = time.process_time,
                 clock: Reader = time.monotonic) -> None:
        self.cpus = max(1, cpus)
        self.busy, self.own, self.clock = busy, own, clock
        self.taken: int | None = None  # whole cores others hold (with hysteresis); None: no reading yet
        self.last: float | None = None  # the latest reading, in cores
        self._sample: tuple[float, float, float] | None = None  # (wall, busy, own) at the last sample
        self._told = False
        self.started = clock()
        self.read()

    @property
    def reading(self) -> bool:
        """Is a first reading still to come (within two PERIODs of the start)? After that, a sensor
        without one cannot read this machine, and callers go on without it."""
        return self.taken is None and self.clock() - self.started < 2 * PERIOD

    @classmethod
    def of_this_machine(cls) -> CpuLoad | None:
        cpus = affinity()
        busy = busy_cpu_reader(cpus)
        return None if busy is None else cls(logical_cpus(cpus), busy)

    def free(self) -> int | None:
        """CPUs the others leave free now (sampled if PERIOD has passed), None while unknown."""
        self.read()
        return None if self.taken is None else self.cpus - self.taken

    def read(self) -> None:
        now = self.clock()
        if self._sample is not None and now - self._sample[0] < PERIOD:
            return
        try:
            sample = (now, float(self.busy()), float(self.own()))
        except Exception as e:  # noqa: BLE001 - a failed read leaves the last reading standing
            if not self._told:
                log.debug("CPU load reading failed (%s)", e)
                self._told = True
            return
        if not all(math.isfinite(v) for v in sample):
            return
        before, self._sample = self._sample, sample
        if before is not None:
            self._take(before, sample)

    def _take(self, before: tuple[float, float, float], now: tuple[float, float, float]) -> None:
        wall, busy, own = (a - b for a, b in zip(now, before, strict=True))
        if wall <= 0 or busy < 0 or own < 0:
            return  # a counter or clock went backwards: this interval says nothing
        others = (busy - own) / wall
        if others < NEGATIVE:
            return
        self.last = others = min(max(others, 0.0), float(self.cpus))
        hi, lo = math.floor(others + 1 - TAKE), math.floor(others + 1 - FREE)
        taken = hi if self.taken is None else min(max(self.taken, hi), lo)
        if taken != self.taken:
            log.debug("other programs take %.2f CPUs: %d of %d free", others, self.cpus - taken, self.cpus)
        self.taken = taken
