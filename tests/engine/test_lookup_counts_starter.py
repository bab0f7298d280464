"""Counting on with the real starter's vocabulary (slow tier): Gemma 3 writes a digit per token, so a
list that goes past 9 is drafted right only when lookup reads a number whole; the output stays plain's."""
from __future__ import annotations

import pytest

from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from tests.engine.live import Live

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_list_past_nine_is_counted_on_whole_and_stays_plains_text(starter_model):
    live = Live(starter_model, LoadSettings(n_ctx=1024, n_threads=2, n_threads_batch=2))
    try:
        prompt = live.tokens("".join(f"Item {i}: the red box.\n" for i in range(1, 10)) + "Item")
        plain = live.plain(prompt, 48)
        assert plain.text.startswith(" 10: the red box.\nItem 11: the red box.\nItem 12")
        assert [live.vocab.piece(t) for t in live.tokens("Item 10")[-2:]] == [b"1", b"0"]  # a digit per token
        runs = {}
        # (the first speculative run of an engine starts drafting a step later, its step costs not yet
        # timed: run once before the two compared)
        for off in ("warm", SpeculationSettings().lookup_hints_off, "sentence_ends,counts"):
            live.forget()
            drafter = live.lookup(prompt, lookup_hints_off=off.replace("warm", ""))
            (runs[off],) = live.run(live.sequence(prompt, 48, drafter=drafter), on_step=Live.check_kv)
    finally:
        live.close()
    counted, copied = (runs[k].stats for k in list(runs)[1:])
    assert all(r.tokens == plain.tokens for r in runs.values())
    wasted = counted.drafted - counted.accepted
    assert wasted <= 1 and counted.accepted > 30, counted  # every number drafted right: 10, 11, 12... (here: all)
    assert copied.drafted - copied.accepted >= wasted + 3, copied  # without counting on: the old number, rejected
