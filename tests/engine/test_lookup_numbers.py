"""Prompt lookup counts on: a numbered list or citations copy the earlier line but not its number."""
from __future__ import annotations

from ggufdesk.engine.speculation.lookup import PromptLookup
from tests.engine.test_adaptive_recovery import COSTS, Counting, simulate

DOT, NL, STOP = 5, 6, 9
WORDS = [20, 21, 22, 23]


class Digits:
    """A vocabulary whose tokens 100..199 write the numbers 0..99 (and 300..399 the same with a space
    before them); `single` bounds the numbers written by one token (none writes more)."""

    def __init__(self, single: int = 100) -> None:
        self.single = single

    def __call__(self, token: int) -> tuple[str, str] | None:
        if 100 <= token < 200:
            return "0", str(token - 100)
        if 300 <= token < 400:
            return " 0", str(token - 300)
        return None

    def write(self, lead: str, digits: str) -> list[int] | None:
        if int(digits) >= self.single or digits != str(int(digits)):
            return None
        return [(100 if lead == "0" else 300) + int(digits)]


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


def drafted_through(truth: list[int], numbers) -> dict[bool, Counting]:
    """The answer `truth` drafted by lookup without counting on and with it (`numbers`)."""
    runs = {}
    for nums in (None, numbers):
        d = Counting(PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS, numbers=nums))
        simulate(d, [1, 2, 3], truth)
        runs[nums is not None] = d
    wasted = {k: d.drafted - d.accepted for k, d in runs.items()}
    assert wasted[True] <= wasted[False] / 3, wasted  # (3 vs 12: each line's number, before)
    assert runs[True].accepted > runs[False].accepted
    assert runs[True].seconds < 0.9 * runs[False].seconds
    return runs


def test_a_numbered_answer_is_drafted_through_its_numbers():
    """A list whose lines repeat but for their number: counting on, the drafts stop failing at each
    number (and teaching the evidence that long matches fail)."""
    drafted_through([t for i in range(1, 13) for t in line(i)], Digits())


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


class DigitTokens:
    """A vocabulary that writes numbers a digit per token (tokens 100..109), as SmolLM2's, Gemma 3's
    and most vocabularies of 2026 do: 4591 is four tokens."""

    def __call__(self, token: int) -> tuple[str, str] | None:
        return ("0", str(token - 100)) if 100 <= token < 110 else None

    def write(self, lead: str, digits: str) -> list[int] | None:
        return [100 + int(d) for d in digits] if lead == "0" else None


SKU, DASH = 7, 8


def digits(v: int) -> list[int]:
    return [100 + int(d) for d in str(v)]


def record(v: int) -> list[int]:
    """'SKU-4591. <words>.\n' with the number a digit per token."""
    return [SKU, DASH] + digits(v) + [DOT] + WORDS + [STOP, NL]


def test_a_number_written_over_several_tokens_is_counted_on():
    text = [1, 2] + record(4590) + record(4591) + record(4592)
    assert draft(text, Digits()) == draft(text)  # a vocabulary that cannot write 4593: the copy as it was
    assert draft(text, DigitTokens()) == record(4593) + [SKU, DASH]  # the whole number counted on
    grows = [1, 2] + record(97) + record(98) + record(99)
    assert draft(grows, DigitTokens()) == (record(100) + [SKU, DASH])[:16]  # a digit more: 99 -> 100


def test_a_draft_that_starts_inside_a_number_counts_on_the_digits_still_to_come():
    text = [1, 2] + record(4590) + record(4591) + record(4592) + record(4593)[:3]  # "SKU-4" written
    assert draft(text, DigitTokens()) == record(4593)[3:] + [SKU, DASH]
    # a carry into a digit already written (4999 -> 5000 after "4"): nothing to count on, the copy as it was
    carry = [1, 2] + record(4997) + record(4998) + record(4999) + record(5000)[:3]
    assert draft(carry, DigitTokens()) == draft(carry)


def test_a_number_the_text_has_only_begun_or_a_run_too_long_for_a_count_is_not_counted_on():
    # the model repeating a digit: the number the draft copies is the one being written, and may go on
    loop = [1, 2, DOT] + digits(5555)
    assert draft(loop, DigitTokens()) == draft(loop) == digits(5) * 16
    ident = [1, 2] + record(1234567890) + record(1234567891) + record(1234567892)  # an identifier
    assert draft(ident, DigitTokens()) == draft(ident)


def test_a_list_numbered_past_nine_a_digit_per_token_is_drafted_through_its_numbers():
    """Items 8 to 19 of a list whose lines repeat but for their number, in a vocabulary that writes
    10 as two tokens: counting on, the drafts stop failing at each number."""
    drafted_through([t for i in range(8, 20) for t in digits(i) + [DOT] + WORDS + [STOP, NL]], DigitTokens())
