"""Hostile and careless clients against a live `ggufdesk serve` with API keys, a rate limit and a body limit."""
from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.serving import ServeProcess

KEY, RATE_KEY = "sekret-1", "sekret-rate"
MODEL = "tiny-target"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def keyed(tiny_model, tmp_path_factory):
    server = ServeProcess(tiny_model, "--ctx", "512", "--parallel", "2", "--api-key", KEY, "--api-key", RATE_KEY,
                          "--rate-limit", "300", "--max-body", "65536", "--temperature", "0",
                          home=tmp_path_factory.mktemp("keyed-home"))
    yield server
    server.stop()


def post(server, path: str, *, key: str | None = KEY, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + path, headers=headers, timeout=60, **kwargs)


def test_missing_or_wrong_keys_are_401(keyed):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"x-api-key": "nope"}):
        r = httpx.post(keyed.url + "/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert httpx.get(keyed.url + "/health").status_code == 200  # health needs no key
    assert httpx.get(keyed.url + "/metrics").status_code == 401


def test_both_sdks_work_with_the_key(keyed):
    o = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    assert o.chat.completions.create(**CHAT).choices[0].message.content is not None
    a = anthropic.Anthropic(base_url=keyed.url, api_key=KEY, max_retries=0)  # sends x-api-key
    assert a.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]).content


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
def test_malformed_bodies_are_400(keyed, body):
    r = post(keyed, "/v1/chat/completions", content=body)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("field,value", [
    ("messages", "hello"), ("messages", []), ("max_tokens", "5"), ("max_tokens", 0), ("temperature", True),
    ("stream", "yes"), ("stop", 5), ("seed", -3), ("model", None),
])
def test_wrong_types_are_400_naming_the_field(keyed, field, value):
    r = post(keyed, "/v1/chat/completions", json={**CHAT, field: value})
    assert r.status_code == 400
    assert r.json()["error"]["param"].split(".")[0] == field


def test_oversized_bodies_are_413(keyed):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = post(keyed, "/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(20):
            yield b" " * 8192

    r = post(keyed, "/v1/messages", content=chunks())
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


def test_unknown_paths_and_methods_answer_in_openais_shape(keyed):
    r = post(keyed, "/v1/images/generations", json={})
    assert r.status_code == 404 and "no such endpoint" in r.json()["error"]["message"]
    r = httpx.get(keyed.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 405 and r.json()["error"]


def test_rate_limit_gives_429_with_retry_after_per_key(keyed):
    body = {"model": MODEL, "prompt": "hello cat dog " * 30, "max_tokens": 8}
    codes = []
    for _ in range(20):
        r = post(keyed, "/v1/completions", key=RATE_KEY, json=body)
        codes.append(r.status_code)
        if r.status_code == 429:
            break
    assert codes[0] == 200 and codes[-1] == 429, codes
    assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert post(keyed, "/v1/chat/completions", json=CHAT).status_code == 200  # another key is unaffected


def test_metrics_parse_with_prometheus_client(keyed):
    post(keyed, "/v1/chat/completions", json=CHAT)
    r = httpx.get(keyed.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in ("ggufdesk_request_duration_seconds", "ggufdesk_time_to_first_token_seconds",
                 "ggufdesk_prompt_tokens", "ggufdesk_generation_tokens", "ggufdesk_request_failures",
                 "ggufdesk_requests_running", "ggufdesk_requests_queued", "ggufdesk_kv_cache_usage_ratio",
                 "ggufdesk_speculative_acceptance_ratio"):
        assert name in families, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("ggufdesk_requests_total", (("endpoint", "chat"), ("outcome", "length")))] >= 1
    assert samples[("ggufdesk_generation_tokens_total", ())] >= 2
    assert samples[("ggufdesk_request_failures_total", (("reason", "auth"),))] >= 1
    assert samples[("ggufdesk_requests_running", ())] == 0
