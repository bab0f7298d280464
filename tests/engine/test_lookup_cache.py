"""The conversation-wide n-gram cache: earlier requests' prompts and answers, bounded, no match across documents."""
from __future__ import annotations

from ggufdesk.engine.speculation.lookup import MATCH_CAP, SEP, NgramCache, PromptLookup


def test_a_later_request_matches_an_earlier_answer():
    c = NgramCache(3)
    c.feed([1, 10, 11, 12, 13, 14, 15, 16])  # request 1: prompt + answer
    c.feed([1, 50, 51, 12, 13])  # request 2, another conversation, ends with 12 13
    n, pos, m = c.match()
    assert n == 2 and m == 2 and c.continuation(pos, 4) == [14, 15, 16]  # stops at the document's end


def test_a_growing_conversation_extends_its_document():
    c = NgramCache(3)
    c.feed([1, 2, 3, 4])
    c.feed([1, 2, 3, 4, 5, 6])  # the next turn: the same tokens and more
    assert c.arena == [1, 2, 3, 4, 5, 6]
    c.feed([1, 2, 9])  # an edited conversation: a new document
    assert c.arena == [1, 2, 3, 4, 5, 6, SEP, 1, 2, 9]


def test_the_match_length_is_measured_beyond_the_ngram_and_capped():
    c = NgramCache(2)
    text = list(range(100, 160))
    c.feed([1] + text + [2] + text[:40])
    n, pos, m = c.match()
    assert n == 2 and m == MATCH_CAP and c.continuation(pos, 3) == text[40:43]
    c.feed([7] + text[35:40])  # a new document: its match ends at its own start
    n, pos, m = c.match()
    assert (n, m) == (2, 5) and c.continuation(pos, 2) == text[40:42]


def test_no_match_spans_two_documents():
    c = NgramCache(3)
    c.feed([5, 6])
    c.feed([7, 8])
    c.feed([6, 7, 9])
    assert c.match() == (0, -1, 0)  # 6 7 never occurred inside one document


def test_the_cache_is_bounded_and_keeps_the_newest_documents():
    c = NgramCache(3, max_tokens=1000)
    for i in range(50):
        c.feed([1] + [1000 * i + j for j in range(100)])
    assert len(c) <= 1000
    assert sum(len(w) for w in c.where) <= 3 * 1000
    c.feed([1, 49000 + 10, 49000 + 11])  # the newest document is still there
    n, pos, _ = c.match()
    assert n == 2 and c.continuation(pos, 2) == [49012, 49013]
    c.feed([1, 10, 11])  # the oldest is gone
    assert c.match() == (0, -1, 0)


def test_lookup_drafts_from_the_shared_cache():
    cache = NgramCache(3)
    answer = list(range(200, 260))
    cache.feed([1, 2, 3] + answer)  # an earlier request
    lk = PromptLookup(ngram=3, k_min=1, k_max=8, adaptive=False, history=cache)
    assert lk.propose([1, 9, 9] + answer[:5], answer[5], 8) == answer[6:14]
    assert len(cache) == 3 + len(answer)  # read, not written: the worker feeds it after the request
    own = PromptLookup(ngram=3, k_min=1, k_max=8, adaptive=False)
    assert own.propose([1, 9, 9] + answer[:5], answer[5], 8) == []  # without it: nothing to copy


def test_the_longer_match_wins_between_this_request_and_the_history():
    history = NgramCache(3)
    history.feed([1, 20, 21, 22, 23, 24, 25, 26, 27])  # an earlier request: a long match, then 27
    lk = PromptLookup(ngram=3, k_min=1, k_max=8, adaptive=False, history=history)
    own = [1, 25, 26, 90, 91, 20, 21, 22, 23, 24, 25]  # in this request: 25 -> 26 -> 90; earlier: ... 25 -> 26 -> 27
    assert lk.propose(own, 26, 3) == [27]
    lk2 = PromptLookup(ngram=3, k_min=1, k_max=8, adaptive=False, history=history)
    assert lk2.propose([1, 25, 26, 90, 91, 22, 7, 25], 26, 3)[:1] == [90]  # here the own match is longer


def test_a_loop_in_the_text_being_written_is_drafted_round_again():
    c = NgramCache(3)
    c.feed([1, 7, 8, 9, 7, 8, 9, 7, 8])
    n, pos, m = c.match()
    assert n == 3 and c.continuation(pos, 7, loop=True) == [9, 7, 8, 9, 7, 8, 9]
    assert c.continuation(pos, 7) == [9, 7, 8]  # without loop: only what is there
    c.feed([1, 7, 8, 9, 7, 8, 9, 7, 8, 9, 5])
    c.feed([2, 7, 8])  # an earlier document's end is not a loop of this one
    n, pos, _ = c.match()
    assert c.continuation(pos, 5, loop=True) == [9, 5]


