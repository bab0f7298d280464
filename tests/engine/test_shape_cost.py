"""A draft changes the step's shape, and a change can cost the steps after it (issue 29, seen on a lent
H200, failed drafts cost several plain steps; by llama.cpp's source its CUDA backend replays a captured
graph only for a shape seen the two steps before, so a draft costs its own step and two graph-less
one-row steps, and the planner billed only the first). The planner measures steps by their age in a run of one shape and charges the first draft
that breaks a run what the steps after it pay (engine/speculation/shape_cost.py); where ages cost
alike (a CPU, a modelled clock) nothing changes."""
from __future__ import annotations

import random

import pytest

from ggufdesk.engine.batching.runner import SeqOutput, StepResult
from ggufdesk.engine.batching.scheduler import DecodeRow, Plan, Prefill
from ggufdesk.engine.speculation.lookup import PromptLookup
from ggufdesk.engine.speculation.shape_cost import ShapeCosts
from ggufdesk.engine.speculation.step_cost import StepCosts
from tests.engine.test_adaptive_recovery import passage
from tests.engine.test_step_cost import TABLE, Fixed, planner, seq


def run_of(sc: ShapeCosts, rows: int, seconds: list[float]) -> None:
    for s in seconds:
        sc.step(rows, s)


def test_steps_are_timed_by_their_age_in_a_run_of_one_shape():
    sc = ShapeCosts()
    assert sc.age(1) == 1
    run_of(sc, 1, [0.010] * 4)  # steady: the first run is not compared with anything
    assert sc.age(1) == 5 and sc.age(5) == 1 and sc.steady[1][0] == 0.010 and sc.penalty(1) == 0.0
    sc.step(5, 0.040)  # a draft step
    run_of(sc, 1, [0.030, 0.020, 0.010])  # a change, then the graph captured, then replayed
    assert sc.excess[1] == [pytest.approx(0.020), pytest.approx(0.010)]
    # in a steady run a draft makes the next two steps a change and a capture: 0.020 + 0.010 over steady
    assert sc.penalty(1) == pytest.approx(0.030)
    sc.step(5, 0.040)
    # right after a change the run's next steps pay the capture anyway: a draft only moves it on a step
    assert sc.age(1) == 1 and sc.penalty(1) == pytest.approx(0.020)
    sc.step(1, 0.030)
    assert sc.age(1) == 2 and sc.penalty(1) == pytest.approx(0.030)


def test_nothing_is_charged_until_every_age_is_measured_or_where_ages_cost_alike():
    sc = ShapeCosts()
    run_of(sc, 1, [0.010] * 4)
    sc.step(5, 0.040)
    sc.step(1, 0.030)
    assert sc.penalty(1) == 0.0 and sc.penalty(4) == 0.0
    alike = ShapeCosts()
    for _ in range(5):
        run_of(alike, 1, [0.010] * 4)
        alike.step(6, 0.030)
    assert alike.penalty(1) == 0.0  # exactly: a modelled clock's decisions do not move


def test_a_run_after_a_prompt_chunk_is_not_measured_and_an_old_steady_time_is_not_compared():
    sc = ShapeCosts()
    run_of(sc, 1, [0.010] * 3)
    sc.step(300, None)  # a prompt chunk: what it costs the next steps is not a draft's doing
    run_of(sc, 1, [0.030, 0.020, 0.010])
    assert 300 not in sc.steady and 1 not in sc.excess
    run_of(sc, 1, [0.010] * 70)  # the run goes on past FRESH steps; a draft then
    sc.step(2, 0.012)
    sc.step(1, 0.020)
    assert sc.excess[1][0] == pytest.approx(0.010)  # the steady time is the run's latest
    old = ShapeCosts()
    run_of(old, 1, [0.010] * 3)
    run_of(old, 2, [0.012] * 70)
    old.step(1, 0.030)
    assert 1 not in old.excess  # 1-row steps last ran steadily 70 steps ago: not compared


def measured(pl, rows: int = 1) -> None:
    """A planner whose steps of `rows` rows cost 30 ms just after a change, 20 ms after that, 10 ms steady."""
    pl.costs.observe(rows, 0.010)
    for _ in range(3):
        run_of(pl.shapes, rows, [0.030, 0.020, 0.010, 0.010])
        pl.shapes.step(rows + 4, 0.040)
    run_of(pl.shapes, rows, [0.030, 0.020, 0.010])


def test_the_first_draft_that_breaks_a_run_is_charged_what_the_steps_after_it_pay():
    pl = planner(StepCosts(TABLE))
    measured(pl)
    d = Fixed(list(range(100, 116)))
    p = Plan(decode=[DecodeRow(seq(0, d))])
    pl.plan(p)
    after = (0.030 + 0.020 - 2 * 0.010) / 0.010  # in plain steps
    assert d.control.costs == pytest.approx({k: c + after for k, c in TABLE.items()})
    step = pl.costs.predict(17)  # 16 drafts, as the table predicts them
    pl.settle(p, StepResult(outputs=[SeqOutput(seq=p.decode[0].seq, accepted=15)], seconds=step, rows=17,
                            n_prompt=0))
    assert d.fed == [(16, 15, pytest.approx(step / 0.010 + after))]


