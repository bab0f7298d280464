"""Drawn model outputs (Hypothesis, derandomized): the golden outputs cut, spliced and garbled, and soups
of their pieces and every format's markers, read by each tool-call format after each reasoning format.
Streamed in pieces of any size, an output reads as it does whole: the same reasoning, the same content,
the same calls (a user sees what the API returns), and every call read has an object for arguments.

Found this way: a harmony reader that had already shown text not starting like a harmony header as the
answer, while the same output read whole dropped it as a header when a <|message|> came later."""
from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggufdesk.core import tools as T
from ggufdesk.core.reasoning import HARMONY, split_all
from tests.core.test_golden_outputs import REASONING, _named, streamed, whole
from tests.fixtures.golden_outputs import BROKEN, GOLDEN

OUTPUTS = [c[3] for c in GOLDEN] + [text for _, text in BROKEN]
# the outputs' pieces: special tokens, tags, JSON punctuation, spaces, words
_SPLIT = r"(<\|[a-z_]+\|>|<[/a-z_=]+>|\[[A-Z_/]+\]|[{}\[\]\",:]|\s+|<｜[^｜]*｜>)"
PIECES = sorted({p for text in OUTPUTS for p in re.split(_SPLIT, text) if p}
                | {m for f in T.FORMATS.values() for m in (*f.tokens, *f.openers)}
                | {m for f in REASONING.values() for m in (f.open, f.close, *f.tokens)}
                | {"\n", " ", "\n\n", "é", "😀", '"name"', '"arguments"'})
EDIT = st.tuples(st.integers(0, 1 << 12), st.sampled_from(["insert", "delete", "repeat"]), st.sampled_from(PIECES),
                 st.integers(1, 8))


def _edited(text: str, edits: list[tuple[int, str, str, int]]) -> str:
    for at, kind, piece, n in edits:
        i = at % (len(text) + 1)
        if kind == "insert":
            text = text[:i] + piece + text[i:]
        elif kind == "delete":
            text = text[:i] + text[i + n:]
        else:
            text = text[:i] + text[max(0, i - n * 4):i] + text[i:]
    return text


TEXTS = st.one_of(
    st.tuples(st.sampled_from(OUTPUTS), st.lists(EDIT, min_size=1, max_size=4)).map(lambda a: _edited(*a)),
    st.tuples(st.sampled_from(OUTPUTS), st.sampled_from(["", " ", "\n", "ok"]), st.sampled_from(OUTPUTS))
      .map("".join),
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=40).map("".join))


@settings(derandomize=True, max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(text=TEXTS, fmt=st.sampled_from(sorted(T.FORMATS)), rfmt=st.sampled_from([None, *sorted(REASONING)]),
       inside=st.booleans(), size=st.sampled_from([1, 2, 3, 5, 7, 13]))
def test_a_drawn_output_streamed_reads_as_it_does_whole(text, fmt, rfmt, inside, size):
    w = whole(fmt, rfmt, inside and rfmt is not None, text)
    s = streamed(fmt, rfmt, inside and rfmt is not None, text, size)
    assert (s[0], s[1], _named(s[2])) == (w[0], w[1], _named(w[2]))
    assert all(isinstance(json.loads(c["function"]["arguments"]), dict) for c in w[2])


def test_text_that_does_not_open_like_harmony_is_the_answer_whatever_follows():
    text = "get_weather celsius<|message|>Paris"
    assert split_all(HARMONY, text) == ("", text)
    assert streamed("hermes", "harmony", False, text, 3)[:2] == ("", text)
