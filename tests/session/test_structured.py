"""A conversation's structured-output setting and an answer's tool calls, through the session."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}


def test_an_answers_tool_calls_are_kept_with_it(rig):
    rid = rig.send("weather in oslo?")
    rig.session.on_event(P.Token(id=rid, text='<tool_call>{"name": "get_weather"}</tool_call>'))
    rig.session.on_event(P.Done(id=rid, finish_reason="tool_calls", tool_calls=[CALL], content=""))
    answer = rig.session.turns[-1]
    assert answer.stats["tool_calls"] == [CALL] and answer.stats["finish_reason"] == "tool_calls"
    rig.settle()
    saved = rig.history.messages(rig.session.conv.id)[-1]
    assert saved.stats["tool_calls"] == [CALL]


def test_the_setting_travels_in_the_sampling_and_is_validated():
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert SamplingSettings(structured=schema).structured == schema
    assert SamplingSettings(structured="json_object").structured == "json_object"
    tools = json.dumps([{"type": "function", "function": {"name": "f"}}])
    assert SamplingSettings(structured=tools).structured == tools
    for bad, word in [("{nope", "not valid JSON"), ('{"not": {}}', "not"),
                      ('[{"type": "function"}]', r"tools\[0\]"), ("3", "must be an object")]:
        with pytest.raises(SettingsError, match=word):
            SamplingSettings(structured=bad)