def test_beside_a_draft_that_changed_the_shape_the_next_drafter_pays_no_change():
    pl = planner(StepCosts(TABLE), n_outputs=40)
    measured(pl, rows=2)
    d1, d2 = Fixed(list(range(100, 116))), Fixed(list(range(200, 216)))
    p = Plan(decode=[DecodeRow(seq(0, d1)), DecodeRow(seq(1, d2))])
    pl.plan(p)  # d1's turn first
    assert d1.asked and d2.asked
    bills = [pl._bills[id(r)] for r in p.decode]
    assert bills[0].after == pytest.approx(0.030) and bills[1].after == 0.0


def test_a_step_with_a_prompt_chunk_charges_no_draft_for_the_change():
    pl = planner(StepCosts(TABLE))
    measured(pl)
    d = Fixed(list(range(100, 116)))
    waiting = seq(1)
    waiting.prompt = list(range(1, 50))
    p = Plan(decode=[DecodeRow(seq(0, d))], prefills=[Prefill(waiting, 8)])
    pl.plan(p)
    assert all(b.after == 0.0 for b in pl._bills.values())


# ---- the loop on a GPU-like clock ---------------------------------------------------------------

REPLAY, DIRECT, CAPTURE = 0.010, 0.018, 0.004  # one-row steps: a replayed graph, none, capturing one
GPU_TABLE = {k: 1.15 if k <= 7 else 1.6 for k in range(1, 17)}  # timed at load: every call a new shape


class GraphClock:
    """A step's cost after llama.cpp's CUDA graph rule: graph-less unless its shape was the two steps before."""

    def __init__(self) -> None:
        self.shapes: list[int] = [0, 0]

    def step(self, rows: int) -> float:
        ratio = 1.0 if rows == 1 else GPU_TABLE[rows - 1]
        a, b = self.shapes[-2:]
        cost = REPLAY * ratio if rows == a == b else DIRECT * ratio + (CAPTURE if rows == b else 0.0)
        self.shapes.append(rows)
        return cost


def loop(truth: list[int], prompt: list[int], *, lookup: bool, charge: bool = True) -> float:
    """Modelled seconds for one sequence to write `truth` through the planner, with or without lookup."""
    costs = StepCosts(GPU_TABLE)
    pl = planner(costs)
    if not charge:
        pl.shapes.penalty = lambda rows: 0.0  # type: ignore[method-assign]
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=GPU_TABLE) if lookup else None
    s = seq(0, lk)
    s.slot.tokens, s.last, s.max_gen = list(prompt[:-1]), prompt[-1], len(truth) + 1  # type: ignore[union-attr]
    clock, total, i = GraphClock(), 0.0, 0
    while i < len(truth):
        p = Plan(decode=[DecodeRow(s)])
        pl.plan(p)
        draft = p.decode[0].draft
        n = 0
        while n < len(draft) and i + n < len(truth) and draft[n] == truth[i + n]:
            n += 1
        seconds = clock.step(1 + len(draft))
        total += seconds
        pl.settle(p, StepResult(outputs=[SeqOutput(seq=s, accepted=n)], seconds=seconds, rows=1 + len(draft),
                                n_prompt=0))
        emitted = truth[i:i + n + 1]
        s.slot.tokens += [s.last] + emitted[:-1]  # type: ignore[union-attr]
        s.last = emitted[-1]
        s.stats.n_gen += len(emitted)
        i += len(emitted)
    return total


