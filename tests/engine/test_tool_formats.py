"""Each tool-call format's lazy grammar, through the real engine on scripted models that get the call
wrong (a misspelt name, a missing or mistyped argument): once the call starts, the grammar makes it a
valid call to a real tool; before it, text is free."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core.settings import LoadSettings
from tests.engine.helpers import collect
from tests.fixtures.scripted import write_scripted

LOAD = LoadSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]
WRONG = {
    "qwen3": '<tool_call>\n{"name": "get_wether", "arguments": {"city": "Pariss"}}\n</tool_call>',
    "hermes": 'Let me look.\n<tool_call>\n{"name": "get_wether", "arguments": {"town": "Paris"}}\n</tool_call>',
    "qwen3-coder": "<tool_call>\n<function=get_wether>\n<parameter=town>\nParis\n</parameter>\n</function>\n</tool_call>",
    "gpt-oss": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"town": 1}<|call|>',
    "deepseek-v3": ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_wether<｜tool▁sep｜>{"city": 3}<｜tool▁call▁end｜>'
                    "<｜tool▁calls▁end｜>"),
    "deepseek-r1": ('ok\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_wether\n```json\n'
                    '{"city": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    "mistral": '[TOOL_CALLS][{"name": "get_wether", "arguments": {"city": 3}}]',
    "llama3": '{"name": "get_wether", "parameters": {"city": 3}}',
}



@pytest.mark.parametrize("family", sorted(WRONG))
def test_the_grammar_makes_a_wrong_call_valid(client, tmp_path, family):
    client.load(str(write_scripted(tmp_path / f"{family}.gguf", family, WRONG[family])), settings=LOAD)
    r = collect(client, client.generate(messages=[{"role": "user", "content": "Weather?"}],
                                        sampling={"temperature": 0.0, "max_tokens": 150}, tools=TOOLS))
    assert r.error is None and r.done.finish_reason == "tool_calls", r.done and r.done.text
    (call,) = r.done.tool_calls
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")


def test_text_before_the_call_is_free_and_kept(client, tmp_path):
    client.load(str(write_scripted(tmp_path / "h.gguf", "hermes", WRONG["hermes"])), settings=LOAD)
    r = collect(client, client.generate(messages=[{"role": "user", "content": "Weather?"}],
                                        sampling={"temperature": 0.0, "max_tokens": 150}, tools=TOOLS))
    assert r.done.content == "Let me look." and r.text.startswith("Let me look.\n<tool_call>")
