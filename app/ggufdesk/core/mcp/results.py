"""A tool's result as the text a model reads: text blocks kept, images and other media as a note,
errors marked, invalid Unicode replaced, and long results cut with a note saying so."""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

# A model's context is small (4096 tokens by default): a result longer than this is cut. The
# session sizes the limit to the loaded model's context (result_limit); this is the ceiling.
MAX_RESULT_CHARS = 32_000
MIN_RESULT_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class ToolResult:
    text: str
    is_error: bool = False
    media: int = 0  # images, audio and other blocks the model was only told about


def clean_text(text: str) -> str:
    """Text that is valid Unicode: lone surrogates (invalid UTF-8 that came through as escapes)
    and NUL characters become U+FFFD."""
    if not isinstance(text, str):
        text = str(text)
    fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return fixed.replace("\0", "\ufffd")


def _size(data: Any) -> str:
    try:
        n = len(base64.b64decode(data or "", validate=False))
    except (binascii.Error, ValueError):
        n = len(data or "")
    return f"{n / 1024:.0f} KB" if n >= 1024 else f"{n} bytes"


def _block(block: Any) -> tuple[str, bool]:
    """(text for the model, whether it stands for media the model cannot see)."""
    kind = getattr(block, "type", "")
    if kind == "text":
        return clean_text(getattr(block, "text", "")), False
    if kind in ("image", "audio"):
        mime = getattr(block, "mime_type", "") or kind
        return (f"[{kind} ({mime}, {_size(getattr(block, 'data', ''))}) returned by the tool: not shown, "
                "this model reads text only]"), True
    if kind == "resource_link":
        return f"[resource: {clean_text(getattr(block, 'uri', ''))}]", False
    if kind == "resource":
        res = getattr(block, "resource", None)
        text = getattr(res, "text", None)
        if isinstance(text, str):
            return clean_text(text), False
        return f"[binary resource {clean_text(str(getattr(res, 'uri', '')))}: not shown]", True
    return f"[a {clean_text(str(kind)) or 'content'} block: not shown]", True


def convert_result(raw: Any) -> ToolResult:
    """An MCP CallToolResult as text: its blocks one after another; structured content only when
    there are no blocks."""
    parts: list[str] = []
    media = 0
    for block in getattr(raw, "content", None) or []:
        text, is_media = _block(block)
        media += is_media
        parts.append(text)
    structured = getattr(raw, "structured_content", None)
    if not parts and structured is not None:
        parts.append(clean_text(json.dumps(structured, ensure_ascii=False, default=str)))
    is_error = bool(getattr(raw, "is_error", False))
    text = "\n".join(parts) if parts else "(the tool returned nothing)"
    return ToolResult(text, is_error, media)


def result_limit(n_ctx: int) -> int:
    """How many characters of a result go to the model: about half its context (~4 characters a
    token), within MIN_RESULT_CHARS..MAX_RESULT_CHARS."""
    return max(MIN_RESULT_CHARS, min(MAX_RESULT_CHARS, n_ctx * 2))


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to `limit` characters with a note saying how much was left out."""
    if len(text) <= limit:
        return text, False
    cut = text[:limit]
    return (cut + f"\n[… result truncated: {len(text):,} characters, the first {limit:,} are shown]"), True
