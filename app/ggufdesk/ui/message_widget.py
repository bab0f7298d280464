"""One chat message: a Markdown body (Qt's own renderer), copy / edit / regenerate, its versions and its speed."""
from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QPalette, QResizeEvent, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QFrame, QHBoxLayout, QLabel, QSizePolicy, QTextBrowser, QToolButton, QVBoxLayout, QWidget,
)

from ggufdesk.core.wording import COMPLETION_NAMES, FINISH_WORDS, ROLE_NAMES, STATUS_NOTES
from ggufdesk.ui import theme
from ggufdesk.ui.image_views import ImageRow

RENDER_INTERVAL_MS = 50  # a streaming body re-renders at most 20 times a second

Stats = Mapping[str, object]  # a message's stored stats (history's Message.stats): JSON values
Citation = dict[str, object]  # session/docs.Citation.as_dict(), as the answer keeps it


def figure(value: object) -> float:
    """A stored figure (a JSON number; None or absent when not measured) as a float, 0 when absent."""
    return float(value) if isinstance(value, (int, float, str)) and value != "" else 0.0


def records(value: object) -> list[dict[str, object]]:
    """A stored list of JSON objects (citations, tool calls); [] when absent."""
    return [d for d in value if isinstance(d, dict)] if isinstance(value, list) else []


def thinking_title(stats: Stats, *, streaming: bool) -> str:
    """'Thinking… · 120 tokens · 4.2 s' while it thinks, 'Thought for 4.2 s · 120 tokens' after."""
    n, secs = int(figure(stats.get("reasoning_tokens"))), figure(stats.get("reasoning_s"))
    parts = [f"{n} tokens"] if n else []
    if streaming:
        return " · ".join(["Thinking…", *parts, *([f"{secs:.1f} s"] if secs else [])])
    return " · ".join([f"Thought for {secs:.1f} s" if secs else "Thought", *parts])


class ThinkingSection(QWidget):
    """A reasoning model's thinking above its answer: one line (▸ Thinking… · N tokens · s) that
    unfolds into the text. Folded by default, also while it streams."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.toggle = QToolButton()
        self.toggle.setObjectName("thinkToggle")
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.toggled.connect(self._fold)
        self.text = QLabel()
        self.text.setObjectName("thinkText")
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.PlainText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.setVisible(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.text)
        self.setVisible(False)

    def _fold(self, open_: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow)
        self.text.setVisible(open_)

    def show_thinking(self, reasoning: str, stats: Stats, *, streaming: bool) -> None:
        self.setVisible(bool(reasoning))
        self.toggle.setText(thinking_title(stats, streaming=streaming))
        self.text.setText(reasoning)


def tool_calls_html(calls: list[dict[str, object]]) -> str:
    """Tool calls (OpenAI-style) as a block a person can read: the function and its arguments."""
    blocks = []
    for call in calls:
        function = call.get("function")
        fn: dict[str, object] = function if isinstance(function, dict) else {}
        try:
            args = json.dumps(json.loads(str(fn.get("arguments") or "{}")), indent=2, ensure_ascii=False)
        except ValueError:
            args = str(fn.get("arguments", ""))
        blocks.append(f"<p><b>Tool call: {html.escape(str(fn.get('name', '?')))}</b></p>"
                      f"<pre>{html.escape(args)}</pre>")
    return "".join(blocks)


def footer_text(stats: Stats) -> str:
    """'stopped at the token limit · 512 tokens · 41.8 tok/s' from a message's stored stats."""
    parts = []
    if (reason := str(stats.get("finish_reason"))) in FINISH_WORDS:
        parts.append(FINISH_WORDS[reason])
    n_gen = int(figure(stats.get("n_gen")))
    if n_gen:
        parts.append(f"{n_gen} tokens")
    rate = figure(stats.get("decode_tok_s"))
    if n_gen > 1 and rate > 0:
        parts.append(f"{rate:.1f} tok/s")
    if stats.get("model"):
        parts.append(str(stats["model"]))
    return " · ".join(parts)


