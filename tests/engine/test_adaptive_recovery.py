"""Adaptive speculation cannot lock itself out: pauses end, refused match lengths are probed again,
and a text whose first drafts fail but which later turns copyable gets drafted (issue: 7 drafted
tokens in a 160-token copy where fixed K=16 accepted 146)."""
from __future__ import annotations

import random

from ggufdesk.engine.speculation.adaptive import MIN_EVIDENCE, PAUSE_FIRST, DraftLength
from ggufdesk.engine.speculation.evidence import PROBE_FIRST, Evidence
from ggufdesk.engine.speculation.lookup import PromptLookup

PLAIN_S, FIXED_S, ROW_S = 0.010, 0.015, 0.003  # a CPU as measured: verifying k costs 1.5 plain steps + k/3


def simulate(drafter, prompt: list[int], truth: list[int], rejected: list[int] | None = None) -> list[bool]:
    """Drive a drafter the way the step loop does (engine/speculation/planner.py), against a model that
    emits `truth`, each step charged by a CPU cost model in seconds.

    Returns, per emitted token, whether it came from an accepted draft; appends to `rejected` the
    position of every rejected draft.
    """
    history, last = list(prompt[:-1]), prompt[-1]
    from_draft: list[bool] = []
    i = 0
    while i < len(truth):
        k = min(drafter.k, len(truth) - i - 1)
        draft = drafter.propose(history, last, k)[:k] if k > 0 else []
        n = 0
        while n < len(draft) and draft[n] == truth[i + n]:
            n += 1
        emitted = truth[i:i + n + 1]
        if n < len(draft) and rejected is not None:
            rejected.append(i + n)
        drafter.feedback(len(draft), n, PLAIN_S if not draft else FIXED_S + ROW_S * len(draft))
        history += [last] + emitted[:-1]
        last = emitted[-1]
        from_draft += [True] * n + [False]
        i += len(emitted)
    return from_draft


def passage(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


def misleading_then_copy(text: list[int]) -> tuple[list[int], int]:
    """An answer that first quotes 3 to 10 tokens of the passage at a time and then departs from it
    (so drafts made there fail), then copies the passage. Returns (tokens, where the copy starts)."""
    out: list[int] = []
    for j in range(8):
        out += text[20 * j:20 * j + 3 + j] + [500 + j, 600 + j, 700 + j]
    return out + [4] + text, len(out) + 1


def test_first_drafts_fail_then_the_copy_is_drafted():
    """The lock-out of the issue, reproduced on the old controller (0 of 240 copied tokens drafted
    at these costs): adaptive must draft the copy almost as fully as a fixed K does."""
    text = passage(240)
    prompt = [1] + text + [2, 3]
    truth, start = misleading_then_copy(text)
    rejected: list[int] = []
    fixed = simulate(PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=False), prompt, truth, rejected)
    assert sum(1 for i in rejected if i < start) >= 6  # drafts made before the copy do fail
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True)
    copy = simulate(lk, prompt, truth)[start:]
    assert sum(copy) >= 0.8 * len(copy), f"only {sum(copy)} of {len(copy)} copied tokens were drafted"
    assert sum(copy) >= 0.85 * sum(fixed[start:])
    assert lk.status == "lookup"


def test_free_text_is_not_drafted_beyond_a_few_probes():
    """No long matches (free writing): short matches stay refused except for rare, short probes."""
    rng = random.Random(0)
    prompt = [1] + [rng.randrange(10, 50) for _ in range(40)]
    truth = [rng.randrange(10, 50) for _ in range(400)]  # reuses tokens and pairs, never a passage
    lk = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True)
    simulate(lk, prompt, truth)
    drafted = sum(n for n, _ in lk.control.samples)
    assert lk.control.spec_steps <= 12 and drafted <= 24, (lk.control.spec_steps, drafted)


def test_a_pause_ends_and_doubles_when_speculation_is_still_slower():
    c = DraftLength(k_min=1, k_max=8, adaptive=True, label="draft")
    c.feedback(0, 0, PLAIN_S)
    for _ in range(MIN_EVIDENCE):
        c.feedback(c.k or 8, 0, 0.060)
    assert c.k == 0 and c.status.startswith("disabled: slower than plain")
    for _ in range(PAUSE_FIRST - 1):
        c.feedback(0, 0, PLAIN_S)
    assert c.k == 0
    c.feedback(0, 0, PLAIN_S)
    assert c.k > 0 and c.status == "draft"  # tried again, on fresh evidence
    for _ in range(MIN_EVIDENCE):
        c.feedback(c.k, 0, 0.060)
    assert c.k == 0 and c.pauses == 2
    for _ in range(2 * PAUSE_FIRST - 1):
        c.feedback(0, 0, PLAIN_S)
    assert c.k == 0  # the second pause is twice as long
    c.feedback(0, 0, PLAIN_S)
    assert c.k > 0


