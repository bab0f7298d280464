"""The thread tuner (engine/batching/threads.py) on modelled step times and fake CPU times
(engine/batching/cpu_load.py): a neighbour takes a core -> fewer threads; it leaves -> a probe finds
more threads faster again; a fixed count never moves."""
from __future__ import annotations

import math

from ggufdesk.engine.batching.cpu_load import PERIOD, CpuLoad, busy_cpu_reader
from ggufdesk.engine.batching.threads import GAP_FIRST, GAP_SENSED, KV_PAD, WINDOW, Threads, ThreadTuner, units

# the starter on 2 cores, as measured (issue 29): seconds per token by thread count
QUIET = {2: 1 / 47, 1: 1 / 25}
ONE_BUSY_LOOP = {2: 1 / 16.8, 1: 1 / 24.9}


def run(tuner: ThreadTuner, machine: dict[int, float], steps: int) -> list[int]:
    seen = []
    for _ in range(steps):
        tuner.observe(machine[tuner.n])
        seen.append(tuner.n)
    return seen


def test_a_neighbour_drops_it_to_one_thread_and_its_leaving_brings_two_back():
    t = ThreadTuner(2)
    quiet = run(t, QUIET, 200)
    assert quiet[-1] == 2 and quiet.count(1) <= 3 * WINDOW  # quiet: 2, but for a few losing probes down
    busy = run(t, ONE_BUSY_LOOP, 100)
    assert busy[-1] == 1 and busy.index(1) <= 2 * WINDOW  # drops within two windows
    assert busy[-80:].count(1) >= 80 - WINDOW  # ... and stays, but for one probe of WINDOW steps
    back = run(t, QUIET, 4 * GAP_FIRST)
    assert back[-1] == 2
    assert back.index(2) <= 4 * GAP_FIRST  # the probe up found it within the (backed-off) gap


def test_probes_up_back_off_while_the_neighbour_stays():
    t = ThreadTuner(2)
    run(t, QUIET, 20)
    run(t, ONE_BUSY_LOOP, 20 * GAP_FIRST)
    assert t.n == 1 and t.gap > GAP_FIRST  # losing probes doubled the gap
    steps_at_two = run(t, ONE_BUSY_LOOP, 2000).count(2)
    assert steps_at_two <= 3 * WINDOW  # few steps wasted on probes


def test_a_neighbour_there_from_the_start_is_found_by_a_probe_down():
    t = ThreadTuner(2)
    seen = run(t, ONE_BUSY_LOOP, 200)
    assert seen[-1] == 1 and seen.index(1) <= GAP_FIRST + WINDOW


def test_a_slower_machine_for_every_count_does_not_keep_fewer_threads():
    t = ThreadTuner(2)
    run(t, QUIET, 30)
    slow_alike = {2: 2 * QUIET[2], 1: 2 * QUIET[1]}  # a long context: every count slower
    assert run(t, slow_alike, 200)[-1] == 2


def test_a_fixed_count_never_changes():
    t = ThreadTuner(2, fixed=True)
    assert set(run(t, QUIET, 50) + run(t, ONE_BUSY_LOOP, 500)) == {2} and t.changes == 0


def test_threads_tunes_one_row_and_multi_row_steps_apart_and_applies_changes():
    applied: list[tuple[int, int]] = []
    th = Threads(2, 2, fixed=False, apply=lambda n, nb: applied.append((n, nb)))
    for _ in range(40):
        th.observe(1, 0, QUIET[2])
        th.observe(4, 0, QUIET[2] * units(4, 0))
    for _ in range(40):
        th.observe(1, 0, ONE_BUSY_LOOP[th.decode.n])  # only one-row steps slow down
        th.observe(4, 0, QUIET[2] * units(4, 0))
    assert th.now == (1, 2) and applied and applied[-1] == (1, 2)
    fixed = Threads(2, 2, fixed=True, apply=lambda n, nb: applied.append((n, nb)))
    for _ in range(100):
        fixed.observe(1, 0, ONE_BUSY_LOOP[2])
    assert fixed.now == (2, 2)


