"""Text out of a document, streamed: lines with their page (PDF) and line number, never the whole file at once."""
from __future__ import annotations

import codecs
import html.parser
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from ggufdesk.core.errors import KnownError

BLOCK = 1 << 20  # bytes read at a time from a text file
SNIFF = 64 * 1024  # bytes the encoding is detected on
MAX_LINE = 2000  # longer lines (minified code, a text without newlines) are cut into pieces this long

TEXT_SUFFIXES = frozenset(
    ".txt .text .md .markdown .rst .adoc .org .tex .csv .tsv .log .json .jsonl .yaml .yml .toml .ini .cfg "
    ".conf .xml .py .pyi .js .mjs .ts .tsx .jsx .c .h .cc .cpp .hpp .cxx .cs .java .kt .kts .go .rs .rb .php "
    ".swift .m .mm .scala .sh .bash .zsh .fish .ps1 .bat .sql .r .jl .lua .pl .pm .hs .ml .ex .exs .erl .clj "
    ".dart .vue .svelte .css .scss .less .gradle .cmake .mk .proto .graphql .tf .nix .el .vim .zig .f90 .asm "
    ".s .ipynb .srt .vtt .bib".split())
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
KNOWN_NAMES = frozenset({"readme", "license", "copying", "makefile", "dockerfile", "changelog", "authors",
                         "notice", "todo", "cmakelists.txt"})


class Skip(KnownError):
    """This file is not indexed; the message says why (shown as a note beside the file)."""


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a document: its page (1-based; 0 when the format has no pages) and line number (1-based)."""

    page: int
    number: int
    text: str


def kind_of(path: Path) -> str | None:
    """"text", "html", "pdf", "docx", or None for a file that is not a document we read."""
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES or path.name.lower() in KNOWN_NAMES:
        return "text"
    if suffix in HTML_SUFFIXES:
        return "html"
    if suffix == ".pdf":
        return "pdf"
    if suffix == ".docx":
        return "docx"
    return None


Where = Callable[[float], None]  # how far into the file reading is, 0..1


def _nowhere(fraction: float) -> None:
    pass


def extract(path: Path, kind: str | None = None, where: Where = _nowhere) -> Iterator[Line]:
    """The document's lines, in order. Raises Skip (with the reason) for what cannot be read as a
    document; OSError for a file that went away or cannot be opened. `where` hears how far it is."""
    kind = kind or kind_of(path)
    if kind == "text":
        yield from text_lines(path, where)
    elif kind == "html":
        yield from html_lines(path, where)
    elif kind == "pdf":
        yield from pdf_lines(path, where)
    elif kind == "docx":
        yield from docx_lines(path)
    else:
        raise Skip("not a document type ggufdesk reads")


# ---- plain text, Markdown, code ---------------------------------------------------------------------------


def detect_encoding(sample: bytes) -> str:
    """The encoding of a file from its first bytes; Skip for a binary file (whatever its name says)."""
    for bom, enc in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF32_LE, "utf-32"),
                     (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
                     (codecs.BOM_UTF16_BE, "utf-16")):
        if sample.startswith(bom):
            return enc
    if b"\x00" in sample:
        raise Skip("binary content (NUL bytes), not text")
    try:
        sample.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError as e:
        if e.start >= len(sample) - 4:  # a character cut at the end of the sample
            return "utf-8"
    from charset_normalizer import from_bytes

    best = from_bytes(sample).best()
    if best is None:
        raise Skip("binary content or an unknown encoding, not text")
    return str(best.encoding)


def decoded_lines(stream: IO[bytes], encoding: str, where: Where = _nowhere, size: int = 0) -> Iterator[str]:
    """Lines (without their end) of a byte stream read a block at a time; undecodable bytes become U+FFFD."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    rest = ""
    done = 0
    while True:
        block = stream.read(BLOCK)
        done += len(block)
        if size:
            where(min(1.0, done / size))
        text = rest + decoder.decode(block, final=not block)
        lines = text.splitlines(keepends=True)
        rest = lines.pop() if lines and block and not lines[-1].endswith(("\n", "\r")) else ""
        for line in lines:
            yield line.rstrip("\r\n")
        if len(rest) > MAX_LINE * 4:  # no line end in sight: hand it on in pieces
            yield rest
            rest = ""
        if not block:
            return


def split_long(text: str) -> Iterator[str]:
    if len(text) <= MAX_LINE:
        yield text
        return
    for i in range(0, len(text), MAX_LINE):
        yield text[i:i + MAX_LINE]


def _open_text(f: IO[bytes]) -> tuple[str, int]:
    """The encoding and size of an open file, left at its start."""
    encoding = detect_encoding(f.read(SNIFF))
    size = f.seek(0, 2)
    f.seek(0)
    return encoding, size


