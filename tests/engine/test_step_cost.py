"""Draft rows priced from whole-step costs (engine/speculation/step_cost.py, planner.py), without llama.cpp."""
from __future__ import annotations

import math
import random

import pytest

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.batching.prefix_cache import Slot
from ggufdesk.engine.batching.runner import SeqOutput, StepResult
from ggufdesk.engine.batching.scheduler import DecodeRow, Plan
from ggufdesk.engine.batching.sequence import Sequence, SequenceStatus
from ggufdesk.engine.speculation.adaptive import DraftLength
from ggufdesk.engine.speculation.drafter import Controlled
from ggufdesk.engine.speculation.lookup import PromptLookup
from ggufdesk.engine.speculation.planner import DraftPlanner
from ggufdesk.engine.speculation.step_cost import FRESH, PRIOR_FIXED, PRIOR_ROW, StepCosts

TABLE = {1: 1.8, 3: 2.4, 7: 3.6, 15: 6.0}  # rows 2, 4, 8, 16 in one-row steps


def test_the_table_shapes_the_curve_and_measurements_set_its_level():
    c = StepCosts(TABLE)
    assert c.predict(1) is None  # nothing measured: no prediction, no drafting
    assert c.shape(1) == 1.0 and c.shape(4) == 2.4 and c.shape(3) == pytest.approx(2.1)
    assert c.shape(24) == pytest.approx(6.0 + (6.0 - 3.6) / 8 * 8)  # beyond the table: its last slope
    c.observe(1, 0.010)
    assert c.predict(16) == pytest.approx(0.060)
    c.observe(4, 0.030)  # four rows measured dearer than the table says: it anchors rows near it
    assert c.predict(4) == pytest.approx(0.030) and c.predict(5) == pytest.approx(0.030 * c.shape(5) / 2.4)
    assert c.predict(1) == pytest.approx(0.010)
    assert StepCosts(None).shape(3) == PRIOR_FIXED + 2 * PRIOR_ROW and StepCosts(None).lengths(4) == [1, 2, 3, 4]
    assert c.lengths(8) == [1, 3, 7]


def test_an_old_measurement_gives_way_to_a_fresh_one():
    c = StepCosts(TABLE)
    c.observe(2, 0.018)
    for _ in range(70):
        c.observe(8, 0.072)  # (twice the table's level: the context grew)
    assert c.predict(2) == pytest.approx(0.072 * 1.8 / 3.6)  # scaled from the fresh 8-row steps


def uncached(c: StepCosts, rows: int) -> float | None:
    """StepCosts.predict's rule, from scratch: the count itself when fresh, else scaled by the table's
    shape from the nearest fresh count in ratio (the latest measured at a tie; any when none is fresh)."""
    rows = max(rows, 1)
    if rows in c.seconds and c.steps - c.seen[rows] <= FRESH:
        return c.seconds[rows]
    if not c.seconds:
        return None
    fresh = [r for r in c.seconds if c.steps - c.seen[r] <= FRESH] or list(c.seconds)
    anchor = min(fresh, key=lambda r: (abs(math.log(r / rows)), -c.seen[r]))
    return c.seconds[anchor] * c.shape(rows) / c.shape(anchor)


@pytest.mark.parametrize("seed", range(6))
def test_kept_predictions_equal_the_rule_recomputed_every_time(seed):
    # predictions and anchors are kept between steps (a step prices ~20 counts): whatever the steps
    # (repeats, new counts, counts going stale after FRESH steps, ties such as 2 between 1 and 4,
    # failed timings), every prediction is the one the rule gives from scratch
    rng = random.Random(seed)
    c = StepCosts({k: 1.0 + 0.3 * k + 0.2 * (k % 2) for k in range(1, 17)} if seed % 2 else TABLE)
    counts = [1, 1, 1, 2, 4, 5, 9, 17, 30]
    rows = 1
    for _ in range(400):
        rows = rng.choice(counts) if rng.random() < 0.3 else rows  # mostly the same count again
        c.observe(rows, rng.choice([0.0, rng.uniform(0.005, 0.05)]) if rng.random() < 0.05 else rng.uniform(0.005, 0.05))
        for _ in range(3 if rng.random() < 0.5 else 1):
            for r in rng.sample(range(1, 34), 8):
                want = uncached(c, r)  # (the same anchor: equal up to the order of one product)
                assert c.predict(r) == (None if want is None else pytest.approx(want, rel=1e-12))
        if rng.random() < 0.02:
            for _ in range(FRESH + 2):
                c.observe(1, 0.01)  # a long plain stretch: the others go stale


