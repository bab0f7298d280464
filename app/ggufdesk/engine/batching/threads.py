"""Threads that fit the machine as it is: fewer when another program takes a core, more when it leaves.

llama.cpp's threads spin-wait for each other at every operation, so when another program takes a
core, a decode with threads = cores waits for the descheduled thread every time: measured on the
starter (2 cores), quiet 2 threads 47 tok/s vs 1 thread 25; with one busy loop beside it 2 threads
16.8 vs 1 thread 24.9, and in `bench/contention.py` 0.8 vs 39.9 (each 2-thread step ~1.25 s).

Two signals. The ceiling comes from a sensor (`cpu_load.CpuLoad`): the CPUs other programs leave
free, read from CPU times before every step, caps the count at once, with no window of steps: step
times alone could not meet the target, because a tuner that must see slow steps before it acts pays
~1.25 s per collapsed step (more than a whole 128-token answer at 1 thread, ~3 s), and a neighbour
there from the start shows no slowdown at all until a probe. When the ceiling rises (the neighbour
left), a probe of one thread more starts at once and a window of step times judges it.

Below the ceiling, step times decide, for what the sensor cannot see (memory-bandwidth contention,
SMT siblings, a platform without the sensor): `ThreadTuner` reads them normalised by what the batch
explains (`units`), each compared only with steps of its kind (the same run of KV_PAD cells, prompt rows
or none: `Threads.observe`), and when they slow down beyond SLOW x the best seen at the current count, tries
one thread fewer for a window of steps and keeps whichever was faster. Every `gap` steps it probes
one thread more the same way, or at the ceiling one fewer (contention the sensor does not see leaves
no slowdown to notice when it was there from the start; GAP_SENSED steps apart where the sensor
reads, GAP_FIRST where it cannot); a probe that loses doubles the gap, up to GAP_MAX. llama.cpp
runs one-row batches on `n_threads` and larger ones on `n_threads_batch`, so the engine keeps one
tuner for each (`Threads`), and `llama_set_n_threads` sets both between steps. While the engine
waits for work the sensor reads on (`idle`), so a request sees what the others do now. A fixed
thread count (`--threads`) turns both signals off.
"""
from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ggufdesk.engine.batching.cpu_load import CpuLoad

WINDOW = 6  # steps timed per thread count before comparing: a median of 6 shrugs off one stalled step
SLOW = 1.3  # steps this much slower than the best seen at the count are not explained by the batch
# (a neighbour on one of two cores moved it by 2.8x; one failed try at this ratio costs WINDOW steps and
# raises the bar) nor by the context: the best is kept per KV_PAD cells, see below
# llama.cpp attends to the KV cache's cells in runs of 256 (n_kv is padded to it), so a step past a multiple
# of 256 cells attends to 256 more at once. Measured (2 threads, FA auto): SmolLM2 135M's decode step at
# 257-289 cells is 1.19x its step at 40-69 cells (1.10x up to 255, the jump 1.08x), the starter's 1.11x.
# Against the best seen since the answer began (a minimum, so it sits low), that read as a neighbour: a
# quiet machine tried one thread fewer at the 256-cell edge in 6 of 10 answers of 229-246 tokens. With
# flash attention the count changes llama.cpp's sums over the cells past 256 in the last bits, so those
# tries also changed greedy answers from run to run (docs/engine.md). The best is therefore the best
# seen within the current run of KV_PAD cells.
KV_PAD = 256
# steps between tries of one thread more, doubled after every losing try: a losing try costs WINDOW
# steps at the slower count (beside a busy loop 6 x (1/16.8 - 1/24.9) s = 0.12 s against 32 steps' 1.3 s,
# 9% at first, halving with every doubling), a winning one regains the full speed within 32 steps
GAP_FIRST = 32
# ... and where the CPU-load sensor watches: it already drops the count the moment a neighbour takes a
# core and probes up the moment one leaves, so the periodic probe only looks for what it cannot see
# (memory bandwidth, SMT siblings: slowdowns, not collapses). Each probe costs the quiet machine WINDOW
# slower steps (6 x (1/37 - 1/59) s = 0.06 s on the starter), 5% of a 128-token answer at a gap of 32
# (bench/contention.py, no busy loop: 0.91 of fixed 2 threads); at 128, a quarter of that
GAP_SENSED = 128
GAP_MAX = 1024  # ... up to this (about a minute of decoding at 20 tok/s)
ROW_SHARE = 0.5  # a decode row beside others costs about half a one-row step (measured 0.54-0.59)
PROMPT_SHARE = 0.1  # a prompt row without logits: prefill runs ~10x as many tokens per second as decode


