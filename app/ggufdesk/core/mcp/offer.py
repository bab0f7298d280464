"""The MCP tools offered to a model: OpenAI-style function tools with names a model can write,
each traced back to its server and tool, and the tools whose schema the grammar cannot enforce."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ggufdesk.core.mcp.host import McpTool
from ggufdesk.core.schema import SchemaError, check_schema
from ggufdesk.core.tools import MAX_TOOLS, NAME_RE


@dataclass(frozen=True, slots=True)
class Offer:
    tools: list[dict[str, Any]] = field(default_factory=list)  # for Generate.tools
    route: dict[str, tuple[str, str]] = field(default_factory=dict)  # offered name -> (server, tool)
    loose: list[str] = field(default_factory=list)  # offered names whose arguments are not enforced
    notes: list[str] = field(default_factory=list)  # what the user should be told once

    def __bool__(self) -> bool:
        return bool(self.tools)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text).strip("_.-") or "tool"


def offered_name(server: str, tool: str, clash: bool) -> str:
    """The name the model sees: the tool's own name when it is valid and unique, otherwise
    `server__tool` made of the characters function names allow (at most 64)."""
    if not clash and NAME_RE.match(tool):
        return tool
    return f"{_safe(server)[:20]}__{_safe(tool)}"[:64]


def build_offer(listing: dict[str, tuple[McpTool, ...]]) -> Offer:
    """Tools of several servers as one list (in the servers' order; at most MAX_TOOLS)."""
    counts: dict[str, int] = {}
    for tools in listing.values():
        for t in tools:
            counts[t.name] = counts.get(t.name, 0) + 1
    offer = Offer()
    taken: set[str] = set()
    for server, tools in listing.items():
        for t in tools:
            name = offered_name(server, t.name, counts[t.name] > 1)
            n = 2
            while name in taken:
                name, n = f"{name[:60]}_{n}", n + 1
            if len(offer.tools) >= MAX_TOOLS:
                offer.notes.append(f"only the first {MAX_TOOLS} MCP tools are offered; {server}/{t.name} and "
                                   "later ones are left out")
                return offer
            taken.add(name)
            schema = t.input_schema if isinstance(t.input_schema, dict) and t.input_schema else {"type": "object"}
            try:
                check_schema(schema)
            except SchemaError as e:
                offer.loose.append(name)
                offer.notes.append(f"the MCP tool {t.name} of {server} is offered without a grammar for its "
                                   f"arguments ({e}); the model may write arguments it does not accept")
            fn: dict[str, Any] = {"name": name, "parameters": schema}
            if t.description:
                fn["description"] = t.description
            offer.tools.append({"type": "function", "function": fn})
            offer.route[name] = (server, t.name)
    return offer
