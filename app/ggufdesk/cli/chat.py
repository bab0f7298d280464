"""`ggufdesk chat`: an interactive terminal chat through the engine process (useful on headless machines).

It drives the same session layer as the GUI window (session/), without saving the history. The MCP
servers of mcp.json (or --mcp-config) offer their tools; each call asks first (cli/mcp_tools.py).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import sys
from typing import TYPE_CHECKING, Any, TextIO

from ggufdesk.cli import mcp_tools
from ggufdesk.cli.run import add_model_arguments, preset_for, resolve_model, settings_from_args
from ggufdesk.cli.worker import describe_split
from ggufdesk.core.errors import KnownError
from ggufdesk.core.wording import FINISH_WORDS
from ggufdesk.session import ChatSession, Refused, Turn
from ggufdesk.session.inbox import Inbox

if TYPE_CHECKING:
    from ggufdesk.core.mcp.host import McpHost
    from ggufdesk.engine.link.client import EngineClient

NAME = "chat"
HELP = "chat in the terminal (Ctrl-C stops an answer; /reset clears the conversation; /exit quits)"
EVENT_SILENCE_S = 600.0  # the engine client's watchdog ends a silent engine long before this


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    # a long chat goes on, as in the window (and says what it dropped)
    p.set_defaults(default_context_overflow="rolling")
    p.add_argument("--system", default="", help="system prompt")
    p.add_argument("--completion", action="store_true",
                   help="plain text continuation instead of chat turns (for base models)")
    p.add_argument("--docs", metavar="NAME",
                   help="answer from a document collection (ggufdesk docs add NAME PATH...), citing [1], [2]")
    mcp_tools.add_arguments(p, interactive=True)


class TerminalView(mcp_tools.ToolNotes):
    """Prints the answer as it streams, its stats when it ends, tool calls, a reasoning model's
    thinking (dim, before the answer), and what the user must know."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(out)
        self._thinking = False
        self._dim = out.isatty() if hasattr(out, "isatty") else False

    def turn_thought(self, turn: Turn, piece: str) -> None:
        """A reasoning model's thinking: shown apart (dim on a terminal), before the answer."""
        if not self._thinking:
            self._thinking = True
            self.out.write("\x1b[2m" if self._dim else "")
            self.out.write("[thinking] ")
        self.out.write(piece)
        self.out.flush()

    def _end_thinking(self) -> None:
        if self._thinking:
            self._thinking = False
            self.out.write(("\x1b[0m" if self._dim else "") + "\n[/thinking]\n")

    def turn_grew(self, turn: Turn, piece: str) -> None:
        self._end_thinking()
        self.out.write(piece)
        self.out.flush()

    def context_noted(self, turn: Turn) -> None:
        print(f"[{turn.stats.get('context_note', '')}]", file=self.out)  # before the answer, as in the window

    def turn_finished(self, turn: Turn) -> None:
        self._end_thinking()
        st = turn.stats
        if st.get("citations"):
            print("\n\nSources:", file=self.out, end="")
            for c in st["citations"]:
                page = f", page {c['page']}" if c.get("page") else ""
                a, b = c["lines"]
                print(f"\n  [{c['index']}] {c['source']}{page}, lines {a}-{b}", file=self.out, end="")
        if st.get("final"):
            print(f"\n[{st['n_gen']} tokens, {st['decode_tok_s']:.1f} tok/s, TTFT {st['ttft_s']:.2f} s]",
                  file=self.out, end="")
        if turn.status == "cancelled":
            print("\n[stopped]", file=self.out, end="")
        elif turn.finish_reason == "repeat":  # a base model's loop, cut (session/guard.py)
            print(f"\n[{FINISH_WORDS['repeat']}]", file=self.out, end="")

    def notice(self, text: str, level: str = "info") -> None:
        if level == "error":
            print(f"\n[error: {text}]", file=self.out, end="")
        else:
            super().notice(text, level)


