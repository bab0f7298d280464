"""A base model's answer that has begun to repeat itself: where it should have ended."""
from __future__ import annotations

MIN_UNIT = 12  # a repeated span shorter than this is a word or a refrain ("ha ha ha"), not a loop
COPIES = 3  # back-to-back copies that make a loop (two can be emphasis or a repeated list item)
WINDOW = 800  # only the end of the text is looked at: the check costs the same on a long answer


def repeat_cut(text: str, *, min_unit: int = MIN_UNIT, copies: int = COPIES,
               window: int = WINDOW) -> int | None:
    """If `text` ends in `copies` back-to-back copies of one span (at least `min_unit` characters),
    the length to cut it to: after the first of those copies. None when it does not.

    A small base model asked to chat often writes one sentence or line again and again until the
    token limit ("I'm a student. I'm a student. ..."): 256 tokens of nothing."""
    tail = text[-window:]
    n = len(tail)
    for k in range(min_unit, n // copies + 1):
        unit = tail[n - k:]
        if not unit.strip():
            continue
        if all(tail[n - (i + 1) * k: n - i * k] == unit for i in range(1, copies)):
            return len(text) - (copies - 1) * k
    return None
