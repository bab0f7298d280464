"""The real `anthropic` SDK (and the raw event sequence) against a live `ggufdesk serve`."""
from __future__ import annotations

import json

import anthropic
import httpx
import pytest

MODEL = "tiny-target"
USER = [{"role": "user", "content": "hello cat"}]


@pytest.fixture(scope="module")
def client(served):
    with anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_message_with_usage(client):
    m = client.messages.create(model=MODEL, max_tokens=5, messages=USER, system="be brief")
    assert m.type == "message" and m.role == "assistant" and m.stop_reason == "max_tokens"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.usage.output_tokens == 5 and m.usage.input_tokens > 0


def test_streamed_message_matches_and_reports_usage(client):
    # the tiny random model's greedy text sits on near-ties that a prompt read fresh and one read from the
    # cache can resolve differently (see test_openai_api's stream test): the compared requests both find
    # the first one's prompt cached
    client.messages.create(model=MODEL, max_tokens=6, messages=USER)
    plain = client.messages.create(model=MODEL, max_tokens=6, messages=USER)
    with client.messages.stream(model=MODEL, max_tokens=6, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == plain.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6
    # Anthropic's input_tokens leave out what was read from a cache (they add up to the prompt)
    prompt = plain.usage.input_tokens + plain.usage.cache_read_input_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == prompt
    assert final.usage.cache_read_input_tokens >= prompt - 1  # the same prompt again: all but its last token


def test_stream_follows_anthropics_event_sequence(served):
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": USER}
    with httpx.stream("POST", served.url + "/v1/messages", json=body, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [(line[7:], None) for line in r.iter_lines() if line.startswith("event: ")]
    names = [e for e, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_errors_come_in_anthropics_shape(client, served):
    assert client.messages.create(model="claude-x", max_tokens=2, messages=USER).model == MODEL  # any name
    with pytest.raises(anthropic.NotFoundError):
        client.get("/v1/messages/nothing-here", cast_to=object)
    r = httpx.post(served.url + "/v1/messages", json={"model": MODEL, "messages": USER})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    assert json.loads(r.text) == body


def test_stop_sequence_is_reported_by_name(client):
    full = client.messages.create(model=MODEL, max_tokens=12, messages=USER).content[0].text
    middle = len(full) // 2
    stop = full[middle:middle + 2]
    assert stop.strip(), f"no usable stop sequence in {full!r}"
    m = client.messages.create(model=MODEL, max_tokens=12, messages=USER, stop_sequences=["never-said", stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == full[:full.index(stop)]
    with client.messages.stream(model=MODEL, max_tokens=12, messages=USER, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    ended = client.messages.create(model=MODEL, max_tokens=3, messages=USER, stop_sequences=["never-said"])
    assert ended.stop_reason == "max_tokens" and ended.stop_sequence is None
