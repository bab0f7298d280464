"""Structured output in core/: which schemas we accept, tool definitions, and parsing tool calls back."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core import toolcalls as TC
from ggufdesk.core import tools as T
from ggufdesk.core.schema import SchemaError, check_schema, load_schema
from tests.fixtures.schemas import SCHEMAS, UNSUPPORTED


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_every_test_schema_is_accepted(name, schema):
    check_schema(schema)


@pytest.mark.parametrize("schema,word", UNSUPPORTED, ids=[w for _, w in UNSUPPORTED])
def test_unsupported_features_are_refused_by_name(schema, word):
    with pytest.raises(SchemaError) as e:
        check_schema(schema)
    assert word in str(e.value)


def test_load_schema_refuses_bad_json_and_non_objects():
    with pytest.raises(SchemaError, match="not valid JSON"):
        load_schema("{nope", source="s.json")
    with pytest.raises(SchemaError, match="must be an object"):
        load_schema("[1, 2]")
    with pytest.raises(SchemaError, match="too large"):
        deep: dict = {"type": "object", "properties": {}}
        node = deep
        for _ in range(100):
            node["properties"]["a"] = {"type": "object", "properties": {}}
            node = node["properties"]["a"]
        check_schema(deep)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


def test_check_tools_normalises_and_refuses_nonsense():
    tools = T.check_tools([WEATHER, TIME])
    assert [t["function"]["name"] for t in tools] == ["get_weather", "now"]
    for bad, msg in [([], "non-empty"), ([{"type": "function"}], "tools\\[0\\]"),
                     ([{"function": {"name": "has space"}}], "name"),
                     ([WEATHER, WEATHER], "twice"),
                     ([{"function": {"name": "x", "parameters": {"not": {}}}}], "not")]:
        with pytest.raises(SchemaError, match=msg):
            T.check_tools(bad)


def test_tool_choice():
    tools = T.check_tools([WEATHER, TIME])
    assert T.pick_tools(tools, None) == (tools, "auto")
    assert T.pick_tools(tools, "none") == ([], "none")
    assert T.pick_tools(tools, "required") == (tools, "required")
    chosen, mode = T.pick_tools(tools, {"type": "function", "function": {"name": "now"}})
    assert mode == "required" and [t["function"]["name"] for t in chosen] == ["now"]
    with pytest.raises(SchemaError, match="not among"):
        T.pick_tools(tools, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(SchemaError, match="tool_choice"):
        T.pick_tools(tools, 42)


@pytest.mark.parametrize("template,fmt", [
    ("{% if tools %}<tools>{{ tools }}</tools> reply in <tool_call></tool_call>{% endif %}", "hermes"),
    ("{% if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "mistral"),
    ("{% if tools %}{{ tools }} Environment: ipython <|python_tag|>{% endif %}", "llama3"),
    ("{{ messages }}", "generic"),
    (None, "generic"),
])
def test_detect_format(template, fmt):
    assert T.detect_format(template).name == fmt


def _written(fmt: T.ToolFormat, calls: list[tuple[str, dict]]) -> str:
    """Calls as a model trained on `fmt` writes them."""
    if fmt.name in ("hermes", "generic"):
        return "Let me check.\n" + "".join(
            f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)
    if fmt.name == "mistral":
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    if fmt.name == "qwen3_coder":
        return "Let me check.\n" + "".join(
            f"<tool_call>\n<function={n}>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items())
            + "</function>\n</tool_call>" for n, a in calls)
    if fmt.name == "harmony":
        return "".join(f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>"
                       f"{json.dumps(a)}<|call|>" for n, a in calls)
    if fmt.name.startswith("deepseek"):
        one = ("function" + T.DS_SEP + "{n}\n```json\n{a}\n```" if fmt.name == "deepseek_r1"
               else "{n}" + T.DS_SEP + "{a}")
        return T.DS_CALLS + "".join(T.DS_CALL + one.format(n=n, a=json.dumps(a)) + T.DS_CALL_END
                                    for n, a in calls) + T.DS_CALLS_END
    body = [{"name": n, "parameters": a} for n, a in calls]
    return "<|python_tag|>" + json.dumps(body[0] if len(body) == 1 else body)


@pytest.mark.parametrize("fmt", list(T.FORMATS.values()), ids=list(T.FORMATS))
def test_calls_round_trip_through_each_format(fmt):
    calls = [("get_weather", {"city": "Oslo", "days": 3}), ("now", {})]
    content, parsed = TC.parse_calls(_written(fmt, calls), fmt)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in parsed)
    assert "tool_call" not in content and "TOOL_CALLS" not in content


def test_newer_mistral_syntax_and_plain_text():
    content, calls = TC.parse_calls('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', T.MISTRAL)
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"}
    for fmt in T.FORMATS.values():
        assert TC.parse_calls("Just an answer.", fmt) == ("Just an answer.", [])


def test_malformed_calls_stay_text():
    text = "<tool_call>{not json</tool_call>"
    assert TC.parse_calls(text, T.HERMES) == (text, [])
    assert TC.parse_calls('{"name": 3, "parameters": {}}', T.LLAMA3)[1] == []
    assert TC.parse_calls('{"name": "x", "parameters": {}} and more', T.LLAMA3)[1] == []


def test_call_stream_holds_back_the_marker():
    s = TC.CallStream(T.HERMES)
    shown = "".join(s.push(p) for p in ["Sure", ", checking <to", "ol_call>\n{\"name\": \"now\", ",
                                        "\"arguments\": {}}\n</tool_call>"])
    assert shown == "Sure, checking"  # the space before a call waits: the content ends before it
    parsed = TC.parse(s.text, T.HERMES)
    assert s.finish(parsed.content) == "" and parsed.calls[0]["function"]["name"] == "now"
    plain = TC.CallStream(T.HERMES)
    shown = "".join(plain.push(p) for p in ["a <b", " c"]) + plain.finish()
    assert shown == "a <b c"


def test_call_text_is_what_models_write():
    call = {"function": {"name": "now", "arguments": "{\"tz\": \"UTC\"}"}}
    assert json.loads(T.call_text(call)) == {"name": "now", "arguments": {"tz": "UTC"}}