def units(rows: int, n_prompt: int) -> float:
    """What a step's rows cost in one-row steps, as a model: how much of its time the batch explains."""
    decode = rows - n_prompt
    decode_units = 1.0 + ROW_SHARE * (decode - 1) if decode else 0.0
    return max(1.0, decode_units + PROMPT_SHARE * n_prompt)


class ThreadTuner:
    """The thread count for one kind of step, chosen from its measured times.

    `observe(seconds per unit, kind)` after each step; `n` is the count to use for the next. A trial runs
    WINDOW steps at another count and is kept when its median beats the median before it.
    """

    def __init__(self, n_max: int, *, fixed: bool = False, gap_first: int = GAP_FIRST) -> None:
        self.n_max = max(1, n_max)
        self.fixed = fixed
        self.n = self.n_max
        self.ceiling = self.n_max  # the most the CPUs other programs leave free allow (`limit`)
        self.times: list[float] = []  # normalised seconds at n since it was last set
        self.best: dict[int, float] = {}  # per count, the best window median seen (its quiet speed)
        self.trial_from: tuple[int, float] | None = None  # during a trial: (the count before, its median)
        self.since = 0  # steps since the count last changed
        self.gap = self.gap_first = gap_first
        self.changes = 0
        self.kind: Hashable = 0  # what makes steps alike (`Threads.observe`: their run of KV_PAD cells, ...)

    def observe(self, t: float, kind: Hashable = 0) -> None:
        """A step's seconds per unit, and what it is like (steps of another `kind` are not compared with it)."""
        if self.fixed or t <= 0:
            return
        if kind != self.kind:  # steps of another kind: every count's quiet speed is to be seen again,
            self.kind = kind  # from steps of this kind only
            self.best.clear()
            if self.trial_from is None:
                self.times = []
            # else a trial's window runs on: a long prompt's chunks cross an edge every step, so a window
            # started again at each would never be judged, and a trial of one thread fewer begun just
            # before the prompt read all of it at that count (bench/prefill_threads.py). Steps of the
            # dearer kind (more cells, prompt rows) count against the trial: kept only where faster still

        self.times.append(t)
        self.since += 1
        if len(self.times) < WINDOW:
            return
        med = statistics.median(self.times[-WINDOW:])
        if self.trial_from is not None:
            self._judge(med)
        elif self.n > 1 and med > SLOW * self.best.get(self.n, med):
            self._try(self.n - 1, med)
        elif self.since >= self.gap and self._probe() != self.n:
            self._try(self._probe(), med)
        else:
            self.best[self.n] = min(self.best.get(self.n, med), med)
            self.times = self.times[-WINDOW:]

    def _probe(self) -> int:
        """One more (the neighbour may have left), or at the ceiling one fewer (contention the sensor
        does not see, there from the start)."""
        return self.n + 1 if self.n < self.ceiling else max(1, self.n - 1)

    def limit(self, free: int) -> None:
        """The CPUs other programs leave free now: above them, drop at once; when they rise, probe
        one more at once (step times judge it after a window)."""
        if self.fixed:
            return
        ceiling = max(1, min(self.n_max, free))
        rose, self.ceiling = ceiling > self.ceiling, ceiling
        if self.trial_from is not None and self.trial_from[0] > ceiling:
            self.trial_from = None  # the count a trial would go back to is no longer allowed
        if self.n > ceiling:
            self.trial_from = None
            self._set(ceiling)
        elif rose and self.n < ceiling and self.trial_from is None:
            # judged against this count's window so far, else its best, else unknown: kept
            now = statistics.median(self.times[-WINDOW:]) if self.times else self.best.get(self.n, math.inf)
            self._try(self.n + 1, now)

    def _try(self, n: int, med: float) -> None:
        self.trial_from = (self.n, med)
        self._set(n)

    def _judge(self, med: float) -> None:
        before, before_med = self.trial_from or (self.n, med)
        self.trial_from = None
        if med < before_med:  # the trial was faster: keep it
            self.best[self.n] = med
            self.gap, self.since, self.times = self.gap_first, 0, []
            return
        self._set(before)
        # the count we came back to may be slower than its best, but the other count did not help: its
        # time now is the new normal (a long context, a busy machine for every count alike)
        self.best[before] = before_med
        self.gap = min(2 * self.gap, GAP_MAX)

    def _set(self, n: int) -> None:
        self.changes += self.n != n
        self.n, self.times, self.since = n, [], 0


