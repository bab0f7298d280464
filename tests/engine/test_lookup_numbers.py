"""Prompt lookup counts on: a numbered list or citations copy the earlier line but not its number."""
from __future__ import annotations

from ggufdesk.engine.speculation.lookup import PromptLookup
from tests.engine.test_adaptive_recovery import COSTS, Counting, simulate

DOT, NL, STOP = 5, 6, 9
WORDS = [20, 21, 22, 23]


class Digits:
    """A vocabulary whose tokens 100..199 write the numbers 0..99 (and 300..399 the same with a space
    before them); `single` bounds the numbers written by one token."""

    def __init__(self, single: int = 100) -> None:
        self.single = single

    def __call__(self, token: int) -> tuple[str, int] | None:
        if 100 <= token < 200:
            return "", token - 100
        if 300 <= token < 400:
            return " ", token - 300
        return None

    def token(self, lead: str, value: int) -> int | None:
        if value >= self.single:
            return None
        return (100 if lead == "" else 300) + value


def line(i: int, words: list[int] = WORDS) -> list[int]:
    return [100 + i, DOT] + words + [STOP, NL]


def draft(text: list[int], numbers=None) -> list[int]:
    d = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS, numbers=numbers)
    return d.propose(text[:-1], text[-1], 16)


def test_a_numbered_list_gets_its_next_number():
    text = [1, 2] + line(1) + line(2) + line(3)
    assert draft(text)[:9] == line(3) + [100 + 3]  # the old way: the line copied with its number, wrong
    assert draft(text, Digits()) == line(4)  # counted on, and stopped before the number after it
    mid = text + line(4)[:3]
    assert draft(mid, Digits()) == line(4)[3:] + line(5)  # mid-line: the number ahead is counted on too


def test_only_a_count_by_one_of_numbers_written_alike_is_counted_on():
    odd = [1, 2] + line(1) + line(3) + line(5)  # 1, 3, 5: not counting by one
    assert draft(odd, Digits()) == draft(odd)
    spaced = [1, 2] + line(1) + [300 + 2, DOT] + WORDS + [STOP, NL] + line(3)  # '2' written ' 2'
    assert draft(spaced, Digits()) == draft(spaced)
    text = [1, 2] + line(8) + line(9)
    assert draft(text + line(10), Digits(single=10)) == draft(text + line(10))  # no one token writes 11
    differs = [1, 2] + line(1, [20, 21, 22, 23]) + line(2, [30, 21, 22, 23]) + line(3, [20, 21, 22, 23])
    assert draft(differs, Digits()) == draft(differs)  # the previous occurrence went on otherwise


def test_a_numbered_answer_is_drafted_through_its_numbers():
    """A list whose lines repeat but for their number: counting on, the drafts stop failing at each
    number (and teaching the evidence that long matches fail)."""
    prompt = [1, 2, 3]
    truth = [t for i in range(1, 13) for t in line(i)]
    runs = {}
    for nums in (None, Digits()):
        d = Counting(PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS, numbers=nums))
        simulate(d, prompt, truth)
        runs[nums is not None] = d
    wasted = {k: d.drafted - d.accepted for k, d in runs.items()}
    assert wasted[True] <= wasted[False] / 3, wasted  # (3 vs 12: each line's number, before)
    assert runs[True].accepted > runs[False].accepted
    assert runs[True].seconds < 0.9 * runs[False].seconds


END, A, COL, ACC, TO, LB, RB, Q = 10, 30, 31, 32, 33, 34, 35, 36  # '."', "Answer", ":", ... '"'
W, X, Y = 40, 41, 42


def test_a_count_is_found_at_a_shorter_ngram_when_the_drafts_own_occurred_once():
    """RAG's "...\"\\nAnswer: According to [2], \"" lines: drafted from just after a line's newline,
    the draft's 3-gram (the closing quote, the newline, "Answer") occurred only at the line before,
    while "\\nAnswer" also opens the prompt's own "[1]" line: the count is found there. A shorter
    n-gram counts only with enough text alike before the number (a catalogue's "with a 2-year" and
    "with a 3-year" say nothing about the next)."""
    def template(i: int) -> list[int]:
        return [NL, A, COL, ACC, TO, LB, 100 + i, RB, Q]

    prompt = [1, 2, 3] + template(1) + [50]
    text = prompt + [51, 52, END] + template(2) + [60, 61, END, NL, A]
    assert draft(text)[:6] == [COL, ACC, TO, LB, 102, RB]  # the old way: the previous line's number
    assert draft(text, Digits())[:6] == [COL, ACC, TO, LB, 103, RB]
    # "2 W X" occurred once (then 102), "W X" also before it (then 101): 2 tokens alike, too few
    short = [1, 7, W, X, 101, Y, 8, 2, W, X, 102, Y, 9, 2, W, X]
    assert draft(short, Digits()) == draft(short) == [102, Y, 9, 2, W, X, 102, Y, 9, 2, W, X, 102, Y, 9, 2]
