"""What the engine gets for the next answer, and a conversation's title from its first message."""
from __future__ import annotations

import base64
import re
from typing import Any, Callable, Protocol, Sequence

from ggufdesk.core.history import Conversation
from ggufdesk.core.image_store import images_of
from ggufdesk.engine.link import protocol as P


class _Said(Protocol):
    @property
    def role(self) -> str: ...
    @property
    def content(self) -> str: ...
    @property
    def stats(self) -> dict[str, Any]: ...


ImageSource = Callable[[str], "bytes | None"]  # an image's bytes by sha256 (None: missing)
NOT_SHOWN = "[an image the model cannot see: it reads text only]"
MISSING = "[an image that is no longer in the history]"


def _chat_message(m: _Said, images: _Images | None = None) -> dict[str, Any] | None:
    """One turn as a chat message: an answer that called tools carries its calls, a tool result
    the call's id and name (OpenAI's shape, which the chat templates read), a user's images parts."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": str(m.stats.get("call_id", "")),
                "name": str(m.stats.get("name", "")), "content": m.content}
    calls = m.stats.get("tool_calls") if m.role == "assistant" else None
    if calls:
        return {"role": "assistant", "content": m.content, "tool_calls": calls}
    keys = images_of(m.stats) if m.role == "user" else []
    if keys and images is not None:
        parts = [images.part(k) for k in keys]
        return {"role": "user", "content": parts + ([{"type": "text", "text": m.content}] if m.content else [])}
    if m.role in ("user", "assistant") and m.content:
        return {"role": m.role, "content": m.content}
    return None


class _Images:
    """The images of one request: parts for the messages and the files (base64) the engine needs."""

    def __init__(self, source: ImageSource | None, vision: bool) -> None:
        self.source, self.vision = source, vision
        self.files: dict[str, str] = {}

    def part(self, key: str) -> dict[str, Any]:
        if not self.vision:
            return {"type": "text", "text": NOT_SHOWN}
        if key not in self.files:
            data = self.source(key) if self.source is not None else None
            if data is None:
                return {"type": "text", "text": MISSING}
            self.files[key] = base64.b64encode(data).decode("ascii")
        return {"type": "image", "image": key}


def build_request(conv: Conversation, messages: Sequence[_Said], *, images: ImageSource | None = None,
                  vision: bool = False) -> dict[str, Any]:
    """Chat messages, or one prompt in completion mode (empty and system turns are left out, and
    tool calls and results too in completion mode). A user's images (stats["images"]) become image
    parts with their files under "images" when the model can see (vision), else a note in the text."""
    if conv.mode == "completion":
        turns = [m for m in messages if m.role in ("user", "assistant") and m.content]
        text = conv.system_prompt + "\n\n" if conv.system_prompt else ""
        for i, m in enumerate(turns):
            sep = "\n" if (i and m.role == "user") else ""
            text += sep + m.content
        return {"prompt": text, "messages": None}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
    pics = _Images(images, vision)
    msgs += [msg for msg in (_chat_message(m, pics) for m in messages) if msg is not None]
    return {"prompt": None, "messages": msgs, **({"images": pics.files} if pics.files else {})}


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
