"""Verification cost measured on this machine (engine/speculation/verify_cost.py) and drafting only measured lengths."""
from __future__ import annotations

import json
import queue

import pytest

from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.speculation.adaptive import DraftLength
from ggufdesk.engine.runtime.worker import CancelBook, Engine

CPU = {1: 1.7, 3: 2.2, 7: 4.5, 15: 6.9}  # the starter on the 2-core CPU, in plain steps
GPU = {1: 1.02, 3: 1.04, 7: 1.08, 15: 1.15}


def controller(costs, k_max=16) -> DraftLength:
    c = DraftLength(k_min=1, k_max=k_max, adaptive=True, label="lookup", sizes_drafts=True, costs=costs)
    for _ in range(3):
        c.feedback(0, 0, 0.010)  # plain steps of 10 ms
    return c


def test_only_measured_lengths_are_drafted_and_the_table_decides_whether_at_all():
    cpu, gpu = controller(CPU), controller(GPU)
    assert cpu.lengths() == [1, 3, 7, 15] and cpu.lengths(8) == [1, 3, 7]
    # a passage being copied (97% per token): both draft; the CPU's 16-row step is worth it only there
    assert cpu.worth(0.97, 16) == 15 and gpu.worth(0.97, 16) == 15
    # a likely but not certain continuation (80%): short on the CPU, long on the GPU
    assert cpu.worth(0.8, 16) == 3 and gpu.worth(0.8, 16) >= 7
    # free text (50%): the CPU drafts nothing, the GPU still a little
    assert cpu.worth(0.5, 16) == 0 and gpu.worth(0.5, 16) >= 1
    assert cpu.worth(0.97, 2) == 1  # only 2 tokens to copy: the longest measured length that fits


def test_costs_between_and_beyond_measured_lengths_are_interpolated():
    c = controller(CPU)
    assert c.ratio(3) == 2.2 and abs(c.ratio(5) - (2.2 + (4.5 - 2.2) / 2)) < 1e-9
    assert abs(c.ratio(0) - 1.0) < 1e-9 and c.ratio(16) > c.ratio(15)
    assert abs(c.step_cost(7) - 0.045) < 1e-9


def test_measured_steps_scale_the_table_within_bounds():
    c = controller(CPU)
    for _ in range(4):
        c.feedback(3, 3, 0.010 * 2.2 * 1.5)  # the machine got busier: steps 1.5x the table
    assert abs(c.correction() - 1.5) < 1e-6
    for _ in range(20):
        c.feedback(3, 3, 0.010 * 2.2 * 10)
    assert c.correction() == 2.0  # bounded: one stalled stretch cannot switch drafting off for good


def test_without_a_table_the_line_prior_applies():
    c = controller(None)
    assert c.lengths() == list(range(1, 17)) and c.costs is None