def readable(stream: TextIO) -> TextIO:
    """Standard input that never raises on invalid UTF-8 or binary bytes (they become U+FFFD)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        return stream
    return io.TextIOWrapper(buffer, encoding="utf-8", errors="replace")


def run(args: argparse.Namespace, *, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    from ggufdesk.engine.link.client import EngineClient

    stdin = stdin or readable(sys.stdin)
    out = stdout or sys.stdout
    model = resolve_model(args.model)
    _, preset = preset_for(model)
    load, sampling, spec = settings_from_args(args, preset)
    if not args.system and preset is not None and preset.system_prompt:
        args.system = preset.system_prompt  # the model's own system prompt, unless one is given
    if getattr(args, "docs", None) and spec.mode == "off":
        spec = dataclasses.replace(spec, mode="lookup")  # answers quote their sources: lookup drafts pay
    docs = DocsChat(args.docs, out) if getattr(args, "docs", None) else None
    host = mcp_tools.open_host(args, err=out)
    try:
        with EngineClient() as client, docs or contextlib.nullcontext():
            return _chat(args, client, client.load(model, settings=load, speculation=spec), host, stdin, out,
                         sampling, docs)
    finally:
        if host is not None:
            host.close()


def _chat(args: argparse.Namespace, client: EngineClient, loaded: Any, host: McpHost | None, stdin: TextIO,
          out: TextIO, sampling: Any, docs: DocsChat | None = None) -> int:
    """The conversation, once the model is loaded: read a line, answer it, until /exit or EOF."""
    from ggufdesk.session.tool_loop import ToolLoop

    assert loaded is not None
    inbox = Inbox()
    view = TerminalView(out)
    tools = ToolLoop(host, allow_all=args.allow_tools, save_config=mcp_tools.save_for(args)) \
        if host is not None else None
    session = ChatSession(engine=client, view=view, post=inbox.post, tools=tools)
    session.on_event(loaded)
    if docs is not None:
        session.attach_docs(docs.attached)
    mode = "completion" if args.completion else "chat"
    note = " (no chat template: built-in turn format; a base model may answer poorly)" \
        if loaded.chat_format == "completion" and mode == "chat" else ""
    print(f"ggufdesk: {loaded.arch} model loaded in {loaded.load_s:.1f} s, {mode} mode{note}. "
          "Ctrl-C stops an answer, /reset clears, /exit quits.", file=out)
    if loaded.rpc:
        print(f"ggufdesk: {describe_split(loaded.rpc)}", file=out)
    if host is not None:
        names = ", ".join(s.name for s in host.config.enabled())
        print(f"ggufdesk: MCP servers {names} offer their tools (started on first use; "
              f"{'calls run without asking' if args.allow_tools else 'each call asks you first'}).",
              file=out)

    def fresh() -> None:
        session.new_conversation(system_prompt=args.system, sampling=sampling)
        session.update_conversation(mode=mode)

    fresh()
    while True:
        print("\n> ", end="", file=out, flush=True)
        line = stdin.readline()
        if not line or line.strip() in ("/exit", "/quit"):
            return 0
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            fresh()
            print("(conversation cleared)", file=out)
            continue
        if not text.strip():
            continue
        if docs is not None:
            docs.refresh()
        try:
            session.send(text)
        except Refused as e:
            print(f"[{e}]", file=out, end="")
            continue
        mcp_tools.pump(client, session, inbox, silence=EVENT_SILENCE_S, notes=view, stdin=stdin)
    raise KnownError("unreachable")  # pragma: no cover


class DocsChat:
    """The collection a terminal chat answers from: opened (with its embedding engine) for the chat's
    length, brought up to date at the start and, when files changed, before a question (polled)."""

    def __init__(self, name: str, out: TextIO) -> None:
        from ggufdesk.core.docs.store import collection_path
        from ggufdesk.session.docs import Attached, open_retriever
        from ggufdesk.session.docs_index import Watcher

        if not collection_path(name).exists():
            raise KnownError(f"there is no collection {name!r}; make one first: ggufdesk docs add {name} PATH...")
        self.out = out
        self.opened = open_retriever(name)
        retriever = self.opened.retriever
        self.attached = Attached(retriever)
        self.watcher = Watcher(name, embed=retriever.embed, embed_model=retriever.coll.embed_model)
        print(f"ggufdesk: answering from {name!r}: {retriever.note}", file=out)
        self.refresh()

    def refresh(self) -> None:
        from ggufdesk.session.docs_index import summary

        report = self.watcher.poll()
        if report is not None and (report.added or report.updated or report.removed):
            print(f"ggufdesk: {self.attached.name!r} re-indexed ({summary(report)})", file=self.out)

    def __enter__(self) -> DocsChat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.opened.__exit__(*exc)
