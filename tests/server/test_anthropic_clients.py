"""Anthropic Messages as clients send them today: Claude Code's real requests, system turns, thinking, count_tokens."""
from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import pytest

MODEL = "tiny-target"
USER = [{"role": "user", "content": "hello cat"}]
CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


def recorded(name: str) -> dict:
    return json.loads((CLIENTS / name).read_text())


def events(r: httpx.Response) -> list[tuple[str, dict]]:
    out, name = [], ""
    for line in r.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
    return out


@pytest.mark.parametrize("name", ["claude_code_2.1.197_title.json", "claude_code_2.1.197_main.json"])
def test_claude_codes_recorded_requests_get_a_well_formed_stream(agent_fake_server, name):
    body = recorded(name)
    body["max_tokens"] = 8  # as sent (32000) but a short answer
    with httpx.stream("POST", agent_fake_server.url + "/v1/messages?beta=true", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        seq = events(r)
    names = [n for n, _ in seq]
    assert names[:3] == ["message_start", "content_block_start", "ping"] and names[-1] == "message_stop"
    start, delta = seq[0][1], next(d for n, d in seq if n == "message_delta")
    assert start["message"]["usage"]["input_tokens"] == delta["usage"]["input_tokens"] > 100
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    count = httpx.post(agent_fake_server.url + "/v1/messages/count_tokens?beta=true", timeout=60, json={
        k: body[k] for k in ("model", "messages", "system", "tools") if k in body})
    assert count.status_code == 200 and count.json()["input_tokens"] > 100


def test_claude_code_without_streaming_too(agent_fake_server):
    body = {**recorded("claude_code_2.1.197_main.json"), "stream": False, "max_tokens": 8}
    r = httpx.post(agent_fake_server.url + "/v1/messages?beta=true", json=body, timeout=60)
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["type"] == "message" and m["content"][0]["type"] == "text" and m["stop_reason"] in ("end_turn", "max_tokens")


def test_an_internal_stop_string_never_leaks(fake_server):
    a = anthropic.Anthropic(base_url=fake_server.url, api_key="x", max_retries=0)
    m = a.messages.create(model="fake-model", max_tokens=50, messages=[{"role": "user", "content": "__stopstr__"}])
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    m = a.messages.create(model="fake-model", max_tokens=50, stop_sequences=["\nUser:"],
                          messages=[{"role": "user", "content": "__stopstr__"}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "\nUser:"
    with a.messages.stream(model="fake-model", max_tokens=50,
                           messages=[{"role": "user", "content": "__stopstr__"}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "end_turn" and final.stop_sequence is None


def test_system_turns_anywhere_count_as_the_system_prompt(served):
    def count(body: dict) -> int:
        r = httpx.post(served.url + "/v1/messages/count_tokens", json={"model": MODEL, **body}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    as_field = count({"system": "be brief\n\nuse words", "messages": USER})
    as_turns = count({"system": [{"type": "text", "text": "be brief"}],
                      "messages": [*USER, {"role": "system", "content": [{"type": "text", "text": "use words"}]}]})
    assert as_field == as_turns > count({"messages": USER})


def test_fields_claude_code_sends_are_accepted(served):
    body = {"model": "claude-sonnet-4-5", "max_tokens": 4, "messages": USER, "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"}, "metadata": {"user_id": "u"}, "some_future_field": {"x": [1]},
            "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]}
    r = httpx.post(served.url + "/v1/messages?beta=true", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == MODEL and r.json()["stop_reason"] == "max_tokens"
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        assert httpx.post(served.url + "/v1/messages", json={**body, "thinking": thinking}, timeout=60).status_code == 200


def test_output_config_format_gives_json(served):
    schema = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
              "additionalProperties": False}
    r = httpx.post(served.url + "/v1/messages", timeout=120, json={
        "model": MODEL, "max_tokens": 60, "messages": USER,
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert r.status_code == 200, r.text
    m = r.json()
    if m["stop_reason"] == "end_turn":
        assert set(json.loads(m["content"][0]["text"])) == {"title"}
    else:
        assert m["content"][0]["text"].startswith('{')


def test_input_tokens_agree_between_start_delta_and_count(served):
    body = {"model": MODEL, "max_tokens": 3, "messages": USER, "system": "be brief"}
    plain = httpx.post(served.url + "/v1/messages", json=body, timeout=60).json()
    with httpx.stream("POST", served.url + "/v1/messages", json={**body, "stream": True}, timeout=60) as r:
        seq = events(r)  # the prompt is in the KV cache now: only its last token is prefilled
    def whole(u):  # Anthropic's input_tokens leave out what a cache held: the two add up to the prompt
        return u["input_tokens"] + u["cache_read_input_tokens"]

    start = whole(seq[0][1]["message"]["usage"])
    delta_usage = next(d for n, d in seq if n == "message_delta")["usage"]
    count = httpx.post(served.url + "/v1/messages/count_tokens",
                       json={k: body[k] for k in ("model", "messages", "system")}).json()["input_tokens"]
    assert start == whole(delta_usage) == whole(plain["usage"]) == count
    assert delta_usage["cache_read_input_tokens"] > 0  # the second request read its prompt from the KV cache


def test_an_assistant_turn_at_the_end_is_continued(served):
    msgs = [*USER, {"role": "assistant", "content": "the dog"}]
    a = httpx.post(served.url + "/v1/messages", json={"model": MODEL, "max_tokens": 3, "messages": msgs}).json()
    c = httpx.post(served.url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": msgs}).json()
    fresh = httpx.post(served.url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": USER}).json()
    whole = a["usage"]["input_tokens"] + a["usage"]["cache_read_input_tokens"]  # (cache reads apart, as Anthropic)
    assert a["content"][0]["type"] == "text" and whole == c["input_tokens"]
    assert c["input_tokens"] > fresh["input_tokens"]  # the prompt ends inside "the dog", no new turn


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
    {"messages": [{"role": "robot", "content": "hi"}]}, {"messages": "hi"}, {"messages": []},
    {"messages": USER, "output_config": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}},
    {"messages": USER, "output_config": {"format": "json"}},
    {"messages": USER, "system": 5}, {"messages": USER, "tools": [{"description": "no name"}]},
    {"messages": USER, "tools": [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(500)]},
])
def test_hostile_bodies_are_400_in_anthropics_shape(served, body):
    paths = ["/v1/messages"] + (["/v1/messages/count_tokens"] if "output_config" not in body else [])
    for path in paths:  # (count_tokens takes no output_config: it does not change the prompt)
        r = httpx.post(served.url + path, json={"model": MODEL, "max_tokens": 4, **body}, timeout=60)
        assert r.status_code in (400, 413), (path, r.text[:300])
        assert r.json()["type"] == "error"
    assert httpx.get(served.url + "/health").status_code == 200


def test_a_huge_array_of_blocks_is_counted_but_does_not_fit(served):
    body = {"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 100_000}]}
    r = httpx.post(served.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    assert httpx.post(served.url + "/v1/messages/count_tokens", json=body, timeout=60).json()["input_tokens"] > 100_000
