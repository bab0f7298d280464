"""What the engine gets for the next answer, and a conversation's title from its first message."""
from __future__ import annotations

import re
from typing import Any, Protocol, Sequence

from ggufdesk.core.history import Conversation
from ggufdesk.engine.link import protocol as P


class _Said(Protocol):
    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str: ...
    @property
    def stats(self) -> dict[str, Any]: ...


def _chat_message(m: _Said) -> dict[str, Any] | None:
    """One turn as a chat message: an answer that called tools carries its calls, a tool result
    the call's id and name (OpenAI's shape, which the chat templates read)."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": str(m.stats.get("call_id", "")),
                "name": str(m.stats.get("name", "")), "content": m.content}
    calls = m.stats.get("tool_calls") if m.role == "assistant" else None
    if calls:
        return {"role": "assistant", "content": m.content, "tool_calls": calls}
    if m.role in ("user", "assistant") and m.content:
        return {"role": m.role, "content": m.content}
    return None


def build_request(conv: Conversation, messages: Sequence[_Said]) -> dict[str, Any]:
    """Chat messages, or one prompt in completion mode (empty and system turns are left out, and
    tool calls and results too in completion mode)."""
    if conv.mode == "completion":
        turns = [m for m in messages if m.role in ("user", "assistant") and m.content]
        text = conv.system_prompt + "\n\n" if conv.system_prompt else ""
        for i, m in enumerate(turns):
            sep = "\n" if (i and m.role == "user") else ""
            text += sep + m.content
        return {"prompt": text, "messages": None}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    msgs += [msg for msg in map(_chat_message, messages) if msg is not None]
    return {"prompt": None, "messages": msgs}


def plain_line(line: str) -> str:
    """One line of Markdown as plain words: no heading marks, emphasis, code ticks or link targets."""
    line = re.sub(r"^\s{0,3}(#{1,6}\s+|>\s*|[-*+]\s+|\d+[.)]\s+)", "", line)
    line = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", line)  # [text](url), ![alt](src)
    line = re.sub(r"(\*\*|__|~~|`+)", "", line)
    line = re.sub(r"(?<!\w)[*_](\S(?:.*?\S)?)[*_](?!\w)", r"\1", line)
    return " ".join(line.split())


def title_from(text: str, limit: int = 48) -> str:
    """A conversation title: the first line of the first message in plain words, shortened at a word."""
    lines = [plain_line(ln) for ln in text.strip().splitlines() if not ln.strip().startswith("```")]
    first = next((ln for ln in lines if ln), "") or "New chat"
    if len(first) <= limit:
        return first
    return first[:limit].rsplit(" ", 1)[0] + "…"


def context_note(ev: P.Overflow) -> str:
    """What the overflow policy dropped, in a quiet line: "3 earlier turns no longer fit the 4,096-token context"."""
    room = f"the {ev.n_ctx:,}-token context" if ev.n_ctx else "the context"
    if ev.dropped_messages:
        turns = "turn no longer fits" if ev.dropped_messages == 1 else "turns no longer fit"
        line = f"{ev.dropped_messages} earlier {turns} {room}"
    elif ev.policy == "truncate-middle":
        line = f"the middle of the conversation ({ev.truncated_tokens:,} tokens) was left out to fit {room}"
    elif ev.policy == "shift":
        line = f"the oldest {ev.truncated_tokens:,} tokens were dropped as the answer filled {room}"
    elif ev.truncated_tokens:
        line = f"the first {ev.truncated_tokens:,} tokens no longer fit {room}"
    else:
        line = ""
    return "; ".join(x for x in (line, ev.note) if x)
