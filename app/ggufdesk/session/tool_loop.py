"""MCP tools in a conversation: which servers it uses, what the model is offered, who may run a call.

The ChatSession drives the loop (answer -> calls -> results -> answer ...); this module holds what
does not depend on its state: the host, the permissions ("always" is remembered per server and
tool in mcp.json's `alwaysAllow`), the round cap, and a call's record while it is decided and run.
"""
from __future__ import annotations

import itertools
import json
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from ggufdesk.core.history import Conversation
from ggufdesk.core.mcp.config import McpConfig
from ggufdesk.core.mcp.host import McpFailure, McpHost, McpTool
from ggufdesk.core.mcp.offer import Offer, build_offer
from ggufdesk.core.mcp.results import ToolResult, clean_text, result_limit, truncate

log = logging.getLogger("ggufdesk.session.tools")

MAX_ROUNDS = 8  # model -> tools -> model rounds for one message; then it must answer without tools
Decision = Literal["once", "always", "deny"]
CallState = Literal["pending", "asking", "running", "done", "error", "denied", "stopped"]
FINAL_STATES: frozenset[CallState] = frozenset({"done", "error", "denied", "stopped"})
DENIED_TEXT = "The user did not allow this tool call. Answer without it, or ask the user."
STOPPED_TEXT = "The user stopped before this tool call finished; it has no result."
_keys = itertools.count(1)


@dataclass(eq=False, slots=True)
class ToolCall:
    """One call the model asked for: shown as a card (server, tool, arguments) until it is done."""

    call_id: str
    name: str  # the name the model used (offer.route maps it to server and tool)
    server: str
    tool: str
    arguments: dict[str, Any]
    arguments_text: str
    state: CallState = "pending"
    result: str = ""
    truncated: bool = False
    recorded: bool = False  # its tool message was added to the conversation
    key: int = field(default_factory=lambda: next(_keys))

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


def parse_call(call: dict[str, Any], offer: Offer) -> ToolCall:
    """An OpenAI-style call from the engine as a ToolCall; a call the offer cannot route, or whose
    arguments are not a JSON object, is an error at once (the model is told why)."""
    fn = call.get("function") or {}
    name = clean_text(str(fn.get("name", "")))
    raw = fn.get("arguments") or "{}"
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        args = None
    server, tool = offer.route.get(name, ("", name))
    text = clean_text(json.dumps(args, ensure_ascii=False) if args is not None else str(raw))
    tc = ToolCall(call_id=str(call.get("id") or f"call_{next(_keys)}"), name=name, server=server, tool=tool,
                  arguments=args if isinstance(args, dict) else {}, arguments_text=text)
    if not server:
        tc.state, tc.result = "error", f"Error: there is no tool named {name!r}."
    elif not isinstance(args, dict):
        tc.state, tc.result = "error", "Error: the arguments must be a JSON object."
    return tc


class ToolLoop:
    """MCP tools for one front end's ChatSession.

    `allow_all` runs every call without asking (`--allow-tools`); `deny_all` refuses every call
    (a non-interactive run without it: the model is told). `save_config` writes mcp.json when the
    user chooses "Always for this tool" (None: remembered until the app closes).
    """

    def __init__(self, host: McpHost, *, max_rounds: int = MAX_ROUNDS, allow_all: bool = False,
                 deny_all: bool = False, save_config: Callable[[McpConfig], object] | None = None) -> None:
        self.host = host
        self.max_rounds = max_rounds
        self.allow_all, self.deny_all = allow_all, deny_all
        self.save_config = save_config
        self._said: set[str] = set()

    def servers_for(self, conv: Conversation) -> list[str]:
        """The servers whose tools this conversation offers: enabled in mcp.json, not turned off here."""
        if conv.mode != "chat" or conv.sampling.structured:
            return []
        off = set(conv.mcp_off)
        return [s.name for s in self.host.config.enabled() if s.name not in off]

    def starting(self, servers: list[str]) -> list[str]:
        """The servers a listing will start (not those running, nor those that failed to start)."""
        return [n for n in servers if self.host.status(n).state in ("stopped", "starting")]

    def list_tools(self, servers: list[str]) -> Future[dict[str, tuple[McpTool, ...] | McpFailure]]:
        return self.host.list_tools(servers)

    def offer(self, listing: dict[str, tuple[McpTool, ...] | McpFailure]) -> tuple[Offer, list[str]]:
        """The offer for the tools that were listed, and what to tell the user (each thing once)."""
        ok = {name: tools for name, tools in listing.items() if not isinstance(tools, McpFailure)}
        failed = [f"{e}; its tools are not offered" for e in listing.values() if isinstance(e, McpFailure)]
        offer = build_offer(ok)
        news = [n for n in [*failed, *offer.notes] if n not in self._said]
        self._said.update(news)
        return offer, news

    def needs_asking(self, call: ToolCall) -> bool:
        cfg = self.host.config.servers.get(call.server)
        return not self.allow_all and (cfg is None or call.tool not in cfg.always_allow)

    def remember(self, server: str, tool: str) -> str | None:
        """"Always for this tool": kept in mcp.json; returns a problem to tell the user, or None."""
        config = self.host.config.allowing(server, tool)
        self.host.update_config(config)
        if self.save_config is None:
            return None
        try:
            self.save_config(config)
        except OSError as e:
            return (f"could not save the permission for {server}/{tool} in mcp.json ({e}); it holds until "
                    "ggufdesk closes")
        return None

    def run(self, call: ToolCall) -> Future[ToolResult]:
        return self.host.call(call.server, call.tool, call.arguments)

    @staticmethod
    def result_text(future: Future[ToolResult], n_ctx: int) -> tuple[CallState, str, bool]:
        """(state, the text the model reads, whether it was cut) for a finished call."""
        try:
            result = future.result()
        except McpFailure as e:
            return "error", f"Error: {e}", False
        except Exception as e:
            log.exception("MCP call failed")
            return "error", f"Error: the tool call failed ({type(e).__name__}: {e})", False
        text = ("Error: " + result.text) if result.is_error else result.text
        text, cut = truncate(text, result_limit(n_ctx))
        return ("error" if result.is_error else "done"), text, cut