def citation_words(c: Citation) -> str:
    from pathlib import Path

    page = f", page {c['page']}" if c.get("page") else ""
    lines = c.get("lines")
    a, b = lines if isinstance(lines, (list, tuple)) and lines else (0, 0)
    return f"[{c.get('index', '?')}] {Path(str(c.get('source', ''))).name}{page}, lines {a}-{b}"


def sources_html(cites: list[Citation], left_out: list[Citation]) -> str:
    """'Sources: [1] a.pdf, page 3 · [2] b.md' as links (cite:N); the ones left out named after them."""
    links = " · ".join(f"<a href='cite:{c.get('index')}'>{html.escape(citation_words(c))}</a>" for c in cites)
    out = f"Sources: {links}" if links else ""
    if left_out:
        names = ", ".join(html.escape(citation_words({**c, "index": "–"})[4:]) for c in left_out)
        out += f"<br><small>Left out (did not fit the context): {names}</small>"
    return out


class MarkdownView(QTextBrowser):
    """A QTextBrowser that is exactly as tall as its content (no inner scrollbar)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(50)
        self.document().setDocumentMargin(2)
        self.document().contentsChanged.connect(self._fit)

    def wrap_code(self) -> None:
        """Long lines in code blocks wrap at the width of the message (Markdown makes them
        non-breaking, and with no horizontal scrolling their ends were cut off)."""
        block = self.document().begin()
        while block.isValid():
            fmt = block.blockFormat()
            if fmt.nonBreakableLines():
                fmt.setNonBreakableLines(False)
                QTextCursor(block).setBlockFormat(fmt)
            block = block.next()

    def _fit(self) -> None:
        self.document().setTextWidth(max(50, self.viewport().width()))
        h = int(self.document().size().height()) + 4
        if h != self.height():
            self.setFixedHeight(h)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(event)
        self._fit()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        return QSize(400, int(self.document().size().height()) + 4)


class MessageWidget(QFrame):
    copy_requested = Signal()
    edit_requested = Signal(int)  # message id
    regenerate_requested = Signal(int)
    version_requested = Signal(int, int)  # message id, step (-1 older / +1 newer)
    citation_requested = Signal(dict)  # a source the answer cites (session/docs.Citation.as_dict())

    def __init__(self, *, message_id: int, role: str, text: str, status: str = "done",
                 stats: Stats | None = None, mode: str = "chat",
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message_id = message_id
        self.role = role
        self.status = status
        self.mode = mode
        self.stats: dict[str, object] = dict(stats or {})
        self.version = (1, 1)  # (this one, how many)
        self._text = text
        self._style = ""
        self.setObjectName(f"msg_{role}")
        self.header = QLabel()
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setMinimumWidth(20)
        self.context = QLabel()  # what the overflow policy left out for this answer, said quietly above it
        self.context.setObjectName("msgContext")
        self.context.setWordWrap(True)
        self.context.setVisible(False)
        self.thinking = ThinkingSection()  # a reasoning model's thinking, folded, above the answer
        self.body = MarkdownView()
        self.tools = QLabel()  # the answer's tool calls, when it made some
        self.tools.setTextFormat(Qt.TextFormat.RichText)
        self.tools.setWordWrap(True)
        self.tools.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.sources = QLabel()  # the documents the answer cites: hover shows the passage, click opens it
        self.sources.setObjectName("msgSources")
        self.sources.setTextFormat(Qt.TextFormat.RichText)
        self.sources.setWordWrap(True)
        self.sources.linkHovered.connect(self._hover_source)
        self.sources.linkActivated.connect(self._open_source)
        self.footer = QLabel()
        self.footer.setObjectName("msgFooter")
        self.footer.setWordWrap(True)  # a narrow window wraps it instead of widening the message
        self.copy_btn = self._button("Copy", "Copy this message as Markdown", self.copy)
        self.edit_btn = self._button("Edit", "Put this message back in the input box; sending "
                                     "replaces it and everything after it",
                                     lambda: self.edit_requested.emit(self.message_id))
        self.regen_btn = self._button("Regenerate", "Write this answer again (the current one "
                                      "stays as an earlier version)",
                                      lambda: self.regenerate_requested.emit(self.message_id))
        self.prev_btn = self._button("‹", "Earlier version of this answer",
                                     lambda: self.version_requested.emit(self.message_id, -1))
        self.next_btn = self._button("›", "Later version of this answer",
                                     lambda: self.version_requested.emit(self.message_id, +1))
        self.version_label = QLabel()
        self.edit_btn.setVisible(role == "user")
        self.regen_btn.setVisible(role == "assistant")
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.header, 1)
        for b in (self.prev_btn, self.version_label, self.next_btn, self.copy_btn, self.edit_btn,
                  self.regen_btn):
            top.addWidget(b)
        lay = self._column = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 8)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.context)
        lay.addWidget(self.thinking)
        self.images_row: ImageRow | None = None  # a user's images (set_images), above the text
        lay.addWidget(self.body)
        lay.addWidget(self.tools)
        lay.addWidget(self.sources)
        lay.addWidget(self.footer)
        self._render_timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render)
        self._restyle()
        self.set_versions(1, 1)
        self.set_status(status)
        self.set_stats(self.stats)
        self._render()

    def set_images(self, images: list[bytes | None]) -> None:
        """Show the message's images (None: one the history no longer has) above its text."""
        if self.images_row is not None:
            self.images_row.setParent(None)
            self.images_row.deleteLater()
            self.images_row = None
        if images:
            self.images_row = ImageRow(images)
            self._column.insertWidget(self._column.indexOf(self.body), self.images_row)

    def _button(self, text: str, tip: str, slot: Callable[[], object]) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        b.clicked.connect(lambda _checked=False: slot())
        return b

    # ---- colours: from the palette, again whenever it changes ---------------------------------

    def _restyle(self) -> None:
        pal = theme.palette()  # the application's: our own style sheet changes the widget's
        base = theme.role(QPalette.ColorRole.Base, pal)
        bg = (theme.mix(base, theme.role(QPalette.ColorRole.Highlight, pal), 0.10)
              if self.role == "user" else base)
        border = theme.mix(base, theme.role(QPalette.ColorRole.Text, pal), 0.18)
        text = theme.role(QPalette.ColorRole.Text, pal)
        style = (f"#msg_{self.role} {{ background: {theme.css(bg)}; border: 1px solid "
                 f"{theme.css(border)}; border-radius: 8px; }}"
                 f" #msg_{self.role} QTextBrowser {{ background: {theme.css(bg)};"
                 f" color: {theme.css(text)}; }}"
                 f" #msg_{self.role} QLabel {{ color: {theme.css(text)}; }}"
                 f" #msg_{self.role} QLabel#msgFooter {{ color: {theme.css(theme.muted(pal))}; }}"
                 f" #msg_{self.role} QLabel#msgContext {{ color: {theme.css(theme.muted(pal))}; }}"
                 f" #msg_{self.role} QLabel#thinkText {{ color: {theme.css(theme.muted(pal))}; }}"
                 f" #msg_{self.role} QToolButton {{ color: {theme.css(text)}; }}")
        if style != self._style:
            self._style = style
            self.setStyleSheet(style)
            if hasattr(self, "header"):
                self.set_status(self.status)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt API
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._restyle()

    # ---- state ----------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        return self._text

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self.set_status(self.status)

    def set_status(self, status: str) -> None:
        self.status = status
        note = STATUS_NOTES.get(status, "")
        names = COMPLETION_NAMES if self.mode == "completion" else ROLE_NAMES
        name = names.get(self.role, self.role)
        colour = theme.css(theme.tone(theme.WARNING_HUE, strong=True))
        self.header.setText(f"<b>{name}</b>&nbsp;&nbsp;<span style='color:{colour}'>{note}</span>"
                            if note else f"<b>{name}</b>")
        streaming = status == "streaming"
        self.regen_btn.setEnabled(not streaming)
        self.edit_btn.setEnabled(not streaming)
        if hasattr(self, "thinking"):
            self._show_thinking()

    def set_stats(self, stats: Stats) -> None:
        """Why the answer ended and how fast it was written (assistant messages)."""
        self.stats = dict(stats or {})
        text = footer_text(self.stats) if self.role == "assistant" else ""
        self.footer.setText(text)
        self.footer.setVisible(bool(text))
        note = str(self.stats.get("context_note") or "") if self.role == "assistant" else ""
        self.context.setText(note)
        self.context.setVisible(bool(note))
        cites = self.citations()
        self.sources.setText(sources_html(cites, records(self.stats.get("sources_left_out"))))
        self.sources.setVisible(bool(cites) or bool(self.stats.get("sources_left_out")))
        self._show_thinking()
        calls = records(self.stats.get("tool_calls")) if self.role == "assistant" else []
        if self.stats.get("tool_loop"):
            calls = []  # MCP calls: each has its own card below the answer (ui/tool_card.py)
        self.tools.setText(tool_calls_html(calls))
        self.tools.setVisible(bool(calls))
        if calls:
            self._render()

    def citations(self) -> list[Citation]:
        return records(self.stats.get("citations")) if self.role == "assistant" else []

    def _citation(self, link: str) -> Citation | None:
        index = link.removeprefix("cite:")
        return next((c for c in self.citations() if str(c.get("index")) == index), None)

    def _hover_source(self, link: str) -> None:
        from PySide6.QtGui import QCursor
        from PySide6.QtWidgets import QToolTip

        c = self._citation(link) if link else None
        if c is None:
            QToolTip.hideText()
            return
        text = str(c.get("text", ""))
        QToolTip.showText(QCursor.pos(), f"<b>{html.escape(citation_words(c))}</b><br>"
                          f"{html.escape(text[:600] + ('…' if len(text) > 600 else ''))}", self.sources)

    def _open_source(self, link: str) -> None:
        c = self._citation(link)
        if c is not None:
            self.citation_requested.emit(c)

    def set_versions(self, index: int, count: int) -> None:
        """Show 'index/count' with arrows when regenerate left earlier versions of this answer."""
        self.version = (index, count)
        many = count > 1
        for w in (self.prev_btn, self.version_label, self.next_btn):
            w.setVisible(many)
        self.version_label.setText(f"{index}/{count}")
        self.prev_btn.setEnabled(index > 1)
        self.next_btn.setEnabled(index < count)

    def set_actions_enabled(self, enabled: bool) -> None:
        self.regen_btn.setEnabled(enabled and self.status != "streaming")
        self.edit_btn.setEnabled(enabled)
        idx, count = self.version
        self.prev_btn.setEnabled(enabled and idx > 1)
        self.next_btn.setEnabled(enabled and idx < count)

    def _show_thinking(self) -> None:
        self.thinking.show_thinking(str(self.stats.get("reasoning") or ""), self.stats,
                                    streaming=self.status == "streaming")

    def think(self, stats: Stats) -> None:
        """Streaming: the thinking grew (stats: reasoning, reasoning_tokens, reasoning_s)."""
        self.stats.update({k: stats[k] for k in ("reasoning", "reasoning_tokens", "reasoning_s") if k in stats})
        self._show_thinking()

    def append(self, piece: str) -> None:
        """Streaming: add text now, re-render the Markdown soon (coalesced)."""
        self._text += piece
        if not self._render_timer.isActive():
            self._render_timer.start()

    def set_text(self, text: str) -> None:
        self._text = text
        self._render_timer.stop()
        self._render()

    def flush(self) -> None:
        if self._render_timer.isActive():
            self._render_timer.stop()
            self._render()

    def _render(self) -> None:
        if self.role == "user":
            self.body.setPlainText(self._text)
        else:
            calls = self.stats.get("tool_calls")
            shown = str(self.stats.get("content") or "") if calls else self._text  # not the call markup
            self.body.setMarkdown(shown or " ")
            self.body.wrap_code()
            self.body.setVisible(bool(shown.strip()) or not calls)

    def rendered_markdown(self) -> str:
        return self.body.document().toMarkdown(QTextDocument.MarkdownFeature.MarkdownDialectGitHub)

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self._text)
        self.copy_requested.emit()
