"""Scripted models through `ggufdesk serve`: reasoning and tool calls in every format come back the
same streamed and not, through the OpenAI and Anthropic APIs (and issue 34 finding 8: with tools
present and no call parsed, the stream keeps the call's text)."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures.scripted import write_scripted
from tests.server.serving import ServeProcess

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_JSON = '{"name": "get_weather", "arguments": {"city": "Paris"}}'

# (family, script, request extras, what the non-streamed message must hold)
CASES = {
    "qwen3-answer": ("qwen3", "<think>\nA greeting. Answer kindly.\n</think>\n\nHello! Nice to meet you.", {},
                     {"reasoning": "A greeting. Answer kindly.", "content": "Hello! Nice to meet you."}),
    "qwen3-budget": ("qwen3", "<think>\nA greeting. Answer kindly.\n</think>\n\nHello! Nice to meet you.",
                     {"reasoning_budget": 2}, {"reasoning": "A greeting.", "content": "Hello! Nice to meet you."}),
    "qwen3-call": ("qwen3", f"<think>\nNeed the weather tool.\n</think>\n\n<tool_call>\n{CALL_JSON}\n</tool_call>",
                   {"tools": TOOLS}, {"reasoning": "Need the weather tool.", "calls": [("get_weather", {"city": "Paris"})]}),
    "qwen3-none": ("qwen3", f"I will call it anyway.\n<tool_call>\n{CALL_JSON}\n</tool_call>",
                   {"tools": TOOLS, "tool_choice": "none"},
                   {"content": f"I will call it anyway.\n<tool_call>\n{CALL_JSON}\n</tool_call>"}),
    "qwen3-cut": ("qwen3", f"Checking.\n<tool_call>\n{CALL_JSON}\n</tool_call>", {"tools": TOOLS, "max_tokens": 5},
                  {"finish": "length"}),
    "coder": ("qwen3-coder", "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
              "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", {"tools": TOOLS},
              {"content": "Checking.", "calls": [("get_weather", {"city": "Paris", "days": 3})]}),
    "harmony": ("gpt-oss", "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>', {"tools": TOOLS},
                {"reasoning": "Need weather.", "calls": [("get_weather", {"city": "Paris"})]}),
    "harmony-answer": ("gpt-oss", "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final"
                       "<|message|>It is sunny.", {}, {"reasoning": "Simple.", "content": "It is sunny."}),
    "r1": ("deepseek-r1", "Need weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
           'get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', {"tools": TOOLS},
           {"reasoning": "Need weather.", "calls": [("get_weather", {"city": "Paris"})]}),
    "v3": ("deepseek-v3", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
           "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", {"tools": TOOLS}, {"calls": [("get_weather", {"city": "Paris"})]}),
    "llama3": ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', {"tools": TOOLS},
               {"calls": [("get_weather", {"city": "Paris"})]}),
    "mistral": ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', {"tools": TOOLS},
                {"calls": [("get_weather", {"city": "Paris"})]}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    family, script, extra, want = CASES[request.param]
    path = write_scripted(tmp_path_factory.mktemp("m") / f"{family}.gguf", family, script)
    server = ServeProcess(path, "--ctx", "2048", "--temperature", "0", home=tmp_path_factory.mktemp("home"))
    yield server, path.stem, extra, want
    server.stop()


def _sse(r: httpx.Response) -> list[dict]:
    out = []
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def _openai(url: str, model: str, extra: dict, stream: bool) -> dict:
    body = {"model": model, "messages": USER, "max_tokens": 200, **extra, "stream": stream}
    with httpx.Client(timeout=120) as c:
        if not stream:
            r = c.post(url + "/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            ch = r.json()["choices"][0]
            m = ch["message"]
            return {"content": m.get("content") or "", "reasoning": m.get("reasoning_content") or "",
                    "calls": [(t["function"]["name"], json.loads(t["function"]["arguments"]))
                              for t in m.get("tool_calls") or []], "finish": ch["finish_reason"]}
        with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            chunks = _sse(r)
    got = {"content": "", "reasoning": "", "calls": [], "finish": None}
    for ch in chunks:
        for choice in ch["choices"]:
            d = choice["delta"]
            got["content"] += d.get("content") or ""
            got["reasoning"] += d.get("reasoning_content") or ""
            got["calls"] += [(t["function"]["name"], json.loads(t["function"]["arguments"]))
                             for t in d.get("tool_calls") or []]
            got["finish"] = choice["finish_reason"] or got["finish"]
    return got


def _anthropic(url: str, model: str, extra: dict, stream: bool) -> dict:
    body = {"model": model, "messages": USER, "max_tokens": extra.get("max_tokens", 200), "stream": stream}
    if "reasoning_budget" in extra:
        body["thinking"] = {"type": "enabled", "budget_tokens": extra["reasoning_budget"]}
    if "tools" in extra:
        body["tools"] = ANTHROPIC_TOOLS
        if extra.get("tool_choice") == "none":
            body["tool_choice"] = {"type": "none"}
    with httpx.Client(timeout=120) as c:
        if not stream:
            r = c.post(url + "/v1/messages", json=body)
            assert r.status_code == 200, r.text
            blocks, stop = r.json()["content"], r.json()["stop_reason"]
        else:
            with c.stream("POST", url + "/v1/messages", json=body) as r:
                events = _sse(r)
            blocks, stop = [], None
            for ev in events:
                if ev["type"] == "content_block_start":
                    blocks.append(dict(ev["content_block"]))
                elif ev["type"] == "content_block_delta":
                    d, b = ev["delta"], blocks[ev["index"]]
                    if d["type"] == "text_delta":
                        b["text"] += d["text"]
                    elif d["type"] == "thinking_delta":
                        b["thinking"] += d["thinking"]
                    elif d["type"] == "input_json_delta":
                        b["input"] = json.loads(d["partial_json"])
                elif ev["type"] == "message_delta":
                    stop = ev["delta"]["stop_reason"]
    return {"content": "".join(b["text"] for b in blocks if b["type"] == "text"),
            "reasoning": "".join(b["thinking"] for b in blocks if b["type"] == "thinking"),
            "calls": [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"], "finish": stop}


def test_openai_streamed_equals_whole(case):
    server, model, extra, want = case
    whole = _openai(server.url, model, extra, stream=False)
    assert _openai(server.url, model, extra, stream=True) == whole
    for key, value in want.items():
        assert whole[key] == value, key


def test_anthropic_streamed_equals_whole(case):
    server, model, extra, want = case
    whole = _anthropic(server.url, model, extra, stream=False)
    assert _anthropic(server.url, model, extra, stream=True) == whole
    for key in ("reasoning", "content", "calls"):
        if key in want:
            assert whole[key] == want[key], key
