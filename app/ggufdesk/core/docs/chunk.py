"""Lines into passages of about CHUNK_CHARS characters, each with its source page and line range.

A passage never spans two pages (a citation names one page), starts at a line start, and repeats the
last line or two of the passage before it (OVERLAP_CHARS) so that a sentence cut at the border is
found from either side. Blank lines are kept as paragraph breaks but never open a passage.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from ggufdesk.core.docs.extract import Line

CHUNK_CHARS = 1000  # ~250 tokens: several fit in a 4k context beside the conversation
OVERLAP_CHARS = 150


@dataclass(frozen=True, slots=True)
class Chunk:
    page: int
    line_start: int
    line_end: int
    text: str


def _make(lines: list[Line]) -> Chunk:
    return Chunk(lines[0].page, lines[0].number, lines[-1].number, "\n".join(ln.text for ln in lines).strip())


def _tail(lines: list[Line], limit: int) -> list[Line]:
    """The last whole lines of a passage that together are at most `limit` characters."""
    out: list[Line] = []
    size = 0
    for line in reversed(lines):
        size += len(line.text) + 1
        if size > limit:
            break
        out.append(line)
    out.reverse()
    while out and not out[0].text.strip():
        out.pop(0)
    return out


def chunks(lines: Iterable[Line], size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> Iterator[Chunk]:
    buf: list[Line] = []
    chars = 0
    fresh = 0  # characters in buf that no earlier passage held
    for line in lines:
        if buf and line.page != buf[-1].page:
            if fresh:
                yield _make(buf)
            buf, chars, fresh = [], 0, 0
        if not buf and not line.text.strip():
            continue
        if buf and chars + len(line.text) > size and fresh:
            yield _make(buf)
            buf = _tail(buf, overlap)
            chars = sum(len(x.text) + 1 for x in buf)
            fresh = 0
        buf.append(line)
        chars += len(line.text) + 1
        fresh += len(line.text.strip())
    if buf and fresh:
        yield _make(buf)
