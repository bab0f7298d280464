"""The context over HTTP: each API's `context_overflow` field, `truncated_tokens` in every response that
dropped tokens, cached tokens in each API's own usage field, /metrics, and `serve --context-overflow`."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.server.serving import ServeProcess

MODEL = "tiny-target"


def conversation(turns: int) -> list[dict[str, str]]:
    msgs = []
    for i in range(turns):
        msgs += [{"role": "user", "content": f"the cat and the dog {i} " * 12},
                 {"role": "assistant", "content": f"red blue green {i} " * 10}]
    return msgs + [{"role": "user", "content": "hello cat"}]


@pytest.fixture(scope="module")
def small(tmp_path_factory, tiny_model):
    """A server with a 256-token context whose requests roll by default."""
    server = ServeProcess(tiny_model, "--ctx", "256", "--parallel", "2", "--temperature", "0",
                          "--context-overflow", "rolling", home=tmp_path_factory.mktemp("serve-small"))
    yield server
    server.stop()


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)


def sse(server, path: str, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", server.url + path, json={"model": MODEL, "stream": True, **body}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_the_api_default_refuses_and_the_field_rolls(served):
    body = {"messages": conversation(40), "max_tokens": 4}
    refused = post(served, "/v1/chat/completions", body)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    rolled = post(served, "/v1/chat/completions", {**body, "context_overflow": "rolling"}).json()
    assert rolled["context_overflow"] == "rolling" and rolled["truncated_tokens"] > 0
    assert rolled["usage"]["prompt_tokens"] <= 2048
    fits = post(served, "/v1/chat/completions", {"messages": conversation(1), "max_tokens": 4}).json()
    assert "truncated_tokens" not in fits and "context_overflow" not in fits  # only when something was dropped


def test_a_policy_that_does_not_exist_is_a_400_naming_the_field(served):
    r = post(served, "/v1/chat/completions", {"messages": conversation(1), "context_overflow": "wrap"})
    assert r.status_code == 400 and "context_overflow" in r.json()["error"]["message"]


def test_cached_tokens_in_openais_and_anthropics_usage(served):
    body = {"messages": conversation(3), "max_tokens": 4}
    first = post(served, "/v1/chat/completions", body).json()
    again = post(served, "/v1/chat/completions", body).json()
    n = again["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= n - 1
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] <= again["usage"]["prompt_tokens_details"]["cached_tokens"]
    msg = post(served, "/v1/messages", body).json()
    usage = msg["usage"]
    assert usage["cache_read_input_tokens"] > 0 and usage["cache_creation_input_tokens"] == 0
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > usage["cache_read_input_tokens"]


def test_every_api_reports_what_its_default_dropped(small):
    body = {"messages": conversation(12), "max_tokens": 4}
    chat = post(small, "/v1/chat/completions", body).json()
    assert chat["truncated_tokens"] > 0 and chat["context_overflow"] == "rolling"
    stream = sse(small, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    last = [e for e in stream if e.get("choices") and e["choices"][0]["finish_reason"]][-1]
    assert last["truncated_tokens"] == chat["truncated_tokens"] == stream[-1]["truncated_tokens"]
    text = post(small, "/v1/completions", {"prompt": "the cat " * 300, "max_tokens": 4}).json()
    assert text["truncated_tokens"] > 0 and text["context_overflow"] == "rolling"
    native = post(small, "/completion", {"prompt": "the cat " * 300, "n_predict": 4}).json()  # llama-server's own
    assert native["truncated"] and native["truncated_tokens"] > 0 and native["context_overflow"] == "rolling"
    assert post(small, "/completion", {"prompt": "the cat " * 300, "n_predict": 4,
                                       "context_overflow": "error"}).status_code == 400
    msg = post(small, "/v1/messages", body).json()
    assert msg["truncated_tokens"] == chat["truncated_tokens"]
    events = sse(small, "/v1/messages", body)
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["truncated_tokens"] == chat["truncated_tokens"] and delta["context_overflow"] == "rolling"
    refused = post(small, "/v1/messages", {**body, "context_overflow": "error"})
    assert refused.status_code == 400


def test_truncate_middle_and_shift_over_http(small):
    long = {"messages": [{"role": "user", "content": "the cat sat " * 150}], "max_tokens": 8}
    middle = post(small, "/v1/chat/completions", {**long, "context_overflow": "truncate-middle"}).json()
    assert middle["context_overflow"] == "truncate-middle" and middle["truncated_tokens"] > 0
    # (a prompt after which the tiny model writes no end of text for 400 tokens)
    shifted = post(small, "/v1/completions", {"prompt": "the were", "max_tokens": 400, "context_overflow": "shift",
                                              "temperature": 0}).json()
    assert shifted["choices"][0]["finish_reason"] == "length" and shifted["usage"]["completion_tokens"] == 400
    assert shifted["context_overflow"] == "shift" and shifted["truncated_tokens"] > 256 - shifted["usage"]["prompt_tokens"]


def test_metrics_count_dropped_and_cached_tokens(small):
    post(small, "/v1/chat/completions", {"messages": conversation(12), "max_tokens": 4})
    text = httpx.get(small.url + "/metrics", timeout=30).text
    dropped = [ln for ln in text.splitlines() if ln.startswith('ggufdesk_truncated_tokens_total{policy="rolling"}')]
    assert dropped and float(dropped[0].split()[-1]) > 0
    assert any(ln.startswith("ggufdesk_prompt_tokens_cached_total ") for ln in text.splitlines())
    assert any(ln.startswith("ggufdesk_prompt_tokens_restored_total ") for ln in text.splitlines())


def test_ollama_and_responses_take_the_field_and_say_what_they_dropped(served):
    name = httpx.get(served.url + "/api/tags", timeout=30).json()["models"][0]["name"]
    msgs = conversation(40)
    chat = {"model": name, "messages": msgs, "stream": False, "options": {"num_predict": 2}}
    refused = httpx.post(served.url + "/api/chat", json=chat, timeout=120)
    assert refused.status_code == 400 and "error" in refused.json()
    rolled = httpx.post(served.url + "/api/chat", json={**chat, "context_overflow": "rolling"}, timeout=120).json()
    assert rolled["done"] and rolled["truncated_tokens"] > 0 and rolled["context_overflow"] == "rolling"
    lines = []
    with httpx.stream("POST", served.url + "/api/chat", json={**chat, "stream": True, "context_overflow": "rolling"},
                      timeout=120) as r:
        lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[-1]["done"] and lines[-1]["truncated_tokens"] == rolled["truncated_tokens"]
    items = [{"role": m["role"], "content": m["content"]} for m in msgs]
    body = {"input": items, "max_output_tokens": 2}
    assert post(served, "/v1/responses", body).status_code == 400  # OpenAI's truncation defaults to disabled
    auto = post(served, "/v1/responses", {**body, "truncation": "auto"}).json()  # OpenAI's own word for rolling
    assert auto["status"] in ("completed", "incomplete") and auto["truncated_tokens"] > 0
    ours = post(served, "/v1/responses", {**body, "context_overflow": "truncate-middle"}).json()
    assert ours["context_overflow"] == "truncate-middle" and ours["truncated_tokens"] > 0