def text_lines(path: Path, where: Where = _nowhere) -> Iterator[Line]:
    with path.open("rb") as f:
        encoding, size = _open_text(f)
        number = 0
        for line in decoded_lines(f, encoding, where, size):
            number += 1
            for piece in split_long(line):
                yield Line(0, number, piece)


# ---- HTML ------------------------------------------------------------------------------------------------


class _HtmlText(html.parser.HTMLParser):
    """Visible text with the source line it starts on; script, style and head content left out."""

    HIDDEN = frozenset({"script", "style", "head", "template", "noscript", "svg"})
    BREAKS = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "section",
                        "article", "table", "ul", "ol", "blockquote", "dd", "dt", "title"})

    def __init__(self, emit: Callable[[int, str], None]) -> None:
        super().__init__(convert_charrefs=True)
        self.emit = emit
        self.hidden = 0
        self.words: list[str] = []
        self.start = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.HIDDEN and tag != "title":
            self.hidden += 1
        if tag in self.BREAKS:
            self.flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in self.HIDDEN and tag != "title" and self.hidden:
            self.hidden -= 1
        if tag in self.BREAKS:
            self.flush()

    def handle_data(self, data: str) -> None:
        if self.hidden:
            return
        words = data.split()
        if words:
            if not self.words:
                self.start = self.getpos()[0]
            self.words += words

    def flush(self) -> None:
        if self.words:
            self.emit(self.start, " ".join(self.words))
            self.words = []


def html_lines(path: Path, where: Where = _nowhere) -> Iterator[Line]:
    out: list[Line] = []
    parser = _HtmlText(lambda n, text: out.extend(Line(0, n, piece) for piece in split_long(text)))
    with path.open("rb") as f:
        encoding, size = _open_text(f)
        for line in decoded_lines(f, encoding, where, size):
            parser.feed(line + "\n")
            yield from out
            out.clear()
    parser.close()
    parser.flush()
    yield from out


# ---- PDF and DOCX ----------------------------------------------------------------------------------------


def pdf_lines(path: Path, where: Where = _nowhere) -> Iterator[Line]:
    """Page by page with pypdfium2 (PDFium reads the file on demand; one page's text in memory at a time)."""
    import pypdfium2 as pdfium

    try:
        doc = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as e:
        if not path.exists():
            raise FileNotFoundError(str(path)) from None
        raise Skip(f"not a readable PDF ({e})") from None
    try:
        pages = len(doc)
        for index in range(pages):
            where(index / pages)
            page = doc[index]
            try:
                textpage = page.get_textpage()
                text = textpage.get_text_range()
                textpage.close()
            except pdfium.PdfiumError as e:
                raise Skip(f"PDF page {index + 1} cannot be read ({e})") from None
            finally:
                page.close()
            for number, line in enumerate(text.splitlines(), 1):
                for piece in split_long(line):
                    yield Line(index + 1, number, piece)
    finally:
        doc.close()


def docx_lines(path: Path) -> Iterator[Line]:
    """Paragraphs (and table rows) in document order; a paragraph's number is its 'line'."""
    import zipfile

    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = docx.Document(str(path))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as e:
        if not path.exists():
            raise FileNotFoundError(str(path)) from None
        raise Skip(f"not a readable DOCX file ({e})") from None
    number = 0
    for block in document.iter_inner_content():
        rows = [block.text] if hasattr(block, "text") else \
            [" | ".join(cell.text for cell in row.cells) for row in block.rows]
        for text in rows:
            number += 1
            for piece in split_long(text):
                yield Line(0, number, piece)


def render_pdf_page(path: Path, page: int, *, width: int = 900) -> tuple[int, int, bytes]:
    """One page of a PDF as an image (width, height, RGBA bytes), for showing a cited passage where it is."""
    import pypdfium2 as pdfium

    try:
        doc = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as e:
        raise Skip(f"not a readable PDF ({e})") from None
    try:
        if not 1 <= page <= len(doc):
            raise Skip(f"the PDF has no page {page}")
        pg = doc[page - 1]
        scale = width / max(1.0, pg.get_width())
        bitmap = pg.render(scale=scale, rev_byteorder=True, force_bitmap_format=pdfium.raw.FPDFBitmap_BGRA)
        w, h = bitmap.width, bitmap.height
        data = bytes(bitmap.buffer)[: w * h * 4] if bitmap.stride == w * 4 else b"".join(
            bytes(bitmap.buffer)[row * bitmap.stride: row * bitmap.stride + w * 4] for row in range(h))
        bitmap.close()
        pg.close()
        return w, h, data
    finally:
        doc.close()
