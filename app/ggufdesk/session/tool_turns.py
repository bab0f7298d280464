"""The tool loop of a ChatSession: offer the conversation's MCP tools, ask before each call, run it,
put its result in the conversation as a tool message, and let the model go on (at most N rounds).

A mixin of ChatSession (session/conversation.py): the loop's steps are session state changes and
run on the session's thread; calls and tool listings run on the MCP host's thread and come back
through `post`.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable

from ggufdesk.core.mcp.host import McpFailure, McpTool
from ggufdesk.core.mcp.offer import Offer
from ggufdesk.core.mcp.results import ToolResult
from ggufdesk.core.toolcalls import CallStream
from ggufdesk.core.tools import model_format
from ggufdesk.engine.link import protocol as P
from ggufdesk.session.tool_loop import DENIED_TEXT, STOPPED_TEXT, Decision, ToolCall, ToolLoop, parse_call
from ggufdesk.session.turns import Ref, Turn

if TYPE_CHECKING:
    from ggufdesk.core.history import Conversation
    from ggufdesk.session.conversation import Phase, SessionView

_Listing = dict[str, tuple[McpTool, ...] | McpFailure]


class ToolTurns:
    """The MCP part of ChatSession; the attributes below are the session's."""

    tools: ToolLoop | None
    view: SessionView
    post: Callable[[Callable[[], None]], None]
    phase: Phase
    answer: Turn | None
    model: P.Loaded | None

    def _init_tools(self, tools: ToolLoop | None) -> None:
        self.tools = tools
        self.offer: Offer | None = None  # what the answer being written was offered
        self.calls: list[ToolCall] = []  # this round's calls, in the model's order
        self.rounds = 0  # tool rounds since the user's message
        self._stream: CallStream | None = None
        self._running: dict[int, Future[ToolResult]] = {}
        self._formats: dict[str, Any] = {}

    # provided by ChatSession
    def _set_phase(self, phase: Phase) -> None: ...
    def _begin(self, answer: Turn, conv: Conversation, request: dict[str, Any], extra: dict[str, Any]) -> None: ...
    def _add(self, turn: Turn, *, status: str, then: Callable[[Any], None] | None = None,
             replaces: Ref | None = None) -> None: ...
    def _start_answer(self, version: tuple[int, int] | None = None, replaces: Ref | None = None) -> None: ...

    # ---- offering ------------------------------------------------------------------------------

    def _offer_tools(self, answer: Turn, conv: Conversation, request: dict[str, Any]) -> None:
        """Once the answer's row is written: list the conversation's tools (starting servers on
        first use), then ask the engine with them. Without servers, ask at once."""
        if self.answer is not answer or self.phase != "saving":
            return  # stopped before its row was on disk: the engine is never asked
        servers = self.tools.servers_for(conv) if self.tools is not None and request.get("messages") else []
        if not servers:
            self._begin(answer, conv, request, {})
            return
        assert self.tools is not None
        starting = self.tools.starting(servers)
        if starting:
            self.view.notice(f"starting MCP server{'s' * (len(starting) > 1)} {', '.join(starting)}…")
        future = self.tools.list_tools(servers)
        future.add_done_callback(lambda f: self.post(lambda: self._tools_listed(answer, conv, request, f)))

    def _tools_listed(self, answer: Turn, conv: Conversation, request: dict[str, Any],
                      future: Future[_Listing]) -> None:
        if self.answer is not answer or self.phase != "saving" or self.tools is None:
            return
        try:
            listing = future.result()
        except Exception as e:  # noqa: BLE001 - the host is closing; answer without tools
            self.view.notice(f"the MCP tools are not available: {e}", "warning")
            listing = {}
        offer, news = self.tools.offer(listing)
        for note in news:
            self.view.notice(note, "warning")
        extra: dict[str, Any] = {}
        self.offer, self._stream = (offer, None) if offer else (None, None)
        if offer:
            last = self.rounds >= self.tools.max_rounds
            extra = {"tools": offer.tools, "tool_choice": "none" if last else "auto"}
            if offer.loose:
                extra["tools_without_grammar"] = list(offer.loose)
            if not last:
                self._stream = CallStream(self._tool_format())
        self._begin(answer, conv, request, extra)

    def _tool_format(self) -> Any:
        path = self.model.model if self.model is not None else ""
        if path not in self._formats:
            self._formats[path] = model_format(path)
        return self._formats[path]

    # ---- the answer's text: calls held back while it streams -------------------------------------

    def _shown_piece(self, text: str) -> str:
        return self._stream.push(text) if self._stream is not None else text

    def _settle_text(self, answer: Turn, ev: P.Done) -> None:
        """At the end of an answer that was offered tools: the text without the call."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        if ev.tool_calls:  # the engine read calls: the text is what it says is not a call
            content = (ev.content or "").strip()
            if content != answer.content:
                answer.content = content
                self.view.turn_changed(answer)
            return
        rest = stream.finish(None)  # no call: all of the text, held-back parts included
        if rest:
            answer.content += rest
            self.view.turn_grew(answer, rest)

    def _wants_tools(self, ev: P.Done) -> bool:
        return self.offer is not None and bool(ev.tool_calls) and ev.finish_reason == "tool_calls"

    # ---- a round of calls ------------------------------------------------------------------------

    def _start_calls(self, raw: list[dict[str, Any]]) -> None:
        assert self.offer is not None
        self.rounds += 1
        self.calls = [parse_call(c, self.offer) for c in raw]
        self._set_phase("tool")
        for call in self.calls:
            self.view.tool_call_changed(call)
        self._next_call()

    def _next_call(self) -> None:
        """Record finished calls, then ask about (or run) the next one; when all are done, the
        model goes on with their results."""
        assert self.tools is not None
        for call in self.calls:
            if call.final:
                if not call.recorded:
                    self._record(call)
                continue
            if call.state in ("asking", "running"):
                return
            if self.tools.deny_all:
                call.state, call.result = "denied", DENIED_TEXT
                self._record(call)
                continue
            if self.tools.needs_asking(call):
                call.state = "asking"
                self.view.tool_call_changed(call)
            else:
                self._run_call(call)
            return
        self._round_done()

    def decide(self, key: int, decision: Decision) -> None:
        """The user's answer to a call's card: "once", "always" (for this tool of this server) or "deny"."""
        call = next((c for c in self.calls if c.key == key and c.state == "asking"), None)
        if call is None or self.phase != "tool" or self.tools is None:
            return
        if decision == "deny":
            call.state, call.result = "denied", DENIED_TEXT
            self._next_call()
            return
        if decision == "always":
            problem = self.tools.remember(call.server, call.tool)
            if problem:
                self.view.notice(problem, "warning")
        self._run_call(call)

    def _run_call(self, call: ToolCall) -> None:
        assert self.tools is not None
        call.state = "running"
        self.view.tool_call_changed(call)
        future = self.tools.run(call)
        self._running[call.key] = future
        future.add_done_callback(lambda f: self.post(lambda: self._call_done(call, f)))

    def _call_done(self, call: ToolCall, future: Future[ToolResult]) -> None:
        self._running.pop(call.key, None)
        if call.state != "running" or future.cancelled():
            return  # stopped: already recorded as such
        call.state, call.result, call.truncated = ToolLoop.result_text(
            future, self.model.n_ctx if self.model is not None else 4096)
        if future.exception() is not None:
            self.view.notice(call.result.removeprefix("Error: "), "warning")
        self._next_call()

    def _record(self, call: ToolCall) -> None:
        """The call's result as a tool message in the conversation (saved, exported, searched)."""
        call.recorded = True
        stats: dict[str, Any] = {"call_id": call.call_id, "name": call.name, "server": call.server, "tool": call.tool,
                 "arguments": call.arguments_text, "state": call.state}
        if call.truncated:
            stats["truncated"] = True
        self._add(Turn(role="tool", content=call.result, stats=stats), status="done")
        self.view.tool_call_changed(call)

    def _round_done(self) -> None:
        assert self.tools is not None
        self.calls = []
        if self.rounds >= self.tools.max_rounds:
            self.view.notice(f"the model asked for tools {self.rounds} times for this message; it answers "
                             "now without them", "warning")
        self._start_answer()

    def _stop_calls(self) -> None:
        """Stop: a running call is cancelled (the server is told), undecided ones never run; each
        gets a tool message saying so, and the conversation is idle again."""
        for call in self.calls:
            if not call.final:
                future = self._running.pop(call.key, None)
                if future is not None:
                    future.cancel()
                call.state, call.result = "stopped", STOPPED_TEXT
            if not call.recorded:
                self._record(call)
        self.calls = []
        self._set_phase("idle")