def test_a_pause_that_ends_on_copyable_text_keeps_speculation_on():
    c = DraftLength(k_min=1, k_max=8, adaptive=True, label="lookup")
    c.feedback(0, 0, PLAIN_S)
    for _ in range(MIN_EVIDENCE):
        c.feedback(c.k or 8, 0, 0.060)
    for _ in range(PAUSE_FIRST):
        c.feedback(0, 0, PLAIN_S)
    for _ in range(3 * MIN_EVIDENCE):
        k = c.k
        assert k > 0
        c.feedback(k, k, FIXED_S + ROW_S * k)  # now every draft is accepted
    assert c.status == "lookup" and c.pauses == 1


def test_a_hard_reason_disables_for_good():
    c = DraftLength(k_min=1, k_max=8, adaptive=True, label="draft")
    c.disable("the draft's context (512) is full")
    for _ in range(4 * PAUSE_FIRST):
        c.feedback(0, 0, PLAIN_S)
    assert c.k == 0 and c.status == "disabled: the draft's context (512) is full"


def test_evidence_probes_a_refused_class_with_backoff():
    ev = Evidence()
    gaps = []
    for _ in range(3):
        n = 1
        while not ev.refused(2):
            n += 1
        gaps.append(n)
        ev.record(2, 2, 0)  # the probe failed
    assert gaps == [PROBE_FIRST, 2 * PROBE_FIRST, 4 * PROBE_FIRST]
    while not ev.refused(2):
        pass
    ev.record(2, 2, 2)  # a probe that succeeds resets the gap
    n = 1
    while not ev.refused(2):
        n += 1
    assert n == PROBE_FIRST


def test_evidence_longer_matches_rate_higher_and_failures_fade():
    ev = Evidence()
    assert ev.alpha(1) < ev.alpha(2) < ev.alpha(3) <= ev.alpha(4) < ev.alpha(8) < ev.alpha(20)
    fresh20 = ev.alpha(20)
    for _ in range(8):
        ev.record(8, 8, 0)
    low = ev.alpha(8)
    # failures of 8-token matches sink that class and make the whole request look less copyable,
    # but a 20-token match is still rated far above them
    assert low < 0.3 and 0.6 < ev.alpha(20) < fresh20
    ev.tick(256)  # four half-lives later the failures weigh 1/16
    assert ev.alpha(8) > low + 0.3
    for _ in range(4):
        ev.record(1, 4, 4)  # short matches accepted: longer ones are rated at least as high
    assert ev.alpha(3) >= ev.alpha(1) > 0.6


def test_evidence_a_copying_request_rates_classes_it_has_not_tried_higher():
    """A class is consulted a few times per answer; what the request's drafts did as a whole counts
    for all of them (accepted beyond what the priors expected: every prior rises, and back)."""
    ev, other = Evidence(), Evidence()
    for _ in range(6):
        ev.record(20, 15, 15)
        other.record(20, 15, 3)
    assert ev.alpha(2) > Evidence().alpha(2) > other.alpha(2)
    assert ev.ratio() > 1.0 > other.ratio()
    ev.tick(64 * 8)
    assert abs(ev.alpha(2) - Evidence().alpha(2)) < 0.01  # faded


class Counting:
    """A drafter wrapper that adds up drafted and accepted tokens."""

    def __init__(self, inner: PromptLookup) -> None:
        self.inner, self.drafted, self.accepted, self.seconds = inner, 0, 0, 0.0

    @property
    def k(self) -> int:
        return self.inner.k

    @property
    def status(self) -> str:
        return self.inner.status

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        return self.inner.propose(history, last, k)

    def feedback(self, n_drafted: int, n_accepted: int, seconds: float) -> None:
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.seconds += seconds
        self.inner.feedback(n_drafted, n_accepted, seconds)

    def woke(self, tokens: int) -> None:
        self.inner.woke(tokens)


COSTS = {1: 1.8, 3: 2.5, 7: 3.5, 15: 6.0}  # the starter on 2 CPU threads, in plain steps
STOP = 9  # the "." of the sentences below


