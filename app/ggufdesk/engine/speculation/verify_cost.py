"""What a step costs by its rows with logits on this machine, measured once per loaded model while the engine is idle.

A verification step evaluates [last] + k drafted tokens with logits on every row; a batched step
evaluates one row per running sequence plus their drafts. The cost is neither the plain step's
(one row) nor a straight line in the rows: on the 2-core CPU with the starter model every row with
logits pays for Gemma's 262k-word output head, and llama.cpp's CPU matrix product for it (a Q8_0
matrix) evidently takes the rows in pairs: an odd count of rows with logits costs about one more
pass over that head, 3 rows 48 ms but 4 rows 42, 5 rows 62 but 6 rows 53, 17 rows 119 but 16 rows
97 (1 row: 26 ms; with logits on one row only, the others, like a prompt's, add 3 ms each whatever
their count; an Intel Xeon host, 2026-12-04). SmolLM2-135M's
Q4_1 model grows by the same 3.4 ms per row, odd or even; on a GPU the rows cost little more than
one. So instead of assuming, the engine times every row count from 1 up to the draft rows
reserved at load (at most K max + 1), and the step loop (engine/speculation/step_cost.py,
planner.py) prices each draft length by the row count the whole step would have: alone a
sequence drafts 1, 3, 5 ... tokens (even rows), beside three other rows 2, 4 ... (an earlier table
of 1, 2, 4, 8 and 16 rows offered only k = 1, 3, 7, 15, which beside four decode rows always made
the step's count odd: drafting there cost nearly twice what it does at an even count).

A load with speculation on measures before it reports Loaded (about two seconds for the starter on 2
CPU cores: two rounds of 1 to 17 rows; rounds past the second only while the timed calls stay
within BUDGET_S, and larger row counts are skipped once the first round passes it and then never
drafted), so no first request waits for it. When a later request turns speculation on, the work is
cut into single decode calls (`Calibration.step`) that the worker runs while idle, so a request
arriving meanwhile waits for one call at most; cached prompt prefixes are dropped first (the
measurement needs an empty KV cache), which costs the next turn one full prefill, once. Either way
it times only while no other program takes a CPU its threads need (`Calibration`): on a busy
machine Loaded comes at once and the rest waits for a quiet moment while idle, at the settings'
thread counts (the key below), whatever the thread tuner runs then. Until it is measured the step
loop prices drafts by its prior (engine/speculation/step_cost.py).

The table is kept on disk (`stored`, `store`: the cache directory's verify_costs.json), keyed by
the model file, the settings that shape a decode call and the machine, so only the first load of a
model with those settings on this machine measures: a one-shot `ggufdesk run --lookup` then starts
its prompt as soon as the model is loaded (measuring before Loaded was the most of what lookup added
to a one-shot run's time to its first token). The table gives the cost curve's shape and the lengths
drafted; its level comes from the steps the engine actually runs (engine/speculation/step_cost.py),
so a table measured at another moment still serves.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _internals as internals

from ggufdesk.core.atomic import locked, write_atomic
from ggufdesk.engine.batching.runner import fill_batch
from ggufdesk.engine.runtime.native import LoadedModel

ROUNDS = (2, 5)  # rounds of every row count timed: at least, and at most while within the budget
# Once the timed calls took this long (a big model on a CPU), larger row counts are skipped: two
# rounds of 1-17 rows take the starter about 2.2 s on 2 cores, so it measures twice.
BUDGET_S = 2.5
# of the table (tables kept from an older one are measured again): 1 timed only 1, 2, 4, 8 and 16
# rows; 2 timed whatever else the machine ran (a neighbour during a round left k = 2 at 38 plain steps,
# k = 3 at 0.59, or only k <= 3 measured once the budget ran out, kept on disk for every later load)
VERSION = 3
TOKEN = 100  # any ordinary token: the cost does not depend on which
STORE_FILE = "verify_costs.json"
STORE_MAX = 64  # tables kept (the newest): one per model and settings in use is plenty


def _key(lm: LoadedModel, k_max: int) -> str:
    """What a table depends on: the model file, the settings that shape a decode call, the machine."""
    s = lm.settings
    try:
        st = os.stat(lm.path)
        file = f"{os.path.abspath(lm.path)}|{st.st_size}|{st.st_mtime_ns}"
    except OSError:
        file = lm.path
    top = max(1, min(k_max + 1, lm.n_outputs, s.n_batch))
    return "|".join(str(x) for x in (f"v{VERSION}", file, s.threads, s.threads_batch, s.n_gpu_layers, s.n_batch,
                                     s.n_ubatch, s.flash_attn, s.type_k, s.type_v, ",".join(s.rpc) if s.rpc else "",
                                     top, platform.node(), os.cpu_count()))


def _store_path() -> Path:
    from ggufdesk.core.hardware import cache_dir

    return cache_dir() / STORE_FILE


def _read_store() -> dict[str, Any]:
    try:
        data = json.loads(_store_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stored(lm: LoadedModel, k_max: int) -> dict[int, float] | None:
    """The table measured before for this model, these settings and this machine (None if none)."""
    table = _read_store().get(_key(lm, k_max))
    if not isinstance(table, dict):
        return None
    try:
        costs = {int(k): float(c) for k, c in table.items()}
    except (TypeError, ValueError):
        return None
    return costs if costs and all(k >= 1 and c > 0 for k, c in costs.items()) else None


def store(lm: LoadedModel, k_max: int, costs: dict[int, float]) -> None:
    """Keep a measured table for the next load (a full disk or a read-only cache only loses it)."""
    path = _store_path()
    try:
        with locked(path, best_effort=True):  # the engines of several models may measure at once
            data = _read_store()
            data.pop(_key(lm, k_max), None)
            data[_key(lm, k_max)] = {str(k): round(c, 4) for k, c in costs.items()}
            write_atomic(path, json.dumps(dict(list(data.items())[-STORE_MAX:]), indent=1))
    except OSError:
        pass


class Calibration:
    """Times verification calls of each row count on sequence 0 of an empty KV cache, one call per step.

    The calls go in rounds (1, 2, 3 ... rows, then again), each cost is the ratio to the one-row
    call of its own round, and the median over rounds counts: a busy moment on a shared machine
    slows one round, not one row count. Timed in blocks of two calls per row count instead, eight
    loads of the starter measured k = 7 at 2.83-4.21 plain steps and k = 15 at 4.84-6.63, enough to
    change which lengths the controller drafts (replayed on the suite at such tables, RAG and copy
    lost up to 7%); in five rounds, eight loads measured 3.29-3.58 and 5.47-5.79.

    A busy moment the CPU-load sensor sees (`quiet`: another program takes a CPU the settings'
    threads need, engine/batching/threads.py) throws its round away, and the measurement waits for
    the machine to be quiet: with two rounds a median cannot outvote one, and neighbours running
    through both (the other engines of bench/contention.py) left tables of three lengths at 0.6-2.1
    plain steps, or k = 2 at 38.
    """

    def __init__(self, lm: LoadedModel, k_max: int, quiet: Callable[[], bool | None] | None = None) -> None:
        top = max(1, min(k_max + 1, lm.n_outputs, lm.settings.n_batch))
        self.lm = lm
        self.quiet = quiet or (lambda: True)  # is the machine quiet (None: the sensor has not read yet)
        self.voided = 0  # rounds thrown away: another program took a CPU meanwhile
        self.busy = 0  # times it found the machine busy (the worker says so the first time)
        self._pending = False  # a round timed, waiting for the sensor's first reading to be kept
        self._all = list(range(1, top + 1))
        self.rows = list(self._all)
        self._todo = [1] + self.rows  # the first call only warms up
        self._warm = False
        self._round: dict[int, float] = {}  # rows -> seconds, this round
        self._ratios: dict[int, list[float]] = {r: [] for r in self.rows if r > 1}
        self.rounds = 0
        self._batch = internals.LlamaBatch(n_tokens=max(self.rows), embd=0, n_seq_max=1)
        self._mem = llama_cpp.llama_get_memory(lm.ctx.ctx)
        self.costs: dict[int, float] | None = None  # k -> seconds of a step drafting k / a plain step's
        self.spent = 0.0  # seconds of timed calls so far

    @property
    def done(self) -> bool:
        return not self._todo and not self._pending

    def step(self) -> bool:
        """One timed decode call (the KV cache must hold nothing else: the worker runs this idle).
        False, nothing timed, while the machine is not quiet, or while a round waits for the sensor's
        first reading: the worker waits and asks again."""
        if self.done:
            return True
        if not self.ready():
            return False
        if not self._todo:
            return True  # (ready() ended the round that waited for a reading, and with it the measurement)
        rows = self._todo.pop(0)
        fill_batch(self._batch, [(TOKEN, i, 0, True) for i in range(rows)])
        t = time.perf_counter()
        rc = llama_cpp.llama_decode(self.lm.ctx.ctx, self._batch.batch)
        # (a GPU computes after llama_decode returns; and llama.cpp counts a call's rows in its perf
        # timings only at a synchronize, else in the first request's `llama_perf`)
        llama_cpp.llama_synchronize(self.lm.ctx.ctx)
        dt = time.perf_counter() - t
        llama_cpp.llama_memory_seq_rm(self._mem, 0, -1, -1)
        if rc != 0:
            self._todo.clear()  # leave the controller on its prior
            return True
        if not self._warm:
            self._warm = True
            return True
        self._round[rows] = dt
        self.spent += dt
        if self.rounds == 0 and self.spent > BUDGET_S:  # finish this row count, skip the larger ones (never drafted)
            self.rows = [r for r in self.rows if r <= rows]
            self._todo = [r for r in self._todo if r <= rows]
        if not self._todo:  # the round is timed: kept once the sensor says it ran quiet
            self._pending = True
            return self.ready()
        return True

    def ready(self) -> bool:
        """May a call be timed now? Not while another program takes a CPU (the round so far is thrown
        away), nor while a timed round waits for the sensor's first reading (it comes a PERIOD after
        the sensor starts: the whole measurement of a small model, or on a GPU, can be shorter)."""
        verdict = self.quiet()
        if verdict is False:
            self.busy += 1
            self._void()
            return False
        if self._pending:
            if verdict is None:
                return False
            self._pending = False
            self._end_round()
        return True

    def _void(self) -> None:
        """Throw the round so far away (its one-row call may predate the neighbour) and its budget
        cut with it: a busy round passes the budget where a quiet one would not."""
        if not self._warm:
            return  # nothing timed yet
        self.voided += bool(self._round)
        self.spent -= sum(self._round.values())
        self._round, self._pending = {}, False
        if self.rounds == 0:
            self.rows = list(self._all)
        self._todo = list(self.rows)

    def _end_round(self) -> None:
        one = self._round[1]
        for r, dt in self._round.items():
            if r > 1:
                self._ratios[r].append(dt / one)
        self.rounds += 1
        round_s = sum(self._round.values())
        self._round = {}
        if self.rounds < ROUNDS[0] or (self.rounds < ROUNDS[1] and self.spent + round_s <= BUDGET_S):
            self._todo = list(self.rows)
            return
        self.costs = {r - 1: statistics.median(v) for r, v in self._ratios.items() if v}