def test_lengths_outside_the_request_s_bounds_are_ignored():
    c = DraftLength(k_min=2, k_max=8, adaptive=True, label="draft", costs=CPU)
    assert c.lengths() == [3, 7] and c._k in (3, 7)  # (k itself is 0 until a plain step was timed)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The machine read as quiet: the measurement waits for that (tested on its own below), and these
    tests must pass on a busy one too."""
    from ggufdesk.engine.batching.threads import Threads

    monkeypatch.setattr(Threads, "quiet", lambda self: True)


@pytest.fixture
def unhurried(monkeypatch):
    """No time budget for the measurement: on a busy machine the real one (2.5 s) can run out in the
    first round and leave the larger row counts unmeasured (the budget itself is tested on a fake clock)."""
    from ggufdesk.engine.speculation import verify_cost

    monkeypatch.setattr(verify_cost, "BUDGET_S", float("inf"))


def test_a_load_with_speculation_measures_before_it_reports_loaded(tiny_model, unhurried):
    events: list = []
    engine = Engine(events.append, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256),
                       speculation=SpeculationSettings(mode="lookup", k_max=8)))
    assert any(isinstance(e, P.Loaded) for e in events), events
    costs = engine.verify_costs
    assert costs is not None and sorted(costs) == list(range(1, 9))  # rows 2 ... 9: up to K max + 1
    assert all(c > 0 for c in costs.values()) and engine._calibration is None
    assert engine.batch.slots.used == 0  # nothing of the measurement is left in the KV cache
    assert engine.batch.drafts.costs.lengths(16) == list(range(1, 9))  # the step loop prices drafts with it
    engine.unload(quiet=True)
    assert engine.verify_costs is None


def test_loaded_s_load_time_counts_the_measurement_it_waited_for(tiny_model, unhurried, monkeypatch):
    """`load_s` (`ggufdesk run --json`, "loaded in ... s") was the model file's open alone: 0.15 s
    where the first `ggufdesk run --lookup` waited 2 s more for the measurement."""
    import time

    from ggufdesk.engine.speculation import verify_cost

    calls, step = [0], verify_cost.Calibration.step

    def slow(self: verify_cost.Calibration) -> bool:  # a lower bound only: a busy machine adds to it
        calls[0] += 1
        time.sleep(0.01)
        return step(self)

    monkeypatch.setattr(verify_cost.Calibration, "step", slow)
    events: list = []
    engine = Engine(events.append, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256),
                       speculation=SpeculationSettings(mode="lookup", k_max=8)))
    loaded = [e for e in events if isinstance(e, P.Loaded)]
    assert loaded and calls[0] > 10, (events, calls)
    assert loaded[0].load_s >= 0.01 * calls[0] + engine.lm.load_s - 0.001
    engine.unload(quiet=True)


def test_the_first_request_s_llama_perf_counts_its_own_rows_not_the_measurement_s(tiny_model, unhurried):
    """llama.cpp adds a decode call's rows to its perf counters only at a synchronize: unsynchronized,
    the measurement's rows (about a hundred here) landed in the first request's `llama_perf`
    (`ggufdesk run --lookup --json`: 524 prompt tokens for a prompt of 53)."""
    events: list = []
    engine = Engine(events.append, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256),
                       speculation=SpeculationSettings(mode="lookup", k_max=8)))
    assert engine.verify_costs is not None  # measured before Loaded
    engine.generate(P.Generate(id="r", prompt="the cat sat on the mat", sampling=SamplingSettings(
        temperature=0, max_tokens=4)))
    while engine.batch.busy:
        engine.batch.step()
    stats = [e for e in events if isinstance(e, P.Stats) and e.id == "r"][-1]
    perf = stats.llama_perf
    assert perf, stats  # alone: llama.cpp's timings are the request's own
    # its prompt, then each multi-row step's rows: at most one per drafted token and one more per step
    assert 0 < perf["prompt_tokens"] <= stats.n_prompt + stats.drafted + stats.n_gen, (perf, stats)
    engine.unload(quiet=True)


def test_measuring_later_runs_while_idle_and_yields_to_requests(tiny_model, unhurried):
    engine = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256)))
    assert engine._calibration is None  # speculation off: nothing measured
    from ggufdesk.core.settings import SpeculationSettings

    engine._drafter(SpeculationSettings(mode="lookup", k_max=8), [1, 2, 3], 8)  # a request turns it on
    assert engine._calibration is not None and engine.verify_costs is None
    inbox: queue.Queue = queue.Queue()
    inbox.put(P.Ping(id="p"))
    assert isinstance(engine.next_request(inbox), P.Ping)  # a request comes before the measurement
    assert engine._calibration is not None
    while engine._calibration is not None:
        engine._calibrate_step()
    # the rows reserved at load (K max 16 by default) bound it, not the request's K max
    assert engine.verify_costs is not None and sorted(engine.verify_costs) == list(range(1, 17))
    engine.unload(quiet=True)


def test_a_slow_machine_stops_measuring_at_the_budget_and_drafts_only_what_it_measured(tiny_model, monkeypatch):
    from ggufdesk.engine.speculation import verify_cost

    monkeypatch.setattr(verify_cost, "BUDGET_S", 0.0)  # every call is over budget
    engine = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256),
                       speculation=SpeculationSettings(mode="lookup", k_max=8)))
    assert engine.verify_costs == {}  # only plain steps were timed: no draft length is known
    c = DraftLength(k_min=1, k_max=8, adaptive=True, label="lookup", costs=engine.verify_costs)
    assert c.costs is None  # ... so the controller falls back to its line
    engine.unload(quiet=True)


class FakeClock:
    """llama_decode that takes `base * (1 + 0.3 * (rows - 1))` seconds of a fake clock, times `slow`
    for the calls listed there (by their index, the warm-up call being 0)."""

    def __init__(self, slow: dict[int, float]) -> None:
        self.now, self.calls, self.slow = 0.0, 0, slow

    def perf_counter(self) -> float:
        return self.now

    def decode(self, ctx, batch) -> int:
        rows = batch.n_tokens
        self.now += 0.01 * (1 + 0.3 * (rows - 1)) * self.slow.get(self.calls, 1.0)
        self.calls += 1
        return 0


def calibrate(monkeypatch, tiny_model, slow: dict[int, float], budget: float = 1.5, busy_at: tuple[int, ...] = ()):
    """A calibration on the fake clock; the CPU-load sensor reads busy when asked before the calls
    listed in `busy_at` (by index), once each (the neighbour gone at the next reading)."""
    import types

    import llama_cpp

    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.speculation import verify_cost
    from ggufdesk.engine.runtime.native import LlamaLog, load_model

    lm = load_model(str(tiny_model), LoadSettings(n_ctx=256), LlamaLog(), n_outputs=17)
    clock = FakeClock(slow)

    class Llama:  # the module's llama_cpp, with the fake decode (nothing else sees it)
        llama_decode = staticmethod(clock.decode)

        def __getattr__(self, name):
            return getattr(llama_cpp, name)

    monkeypatch.setattr(verify_cost, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(verify_cost, "llama_cpp", Llama())
    monkeypatch.setattr(verify_cost, "BUDGET_S", budget)
    try:
        waiting = set(busy_at)

        def quiet() -> bool:
            if clock.calls in waiting:
                waiting.discard(clock.calls)
                return False
            return True

        cal = verify_cost.Calibration(lm, 16, quiet)
        while not cal.done:
            cal.step()
        return cal, clock
    finally:
        lm.close()


def test_a_busy_moment_slows_a_round_not_a_row_count(monkeypatch, tiny_model):
    """Rounds of 1, 2, 3 ... 17 rows, each cost taken against its own round's one-row call, the median
    over rounds: a whole round three times slower (the machine got busy) and one stalled call change
    nothing (timed in blocks per row count, they would have moved k = 1 and k = 7)."""
    n = 17  # row counts per round: 1 ... K max + 1
    # calls: 0 warms up; round r (0-based) is calls 1 + n r .. n + n r, in the order 1, 2, 3 ... rows
    slow = {1 + n * 1 + i: 3.0 for i in range(n)}  # round 2, every call
    slow[1 + n * 3 + 7] = 4.0  # round 4, the 8-row call
    slow[1 + n * 0 + 1] = 2.0  # round 1, the 2-row call
    cal, clock = calibrate(monkeypatch, tiny_model, slow, budget=100.0)
    assert cal.rounds == 5 and clock.calls == 1 + 5 * n
    assert cal.costs is not None and sorted(cal.costs) == list(range(1, 17))
    for k, c in cal.costs.items():
        assert abs(c - (1 + 0.3 * k)) < 1e-9, (k, c)


def test_rounds_past_the_second_stay_within_the_budget(monkeypatch, tiny_model):
    per_round = 0.01 * sum(1 + 0.3 * (r - 1) for r in range(1, 18))
    cal, clock = calibrate(monkeypatch, tiny_model, {}, budget=2.5 * per_round)
    assert cal.rounds == 2 and clock.calls == 1 + 2 * 17  # a third round would pass the budget
    cal, clock = calibrate(monkeypatch, tiny_model, {}, budget=0.5 * per_round)
    spent = [0.01 * sum(1 + 0.3 * (r - 1) for r in range(1, n + 1)) for n in range(1, 18)]
    last = next(n for n in range(1, 18) if spent[n - 1] > 0.5 * per_round)  # the call that passed it: 12 rows
    assert last == 12
    assert cal.rounds == 2 and sorted(cal.costs or {}) == list(range(1, last))  # 13 rows and up skipped


def test_a_round_the_sensor_saw_busy_is_thrown_away_and_measured_again(monkeypatch, tiny_model):
    """A neighbour slows the second round's 9-, 10- and 11-row calls, and the sensor, read a moment
    later, sees it before the 12-row call: the round so far goes, and the two rounds kept are quiet
    ones. Unseen, the median of two rounds (their mean) carries it into k = 8, 9 and 10."""
    n = 17
    per_round = 0.01 * sum(1 + 0.3 * (r - 1) for r in range(1, n + 1))
    slow = {1 + n + 8 + i: 3.0 for i in range(3)}
    unseen, _ = calibrate(monkeypatch, tiny_model, slow, budget=2.5 * per_round)
    assert unseen.costs is not None and unseen.costs[9] == pytest.approx((1 + 0.3 * 9) * 2)  # (1x + 3x) / 2
    cal, clock = calibrate(monkeypatch, tiny_model, slow, budget=2.5 * per_round, busy_at=(1 + n + 11,))
    assert cal.voided == 1 and cal.rounds == 2 and clock.calls == 1 + 2 * n + 11  # 11 calls measured again
    assert cal.costs is not None and sorted(cal.costs) == list(range(1, 17))
    for k, c in cal.costs.items():
        assert abs(c - (1 + 0.3 * k)) < 1e-9, (k, c)


def test_a_busy_first_round_does_not_cut_the_lengths_measured(monkeypatch, tiny_model):
    """A neighbour makes the first round's first two calls 100 times slower: they pass the budget,
    which leaves every longer length unmeasured (never drafted) for good; the sensor, read as the
    cut round ends, sees it, and the quiet rounds measure every length."""
    n = 17
    per_round = 0.01 * sum(1 + 0.3 * (r - 1) for r in range(1, n + 1))
    slow = {1: 100.0, 2: 100.0}
    unseen, _ = calibrate(monkeypatch, tiny_model, slow, budget=2.5 * per_round)
    assert unseen.costs is not None and sorted(unseen.costs) == [1]
    cal, _ = calibrate(monkeypatch, tiny_model, slow, budget=2.5 * per_round, busy_at=(3,))
    assert cal.voided == 1 and cal.costs is not None and sorted(cal.costs) == list(range(1, 17))
    for k, c in cal.costs.items():
        assert abs(c - (1 + 0.3 * k)) < 1e-9, (k, c)


def test_a_round_timed_before_the_sensor_first_reads_waits_for_that_reading(monkeypatch, tiny_model):
    """A measurement shorter than the sensor's first reading (a small model, a GPU): its round waits,
    is kept when the reading says quiet and measured again when it says busy."""
    import types

    import llama_cpp

    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.runtime.native import LlamaLog, load_model
    from ggufdesk.engine.speculation import verify_cost

    clock = FakeClock({})

    class Llama:
        llama_decode = staticmethod(clock.decode)

        def __getattr__(self, name):
            return getattr(llama_cpp, name)

    monkeypatch.setattr(verify_cost, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(verify_cost, "llama_cpp", Llama())
    monkeypatch.setattr(verify_cost, "BUDGET_S", 2.5 * 0.01 * sum(1 + 0.3 * (r - 1) for r in range(1, 18)))
    lm = load_model(str(tiny_model), LoadSettings(n_ctx=256), LlamaLog(), n_outputs=17)
    try:
        for later, voided in ((True, 0), (False, 1)):
            # no reading through round 1 (a check before each call and one at its end), two waits, then one
            readings = iter([None] * 21 + [later])
            cal = verify_cost.Calibration(lm, 16, lambda r=readings: next(r, True))
            for _ in range(17):  # the warm-up and round 1's first 16 calls
                assert cal.step()
            assert not cal.step()  # its last call: timed, and the round waits for a reading
            assert not cal.done and cal.rounds == 0 and not cal.step() and not cal.step()  # still none
            while not cal.done:
                cal.step()
            assert cal.voided == voided and cal.rounds == 2 and sorted(cal.costs or {}) == list(range(1, 17))
    finally:
        lm.close()


def test_a_busy_machine_at_load_reports_loaded_and_measures_once_quiet_keeping_the_cache_till_then(
        tiny_model, unhurried, monkeypatch, caplog):
    """A load with speculation on a busy machine does not wait for it: Loaded comes, the measurement
    waits (a prompt cached meanwhile stays cached) and runs once the machine is quiet."""
    from ggufdesk.engine.batching.threads import Threads

    caplog.set_level("INFO", logger="ggufdesk.engine")
    busy = [True]
    monkeypatch.setattr(Threads, "quiet", lambda self: not busy[0])
    events: list = []
    engine = Engine(events.append, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256),
                       speculation=SpeculationSettings(mode="lookup", k_max=8)))
    assert any(isinstance(e, P.Loaded) for e in events), events
    assert engine.verify_costs is None and engine._calibration is not None
    evicted: list = []
    assert engine.batch is not None
    monkeypatch.setattr(type(engine.batch.slots), "used", property(lambda self: 1))
    monkeypatch.setattr(engine.batch.slots, "evict", lambda n: evicted.append(n))
    for _ in range(5):
        assert engine._calibrate_step() is False
    assert evicted == [] and engine._calibration is not None and engine._calibration.spent == 0.0
    said = [r for r in caplog.records if "measured later, while quiet" in r.getMessage()]
    assert len(said) == 1  # said once, not at every wait
    busy[0] = False
    while engine._calibration is not None:
        engine._calibrate_step()
    assert evicted and engine.verify_costs is not None and sorted(engine.verify_costs) == list(range(1, 9))
    engine.unload(quiet=True)


def test_the_worker_waits_for_a_quiet_machine_without_spinning_and_answers_meanwhile(monkeypatch):
    import queue

    from ggufdesk.engine.runtime import worker

    waits: list[float | None] = []

    class Inbox(queue.Queue):
        def get(self, block: bool = True, timeout: float | None = None) -> P.Message:
            waits.append(timeout)
            if len(waits) < 3:
                raise queue.Empty
            return P.Ping(id="p")

    engine = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    engine._calibration = object()  # type: ignore[assignment]
    monkeypatch.setattr(engine, "_calibrate_step", lambda: False)  # the machine stays busy
    assert isinstance(engine.next_request(Inbox()), P.Ping)
    assert waits == [worker.IDLE_SENSE_S] * 3  # each wait a sensor period, not a spin on get_nowait


def count_calibrations(monkeypatch) -> list:
    """The measurements started from now on (one entry each)."""
    from ggufdesk.engine.speculation import verify_cost

    made: list = []
    real = verify_cost.Calibration

    def counted(*a, **kw):
        made.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(verify_cost, "Calibration", counted)
    return made


def test_a_second_load_reads_the_table_measured_by_the_first_and_measures_nothing(tiny_model, unhurried,
                                                                                    monkeypatch):
    """Only the first load of a model with these settings on this machine measures (a one-shot
    `ggufdesk run --lookup` then starts its prompt as soon as the model is loaded)."""

    load = P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256), speculation=SpeculationSettings(mode="lookup", k_max=8))
    first = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    first.load(load)
    measured = first.verify_costs
    first.unload(quiet=True)
    assert measured is not None

    made = count_calibrations(monkeypatch)
    second = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    second.load(load)
    assert made == [] and second.verify_costs == pytest.approx(measured, abs=1e-3)
    assert second.batch.drafts.costs.lengths(16) == list(range(1, 9))
    second.unload(quiet=True)
    other = P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256, n_threads=1, n_threads_batch=3),
                   speculation=SpeculationSettings(mode="lookup", k_max=8))
    third = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    third.load(other)
    assert len(made) == 1 and third.verify_costs is not None  # other settings: measured afresh
    third.unload(quiet=True)


def test_a_damaged_stored_table_is_measured_again(tiny_model, unhurried):
    from ggufdesk.core.hardware import cache_dir

    path = cache_dir() / "verify_costs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    engine = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256),
                       speculation=SpeculationSettings(mode="lookup", k_max=8)))
    assert engine.verify_costs is not None and sorted(engine.verify_costs) == list(range(1, 9))
    engine.unload(quiet=True)
    assert json.loads(path.read_text())  # and kept, readable, for the next load


def test_a_table_kept_by_the_earlier_version_is_measured_again(tiny_model, unhurried, monkeypatch):
    """Version 1 timed only 1, 2, 4, 8 and 16 rows, which offered the step loop only k = 1, 3, 7, 15
    (beside four decode rows: always an odd, dear count of rows); such a table is not reused."""
    from ggufdesk.engine.speculation import verify_cost

    load = P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256),
                  speculation=SpeculationSettings(mode="lookup", k_max=8))
    monkeypatch.setattr(verify_cost, "VERSION", 1)
    old = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    old.load(load)
    old.unload(quiet=True)
    monkeypatch.setattr(verify_cost, "VERSION", 2)
    made = count_calibrations(monkeypatch)
    new = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    new.load(load)
    assert len(made) == 1 and new.verify_costs is not None and sorted(new.verify_costs) == list(range(1, 9))
    new.unload(quiet=True)


def test_a_full_disk_loses_the_stored_table_not_the_load(tiny_model, unhurried, monkeypatch):
    import errno
    import os

    from ggufdesk.core.hardware import cache_dir

    def full(fd: int) -> None:  # the data reaches the disk at the latest here (core/atomic.py)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    engine = Engine(lambda e: None, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256),
                       speculation=SpeculationSettings(mode="lookup", k_max=8)))
    assert engine.verify_costs is not None and sorted(engine.verify_costs) == list(range(1, 9))  # in use
    engine.unload(quiet=True)
    assert not (cache_dir() / "verify_costs.json").exists()  # nothing half written for the next load
    assert [p.name for p in cache_dir().iterdir() if p.name.endswith(".tmp")] == []
