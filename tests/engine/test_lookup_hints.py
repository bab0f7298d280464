"""Prompt lookup's content hints (engine/speculation/hints.py): the Unicode text rules (quote pairs of
many languages, sentence ends with closing quotes and in CJK, numbers in any digit script) and each
hint's switch (a request's setting, the environment)."""
from __future__ import annotations

from typing import Any, cast

import pytest

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import LOOKUP_HINTS, SpeculationSettings
from ggufdesk.engine.speculation import hints
from ggufdesk.engine.speculation.lookup import PromptLookup
from ggufdesk.engine.speculation.speculative import TokenText, make_drafter
from tests.engine.test_adaptive_recovery import COSTS


@pytest.mark.parametrize("text", [".", " house.", ".”", "Haus.“", " maison.»", "?»", "!", "す。", "。」", "！",
                                  "？", "．", "\n", "end.\n", "है।", " it.)", " it.'"])
def test_sentence_ends_in_many_scripts_and_before_closing_quotes(text):
    assert hints.ends_sentence(text)


@pytest.mark.parametrize("text", [" house", "Mr", "”", "„", "、", "3", " the", "...x"])
def test_not_sentence_ends(text):
    assert not hints.ends_sentence(text)


def _state(*pieces: str) -> int:
    return hints.inside_quote([(i, hints.quote_marks(p)[1]) for i, p in enumerate(pieces)])


@pytest.mark.parametrize("opening,closing", [("„", "“"), ("“", "”"), ("«", "»"), ("»", "«"), ("「", "」"),
                                             ("『", "』"), ("‚", "‘"), ("‹", "›"), ('"', '"')])
def test_quote_pairs_of_many_languages_open_and_close(opening, closing):
    assert _state("Er sagte ", opening + "Das", " ist", " gut") == 1  # open since the second piece
    assert _state("Er sagte ", opening + "Das", " ist", " gut." + closing) == -1  # closed
    assert _state("Er sagte ", opening + "Das" + closing, " und") == -1


def test_the_german_closing_mark_does_not_open_an_english_quote_inside_it():
    assert _state("„Ja", "“", " sagte er, „nein") == 2  # the first closed, the second open
    assert _state("“Yes", "„", " no") == 0  # „ inside an English quote is not its closer


def test_a_new_line_starts_quote_tracking_afresh():
    starts, marks = hints.quote_marks("«a»\n„b")
    assert starts and marks == "„"


@pytest.mark.parametrize("text,lead,digits", [("3", "0", "3"), (" 12", " 0", "12"), ("３", "０", "3"), ("٣", "٠", "3"),
                                              ("१२", "०", "12"), ("  7", "  0", "7"), ("09", "0", "09")])
def test_numbers_in_any_digit_script(text, lead, digits):
    assert hints.number(text) == (lead, digits)
    after = hints.next_number(digits)
    assert hints.write_number(lead, after) == text[:len(lead) - 1] + hints.write_number(lead[-1], after)
    assert hints.number(hints.write_number(lead, after)) == (lead, after)


@pytest.mark.parametrize("digits,after", [("3", "4"), ("9", "10"), ("09", "10"), ("007", "008"), ("4599", "4600")])
def test_the_next_number_keeps_its_width(digits, after):
    assert hints.next_number(digits) == after


@pytest.mark.parametrize("text", ["²", "3a", "1２", "", " ", "1234567890", "x"])
def test_not_numbers(text):
    assert hints.number(text) is None


class TextVocab:
    """A vocabulary of pieces by token id, read the way TokenText reads a model's."""

    def __init__(self, pieces: dict[int, str]) -> None:
        self.pieces = pieces
        self.by_text = {v: k for k, v in pieces.items()}

    def ends(self, t: int) -> bool:
        return hints.ends_sentence(self.pieces.get(t, ""))

    def quotes(self, t: int) -> tuple[bool, str]:
        return hints.quote_marks(self.pieces.get(t, ""))

    def __call__(self, t: int) -> tuple[str, str] | None:
        return hints.number(self.pieces.get(t, ""))

    def write(self, lead: str, digits: str) -> list[int] | None:
        """A digit a token, as most vocabularies of 2026 write numbers (the lead's spaces on the first)."""
        text = hints.write_number(lead, digits)
        pieces = [text[:len(text) - len(digits) + 1]] + list(text[len(text) - len(digits) + 1:])
        tokens = [self.by_text.get(p) for p in pieces]
        return None if None in tokens else tokens  # type: ignore[return-value]


def test_a_list_numbered_in_full_width_digits_counts_on():
    v = TextVocab({100 + i: chr(0xFF10 + i) for i in range(10)} | {5: "．", 6: "\n", 9: "。"})
    def line(i: int) -> list[int]:
        return [100 + i, 5, 20, 21, 22, 23, 9, 6]

    text = [1, 2] + line(1) + line(2) + line(3)
    d = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS, numbers=v)
    assert d.propose(text[:-1], text[-1], 16) == line(4)  # "４．", not the copied "３．"


def test_a_german_quote_closed_in_the_text_is_not_quoted_and_an_open_one_is():
    v = TextVocab({1: " „", 2: "Das", 3: " ist", 4: " gut.“", 5: " Er", 6: " sagte"})
    d = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=COSTS, ends_sentence=v.ends,
                     quote_marks=v.quotes)
    d.cache.feed([5, 6, 1, 2, 3, 4, 5])
    assert d._quoted([]) == -1
    d.cache.feed([5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3])
    assert d._quoted([]) == 2  # inside since „, two tokens written after it
    assert d._quoted([4]) == -1  # a draft that closes the quote


def test_each_hint_has_a_switch_in_the_request_and_the_environment(monkeypatch):
    assert hints.active() == frozenset(LOOKUP_HINTS)
    assert hints.active("quotes, counts") == {"sentence_ends"}
    monkeypatch.setenv(hints.ENV_OFF, "sentence_ends")
    assert hints.active("counts") == {"quotes"}
    with pytest.raises(SettingsError, match="unknown lookup hint 'quote'"):
        SpeculationSettings(mode="lookup", lookup_hints_off="quote")


@pytest.mark.parametrize("off", ["", *LOOKUP_HINTS, ",".join(LOOKUP_HINTS)])
def test_a_hint_switched_off_leaves_lookup_without_its_reader(off, monkeypatch):
    monkeypatch.delenv(hints.ENV_OFF, raising=False)
    text = TokenText(cast(Any, "ends"), cast(Any, "quotes"), cast(Any, "numbers"))
    spec = SpeculationSettings(mode="lookup", lookup_hints_off=off)
    d = make_drafter(spec, prompt=[1], draft=None, target=cast(Any, None), text=text)
    assert isinstance(d, PromptLookup)
    gone = set(off.split(",")) - {""}
    assert (d.ends_sentence is None) == ("sentence_ends" in gone)
    assert (d.quote_marks is None) == ("quotes" in gone)
    assert (d.numbers is None) == ("counts" in gone)
