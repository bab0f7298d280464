"""Passages: size, overlap, line ranges, pages, blank lines."""
from __future__ import annotations

from ggufdesk.core.docs.chunk import chunks
from ggufdesk.core.docs.extract import Line


def test_passages_cover_every_line_with_a_little_overlap():
    src = [Line(0, i, f"line {i} " + "w" * 90) for i in range(1, 101)]
    out = list(chunks(src, size=1000, overlap=150))
    assert out[0].line_start == 1 and out[-1].line_end == 100
    for a, b in zip(out, out[1:]):
        assert b.line_start <= a.line_end  # the next passage repeats the last line(s)
        assert a.line_end - b.line_start < 3
    assert all(len(c.text) <= 1000 + 100 for c in out)
    assert all(c.text.count("line") == c.line_end - c.line_start + 1 for c in out)


def test_a_passage_never_spans_two_pages_and_blank_lines_never_open_one():
    src = [Line(1, 1, "a"), Line(1, 2, ""), Line(2, 1, ""), Line(2, 2, "b"), Line(3, 1, "")]
    out = list(chunks(src))
    assert [(c.page, c.line_start, c.line_end, c.text) for c in out] == [(1, 1, 2, "a"), (2, 2, 2, "b")]


def test_nothing_but_blank_lines_makes_no_passage():
    assert list(chunks([Line(0, i, "  ") for i in range(5)])) == []
