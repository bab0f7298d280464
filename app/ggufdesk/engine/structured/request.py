"""Structured output for one request: a JSON schema, a raw grammar or tools -> a GrammarConstraint.

The worker calls `plan(req, ...)` before prefill: it checks the request (SchemaError names what is
unsupported), tells how to render the prompt (tools through the model's own template, or
explained in a system message) and builds the grammar; after generation `finish` parses tool calls.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from ggufdesk.core import tools as T
from ggufdesk.core.schema import SchemaError, json_digest, json_object_schema
from ggufdesk.core.toolcalls import Parsed, parse
from ggufdesk.engine.structured.grammar import (GrammarConstraint, _openings, check_bounded, schema_to_gbnf,
                                                tool_grammar)


@dataclass
class Structured:
    """What a request asks for, resolved against the loaded model."""

    gbnf: str | None = None
    marker: str | None = None  # lazy grammar: free text until this
    tools: list[dict[str, Any]] = field(default_factory=list)  # rendered into the prompt
    fmt: T.ToolFormat | None = None  # how calls are written and parsed
    mode: str = "none"  # tools: none | auto | required

    def system_message(self) -> str | None:
        """Tool instructions for templates that cannot render tools themselves."""
        if self.tools and self.fmt is not None and not self.fmt.native:
            return T.system_prompt(self.tools)
        return None

    def constraint(self, vocab: Any, n_vocab: int, *, piece: Callable[[int], bytes],
                   tokenize: Callable[[str], list[int]]) -> GrammarConstraint | None:
        if self.gbnf is None:
            return None
        marker_tokens = None
        if self.marker is not None:
            toks = tokenize(self.marker)
            marker_tokens = toks if len(toks) == 1 else None
        return GrammarConstraint(
            vocab, n_vocab, self.gbnf, piece=piece, marker=self.marker, marker_tokens=marker_tokens,
            openings=_openings(self.fmt, self.tools) if self.fmt is not None and self.marker else None)

    def parse(self, text: str) -> Parsed:
        """The tool calls in an answer (core/toolcalls.py); none without tools."""
        if not self.tools or self.fmt is None:
            return Parsed(text)
        return parse(text, self.fmt, self.tools)


def prepare_messages(messages: list[dict[str, Any]], st: Structured) -> list[dict[str, Any]]:
    """Messages as the template can take them: for templates that know no tools, calls and tool
    results become text in the generic format, and the tool instructions a system message."""
    native = st.fmt is not None and st.fmt.native
    out: list[dict[str, Any]] = []
    for m in messages:
        if not native and m.get("role") == "assistant" and m.get("tool_calls"):
            calls = "".join(
                "<tool_call>\n" + T.call_text(c) + "\n</tool_call>" for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (m.get("content") or "") + calls})
        elif not native and m.get("role") == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.get('content', '')}\n</tool_response>"})
        elif native and st.fmt is not None and st.fmt.object_args and m.get("tool_calls"):
            out.append({**m, "tool_calls": [_object_args(c) for c in m["tool_calls"]]})
        else:
            out.append(m)
    extra = st.system_message()
    if extra:
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + extra}
        else:
            out.insert(0, {"role": "system", "content": extra})
    return out


def _object_args(call: dict[str, Any]) -> dict[str, Any]:
    """A call with its arguments as an object (templates that write them with `tojson` want one)."""
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return call
    return {**call, "function": {**fn, "arguments": args}}


# Plans by a digest of their inputs: an agent sends the same tools (and the worker renders them with
# the same template) on every turn; planning Claude Code's 25 tools cost 60-85 ms of the step loop's
# thread each turn (bench/queue_stall.py). A hit is copied: a request may not change another's plan.
_PLANS: collections.OrderedDict[bytes, Structured] = collections.OrderedDict()
_PLANS_MAX = 16


def plan(**fields: Any) -> Structured:
    """Resolve a request's structured-output fields (`_plan`'s arguments); SchemaError on anything
    unsupported. A plan made before for the same fields is reused."""
    key = json_digest(fields, sort_keys=False)  # (the order of properties and tools is the grammar's)
    if key is None:
        return _plan(**fields)
    hit = _PLANS.get(key)
    if hit is None:
        hit = _PLANS[key] = _plan(**fields)
        while len(_PLANS) > _PLANS_MAX:
            _PLANS.popitem(last=False)
    _PLANS.move_to_end(key)
    return dataclasses.replace(hit, tools=copy.deepcopy(hit.tools))


def _plan(*, json_schema: Any = None, grammar: str | None = None, tools: Any = None,
          tool_choice: Any = None, parallel_tool_calls: bool = False, template_source: str | None,
          chat: bool, tools_without_grammar: list[str] | None = None, reasoning: bool = False) -> Structured:
    """Resolve a request's structured-output fields; raises SchemaError on anything unsupported.
    reasoning: the model thinks first, so even a required call's grammar waits for its marker."""
    asked = [n for n, v in (("json_schema", json_schema), ("grammar", grammar), ("tools", tools))
             if v is not None]
    if len(asked) > 1:
        raise SchemaError(f"use one of json_schema, grammar and tools per request, not {' and '.join(asked)}")
    if grammar is not None:
        if not isinstance(grammar, str) or "root" not in grammar:
            raise SchemaError("a grammar must be GBNF text with a `root` rule")
        return Structured(gbnf=check_bounded(grammar))
    if json_schema is not None:
        schema = json_object_schema() if json_schema == "json_object" else json_schema
        return Structured(gbnf=check_bounded(schema_to_gbnf(schema)))
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise SchemaError("tool_choice needs tools")
        return Structured()
    if not chat:
        raise SchemaError("tools need a chat request (messages), not a plain prompt")
    loose = frozenset(tools_without_grammar or ())
    checked = T.check_tools(tools, loose)
    chosen, mode = T.pick_tools(checked, tool_choice)
    fmt = T.detect_format(template_source)
    if mode == "none":
        return Structured()
    tg = tool_grammar(T.loosen(chosen, loose), fmt, mode, parallel=parallel_tool_calls)
    lazy = tg.lazy or reasoning
    return Structured(gbnf=check_bounded(tg.gbnf), marker=tg.marker if lazy else None, tools=chosen, fmt=fmt,
                      mode=mode)