class Fixed(Controlled):
    """A drafter that proposes `tokens` and records its feedback."""

    def __init__(self, tokens: list[int], **kw) -> None:
        self.control = DraftLength(k_min=1, k_max=16, adaptive=False, label="lookup", costs=TABLE, **kw)
        self.tokens, self.fed, self.asked = tokens, [], []

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        self.asked.append(k)
        return self.tokens[:k]

    def feedback(self, n_drafted: int, n_accepted: int, cost: float, drafting: float = 0.0) -> None:
        self.fed.append((n_drafted, n_accepted, round(cost, 6)))


def seq(i: int, drafter=None) -> Sequence:
    s = Sequence(rid=f"r{i}", prompt=[1, 2, 3], sampling=SamplingSettings(), max_gen=100, drafter=drafter,
                 status=SequenceStatus.DECODING, slot=Slot(seq=i, tokens=[1, 2, 3]), last=5)
    return s


def planner(costs: StepCosts, n_outputs: int = 17) -> DraftPlanner:
    return DraftPlanner(costs, n_outputs=n_outputs, n_batch=64, n_ctx=1000, clock=lambda: 0.0)


def test_a_draft_row_beside_others_is_priced_by_what_it_adds_to_the_step():
    costs = StepCosts(TABLE)
    for rows in (1, 4, 8):
        costs.observe(rows, 0.010 * costs.shape(rows))
    d = Fixed(list(range(100, 116)))
    alone = Plan(decode=[DecodeRow(seq(0, d))])
    planner(costs).plan(alone)
    assert d.control.costs == pytest.approx(TABLE)  # alone: the verification table itself
    plain = [DecodeRow(seq(i)) for i in range(1, 4)]
    d2 = Fixed(list(range(100, 116)))
    beside = Plan(decode=[DecodeRow(seq(0, d2)), *plain])
    planner(costs).plan(beside)
    share = 0.010 * 2.4 / 4  # four rows: each one's share of the step
    assert d2.control.costs[3] == pytest.approx(1 + 0.010 * (costs.shape(7) - 2.4) / share)
    # beside others the first draft row costs half a share (alone: 0.8 of a plain step)
    assert d2.control.costs[1] == pytest.approx(1.5) and d2.control.costs[1] < TABLE[1]
    assert beside.decode[0].draft == list(range(100, 116))[:13] and beside.decode[0].seq.status is SequenceStatus.VERIFYING
    assert d2.asked == [13]  # the logits rows left beside 4 decode rows: 17 - 4


def test_rows_are_shared_in_turns_and_feedback_is_in_units_of_the_share():
    costs = StepCosts(TABLE)
    costs.observe(2, 0.018)
    a, b = Fixed([7] * 16), Fixed([8] * 16)
    pl = planner(costs, n_outputs=2 + 9)
    plans = []
    for _ in range(2):
        p = Plan(decode=[DecodeRow(seq(0, a)), DecodeRow(seq(1, b))])
        pl.plan(p)
        plans.append([len(r.draft) for r in p.decode])
        rows = 2 + sum(len(r.draft) for r in p.decode)
        outs = [SeqOutput(seq=r.seq, accepted=len(r.draft)) for r in p.decode]
        pl.settle(p, StepResult(outputs=outs, seconds=costs.predict(rows), rows=rows, n_prompt=0))
    assert plans == [[9, 0], [0, 9]]  # the first in line took the rows; next step the other is first
    assert [f[0] for f in a.fed] == [9, 0] and [f[0] for f in b.fed] == [0, 9]
    assert a.fed[1][2] == pytest.approx(1.0)  # a plain step costs one share (measured as predicted)
    assert a.fed[0][2] > 1.0 and a.fed[0][1] == 9


def parity(rows: int) -> float:
    """A step of `rows` rows with logits in one-row steps, as on the 2-core CPU with the starter:
    llama.cpp's kernel for its output head works on rows in pairs, so an odd count pays about one
    more pass over it (3 rows cost more than 4; engine/speculation/verify_cost.py)."""
    return 1.0 if rows == 1 else 0.6 + 0.25 * rows + (0.75 if rows % 2 else 0.0)


PARITY = {k: parity(k + 1) for k in range(1, 17)}  # every row count up to 17 measured


