"""Reading tool calls back out of a model's answer, in each format of core/tools.py, whole or as it streams.

`parse(text, fmt)` finds every call; a call that starts but cannot be read (broken JSON or XML, a
call cut by max_tokens) stays in the text and adds a warning, so nothing is lost. The content is the
text outside the calls: the text before the first call without its trailing spaces, then each
later piece trimmed, one per line. `CallStream` shows text as it comes and holds back anything that
may open a call; at the end the engine's parse says what the rest of the content is, so a streamed
answer always adds up to the one returned whole.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ggufdesk.core.tools import DS_CALL, DS_CALL_END, DS_CALLS, DS_CALLS_END, DS_SEP, ToolFormat, xml_raw

Span = tuple[int, int, "dict[str, Any] | None"]  # start, end, the call (None: it could not be read)


@dataclass
class Parsed:
    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def make_call(name: Any, args: Any) -> dict[str, Any] | None:
    """An OpenAI-style call, or None when the name or the arguments are not what a call needs."""
    if not isinstance(name, str) or not name.strip():
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": name.strip(), "arguments": json.dumps(args, ensure_ascii=False)}}


def _from_obj(obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    return make_call(obj.get("name"), args)


def _json_prefix(text: str, start: int = 0) -> tuple[Any, int]:
    """The JSON value at text[start:] (after spaces): (value, end), or (None, 0) if there is none."""
    s = start + len(text[start:]) - len(text[start:].lstrip())
    try:
        return json.JSONDecoder().raw_decode(text, s)
    except (ValueError, RecursionError):
        return None, 0


# ---- one reader per format: the spans of text that are calls ------------------------------------


def _xml_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A Qwen3-Coder parameter's value: raw text where its schema makes it so (core/tools.py xml_raw),
    else JSON (as the grammar writes it); a parameter its tool does not name: JSON unless that reads
    as a bare string."""
    value = raw.removeprefix("\n").removesuffix("\n")
    if schema and xml_raw(schema):
        return value
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return value
    return parsed if schema or not isinstance(parsed, str) else value