def test_units_explain_the_batch():
    assert units(1, 0) == 1.0
    assert units(3, 0) == 2.0  # two more decode rows at half a step each
    assert units(64, 64) == 6.4  # a prefill chunk: a tenth of a step per prompt row


# ---- the CPU load sensor (engine/batching/cpu_load.py) on fake CPU-time sources ----------------------

class Machine:
    """Two CPUs on a fake clock: `others` cores busy with other programs, our process busy on `own`
    cores; step(seconds) advances the clock and both CPU-time counters."""

    def __init__(self, others: float = 0.0) -> None:
        self.t, self.busy_s, self.own_s = 100.0, 5000.0, 3.0
        self.others = others

    def clock(self) -> float:
        return self.t

    def busy(self) -> float:
        return self.busy_s

    def own(self) -> float:
        return self.own_s

    def step(self, seconds: float, own_cores: float) -> None:
        """The scheduler shares the 2 CPUs among every busy thread alike when there are more: beside
        our 2 spinning threads, a busy loop gets 2/3 of a CPU."""
        self.t += seconds
        share = min(1.0, 2 / (own_cores + self.others)) if own_cores + self.others else 1.0
        self.own_s += own_cores * share * seconds
        self.busy_s += (own_cores + self.others) * share * seconds

    def load(self) -> CpuLoad:
        return CpuLoad(2, self.busy, own=self.own, clock=self.clock)


def engine(machine: Machine, *, fixed: bool = False) -> tuple[Threads, list[tuple[int, int]]]:
    applied: list[tuple[int, int]] = []
    th = Threads(2, 2, fixed=fixed, apply=lambda n, nb: applied.append((n, nb)), load=machine.load())
    return th, applied


def decode(th: Threads, machine: Machine, steps: int, speeds: dict[int, float]) -> list[int]:
    """One-row steps as the engine runs them: prepare, run at the count in use (its spinning threads
    are our CPU), observe."""
    used = []
    for _ in range(steps):
        th.prepare()
        n = th.decode.n
        used.append(n)
        machine.step(speeds[n], own_cores=n)
        th.observe(1, 0, speeds[n])
    return used


COLLAPSED = {2: 1.25, 1: 1 / 39.9}  # bench/contention.py beside one busy loop: a 2-thread step ~1.25 s


def test_a_neighbour_there_from_the_start_gets_one_thread_from_the_first_step():
    m = Machine(others=1.0)
    th, applied = engine(m)
    m.step(5.0, own_cores=0.0)  # the engine idles after loading; the busy loop runs
    th.prepare()  # before the request's prefill
    assert th.now == (1, 1) and applied == [(1, 1)]
    assert decode(th, m, 100, COLLAPSED) == [1] * 100  # the ceiling forbids probes up while it stays


def test_a_neighbour_arriving_mid_answer_drops_to_one_thread_at_the_next_step():
    m = Machine()
    th, _ = engine(m)
    assert set(decode(th, m, 30, QUIET)) == {2}
    m.others = 1.0
    used = decode(th, m, 20, COLLAPSED)
    assert used[0] == 2 and used[1:] == [1] * 19  # one collapsed step, then 1 thread at once


def left_after_a_neighbour(then: dict[int, float], steps: int) -> list[int]:
    """The counts used for `steps` steps at `then` speeds after a busy loop, there from the start, left."""
    m = Machine(others=1.0)
    th, _ = engine(m)
    m.step(1.0, own_cores=0.0)
    assert set(decode(th, m, 30, COLLAPSED)) == {1}
    m.others = 0.0
    return decode(th, m, steps, then)


def test_the_neighbour_leaving_brings_two_threads_back_when_they_are_faster():
    used = left_after_a_neighbour(QUIET, 60)
    assert used[-1] == 2 and used.index(2) <= PERIOD / QUIET[1] + 2  # the next reading, then a probe at once