def sentences(n: int, length: int = 20) -> list[list[int]]:
    return [list(range(1000 + 50 * i, 1000 + 50 * i + length - 1)) + [STOP] for i in range(n)]


def with_and_without_cut(prompt: list[int], truth: list[int]) -> dict[bool, Counting]:
    """The same answer drafted by adaptive lookup that knows sentence ends (True) and one that does not."""
    runs = {}
    for cut in (False, True):
        d = Counting(PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS,
                                  ends_sentence=(lambda t: t == STOP) if cut else None))
        simulate(d, prompt, truth)
        runs[cut] = d
    return runs


def test_drafts_stop_at_sentence_ends_once_the_answer_stops_there():
    """A quoting answer: each quote ends where its sentence does, while the source goes on. After
    the first quotes, drafts reaching a sentence end are cut there: fewer rows wasted, less time."""
    src = sentences(8)
    prompt = [1] + [t for s in src for t in s] + [2, 3]
    truth: list[int] = []
    for i, j in enumerate((0, 3, 1, 4, 2, 6, 5, 7)):
        truth += [60 + 4 * i, 61 + 4 * i, 62 + 4 * i] + src[j]  # words of the answer's own, then the quote
    runs = with_and_without_cut(prompt, truth)
    assert runs[True].accepted >= runs[False].accepted
    wasted = {cut: d.drafted - d.accepted for cut, d in runs.items()}
    assert wasted[True] <= 0.75 * wasted[False], wasted
    assert runs[True].seconds < 0.97 * runs[False].seconds
    assert runs[True].inner.reached >= 2 and runs[True].inner.crossed == 0


def test_a_copy_across_sentences_keeps_its_long_drafts():
    src = sentences(12)
    text = [t for s in src for t in s]
    prompt = [1] + text + [2, 3]
    runs = with_and_without_cut(prompt, text)
    assert runs[True].accepted >= 0.95 * runs[False].accepted
    assert runs[True].inner.crossed >= 3 and runs[True].inner.crossed == runs[True].inner.reached


def test_a_draft_that_starts_with_a_sentence_end_is_cut_at_the_next_one():
    """Once the cut is on, a draft that follows a sentence end (a closing quote) and opens with
    another (the newline before the answer's next line) runs to the next sentence end; it used to
    be cut to that newline alone, a one-token draft that rarely pays for its row."""
    nl = 8  # a newline: a sentence end too
    d = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS,
                     ends_sentence=lambda t: t in (STOP, nl))
    d.reached, d.crossed = 3, 0  # this request's quotes stopped at their sentence ends
    source = [40, 41, 42, STOP, nl] + list(range(20, 27)) + [STOP, nl] + list(range(30, 40))
    prompt = [1] + source + [2, 3]
    after_quote = d.propose(prompt + [40, 41, 42], STOP, 16)
    assert after_quote == source[4:19]  # the newline, the next line and past its end: 15, the shortest measured length there
    mid_sentence = d.propose(prompt + [40, 41], 42, 16)
    assert mid_sentence == [STOP]  # mid-sentence, the end comes first: the quote stops there, as before


QUOTE, CLOSE = 7, 10  # a '"' alone, and '."' (a sentence end that closes a quote)


def quote_marks(t: int) -> tuple[bool, str]:
    return False, '"' if t in (QUOTE, CLOSE) else ""


def test_inside_an_open_quote_a_draft_stops_at_its_first_sentence_end_from_the_start():
    """With no evidence yet from this request, a draft written inside a quote that it does not
    close stops at its sentence end (the quote will close there, and the source cannot say so);
    the same draft outside a quote, or one that closes the quote itself, runs on."""
    def draft(source: list[int], answer: list[int], reached: int = 0, crossed: int = 0) -> list[int]:
        d = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS,
                         ends_sentence=lambda t: t in (STOP, CLOSE), quote_marks=quote_marks)
        d.reached, d.crossed = reached, crossed  # this request's drafts that reached a sentence end / went past it
        return d.propose([1] + source + [2, 3] + answer[:-1], answer[-1], 16)

    source = [40, 41, 42, 43, 44, STOP] + list(range(50, 70))
    assert draft(source, [QUOTE, 40, 41, 42]) == source[3:6]  # up to the end: 3, a measured length
    assert draft(source, [40, 41, 42]) == source[3:19]  # no quote: all 16 asked for, as before
    assert draft(source, [QUOTE, 4, QUOTE, 40, 41, 42]) == source[3:19]  # that quote is closed
    closing = [40, 41, 42, QUOTE, 43, STOP] + list(range(50, 70))  # a source that closes the quote itself
    assert draft(closing, [QUOTE, 40, 41, 42]) == closing[3:19]
    # the request's own evidence decides when it leans either way; the quote tips an even balance
    assert draft(source, [QUOTE, 40, 41, 42], reached=4, crossed=2) == source[3:6]
    assert draft(source, [QUOTE, 40, 41, 42], reached=4, crossed=3) == source[3:19]
    assert draft(source, [40, 41, 42], reached=4, crossed=1) == source[3:6]  # without a quote, as before


