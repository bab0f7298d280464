"""What the engine gets for the next answer, and a conversation's title from its first message."""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from ggufdesk.core.history import Conversation


class _Said(Protocol):
    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str: ...


def build_request(conv: Conversation, messages: Sequence[_Said]) -> dict[str, Any]:
    """Chat messages, or one prompt in completion mode (empty and system turns are left out)."""
    turns = [m for m in messages if m.role in ("user", "assistant") and m.content]
    if conv.mode == "completion":
        text = conv.system_prompt + "\n\n" if conv.system_prompt else ""
        for i, m in enumerate(turns):
            sep = "\n" if (i and m.role == "user") else ""
            text += sep + m.content
        return {"prompt": text, "messages": None}
    msgs = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    msgs += [{"role": m.role, "content": m.content} for m in turns]
    return {"prompt": None, "messages": msgs}


def title_from(text: str, limit: int = 48) -> str:
    """A conversation title: the first line of the first message, shortened at a word."""
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else "New chat"
    if len(first) <= limit:
        return first
    return first[:limit].rsplit(" ", 1)[0] + "…"
