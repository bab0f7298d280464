"""Looking for a draft has a price of its own (issue 29, seen on a lent H200: prompt lookup's search and
the pricing of its lengths, paid on every step, were a tenth of SmolLM2's step there, and free writing
ran at 0.77-0.85x plain). A drafter rests between looks that do not pay, for a stride that doubles up
to where looking costs REST_SHARE of plain decoding (none where a look costs under twice that), and
looks every step again once a look pays
(engine/speculation/adaptive.py `looked`); a resting drafter is neither priced nor asked
(engine/speculation/planner.py)."""
from __future__ import annotations

import random

import pytest

from ggufdesk.engine.batching.runner import SeqOutput, StepResult
from ggufdesk.engine.batching.scheduler import DecodeRow, Plan
from ggufdesk.engine.speculation.adaptive import MIN_EVIDENCE, REST_SHARE, DraftLength
from ggufdesk.engine.speculation.lookup import PromptLookup
from ggufdesk.engine.speculation.step_cost import StepCosts
from tests.engine.test_adaptive_recovery import FIXED_S, PLAIN_S, ROW_S, passage
from tests.engine.test_step_cost import TABLE, Fixed, planner, seq


def simulate(lk: PromptLookup, prompt: list[int], truth: list[int], look_s: float) -> tuple[list[bool], int]:
    """The step loop's calls, as in test_adaptive_recovery.simulate, with every look (a step on which
    the drafter was asked) charged `look_s` seconds. Returns (per token: from a draft?, looks)."""
    history, last = list(prompt[:-1]), prompt[-1]
    from_draft: list[bool] = []
    looks = i = 0
    while i < len(truth):
        k = min(lk.k, len(truth) - i - 1)
        looking = look_s if k > 0 else 0.0
        looks += k > 0
        draft = lk.propose(history, last, k)[:k] if k > 0 else []
        n = 0
        while n < len(draft) and draft[n] == truth[i + n]:
            n += 1
        emitted = truth[i:i + n + 1]
        step = PLAIN_S if not draft else FIXED_S + ROW_S * len(draft)
        lk.feedback(len(draft), n, step + looking, looking)
        history += [last] + emitted[:-1]
        last = emitted[-1]
        from_draft += [True] * n + [False]
        i += len(emitted)
    return from_draft, looks


def free_text(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    prompt = [1] + [rng.randrange(10, 50) for _ in range(40)]
    return prompt, [rng.randrange(10, 50) for _ in range(n)]  # reuses tokens and pairs, never a passage


def unmatched(n: int) -> tuple[list[int], list[int]]:
    """A prompt and an answer that share no n-gram: every look finds nothing and costs only itself."""
    return [1, *range(2000, 2040)], list(range(5000, 5000 + n))


def test_looks_that_cost_a_tenth_of_a_step_and_find_nothing_become_rare():
    prompt, truth = unmatched(400)
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True)
    _, looks = simulate(lk, prompt, truth, 0.1 * PLAIN_S)
    # every step before; now, once the stride has grown, one every 0.1 / REST_SHARE = 5 tokens
    assert lk.control.stride in (4, 5)  # (4: the float division can land a hair under 5)
    assert looks <= 400 / 5 + 15, looks


def test_looks_cheaper_than_the_rest_allows_go_on_every_step():
    prompt, truth = unmatched(400)
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True)
    _, looks = simulate(lk, prompt, truth, 1.9 * REST_SHARE * PLAIN_S)  # (under twice the share: no rest)
    assert lk.control.stride == 1 and looks == 400 - 2  # (not the first step, a plain probe, nor the last)


def test_failed_probes_keep_a_rest_up_but_do_not_stretch_it():
    """Failed drafts cost far more than a look, but the pause and the evidence answer for them: the
    rest stays at what looking costs (a copy that starts meanwhile is caught 5 tokens late at most)."""
    prompt, truth = free_text(400)
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True)
    _, looks = simulate(lk, prompt, truth, 0.1 * PLAIN_S)
    assert looks <= 100 and 1 < lk.control.stride <= 5, (looks, lk.control.stride)


def test_a_copy_after_long_free_text_is_still_drafted():
    text = passage(240)
    _, free = free_text(200, seed=1)
    prompt = [1] + text + [2, 3]
    truth = free + [4] + text
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True)
    from_draft, _ = simulate(lk, prompt, truth, 0.1 * PLAIN_S)
    copy = from_draft[len(free) + 1:]
    assert sum(copy) >= 0.8 * len(copy), f"only {sum(copy)} of {len(copy)} copied tokens were drafted"
    assert lk.control.stride == 1  # the copy's looks paid


def test_a_look_that_pays_brings_back_a_look_every_step():
    c = DraftLength(k_min=1, k_max=8, adaptive=True, label="lookup")
    c.feedback(0, 0, PLAIN_S)
    for _ in range(MIN_EVIDENCE + 2):  # looks that find nothing, each a fifth of a step
        c.feedback(0, 0, 1.2 * PLAIN_S)
        c.looked(0, 0, 1.2 * PLAIN_S, 0.2 * PLAIN_S)
    assert c.stride > 1 and c.k == 0  # resting
    while c.k == 0:
        c.feedback(0, 0, PLAIN_S)
    c.feedback(4, 4, FIXED_S + 4 * ROW_S)
    c.looked(4, 4, FIXED_S + 4 * ROW_S, 0.2 * PLAIN_S)
    assert c.stride == 1 and c.k > 0


def test_an_unpriced_look_changes_nothing():
    """A modelled clock (the tests' ModelClock) moves only when the model decodes: looks cost 0 there."""
    c = DraftLength(k_min=1, k_max=8, adaptive=True, label="lookup")
    c.feedback(0, 0, PLAIN_S)
    for _ in range(4 * MIN_EVIDENCE):
        c.feedback(0, 0, PLAIN_S)
        c.looked(0, 0, PLAIN_S, 0.0)
    assert c.stride == 1 and not c.gains and c.k > 0


def test_fixed_k_never_rests():
    c = DraftLength(k_min=1, k_max=8, adaptive=False, label="lookup")
    c.feedback(0, 0, PLAIN_S)
    for _ in range(4 * MIN_EVIDENCE):
        c.feedback(0, 0, 1.5 * PLAIN_S)
        c.looked(0, 0, 1.5 * PLAIN_S, 0.5 * PLAIN_S)
    assert c.k == 8


def test_a_resting_drafter_is_neither_priced_nor_asked():
    costs = StepCosts(TABLE)
    costs.observe(1, 0.010)
    d = Fixed(list(range(100, 116)))
    d.control.adaptive = True
    d.control.feedback(0, 0, 1.0)  # a plain step: t0 known
    d.control.look_at = d.control.tokens + 3  # resting for three more tokens
    before = dict(d.control.costs or {})
    pl = planner(costs)
    p = Plan(decode=[DecodeRow(seq(0, d))])
    pl.plan(p)
    assert p.decode[0].draft == [] and d.asked == [] and (d.control.costs or {}) == before
    pl.settle(p, StepResult(outputs=[SeqOutput(seq=p.decode[0].seq, accepted=0)], seconds=0.010, rows=1,
                            n_prompt=0))
    assert d.fed == [(0, 0, pytest.approx(1.0))]  # billed as a plain step, nothing for looking