def test_a_quoting_answer_wastes_fewer_rows_from_its_first_quote():
    """Quotes that close at their sentence's end: knowing the quote marks, the first quotes are cut
    too, before the request's evidence would have turned the cut on."""
    src = sentences(8)
    prompt = [1] + [t for s in src for t in s] + [2, 3]
    truth: list[int] = []
    for i, j in enumerate((0, 3, 1, 4, 2, 6, 5, 7)):
        truth += [60 + 4 * i, 61 + 4 * i, QUOTE] + src[j][:-1] + [CLOSE]
    runs = {}
    for marks in (None, quote_marks):
        d = Counting(PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS,
                                  ends_sentence=lambda t: t in (STOP, CLOSE), quote_marks=marks))
        simulate(d, prompt, truth)
        runs[marks is not None] = d
    assert runs[True].accepted >= runs[False].accepted
    wasted = {q: d.drafted - d.accepted for q, d in runs.items()}
    assert wasted[True] < wasted[False], wasted
    assert runs[True].seconds < runs[False].seconds


def test_inside_a_quote_the_one_earlier_place_of_its_words_is_drafted_from_its_first_token():
    """A quote's first word occurring once before is the source being quoted: drafted at once (a
    one-token match elsewhere is not worth its rows), but not when the match takes in the opening
    mark itself (the answer's own template before each quote) nor when the word occurs twice."""
    source = [40, 41, 42, 43, 44, 45, 46, 47]
    prompt = [1] + source + [2, 3, 5, QUOTE, 70, 71, 72, 73, 74, 75, 76, CLOSE] + [2, 3]

    def draft(answer: list[int]) -> list[int]:
        d = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS,
                         ends_sentence=lambda t: t in (STOP, CLOSE), quote_marks=quote_marks)
        d.feedback(0, 0, PLAIN_S)  # a plain step: the controller now judges drafts
        return d.propose(prompt + answer[:-1], answer[-1], 16)

    assert draft([QUOTE, 40]) == source[1:]  # inside a quote: the rest of the source
    assert draft([6, 40]) == []  # the same one-token match outside a quote
    assert draft([QUOTE, 6, 40]) == source[1:]  # further into the quote
    assert draft([6, QUOTE]) == []  # the match is the opening mark itself (the answer's template before each quote)
    twice = [1] + source + [2, 40, 60, 61, 62] + [2, 3]
    d = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS, quote_marks=quote_marks)
    d.feedback(0, 0, PLAIN_S)
    assert d.propose(twice + [QUOTE], 40, 16) == []  # two places it could be quoting from


def test_a_short_match_through_a_quotes_opening_mark_is_judged_by_its_words_inside():
    """'[3], "The' matches the answer's '[2], "The' three tokens long, but only its template: which
    source the quote takes is told by the one word inside it. Judged by that word, it is not worth
    drafting; without quote marks, or as part of a long copy that runs through the quote, it is."""
    first, second = [40, 41, 42, 43, 44, 45], [40, 51, 52, 53, 54, 55]  # two sources opening alike
    prompt = [1] + first + [STOP] + second + [STOP, 2, 3]
    answer = [6, QUOTE] + first + [CLOSE, 6, QUOTE, 40]

    def draft(text: list[int], marks=quote_marks) -> list[int]:
        d = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS, quote_marks=marks)
        d.feedback(0, 0, PLAIN_S)
        return d.propose(text[:-1], text[-1], 16)

    assert draft(prompt + answer) == []
    assert draft(prompt + answer, marks=None)[:5] == first[1:]  # judged by its 3 tokens: the old way
    passage = [60, 61, 62, 63, 64, QUOTE] + first + [CLOSE]
    copying = [1] + passage + [2, 3] + passage[:7]  # a copy running through the opening mark
    assert draft(copying)[:5] == first[1:]