def test_beyond_a_table_of_every_row_count_its_pattern_repeats():
    c = StepCosts(PARITY)
    assert [c.shape(r) for r in range(1, 18)] == pytest.approx([parity(r) for r in range(1, 18)])
    assert [c.shape(r) for r in range(18, 30)] == pytest.approx([parity(r) for r in range(18, 30)])
    assert c.lengths(16) == list(range(1, 17)) and c.lengths(5) == [1, 2, 3, 4, 5]


def lookup_like() -> Controlled:
    """A drafter that sizes its own drafts by the prices, as lookup does (DraftLength.worth)."""
    d = Fixed(list(range(100, 116)))
    d.control = DraftLength(k_min=1, k_max=16, adaptive=True, label="lookup", sizes_drafts=True, costs=PARITY)
    for _ in range(3):
        d.control.feedback(0, 0, 1.0)  # plain steps: one share each

    def propose(history, last, k):
        d.asked.append(k)
        return d.tokens[:d.control.worth(0.9, k)]

    d.propose = propose  # type: ignore[method-assign]
    return d


def test_drafts_beside_others_land_the_step_on_a_cheap_row_count():
    """Beside four decode rows every length of the old table (1, 3, 7, 15) made the step's count odd
    and dear; priced by the step's whole count the drafters choose even counts, and beside three rows
    one draft row makes the step cheaper than none."""
    costs = StepCosts(PARITY)
    for rows in (1, 3, 4, 8):
        costs.observe(rows, 0.010 * parity(rows))
    drafters = [lookup_like() for _ in range(2)]
    four = Plan(decode=[DecodeRow(seq(0, drafters[0])), DecodeRow(seq(1, drafters[1])),
                        *(DecodeRow(seq(i)) for i in (2, 3))])
    planner(costs, n_outputs=17).plan(four)
    prices = drafters[0].control.costs
    assert prices[1] > prices[2] and prices[3] > prices[4]  # an odd count costs more than the even one above
    drafted = [len(r.draft) for r in four.decode]
    assert all(n > 0 for n in drafted[:2]) and (4 + sum(drafted)) % 2 == 0, drafted
    three = Plan(decode=[DecodeRow(seq(0, lookup_like())), *(DecodeRow(seq(i)) for i in (1, 2))])
    planner(costs, n_outputs=17).plan(three)
    assert three.decode[0].seq.drafter.control.costs[1] < 1.0  # one more row: a cheaper step
    assert (3 + len(three.decode[0].draft)) % 2 == 0


def test_a_drafter_that_does_not_look_this_step_costs_the_step_no_pricing():
    """Beside three others a resting drafter's bookkeeping is a GPU step's few percent (docs/bench/
    speculative-decoding.md, "What resting costs"): a drafter whose k is 0 is not priced, nor is what a
    change of shape would cost, and its step is billed as a plain one."""
    costs = StepCosts(TABLE)
    costs.observe(4, 0.024)
    pl = planner(costs)
    charged: list[int] = []
    penalty = pl.shapes.penalty
    pl.shapes.penalty = lambda rows: charged.append(rows) or penalty(rows)  # type: ignore[method-assign]
    resting = [Fixed(list(range(100, 116))) for _ in range(4)]
    for d in resting:
        d.control.disable("resting")  # k is 0
        d.control.costs = None
    p = Plan(decode=[DecodeRow(seq(i, d)) for i, d in enumerate(resting)])
    pl.plan(p)
    assert charged == [] and all(d.control.costs is None and not d.asked for d in resting)
    assert all(r.draft == [] and r.seq.status is SequenceStatus.DECODING for r in p.decode)
    pl.settle(p, StepResult(outputs=[SeqOutput(seq=r.seq, accepted=0) for r in p.decode], seconds=0.024, rows=4,
                            n_prompt=0))
    assert [d.fed for d in resting] == [[(0, 0, 1.0)]] * 4  # a plain step, as predicted
    looking = Fixed(list(range(100, 116)))
    p = Plan(decode=[DecodeRow(seq(0, looking)), *(DecodeRow(seq(i + 1, d)) for i, d in enumerate(resting[:3]))])
    pl.plan(p)
    assert charged == [4] and looking.asked and p.decode[0].draft


def test_the_plain_step_median_is_taken_when_read():
    c = DraftLength(k_min=1, k_max=16, adaptive=True, label="lookup", costs=TABLE)
    assert c.t0 is None and c.k == 0  # no plain step yet: a probe
    for seconds in (0.012, 0.010, 0.030):
        c.feedback(0, 0, seconds)
    assert c.t0 == 0.012 and c.k > 0
    c.feedback(0, 0, 0.009)
    assert c.t0 == pytest.approx((0.010 + 0.012) / 2)


