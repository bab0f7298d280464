"""Structured output and tool calls through both SDKs on the tiny model (the grammar makes them valid)."""
from __future__ import annotations

import json

import anthropic
import openai
import pytest

MODEL = "tiny-target"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, "required": ["color"],
         "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "wx", "description": "weather now",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
                   "additionalProperties": False}}}


@pytest.fixture(scope="module")
def oa(served):
    with openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def an(served):
    with anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0, timeout=120) as c:
        yield c


def test_json_schema_response_format(oa):
    r = oa.chat.completions.create(model=MODEL, messages=USER, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "c", "schema": COLOR, "strict": True}})
    assert json.loads(r.choices[0].message.content)["color"] in ("red", "blue")


def test_json_object_response_format(oa):
    r = oa.chat.completions.create(model=MODEL, messages=USER, max_tokens=24,
                                   response_format={"type": "json_object"})
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":  # a cut answer cannot be whole JSON
        assert isinstance(json.loads(text), dict)
    else:
        assert text.lstrip().startswith("{")


def test_required_tool_call(oa):
    r = oa.chat.completions.create(model=MODEL, messages=USER, max_tokens=200, tools=[WEATHER],
                                   tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "wx" and call.id
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")


def test_named_tool_call_streamed(oa):
    chunks = list(oa.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=200, tools=[WEATHER], stream=True,
        tool_choice={"type": "function", "function": {"name": "wx"}}))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "wx"
    assert json.loads(deltas[0].function.arguments)["city"] in ("Paris", "Rome")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_conversation_with_a_tool_result_goes_on(oa):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "wx", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    r = oa.chat.completions.create(model=MODEL, messages=history, max_tokens=4, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None


def test_bad_tools_and_schemas_are_400(oa):
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, tools=[{"type": "function",
                                   "function": {"name": "bad name!"}}])
    assert e.value.param == "tools"
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model=MODEL, messages=USER, max_tokens=4, tools=[WEATHER],
                                   tool_choice={"type": "function", "function": {"name": "other"}})
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model=MODEL, messages=USER, max_tokens=4,
                                   response_format={"type": "json_schema", "json_schema": {"name": "x"}})


def test_anthropic_tool_use_streamed_then_its_result(an):
    tool = {"name": "wx", "description": "weather now", "input_schema": WEATHER["function"]["parameters"]}
    with an.messages.stream(model=MODEL, max_tokens=200, messages=USER, tools=[tool],
                            tool_choice={"type": "any"}) as s:
        m = s.get_final_message()
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"][0]
    assert use.name == "wx" and use.input["city"] in ("Paris", "Rome") and use.id.startswith("toolu_")
    followup = USER + [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                          "input": use.input}]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                     "content": "sunny"}]}]
    m2 = an.messages.create(model=MODEL, max_tokens=3, messages=followup)
    assert m2.stop_reason == "max_tokens"
