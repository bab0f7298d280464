"""Reading documents: encodings, binary files under text names, HTML, PDF pages, DOCX, very long lines."""
from __future__ import annotations

import pytest

from ggufdesk.core.docs import extract as X
from ggufdesk.core.docs.chunk import chunks
from tests.fixtures import corpus


def lines(path):
    return [(ln.page, ln.number, ln.text) for ln in X.extract(path)]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "latin-1", "cp1252", "shift_jis"])
def test_text_in_any_common_encoding_reads_back_the_same(tmp_path, encoding):
    text = "Grüße aus Köln — café\nzweite Zeile\n" if encoding != "shift_jis" else "日本語のテキストです。\n二行目\n"
    if encoding in ("latin-1",):
        text = text.replace("—", "-")
    path = tmp_path / "a.txt"
    path.write_bytes(text.encode(encoding))
    assert [t for _, _, t in lines(path)] == text.splitlines()


def test_a_binary_file_named_txt_is_skipped_with_a_reason(tmp_path):
    path = tmp_path / "photo.txt"
    path.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(X.Skip, match="binary"):
        lines(path)


def test_line_numbers_count_every_line_and_long_lines_are_cut(tmp_path):
    path = tmp_path / "min.js"
    path.write_text("first\n\n" + "x" * (X.MAX_LINE * 2 + 5) + "\nlast", encoding="utf-8")
    got = lines(path)
    assert [(n, len(t)) for _, n, t in got] == [(1, 5), (2, 0), (3, X.MAX_LINE), (3, X.MAX_LINE), (3, 5), (4, 4)]


def test_a_text_without_any_newline_is_read_in_pieces_not_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(X, "BLOCK", 1000)
    path = tmp_path / "one.txt"
    path.write_text("y" * 50_000, encoding="utf-8")
    got = lines(path)
    assert sum(len(t) for _, _, t in got) == 50_000 and max(len(t) for _, _, t in got) <= X.MAX_LINE


def test_crlf_and_lone_cr_line_ends(tmp_path):
    path = tmp_path / "dos.txt"
    path.write_bytes(b"one\r\ntwo\r\nthree\rfour")
    assert [t for _, _, t in lines(path)] == ["one", "two", "three", "four"]


def test_html_keeps_visible_text_with_its_source_line_and_drops_scripts(tmp_path):
    path = tmp_path / "p.html"
    path.write_text("<html><head><title>T</title><script>var secret = 1;</script></head>\n<body>\n"
                    "<h1>Heading &amp; more</h1>\n<p>First\nparagraph</p>\n<style>p{}</style><p>Second</p></body></html>",
                    encoding="utf-8")
    got = lines(path)
    texts = [t for _, _, t in got]
    assert "Heading & more" in texts and "First paragraph" in texts and "Second" in texts
    assert not any("secret" in t or "p{}" in t for t in texts)
    assert dict((t, n) for _, n, t in got)["First paragraph"] == 4


def test_pdf_text_comes_page_by_page_with_page_numbers(tmp_path):
    path = tmp_path / "p.pdf"
    corpus.write_pdf(path, "Title", ["alpha page one", "beta page two", "gamma page three"], pages_per_para=1)
    got = lines(path)
    pages = {t: p for p, _, t in got}
    assert pages["alpha page one"] == 2 and pages["beta page two"] == 3 and pages["gamma page three"] == 4
    assert pages["Title"] == 1
    cs = list(chunks(X.extract(path)))
    assert [c.page for c in cs] == [1, 2, 3, 4]  # a passage never spans two pages


def test_a_corrupt_pdf_is_skipped_with_a_reason(tmp_path):
    path = tmp_path / "broken.pdf"
    path.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 10)
    with pytest.raises(X.Skip, match="PDF"):
        lines(path)


def test_a_truncated_pdf_is_skipped_or_read_never_crashes(tmp_path):
    whole = tmp_path / "whole.pdf"
    corpus.write_pdf(whole, "T", ["some words"] * 20, pages_per_para=1)
    cut = tmp_path / "cut.pdf"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    try:
        lines(cut)
    except X.Skip:
        pass


def test_docx_paragraphs_and_tables_in_order(tmp_path):
    import docx

    d = docx.Document()
    d.add_paragraph("Opening words")
    table = d.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "cell A", "cell B"
    d.add_paragraph("Closing words")
    path = tmp_path / "m.docx"
    d.save(str(path))
    assert [(n, t) for _, n, t in lines(path)] == [(1, "Opening words"), (2, "cell A | cell B"), (3, "Closing words")]


def test_a_docx_that_is_not_a_zip_is_skipped(tmp_path):
    path = tmp_path / "fake.docx"
    path.write_text("not a zip", encoding="utf-8")
    with pytest.raises(X.Skip, match="DOCX"):
        lines(path)


def test_kinds_by_name():
    from pathlib import Path

    assert X.kind_of(Path("a.MD")) == "text" and X.kind_of(Path("Makefile")) == "text"
    assert X.kind_of(Path("x.htm")) == "html" and X.kind_of(Path("x.PDF")) == "pdf"
    assert X.kind_of(Path("x.docx")) == "docx" and X.kind_of(Path("x.exe")) is None