def test_a_probe_up_that_step_times_find_slower_goes_back():
    hidden = {2: 1 / 20, 1: 1 / 25}  # free CPUs, but 2 threads slower (memory bandwidth, SMT siblings)
    used = left_after_a_neighbour(hidden, 40)
    assert 2 in used and used[-1] == 1 and used.count(2) <= WINDOW


def test_half_a_core_keeps_the_count_it_has():
    m = Machine(others=0.4)  # within the hysteresis band: taken by neither reading
    load = m.load()
    m.step(1.0, own_cores=1.0)
    assert load.free() == 2
    m.others = 0.6
    m.step(1.0, own_cores=1.0)
    assert load.free() == 1
    m.others = 0.4
    m.step(1.0, own_cores=1.0)
    assert load.free() == 1  # not given back until below 0.3
    m.others = 0.2
    m.step(1.0, own_cores=1.0)
    assert load.free() == 2


def test_readings_that_go_backwards_or_are_not_numbers_or_fail_are_ignored():
    m = Machine(others=1.0)
    bad: list[object] = []

    def busy() -> float:
        if bad:
            v = bad.pop()
            if isinstance(v, Exception):
                raise v
            return float(v)  # type: ignore[arg-type]
        return m.busy_s

    load = CpuLoad(2, busy, own=m.own, clock=m.clock)
    m.step(1.0, own_cores=1.0)
    assert load.free() == 1
    m.others = 0.0
    for v in (float("nan"), -1e9, OSError("no /proc/stat"), float("inf")):
        bad.append(v)
        m.step(1.0, own_cores=1.0)
        assert load.free() == 1  # the last good reading stands
    m.step(1.0, own_cores=1.0)
    load.free()  # (the interval after a bad sample is skipped, the next counts)
    m.step(1.0, own_cores=1.0)
    assert load.free() == 2
    m.t -= 10  # the clock jumped back
    assert load.free() == 2
    m.own_s += 50  # own CPU beyond the system's: inconsistent, ignored
    m.step(1.0, own_cores=1.0)
    assert load.free() == 2 and load.last is not None and load.last >= 0


def test_samples_come_no_more_often_than_the_period():
    m = Machine(others=1.0)
    calls = []
    load = CpuLoad(2, lambda: calls.append(1) or m.busy_s, own=m.own, clock=m.clock)
    for _ in range(50):
        m.step(PERIOD / 10, own_cores=1.0)
        load.free()
    assert len(calls) <= 1 + 50 // 10


def test_a_fixed_count_never_consults_the_sensor():
    th = Threads(2, 2, fixed=True, apply=lambda n, nb: None, load=_Exploding())  # type: ignore[arg-type]
    for _ in range(50):
        th.prepare()
        th.observe(1, 0, COLLAPSED[2])
    assert th.now == (2, 2)


class _Exploding:
    def free(self) -> int:
        raise AssertionError("a fixed count consulted the sensor")


def test_without_a_sensor_it_behaves_as_step_times_say():
    th = Threads(2, 2, fixed=False, apply=lambda n, nb: None, load=None)
    for _ in range(200):
        th.prepare()
        th.observe(1, 0, QUIET[th.decode.n])
    assert th.now == (2, 2)


def test_the_machine_reader_reads_or_says_none():
    busy = busy_cpu_reader()
    if busy is not None:  # psutil is a dependency; where it reads nothing the engine runs on step times
        assert math.isfinite(busy()) and busy() >= 0
    load = CpuLoad.of_this_machine()
    assert load is None or load.cpus >= 1


def test_the_sensor_reads_only_the_cpus_this_process_may_run_on(monkeypatch):
    import psutil

    from ggufdesk.engine.batching import cpu_load

    n = len(psutil.cpu_times(percpu=True))
    whole, first = busy_cpu_reader(), busy_cpu_reader(frozenset({0}))
    assert whole is not None and first is not None
    if n > 1:  # CPU 0 alone has been busy no longer than all of them together
        assert first() <= whole() + 0.5
    assert cpu_load.logical_cpus(frozenset({0})) == 1
    monkeypatch.setattr(cpu_load, "affinity", lambda: frozenset({0}))
    load = CpuLoad.of_this_machine()
    assert load is not None and load.cpus == 1
    # CPUs psutil does not list (offline ones) make an index no CPU's number: the whole machine is read
    odd = busy_cpu_reader(frozenset({0, n + 7}))
    assert odd is not None and abs(odd() - whole()) < 0.5


