"""Structured output and tool calls at the API edge: OpenAI/Anthropic fields to the engine's, calls back out."""
from __future__ import annotations

import json
from typing import Any

from ggufdesk.core import tools as T
from ggufdesk.core.schema import MAX_TOOL_VALUES, SchemaError, check_schema, check_size
from ggufdesk.server.errors import invalid


def response_format(rf: dict[str, Any] | None) -> dict[str, Any] | str | None:
    """OpenAI's response_format as Generate.json_schema (None, "json_object" or a schema)."""
    if rf is None or rf.get("type") in (None, "text"):
        return None
    if rf.get("type") == "json_object":
        return "json_object"
    if rf.get("type") == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise invalid("response_format.json_schema.schema must be a JSON schema object",
                          param="response_format")
        try:
            check_schema(schema)
        except SchemaError as e:
            raise invalid(f"response_format: {e}", param="response_format", code="invalid_schema") from None
        return schema
    raise invalid(f"response_format type {rf.get('type')!r} is not one of text, json_object, json_schema",
                  param="response_format")


def openai_tools(tools: list[Any] | None, choice: Any, parallel: bool | None) -> dict[str, Any]:
    """Generate's tool fields for OpenAI tools/tool_choice/parallel_tool_calls (checked here: 400s)."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise invalid("tool_choice needs tools", param="tool_choice")
        return {}
    try:
        # all tools together first: each tool's own limit would let 128 of them cost 128 times as much
        check_size(tools, what="the tool list", max_values=MAX_TOOL_VALUES)
        checked = T.check_tools(tools)
        T.pick_tools(checked, choice)
    except SchemaError as e:
        raise invalid(str(e), param="tools", code="invalid_tools") from None
    return {"tools": checked, "tool_choice": choice, "parallel_tool_calls": bool(parallel)}


def anthropic_tools(tools: list[Any] | None, choice: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic tools (input_schema) and tool_choice {auto, any, tool, none} as Generate's fields."""
    if not tools:
        return {}
    converted = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or "name" not in t:
            raise invalid(f"tools[{i}] must be {{\"name\", \"description\", \"input_schema\"}}", param="tools")
        fn = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        converted.append({"type": "function", "function": fn})
    choice = choice or {"type": "auto"}
    kind = str(choice.get("type"))
    mapped: Any = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        mapped = {"type": "function", "function": {"name": choice.get("name")}}
    if mapped is None:
        raise invalid("tool_choice.type must be auto, any, tool or none", param="tool_choice")
    out = openai_tools(converted, mapped, not choice.get("disable_parallel_tool_use", False))
    return out


def anthropic_tool_use(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": fn["name"],
            "input": args}
