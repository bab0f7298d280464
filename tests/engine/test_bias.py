"""The sampler's logit bias from a request: token ids and text keys merged, and reported back as applied."""
from __future__ import annotations

import math

import pytest

from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.tokens import applied_bias, logit_bias


def test_entries_for_one_token_add_up_and_never_wins():
    """A text key's tokens may repeat (" the " and " a " both hold a space token): llama.cpp applies
    each entry, so their biases add; null (never) and ignore_eos's tokens are -inf."""
    ids, values = logit_bias([("5", -2.0), (5, -3.0), (7, None), ("9", 1)], never=[2], n_vocab=10)
    got = dict(zip(ids.tolist(), values.tolist()))
    assert got[5] == -5.0 and got[9] == 1.0 and math.isinf(got[7]) and math.isinf(got[2])
    assert applied_bias((ids, values)) == [[2, None], [5, -5.0], [7, None], [9, 1.0]]
    assert applied_bias(None) == []


@pytest.mark.parametrize("pairs,why", [
    ([("the", 1.0)], "token ids"), ([(10, 1.0)], "not in the vocabulary"), ([(-1, 1.0)], "not in the vocabulary"),
    ([(1, True)], "number or null"), ([(1, "x")], "number or null"), ([(1, 1e9)], "number or null"),
])
def test_a_bad_entry_is_a_settings_error(pairs, why):
    with pytest.raises(P.EngineRequestError) as e:
        logit_bias(pairs, never=[], n_vocab=10)
    assert why in str(e.value) and e.value.kind == "settings"