def free_text(n: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    prompt = [1] + [rng.randrange(10, 40) for _ in range(60)]
    return prompt, [rng.randrange(10, 40) for _ in range(n)]  # short n-grams recur by chance, passages never


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_a_gpu_like_clock_free_text_loses_less_to_drafts_that_fail(seed):
    prompt, truth = free_text(400, seed)
    plain = loop(truth, prompt, lookup=False)
    charged = loop(truth, prompt, lookup=True)
    uncharged = loop(truth, prompt, lookup=True, charge=False)
    assert charged < uncharged  # billing the draft step alone lets failed drafts through
    # what is left: the first drafts (before a change was measured) and the evidence's probes, which
    # keep a copy that starts later from being locked out, each a change of shape (here 6-7%)
    assert charged <= 1.08 * plain


def test_on_a_gpu_like_clock_a_copy_still_drafts():
    text = passage(300)
    prompt = [1, *text, 2]
    plain = loop(text, prompt, lookup=False)
    assert loop(text, prompt, lookup=True) < plain / 3


# ---- holding a shape: padding a step to the run's count instead of leaving the run ----------------

def settled(sc: ShapeCosts, top_s: float, fell: tuple[float, float] = (0.008, 0.012)) -> None:
    """Four-row steps 10 ms steady, `fell` more at the first two steps after a change; then a run of
    eight rows that has settled at `top_s`."""
    for _ in range(3):
        run_of(sc, 4, [0.010 + fell[0], 0.010 + fell[1], 0.010, 0.010])
        sc.step(8, 0.020)
    run_of(sc, 4, [0.010 + fell[0], 0.010 + fell[1], 0.010])
    run_of(sc, 8, [0.020, 0.020, top_s, top_s])


def test_a_run_is_held_where_its_count_costs_no_more_than_leaving_it():
    flat = lambda rows: 1.0  # noqa: E731  (the table: four and eight rows cost the kernels alike)
    gpu = ShapeCosts()
    settled(gpu, 0.010)
    assert gpu.hold(4, 1, flat) and gpu.hold(4, 1000, flat)  # a replayed graph: held whatever comes next
    dear = ShapeCosts()
    settled(dear, 0.014)  # eight rows 4 ms dearer: held only while a draft would come back soon
    assert dear.hold(4, 1, flat) and not dear.hold(4, 10, flat)
    cpu = ShapeCosts()  # each row costs, a change almost nothing: never held
    settled(cpu, 0.016, fell=(0.0005, 0.0002))
    assert not cpu.hold(4, 1, flat)
    assert not cpu.hold(8, 1, flat) and not ShapeCosts().hold(4, 1, flat)  # nothing to hold, nothing measured
    gpu.step(12, None)  # a prompt chunk beside the decode rows: its rows have no logits, no draft keeps them
    assert not gpu.hold(4, 1, flat)


def test_a_count_not_measured_is_scaled_from_the_nearest_one_by_the_table():
    sc = ShapeCosts()
    settled(sc, 0.010)
    sc.step(3, 0.020)  # a client finished: three rows never ran steadily, nor after a change
    run_of(sc, 8, [0.020, 0.020, 0.010])
    table = {3: 1.0, 4: 1.0, 8: 1.0}
    assert sc.hold(3, 1000, table.__getitem__)  # three rows as dear as four, a change to three as one to four
    table[8] = 2.0  # eight rows twice three's (its steady measured, three's scaled from it): held only
    assert sc.hold(3, 1, table.__getitem__) and not sc.hold(3, 10, table.__getitem__)  # while drafts come soon


def holding(n_outputs: int = 17):
    """A planner whose last steps ran eight rows (a draft beside four decode rows) and whose counts
    cost alike when replayed (a GPU-like clock), with drafts every few steps."""
    costs = StepCosts({k: 1.0 if k <= 7 else 1.6 for k in range(1, 17)})  # from nine rows on, dearer
    costs.observe(4, 0.010)
    pl = planner(costs, n_outputs=n_outputs)
    settled(pl.shapes, 0.010)
    pl._gap = 2.0  # (what settle keeps from steps with drafts outside a hold)
    return pl


def test_a_held_step_is_padded_and_the_pads_are_no_drafters():
    pl = holding()
    d = Fixed([])  # looks, finds nothing
    p = Plan(decode=[DecodeRow(seq(0, d)), *[DecodeRow(seq(i)) for i in range(1, 4)]])
    pl.plan(p)
    assert p.decode_rows == 8 and sum(r.pad for r in p.decode) == 4 and pl._held == 8
    assert all(c == pytest.approx(1.0) for k, c in d.control.costs.items() if k <= 4)  # inside the hold: free
    assert d.control.costs[5] == pytest.approx(1.0 + 0.006 / 0.0025)  # beyond it: what the ninth row adds
    padded = next(r for r in p.decode if r.pad)
    assert padded.draft == [padded.seq.last] * padded.pad  # filler, verified like any draft
    outs = [SeqOutput(seq=r.seq, accepted=1 if r.pad else 0) for r in p.decode]  # one filler row matched
    pl.settle(p, StepResult(outputs=outs, seconds=0.010, rows=8, n_prompt=0))
    assert d.fed[-1][:2] == (0, 0) and p.decode[0].seq.stats.drafted == 0  # nobody's drafts, nobody's bill
    assert pl._gap == 2.0  # a hold says nothing of how often drafts change the shape


def test_a_step_is_not_held_without_room_nor_beside_a_prompt_chunk():
    pl = holding(n_outputs=6)  # two draft rows reserved: eight rows cannot be reached
    p = Plan(decode=[DecodeRow(seq(0, Fixed([]))), *[DecodeRow(seq(i)) for i in range(1, 4)]])
    pl.plan(p)
    assert p.decode_rows == 4 and pl._held == 0
    pl = holding()
    waiting = seq(9)
    waiting.prompt = list(range(1, 50))
    p = Plan(decode=[DecodeRow(seq(0, Fixed([]))), *[DecodeRow(seq(i)) for i in range(1, 4)]],
             prefills=[Prefill(waiting, 8)])
    pl.plan(p)
    assert p.decode_rows == 4 and pl._held == 0  # a chunk changes the shape anyway
