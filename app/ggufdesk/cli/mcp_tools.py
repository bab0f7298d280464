"""MCP tools for `ggufdesk run` and `ggufdesk chat`: the servers file, permissions, and the loop
that feeds engine events and tool results to the session on the main thread."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO, cast

from ggufdesk.core.errors import KnownError
from ggufdesk.session import SessionView

if TYPE_CHECKING:
    from ggufdesk.core.mcp.host import McpHost
    from ggufdesk.engine.link.client import EngineClient
    from ggufdesk.session import ChatSession
    from ggufdesk.session.inbox import Inbox
    from ggufdesk.session.tool_loop import Decision, ToolCall

POLL_S = 0.05  # how often the loop looks at tool results between engine events
ASK = "Run it? [y] once, [a] always for this tool, [n] no: "


def add_arguments(p: argparse.ArgumentParser, *, interactive: bool) -> None:
    also = "" if interactive else "; with it or --allow-tools the model may call their tools"
    p.add_argument("--mcp-config", metavar="FILE",
                   help="MCP servers (an mcpServers JSON, as Claude Desktop or LM Studio write it; "
                        "default: ggufdesk's mcp.json)" + also)
    p.add_argument("--allow-tools", action="store_true",
                   help="run the model's MCP tool calls without asking" if interactive else
                   "run the model's MCP tool calls (without it, calls are refused and the model is told)")


def open_host(args: argparse.Namespace, *, err: TextIO) -> McpHost | None:
    """The host for the servers of --mcp-config (strict: a typo is an error) or of the app's
    mcp.json (a broken one is kept aside and the user told); None when there are none enabled."""
    from ggufdesk.core.mcp.config import load_mcp_config, mcp_log_dir, open_mcp_config
    from ggufdesk.core.mcp.host import McpHost

    if args.mcp_config:
        path = Path(args.mcp_config)
        if not path.is_file():
            raise KnownError(f"--mcp-config: {path} does not exist")
        config = load_mcp_config(path)
    else:
        report = open_mcp_config()
        if report.warning:
            print(f"ggufdesk: {report.warning}", file=err)
        config = report.config
    if not config.enabled():
        return None
    return McpHost(config, log_dir=mcp_log_dir())


def save_for(args: argparse.Namespace) -> Callable[[Any], Any]:
    """Where "always" is written: the file given, or the app's mcp.json."""
    from ggufdesk.core.mcp.config import save_mcp_config

    path = Path(args.mcp_config) if args.mcp_config else None
    return lambda config: save_mcp_config(config, path)


def describe(call: ToolCall) -> str:
    args = call.arguments_text if len(call.arguments_text) <= 300 else call.arguments_text[:300] + "…"
    return f"{call.server}/{call.tool} {args}"


class ToolNotes(SessionView):
    """What the terminal shows of tool calls; calls waiting for permission are queued for `pump`."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.asking: list[ToolCall] = []

    def tool_call_changed(self, call: ToolCall) -> None:
        if call.state == "asking":
            self.asking.append(call)
        elif call.state == "running":
            print(f"\n[tool {describe(call)}: running…]", file=self.out, flush=True)
        elif call.final and call.recorded:
            result = call.result if len(call.result) <= 200 else call.result[:200] + "…"
            print(f"[tool {call.server}/{call.tool}: {call.state}] {result}", file=self.out, flush=True)

    def notice(self, text: str, level: str = "info") -> None:
        if level == "warning":
            print(f"\n[note: {text}]", file=self.out, end="", flush=True)


def ask(call: ToolCall, stdin: TextIO, out: TextIO) -> Decision:
    print(f"\nThe model wants to call the MCP tool {describe(call)}", file=out)
    while True:
        print(ASK, end="", file=out, flush=True)
        line = stdin.readline()
        if not line:
            return "deny"
        answer = line.strip().lower()
        if answer in ("y", "yes", "once"):
            return "once"
        if answer in ("a", "always"):
            return "always"
        if answer in ("n", "no", "d", "deny"):
            return "deny"


def pump(client: EngineClient, session: ChatSession, inbox: Inbox, *, silence: float,
         notes: ToolNotes | None = None, stdin: TextIO | None = None) -> None:
    """Feed engine events and the tool loop's results to the session until it is idle; ask the
    user about calls (with `notes` and `stdin`); Ctrl-C stops the answer or the tool."""
    last = time.monotonic()
    while session.busy:
        try:
            inbox.run_pending()
            if notes is not None and notes.asking:
                call = notes.asking.pop(0)
                if call.state == "asking":
                    session.decide(call.key, ask(call, stdin or sys.stdin, notes.out))
                continue
            ev = next(client.events(timeout=POLL_S), None)
            if ev is not None:
                last = time.monotonic()
                session.on_event(ev)
            elif session.phase in ("streaming", "stopping") and time.monotonic() - last > silence:
                session.close()  # nothing at all for this long: keep what was written
                return
            elif session.phase not in ("streaming", "stopping"):
                last = time.monotonic()
        except KeyboardInterrupt:
            session.stop()


def tool_rounds(session: ChatSession) -> list[dict[str, Any]]:
    """`run --json`'s tool_rounds: every call of the answer, in order, with what the model read."""
    import json

    def arguments(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            return text

    return [{"server": t.stats.get("server", ""), "tool": t.stats.get("tool", ""),
             "arguments": arguments(t.stats.get("arguments", "{}")), "result": t.content,
             "state": t.stats.get("state", "")} for t in session.turns if t.role == "tool"]


class RunView(ToolNotes):
    """`run`'s view: the answers' text on stdout (unless --json), tool calls and notes on stderr."""

    def __init__(self, *, echo: bool) -> None:
        super().__init__(sys.stderr)
        self.echo = echo
        self.errors: list[str] = []

    def turn_grew(self, turn: Any, piece: str) -> None:
        if self.echo:
            sys.stdout.write(piece)
            sys.stdout.flush()

    def notice(self, text: str, level: str = "info") -> None:
        if level == "error":
            self.errors.append(text)  # the run's error, if its answer failed
        else:
            super().notice(text, level)


def run_once(client: EngineClient, loaded: Any, host: McpHost, args: argparse.Namespace, prompt: str,
             sampling: Any) -> tuple[str, dict[str, Any], Any, list[dict[str, Any]]]:
    """`run` with MCP tools, through the session's tool loop: calls run only with --allow-tools
    (otherwise each is refused and the model told). (text, the last answer's stats, its Done, tool_rounds)."""
    from ggufdesk.engine.link import protocol as P
    from ggufdesk.session import ChatSession
    from ggufdesk.session.inbox import Inbox
    from ggufdesk.session.tool_loop import ToolLoop

    inbox = Inbox()
    view = RunView(echo=not args.json)
    tools = ToolLoop(host, allow_all=args.allow_tools, deny_all=not args.allow_tools)
    session = ChatSession(engine=client, view=view, post=inbox.post, tools=tools)
    session.on_event(loaded)
    session.new_conversation(system_prompt=args.system, sampling=sampling)
    session.send(prompt)
    pump(client, session, inbox, silence=600.0)
    answer = next((t for t in reversed(session.turns) if t.role == "assistant"), None)
    if answer is None or answer.status == "error":
        raise KnownError(view.errors[-1] if view.errors else "the answer failed")
    # the turn keeps its Done's finish_reason (a P.FinishReason) as a plain str
    finish = cast("P.FinishReason", answer.finish_reason or "stop")
    done = P.Done(id="", finish_reason=finish, tool_calls=answer.stats.get("tool_calls") or [])
    return answer.content, answer.stats, done, tool_rounds(session)
