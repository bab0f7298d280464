"""The thread tuner (engine/batching/threads.py) on modelled step times: a neighbour takes a core ->
fewer threads; it leaves -> a probe finds more threads faster again; a fixed count never moves."""
from __future__ import annotations

from ggufdesk.engine.batching.threads import GAP_FIRST, WINDOW, Threads, ThreadTuner, units

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