class Threads:
    """The engine's decode (one-row steps) and batch (multi-row steps) thread counts, tuned from step
    times and applied between steps by `apply(n_threads, n_threads_batch)` (llama_set_n_threads)."""

    def __init__(self, n_threads: int, n_threads_batch: int, *, fixed: bool,
                 apply: Callable[[int, int], None], load: CpuLoad | None = None) -> None:
        self.sensor = load  # the CPUs other programs leave free, read also where the counts are fixed (`quiet`)
        self.load = None if fixed else load  # ... and what tunes the counts (None: step times only)
        gap = GAP_FIRST if self.load is None else GAP_SENSED
        self.decode = ThreadTuner(n_threads, fixed=fixed, gap_first=gap)
        self.batch = ThreadTuner(n_threads_batch, fixed=fixed, gap_first=gap)
        self.apply = apply
        self.full = (n_threads, n_threads_batch)  # the counts the settings ask for
        self._applied = self.full

    @property
    def now(self) -> tuple[int, int]:
        return self.decode.n, self.batch.n

    def observe(self, rows: int, n_prompt: int, seconds: float, cells: int = 0) -> None:
        """One step's rows (of them prompt rows), seconds and the KV cells in use after it; sets new counts
        before the next step."""
        if rows <= 0:
            return
        # alike: the same run of KV_PAD cells, and prompt rows or none. A prompt row's price grows with the
        # cells it attends to, and PROMPT_SHARE does not: SmolLM2 at 4,096-4,351 cells read prompt chunks of
        # 32-96 rows at 54-84 ms a unit where the 4-row decode steps before them took 24-28, so a prompt
        # arriving beside decoding sequences tried one thread fewer for WINDOW steps (0.33-0.45 s each there)
        kind = (cells // KV_PAD, n_prompt > 0)
        (self.decode if rows == 1 else self.batch).observe(seconds / units(rows, n_prompt), kind)
        self._apply()

    def prepare(self) -> None:
        """Before a step: the CPUs other programs leave free cap both counts (`CpuLoad`)."""
        free = None if self.load is None else self.load.free()
        if free is not None:
            self.decode.limit(free)
            self.batch.limit(free)
            self._apply()

    @property
    def sensing(self) -> bool:
        """Whether idle() has a sensor to keep fresh (threads left to the engine, psutil present)."""
        return self.load is not None

    def idle(self) -> None:
        """While the engine waits for work, every PERIOD: keep the sensor's interval recent, so the first
        reading of the next request says what other programs do now, not what they did over the whole
        wait (another engine's answer, a build that has ended: bench/contention.py's quiet condition
        started at 1 thread after the loud ones, 0.81 of fixed 2 threads)."""
        if self.load is not None:
            self.load.read()

    def quiet(self) -> bool | None:
        """Do other programs leave the settings' threads their CPUs now (True where nothing can read
        it; None until the sensor's first reading)? What engine/speculation/verify_cost.py's
        measurement waits for: a table timed beside a neighbour is that moment's, not this machine's,
        and it is kept on disk."""
        if self.sensor is None:
            return True
        free = self.sensor.free()
        if free is None:
            return None if self.sensor.reading else True
        return free >= min(max(self.full), self.sensor.cpus)  # (more threads than CPUs: all of them)

    @contextlib.contextmanager
    def at_full(self) -> Iterator[None]:
        """Run the settings' counts inside (a measurement keyed by them), the tuned ones again after."""
        self.apply(*self.full)
        try:
            yield
        finally:
            self.apply(*self._applied)

    def _apply(self) -> None:
        if self.now != self._applied:
            self._applied = self.now
            self.apply(*self.now)