def test_the_occurrence_with_the_longest_real_match_wins_over_the_latest():
    source = list(range(100, 130))  # a passage in the prompt
    mixed = [7, 8, 9, 127, 128, 129, 55, 56]  # the answer so far met the passage's last 3-gram elsewhere
    d = NgramCache(3)
    d.feed([1] + source + [2] + mixed + [3] + source[20:30])  # now it quotes 120..129 as in the passage
    n, pos, m = d.match()
    assert n == 3 and m == 10 and d.continuation(pos, 1) == [2]  # the passage's 10-token match, not mixed's 3
    c = NgramCache(3)
    c.feed([1] + source + [2] + mixed + [3, 60, 127, 128, 129])  # neither occurrence matches beyond the 3-gram
    n, pos, m = c.match()
    assert (n, m) == (3, 3) and c.continuation(pos, 2) == [55, 56]  # a tie: the latest


def test_agreement_counts_the_occurrences_that_continue_alike():
    c = NgramCache(2)
    c.feed([1, 7, 8, 30, 0, 7, 8, 30, 0, 7, 8, 31, 0, 7, 8])
    n, pos, m = c.match()
    assert n == 2 and c.continuation(pos, 1) == [31]  # the latest occurrence wins a tie
    assert c.agreement([7, 8], pos) == (3, 1)  # three earlier "7 8": one goes on with 31, two with 30
    c.feed([2, 5, 6, 40, 5, 6, 40, 5, 6])
    n, pos, m = c.match()
    assert c.agreement([5, 6], pos) == (2, 2)
    assert c.agreement([9, 9], 0) == (0, 0)  # never seen


def test_a_short_match_is_judged_by_whether_its_occurrences_agree():
    """Split continuations make a 2-token match count as one token; unanimous ones as three."""
    lk = PromptLookup(ngram=2, k_min=1, k_max=8, adaptive=False)
    lk.propose([1, 7, 8, 30, 0, 7, 8, 31, 0, 7], 8, 4)
    split = lk._last_m
    lk = PromptLookup(ngram=2, k_min=1, k_max=8, adaptive=False)
    lk.propose([1, 7, 8, 30, 0, 5, 7, 8, 30, 0, 9, 7], 8, 4)  # the real match is "7 8" alone
    agreed = lk._last_m
    lk = PromptLookup(ngram=2, k_min=1, k_max=8, adaptive=False)
    lk.propose([1, 7, 8, 30, 0, 9], 8, 4)
    once = lk._last_m
    assert (split, once, agreed) == (1, 1, 3)


def _state(c: NgramCache) -> tuple:
    return c.arena, c.doc_start, c.where, c.prev


def test_a_request_growing_look_by_look_is_indexed_as_if_fed_whole():
    import random
    rng = random.Random(3)
    text = [rng.randrange(20) for _ in range(300)]
    grown, fed = NgramCache(3), NgramCache(3)
    i = looked = 40
    while i < len(text):
        grown.grow(text[:i - 1], text[i - 1])  # a look: the sequence's tokens and its last one
        fed.feed(text[:i])
        assert _state(grown) == _state(fed)
        looked, i = i, i + rng.choice([1, 1, 2, 5])  # plain steps and accepted drafts
    grown.grow(text[:looked - 1], text[looked - 1])  # looked at again without a step: nothing new
    assert _state(grown) == _state(fed)  # (fed was not fed again)
    grown.grow(text[:looked - 8], text[looked - 8])  # a text shorter than the last: fed anew, as feed does
    fed.feed(text[:looked - 7])
    assert _state(grown) == _state(fed) and grown.doc_start == looked + 1


def test_a_shifted_context_starts_a_new_document():
    """A context shift (engine/batching/shift.py) drops half the text after its kept start: the text then
    no longer goes on from the arena's end, whether the drafter looks right after it or only after the
    text grew back past its old length (a drafter resting through the shift)."""
    text = list(range(1000, 1200))
    for regrown in (0, 150):
        c = NgramCache(3)
        c.grow(text[:99], text[99])
        shifted = text[:4] + text[52:100] + list(range(5000, 5000 + regrown))
        c.grow(shifted[:-1], shifted[-1])
        assert c.arena == text[:100] + [SEP] + shifted and c.doc_start == 101