def test_the_engine_asks_the_sensor_before_the_first_decode_call_and_reports_the_count_in_use(tiny_model):
    import llama_cpp

    from ggufdesk.core.settings import LoadSettings, SamplingSettings
    from ggufdesk.engine.batching.batch import BatchEngine
    from ggufdesk.engine.batching.sequence import Sequence
    from ggufdesk.engine.batching.vocab import Vocab
    from ggufdesk.engine.link import protocol as P
    from ggufdesk.engine.runtime.native import LlamaLog, load_model

    lm = load_model(str(tiny_model), LoadSettings(n_ctx=256, n_batch=64, n_ubatch=64), LlamaLog())  # adaptive
    try:
        events: list[object] = []
        now: list[tuple[int, int]] = []
        at_decode: list[tuple[int, int]] = []

        def set_threads(ctx: object, n: int, nb: int) -> None:
            now.append((n, nb))
            llama_cpp.llama_set_n_threads(ctx, n, nb)

        def decode(ctx: object, batch: object) -> int:
            at_decode.append(now[-1] if now else (lm.settings.threads, lm.settings.threads_batch))
            return int(llama_cpp.llama_decode(ctx, batch))

        loop = BatchEngine(lm, Vocab(lm), emit=events.append, cancelled=lambda rid: False,
                           set_batch=lambda rids: None, decode=decode, set_threads=set_threads)
        m = Machine(others=1.0)
        loop.threads.load = m.load()
        m.step(5.0, own_cores=0.0)  # a busy loop beside the idle engine
        loop.submit(Sequence(rid="r", prompt=loop.vocab.tokenize("the cat " * 4), max_gen=4,
                             sampling=SamplingSettings(temperature=0, max_tokens=4)))
        while loop.busy:
            loop.step()
    finally:
        lm.close()
    assert at_decode and set(at_decode) == {(1, 1)}  # the prefill and every decode ran on 1 thread
    stats = [e for e in events if isinstance(e, P.Stats)]
    assert stats and stats[-1].threads == 1


def idle(th: Threads, machine: Machine, seconds: float) -> None:
    """The engine waiting for work: the worker calls idle() every PERIOD (runtime/worker.next_request)."""
    for _ in range(round(seconds / PERIOD)):
        machine.step(PERIOD, own_cores=0.0)
        th.idle()


def test_a_neighbour_that_left_while_the_engine_waited_costs_the_next_request_nothing():
    m = Machine(others=1.0)
    th, applied = engine(m)
    idle(th, m, 5.0)  # another program (or engine) busy while we wait ...
    m.others = 0.0
    idle(th, m, 1.0)  # ... then gone before the request comes
    th.prepare()
    assert th.now == (2, 2) and applied == []
    assert set(decode(th, m, 30, QUIET)) == {2}


def test_a_neighbour_still_there_when_the_request_comes_is_seen_through_the_idle_readings():
    m = Machine(others=0.0)
    th, _ = engine(m)
    idle(th, m, 5.0)
    m.others = 1.0
    idle(th, m, 1.0)
    th.prepare()
    assert th.now == (1, 1)


def test_idle_readings_without_a_sensor_or_with_a_fixed_count_do_nothing():
    for th in (Threads(2, 2, fixed=False, apply=lambda n, nb: None, load=None),
               Threads(2, 2, fixed=True, apply=lambda n, nb: None, load=_Exploding())):  # type: ignore[arg-type]
        assert not th.sensing
        th.idle()
        assert th.now == (2, 2)


