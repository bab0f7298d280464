"""Prompt lookup's content hints, each behind a switch, and the Unicode text rules they read tokens by.

The principled core of prompt lookup (engine/speculation/lookup.py: the n-gram cache over the
conversation, the longest real match, acceptance by match length, the cost-table controller) knows
nothing about text. Three hints add what a token's text says, each on its own and each switchable,
so that a bench (bench/speculative.py --hints) can show what it is worth on the tuned suite and on
the held-out one (bench/spec_heldout.py):

- `sentence_ends`: copying stops at sentence ends, so once a request's drafts have more often
  stopped at one than carried past it, a draft is cut there;
- `quotes`: inside a quote the draft does not close, the cut starts at once; a quoted word seen once
  earlier marks the source being quoted; a short match that takes in the quote's opening mark is
  judged by its words inside the quote only;
- `counts`: numbered lists and citations count up, so the copied number is written one higher
  (a number written over several tokens, a digit each, included).

A hint is off for a request when `SpeculationSettings.lookup_hints_off` names it (by default
`sentence_ends`, which did not win on the held-out suite: core/settings.py says by how much; set
it to "" for every hint), and for the whole engine process when the environment variable
GGUFDESK_LOOKUP_HINTS_OFF does (a comma-separated list, e.g. "quotes,counts").

The text rules are Unicode-aware: the quote pairs of many languages (QUOTE_PAIRS), sentence ends in
Latin, CJK and Devanagari script (SENTENCE_ENDS), closing quotes after them (`.”`, `。」`), and
numbers in any decimal digit script (str.isdecimal; the next number is written in the same script).
They read each token's text alone: a mark a byte-level vocabulary splits over two tokens (SmolLM2's
「 」 ！ ？) goes unread. Joining them was tried (2026-12-04): SmolLM2's held-out answers never write
those marks, so it moved no replayed figure and was not kept.
"""
from __future__ import annotations

import os
import unicodedata

from ggufdesk.core.settings import LOOKUP_HINTS, hint_names

ENV_OFF = "GGUFDESK_LOOKUP_HINTS_OFF"

# opening mark -> its closing mark. The closer depends on the opener: “ closes German „ but opens an
# English quote, » closes French « but opens a German »…« quote. English single quotes are left out:
# ’ is also the apostrophe, so it would close quotes that never opened.
QUOTE_PAIRS = {
    '"': '"',  # ASCII
    "\u201c": "\u201d",  # “…” English, Chinese
    "\u201e": "\u201c",  # „…“ German, Czech, Polish...
    "\u00ab": "\u00bb",  # «…» French, Russian, Spanish...
    "\u00bb": "\u00ab",  # »…« German, Danish
    "\u201a": "\u2018",  # ‚…‘ German single
    "\u2039": "\u203a",  # ‹…› French single
    "\u300c": "\u300d",  # 「…」 Japanese
    "\u300e": "\u300f",  # 『…』 Japanese, nested
}
QUOTE_CHARS = frozenset(QUOTE_PAIRS) | frozenset(QUOTE_PAIRS.values())
# what may follow a sentence end and still end the sentence: closing quotes and brackets
AFTER_END = "".join(sorted(QUOTE_CHARS)) + "'\u2019)]）】 "
# full stop, exclamation and question marks: Latin, CJK full-width, ideographic full stop, Devanagari danda
SENTENCE_ENDS = (".", "!", "?", "\u3002", "\uff01", "\uff1f", "\uff0e", "\u0964")
MAX_DIGITS = 9  # a number longer than this is an identifier, not a count (and int() stays cheap)


def active(off: str = "") -> frozenset[str]:
    """The hints on: all of LOOKUP_HINTS but those `off` (a request's setting) or the environment names."""
    gone = set(hint_names(off)) | set(hint_names(os.environ.get(ENV_OFF, "")))
    return frozenset(h for h in LOOKUP_HINTS if h not in gone)


def ends_sentence(text: str) -> bool:
    """Does a token's text end a sentence or a line (. ! ? 。！？ before closing quotes, or a newline)?"""
    return "\n" in text or text.rstrip(AFTER_END).endswith(SENTENCE_ENDS)


def quote_marks(text: str) -> tuple[bool, str]:
    """The quote marks a token writes on its line: (does it start a new line, the marks after its
    last newline in order)."""
    return "\n" in text, "".join(ch for ch in text.rsplit("\n", 1)[-1] if ch in QUOTE_CHARS)


def inside_quote(marks: list[tuple[int, str]]) -> int:
    """Where the quote open at the end of `marks` (position, that token's marks; in text order)
    was opened, else -1. Inside a quote only its own closer counts; outside any opener opens."""
    opener, at = "", -1
    for i, m in marks:
        for ch in m:
            if opener and ch == QUOTE_PAIRS[opener]:
                opener, at = "", -1
            elif not opener and ch in QUOTE_PAIRS:
                opener, at = ch, i
    return at


def number(text: str) -> tuple[str, str] | None:
    """A token that writes digits: (its lead, the digits as ASCII, leading zeros kept), else None. The
    lead is the spaces before the digits and the zero of their script ("  0", "０"): two numbers are
    written alike when their leads are equal, and a token whose lead is only the zero can continue a
    number written over several tokens (most vocabularies of 2026 write a digit per token)."""
    digits = text.lstrip(" ")
    if not digits or len(digits) > MAX_DIGITS or not digits.isdecimal():
        return None
    zeros = {chr(ord(ch) - unicodedata.decimal(ch)) for ch in digits}
    if len(zeros) != 1:
        return None
    return text[:len(text) - len(digits)] + zeros.pop(), "".join(str(unicodedata.decimal(ch)) for ch in digits)


def write_number(lead: str, digits: str) -> str:
    """The text of ASCII `digits` written like a number with this lead (number())."""
    zero = ord(lead[-1])
    return lead[:-1] + "".join(chr(zero + int(d)) for d in digits)


def next_number(digits: str) -> str:
    """The number after `digits`, as wide (zeros kept in front: 007 -> 008, 9 -> 10)."""
    return str(int(digits) + 1).zfill(len(digits))