def dozing_loop(lk, pl: DraftPlanner, s: Sequence, steps: int) -> tuple[list[int], list[bool]]:
    """Run `steps` one-row steps (nothing accepted): the token counts at which lk looked, and which
    steps billed it."""
    looks: list[int] = []
    real = lk.propose
    lk.propose = lambda h, last, k: looks.append(s.stats.n_gen) or real(h, last, k)
    billed = []
    for _ in range(steps):
        p = Plan(decode=[DecodeRow(s)])
        pl.plan(p)
        billed.append(bool(pl._bills))
        pl.settle(p, StepResult(outputs=[SeqOutput(seq=s, tokens=[7])], seconds=0.010, rows=1 + len(p.decode[0].draft),
                                n_prompt=0))
        s.stats.n_gen += 1
    lk.propose = real
    return looks, billed


def test_a_resting_drafter_is_skipped_until_its_next_look_and_then_told_what_was_written():
    """Beside three others the bookkeeping of drafters that only keep count is a GPU step's few
    percent: while its control's k stays 0 whatever the steps say (resting between looks, paused,
    disabled) the planner skips a drafter, and wakes it, told the tokens written, when a look is due."""
    costs = StepCosts(TABLE)
    pl = planner(costs)
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=TABLE)
    s = seq(0, lk)
    looks, billed = dozing_loop(lk, pl, s, 2)  # the first step measures a plain step; the second looks
    assert looks == [1] and billed == [True, True]
    c = lk.control
    c.look_at = due = c.tokens + 5  # resting: the next look 5 tokens on
    learnt = costs.steps
    looks, billed = dozing_loop(lk, pl, s, 7)
    assert billed == [True, False, False, False, False, True, True]  # one resting step, then skipped
    assert looks == [due, due + 1]  # looked when due (tokens count as n_gen does), as if never skipped
    assert c.tokens == lk.evidence.clock == s.stats.n_gen  # every token counted, asleep or not
    assert costs.steps == learnt + 7  # the steps a drafter slept through still taught their cost


def test_a_step_where_every_drafter_dozes_prices_nothing_and_bills_nothing():
    costs = StepCosts(TABLE)
    pl = planner(costs, n_outputs=40)
    lks = [PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=TABLE) for _ in range(3)]
    seqs = [seq(i, lk) for i, lk in enumerate(lks)]
    for lk in lks:
        lk.control.disable("test")
    asked = []
    real = costs.predict
    costs.predict = lambda rows: asked.append(rows) or real(rows)  # type: ignore[method-assign]
    for step in range(3):
        p = Plan(decode=[DecodeRow(s) for s in seqs])
        pl.plan(p)
        assert all(r.draft == [] for r in p.decode)
        if step:  # (the first step finds them disabled: plain rows, billed; then they doze)
            assert asked == [] and pl._bills == {}
        pl.settle(p, StepResult(outputs=[SeqOutput(seq=s, tokens=[7]) for s in seqs], seconds=0.010, rows=3,
                                n_prompt=0))
        asked.clear()
        for s in seqs:
            s.stats.n_gen += 1
    assert costs.steps == 3  # their steps still taught the cost of three rows


def test_a_paused_drafter_sleeps_through_its_pause_and_a_disabled_one_for_good():
    pl = planner(StepCosts(TABLE))
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=TABLE)
    s = seq(0, lk)
    dozing_loop(lk, pl, s, 2)
    lk.control.pause("slower than plain")
    start, resume = s.stats.n_gen, lk.control.resume_at
    looks, billed = dozing_loop(lk, pl, s, 11)
    assert looks == [] and billed == [True] + [False] * 10  # the step that found it paused, then skipped
    # the status counts down while it sleeps, as if told every token
    assert lk.control.status == f"disabled: slower than plain; retrying after {resume - s.stats.n_gen} more tokens"
    looks, billed = dozing_loop(lk, pl, s, 29)
    assert billed.count(True) == 40 - (resume - start)  # billed again from the pause's end on
    assert looks[0] == resume and lk.control.status == "lookup"  # looked again at the token the pause ended
    lk.control.disable("the context is full")
    looks, billed = dozing_loop(lk, pl, s, 50)
    assert looks == [] and billed == [True] + [False] * 49
    assert lk.control.status == "disabled: the context is full"