def test_the_worker_reads_the_sensor_while_it_waits_and_still_answers_the_request():
    import queue

    from ggufdesk.engine.link import protocol as P
    from ggufdesk.engine.runtime import worker

    ticks: list[int] = []

    class Sensing:  # the step loop's threads, with a sensor
        sensing = True

        def idle(self) -> None:
            ticks.append(1)

    class Batch:  # an idle step loop
        busy = False
        threads = Sensing()

        def idle(self) -> None:
            pass

    class SlowInbox(queue.Queue):  # nothing for three periods, then a request
        def get(self, block: bool = True, timeout: float | None = None) -> P.Message:
            assert timeout == worker.IDLE_SENSE_S  # never a blocking wait while the sensor reads
            if len(ticks) < 3:
                raise queue.Empty
            return P.Ping(id="p")

    engine = worker.Engine(lambda e: None, worker.CancelBook())  # type: ignore[arg-type]
    engine.batch = Batch()  # type: ignore[assignment]
    assert isinstance(engine.next_request(SlowInbox()), P.Ping) and len(ticks) == 3


def test_with_a_sensor_a_quiet_machine_is_probed_less_often():
    m = Machine()
    sensed, _ = engine(m)
    blind = Threads(2, 2, fixed=False, apply=lambda n, nb: None, load=None)
    assert sensed.decode.gap == GAP_SENSED > blind.decode.gap == GAP_FIRST
    used = decode(sensed, m, GAP_SENSED + 2 * WINDOW, QUIET)
    assert used[:GAP_SENSED].count(1) == 0 and 1 in used  # no probe before the gap, then one
    assert used[-1] == 2 and sensed.decode.gap == 2 * GAP_SENSED  # it lost and backed off


def test_quiet_reads_the_sensor_also_where_the_counts_are_fixed():
    """The verification-cost measurement (engine/speculation/verify_cost.py) waits for a quiet machine
    whatever the thread settings: a neighbour on one of 2 CPUs leaves too little for 2 threads, enough
    for 1; without a sensor it is taken as quiet, and None says its first reading is still to come."""
    for fixed in (False, True):
        m = Machine(others=1.0)
        th = Threads(2, 2, fixed=fixed, apply=lambda n, nb: None, load=m.load())
        assert th.quiet() is None  # one sample: no interval read yet
        m.step(PERIOD, own_cores=0)
        assert not th.quiet()
        m.others = 0.0
        m.step(PERIOD, own_cores=0)
        assert th.quiet()
    m = Machine(others=1.0)
    one = Threads(1, 1, fixed=True, apply=lambda n, nb: None, load=m.load())
    m.step(PERIOD, own_cores=0)
    assert one.quiet()
    assert Threads(2, 2, fixed=False, apply=lambda n, nb: None, load=None).quiet()


def test_at_full_runs_the_settings_counts_inside_and_the_tuned_ones_after():
    applied: list[tuple[int, int]] = []
    m = Machine(others=1.0)
    th = Threads(2, 2, fixed=False, apply=lambda n, nb: applied.append((n, nb)), load=m.load())
    m.step(PERIOD, own_cores=0)
    th.prepare()  # the neighbour: one thread
    assert th.now == (1, 1) and applied == [(1, 1)]
    with th.at_full():
        assert applied[-1] == (2, 2)
    assert applied[-1] == (1, 1) and th.now == (1, 1)
    try:
        with th.at_full():
            raise RuntimeError("a failed call")
    except RuntimeError:
        pass
    assert applied[-1] == (1, 1)


def test_more_threads_than_cpus_are_quiet_when_nothing_else_runs():
    m = Machine()
    th = Threads(8, 8, fixed=True, apply=lambda n, nb: None, load=m.load())  # 8 asked of 2 CPUs
    m.step(PERIOD, own_cores=0)
    assert th.quiet()
    m.others = 1.0
    m.step(PERIOD, own_cores=0)
    assert not th.quiet()