def _xml_call(body: str, schemas: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """<function=NAME><parameter=KEY>VALUE</parameter>...</function> (Qwen3-Coder)."""
    m = re.match(r"\s*<function=([^>\n]+)>(.*?)</function>\s*$", body, re.S)
    if m is None:
        return None
    name, inner = m.group(1).strip(), m.group(2)
    props = (schemas.get(name) or {}).get("properties") or {}
    args: dict[str, Any] = {}
    pos = 0
    for p in re.finditer(r"<parameter=([^>\n]*)>(.*?)</parameter>", inner, re.S):  # (a key may be "")
        if inner[pos:p.start()].strip():
            return None
        key = p.group(1).strip()
        args[key] = _xml_value(p.group(2), props.get(key))
        pos = p.end()
    return make_call(name, args) if not inner[pos:].strip() else None


def _tagged(text: str, schemas: dict[str, dict[str, Any]]) -> Iterator[Span]:
    """<tool_call>...</tool_call> holding JSON (hermes) or XML (qwen3_coder); a call cut off before
    its JSON or its </function> ends counts as one that could not be read."""
    for m in re.finditer(r"<tool_call>(.*?)(</tool_call>|$)", text, re.S):
        body = m.group(1)
        if body.lstrip().startswith("<function="):
            call = _xml_call(body, schemas) if m.group(2) else None
        else:
            value, end = _json_prefix(body)
            call = _from_obj(value) if end and not body[end:].strip() else None
        yield m.start(), m.end(), call


_HARMONY = re.compile(
    r"(?:<\|start\|>assistant)?\s*(?:<\|channel\|>[a-z]*\s*)?to=functions\.([^\s<]+)[^<]*"
    r"(?:(?:<\|channel\|>|<\|constrain\|>)[^<]*)*<\|message\|>(.*?)(<\|call\|>|<\|end\|>|(?=<\|start\|>)|$)", re.S)


def _harmony(text: str) -> Iterator[Span]:
    for m in _HARMONY.finditer(text):
        body = m.group(2)
        value, end = _json_prefix(body)
        yield m.start(), m.end(), (make_call(m.group(1), value)
                                   if end and not body[end:].strip() and isinstance(value, dict) else None)


def _deepseek(text: str) -> Iterator[Span]:
    """<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜> (R1) or
    <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1), inside <｜tool▁calls▁begin｜>...;
    the whole block is one span, each call in it is read."""
    i = text.find(DS_CALLS)
    if i < 0:
        i = text.find(DS_CALL)
        if i < 0:
            return
    end_block = text.find(DS_CALLS_END, i)
    end = len(text) if end_block < 0 else end_block + len(DS_CALLS_END)
    block = text[i:end]
    parts = re.findall(re.escape(DS_CALL) + r"(.*?)" + re.escape(DS_SEP) + r"(.*?)(" + re.escape(DS_CALL_END)
                       + r"|$)", block, re.S)
    calls = [_deepseek_call(kind, body) if closed else None for kind, body, closed in parts]
    if not calls or any(c is None for c in calls):
        yield i, end, None
        return
    for n, call in enumerate(calls):  # one span per call; the first one covers the block
        yield (i, end, call) if n == 0 else (end, end, call)


def _deepseek_call(kind: str, body: str) -> dict[str, Any] | None:
    if kind.strip() == "function":
        m = re.match(r"\s*([^\n]+)\n```(?:json)?\s*(.*?)\s*```\s*$", body, re.S)
        return make_call(m.group(1), m.group(2)) if m else None
    value, end = _json_prefix(body)
    return make_call(kind, value) if end and not body[end:].strip() and isinstance(value, dict) else None


def _mistral(text: str) -> Iterator[Span]:
    i = text.find("[TOOL_CALLS]")
    if i < 0:
        return
    start = i + len("[TOOL_CALLS]")
    value, end = _json_prefix(text, start)
    if end and isinstance(value, (dict, list)):
        items = value if isinstance(value, list) else [value]
        calls = [_from_obj(v) for v in items]
        ok = bool(calls) and all(calls) and not text[end:].strip()
        yield from _block(i, end if ok else len(text), calls if ok else [None])
        return
    # newer: [TOOL_CALLS]name[ARGS]{...}, each further call after another [TOOL_CALLS] or none
    found = list(re.finditer(r"\s*(?:\[TOOL_CALLS\])?\s*([A-Za-z0-9_.-]+)\[ARGS\]", text[start:]))
    calls, pos = [], start
    for m in found:
        if m.start() + start != pos:
            calls = [None]
            break
        args, pos = _json_prefix(text, start + m.end())
        calls.append(make_call(m.group(1), args) if pos else None)
        if not pos:
            break
    ok = bool(calls) and all(calls) and not text[pos:].strip()
    yield from _block(i, len(text), calls if ok else [None])


def _block(start: int, end: int, calls: list[dict[str, Any] | None]) -> Iterator[Span]:
    for n, call in enumerate(calls):
        yield (start, end, call) if n == 0 else (end, end, call)


def _llama3(text: str) -> Iterator[Span]:
    """The whole answer is one JSON call (or a list of them), maybe after <|python_tag|>."""
    lead = len(text) - len(text.lstrip())
    body = text[lead:]
    if not body.startswith(("{", "[", "<|python_tag|>")):
        return
    off = lead + (len("<|python_tag|>") if body.startswith("<|python_tag|>") else 0)
    value, end = _json_prefix(text, off)
    rest = text[end:].strip().strip(";") if end else ""
    items = value if isinstance(value, list) else [value]
    calls = [_from_obj(v) for v in items] if end and not rest else []
    if calls and all(calls):
        yield from _block(lead, len(text), calls)
    elif body.startswith("<|python_tag|>") or (end and isinstance(value, dict) and "name" in value):
        yield lead, len(text), None


def _readers(fmt: ToolFormat, schemas: dict[str, dict[str, Any]]) -> Callable[[str], Iterator[Span]]:
    if fmt.name in ("hermes", "generic", "qwen3_coder"):
        return lambda text: _tagged(text, schemas)
    return {"harmony": _harmony, "deepseek_r1": _deepseek, "deepseek_v3": _deepseek, "mistral": _mistral,
            "llama3": _llama3}[fmt.name]


# ---- the whole answer ------------------------------------------------------------------------------


def parse(text: str, fmt: ToolFormat, tools: list[dict[str, Any]] | None = None) -> Parsed:
    """The calls in `text` and the content around them; calls that cannot be read stay text, with a warning.

    tools: the request's tools (their parameter schemas type the values of XML calls)."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or []}
    spans = list(_readers(fmt, schemas)(text))
    calls = [c for _, _, c in spans if c is not None]
    broken = sum(1 for _, _, c in spans if c is None)
    warnings = [f"{broken} tool call(s) in the {fmt.name} format could not be read (cut off, or broken "
                "JSON/XML); returned as text"] if broken else []
    if not calls:
        return Parsed(text, [], warnings)
    pieces, pos = [], 0
    for start, end, call in spans:
        if call is None:
            continue
        pieces.append(text[pos:start])
        pos = max(pos, end)
    pieces.append(text[pos:])
    return Parsed(join_content(pieces), calls, warnings)


def join_content(pieces: list[str]) -> str:
    """The text around calls: the first piece without its trailing spaces, then each later one trimmed."""
    later = [p.strip() for p in pieces[1:] if p.strip()]
    return "\n".join([pieces[0].rstrip()] + later) if pieces[0].strip() else "\n".join(later)


def parse_calls(text: str, fmt: ToolFormat) -> tuple[str, list[dict[str, Any]]]:
    """(content, calls) of `parse`."""
    p = parse(text, fmt)
    return p.content, p.calls


# ---- streaming -------------------------------------------------------------------------------------


class CallStream:
    """Streams text while holding back anything that may open a tool call (and the spaces before it).

    push(text) -> text that is safe to show now. finish(content) -> the rest: `content` is what the
    answer returned whole says (the engine's parse, or all of the text when no call was parsed), so
    what was shown plus the rest is always exactly that.
    """

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self.shown = ""
        self.in_call = False

    def push(self, piece: str) -> str:
        self.text += piece
        if self.in_call:
            return ""
        i = self._call_start()
        if i >= 0:
            self.in_call = True
            return self._show(self.text[:i].rstrip())
        end = len(self.text) - self._partial_marker()
        safe = self.text[:end]
        if self.fmt.name == "llama3" and not safe.strip():
            return ""
        return self._show(safe.rstrip())

    def _show(self, upto: str) -> str:
        if len(upto) <= len(self.shown):
            return ""
        out, self.shown = upto[len(self.shown):], upto
        return out

    def _call_start(self) -> int:
        if self.fmt.name == "llama3":
            body = self.text.lstrip()
            return len(self.text) - len(body) if body.startswith(("{", "[", "<|python_tag|>")) else -1
        hits = [i for m in self.fmt.openers if (i := self.text.find(m)) >= 0]
        return min(hits) if hits else -1

    def _partial_marker(self) -> int:
        """How long a tail of the text could still grow into a call's opening."""
        best = 0
        for m in self.fmt.openers:
            for n in range(min(len(m) - 1, len(self.text)), best, -1):
                if self.text.endswith(m[:n]):
                    best = n
                    break
        return best

    def finish(self, content: str | None = None) -> str:
        """The text not yet shown of `content` (None: all of the text, no call was parsed)."""
        final = self.text if content is None else content
        if final.startswith(self.shown):
            return final[len(self.shown):]
        n = 0  # cannot happen with the engine's own parse; never show a character twice
        while n < min(len(final), len(self.shown)) and final[n] == self.shown[n]:
            n += 1
        return final[n:]