def test_a_sensor_that_never_reads_stops_holding_the_measurement_back():
    """A reader that fails after the first sample: no reading ever comes, and after two periods the
    machine counts as quiet (as without a sensor) rather than keeping the measurement waiting."""
    m = Machine()
    load = m.load()
    load.busy = lambda: (_ for _ in ()).throw(OSError("gone"))  # type: ignore[method-assign]
    th = Threads(2, 2, fixed=False, apply=lambda n, nb: None, load=load)
    m.step(PERIOD, own_cores=0)
    assert th.quiet() is None
    m.step(PERIOD, own_cores=0)
    assert th.quiet() is True


def test_a_step_past_a_256_cell_edge_is_not_taken_for_a_neighbour():
    """llama.cpp attends to the cache in runs of KV_PAD cells: past an edge every step attends to 256
    more at once (SmolLM2: 1.19x its early steps). A quiet machine tried one thread fewer there in 6 of
    10 answers; the best is now the best within the run of cells, so nothing is tried."""
    t = ThreadTuner(2, gap_first=GAP_SENSED)
    seen = []
    for cells in range(200, 200 + GAP_SENSED - 2 * WINDOW):  # past the edge at 256; the periodic probe later
        slower = 1.0 + 0.5 * (cells // KV_PAD)  # 1.5x past the edge: beyond SLOW of the early steps
        t.observe(QUIET[t.n] * slower, cells // KV_PAD)
        seen.append(t.n)
    assert set(seen) == {2} and t.changes == 0


def test_a_neighbour_arriving_within_a_run_of_cells_is_still_seen():
    t = ThreadTuner(2, gap_first=GAP_SENSED)
    for _ in range(3 * WINDOW):
        t.observe(QUIET[t.n], 1)
    seen = []
    for _ in range(4 * WINDOW):
        t.observe(ONE_BUSY_LOOP[t.n], 1)
        seen.append(t.n)
    assert seen[-1] == 1 and seen.index(1) <= 2 * WINDOW


def test_a_trial_under_way_when_a_long_prompt_starts_is_judged_not_kept_for_the_whole_prompt():
    """A long prompt's chunks cross a run of KV_PAD cells every step, and each new run starts the
    window again; a trial of one thread fewer begun just before such a prompt was never judged and
    read the whole prompt at one thread. The trial's window now runs on across runs of cells."""
    t = ThreadTuner(2, gap_first=GAP_SENSED)
    for _ in range(GAP_SENSED + WINDOW):  # quiet steps until the periodic probe tries one fewer
        t.observe(QUIET[t.n], 0)
        if t.trial_from is not None:
            break
    assert t.n == 1 and t.trial_from is not None
    seen = []
    for chunk in range(1, 1 + 4 * WINDOW):  # a prompt of 24 chunks of 512 tokens: 2 runs of cells each
        t.observe(QUIET[t.n], 2 * chunk)
        seen.append(t.n)
    assert seen[-1] == 2 and seen.index(2) <= WINDOW


def test_a_prompt_arriving_beside_decoding_sequences_is_not_taken_for_a_neighbour():
    """A prompt row's price grows with the cells it attends to: SmolLM2 at 4,096-4,351 cells read prompt
    chunks of 32-96 rows at 54-84 ms a unit where the 4-row decode steps before them took 24-28. Compared
    with those, the chunks read as a neighbour and the batch count went to one thread for WINDOW steps.
    Steps with prompt rows are now compared only with each other."""
    applied: list[tuple[int, int]] = []
    th = Threads(2, 2, fixed=False, apply=lambda n, nb: applied.append((n, nb)), load=None)
    cells = 4 * KV_PAD + 10
    for _ in range(14):  # four sequences decoding: 4-row steps
        th.observe(4, 0, 0.062, cells)
        cells += 4
    for _ in range(12):  # one has ended: a new request's prompt in chunks of 29 rows beside the three decoding
        th.observe(32, 29, 0.38, cells)
        cells += 32
    assert cells // KV_PAD == 4 + 1  # (one edge crossed: the window had room to fill on either side)
    assert applied == [] and th.now == (2, 2)
