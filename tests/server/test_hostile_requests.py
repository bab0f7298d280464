"""Hostile request bodies against a live server (issue 34, findings 1, 2, 3 and 9): each one gets a clear 4xx,
and while it runs /health answers, a normal request is served and the engine process stays the same."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.server.hostile_live import HANG_S, MODEL, during, engine_pids, normal_request, record
from tests.server.serving import ServeProcess

URL = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def plain(tiny_model, tmp_path_factory):
    server = ServeProcess(tiny_model, "--ctx", "1024", "--parallel", "2", "--temperature", "0",
                          home=tmp_path_factory.mktemp("hostile-home"))
    yield server
    server.stop()


def raw_post(server, path: str, body: str | bytes) -> httpx.Response:
    data = body.encode() if isinstance(body, str) else body
    return httpx.post(server.url + path, content=data, headers={"Content-Type": "application/json"},
                      timeout=HANG_S * 4)


def deep(n: int) -> str:
    return "[" * n + "1" + "]" * n


def chat(**extra) -> dict:
    return {"model": MODEL, "messages": USER, "max_tokens": 8, **extra}


def schema_format(schema: dict | str) -> str:
    """A chat body whose response_format schema is `schema` (raw JSON text allowed, for 1e999 and NaN)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    head = json.dumps(chat())[:-1]
    return head + ', "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": ' + text + "}}}"


def check_held(server, case: str, send) -> httpx.Response:
    """Send one hostile request while watching; it must not be a 5xx, /health must keep answering, a normal
    request must be served, and the engine must be the same process afterwards."""
    before = engine_pids(server.proc.pid)
    out = during(server.url, send)
    r = out.result
    assert isinstance(r, httpx.Response), r
    record(case, status=r.status_code, hostile_s=round(out.hostile_s, 3), worst_health_s=round(out.worst_health_s, 3),
           health_asked=out.health_asked, normal_status=out.normal_status, normal_s=round(out.normal_s, 3))
    assert r.status_code < 500, (r.status_code, r.text[:300])
    assert out.worst_health_s < HANG_S and out.normal_status == 200
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert normal_request(server.url)[0] == 200
    assert engine_pids(server.proc.pid) == before  # no crash, no restart
    return r


# ---- finding 1: one request must never kill the engine link ----------------------------------------


def test_a_600_deep_tool_call_argument_is_refused_and_the_engine_link_lives(plain):
    call = '{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ' + deep(600) + "}}"
    body = ('{"model": "tiny-target", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}, '
            '{"role": "assistant", "content": null, "tool_calls": [' + call + ']}, '
            '{"role": "tool", "tool_call_id": "c1", "content": "ok"}]}')
    r = check_held(plain, "600-deep tool_calls arguments", lambda: raw_post(plain, URL, body))
    assert r.status_code == 400 and "deep" in r.json()["error"]["message"]


def test_a_600_deep_schema_default_is_refused_and_the_engine_link_lives(plain):
    body = schema_format('{"type": "object", "default": ' + deep(600) + "}")
    r = check_held(plain, "600-deep schema default", lambda: raw_post(plain, URL, body))
    assert r.status_code == 400


# ---- finding 2: bounded work before unbounded work ----------------------------------------------------


def big_schema(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


def test_a_100k_property_schema_is_refused_without_freezing_the_server(plain):
    body = schema_format(big_schema(100_000))
    assert 2_000_000 < len(body) < 4 * 1024 * 1024
    r = check_held(plain, "100k-property schema (response_format)", lambda: raw_post(plain, URL, body))
    assert r.status_code == 400 and "too large" in r.json()["error"]["message"]


def test_huge_tool_parameters_are_refused_without_freezing_the_server(plain):
    tool = {"type": "function", "function": {"name": "f", "parameters": big_schema(100_000)}}
    r = check_held(plain, "100k-property tool parameters", lambda: raw_post(plain, URL, json.dumps(chat(tools=[tool]))))
    assert r.status_code == 400


def test_huge_anthropic_input_schema_is_refused_without_freezing_the_server(plain):
    body = {"model": MODEL, "max_tokens": 8, "messages": USER,
            "tools": [{"name": "f", "input_schema": big_schema(100_000)}]}
    r = check_held(plain, "100k-property Anthropic input_schema",
                   lambda: raw_post(plain, "/v1/messages", json.dumps(body)))
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_many_tools_each_under_the_limit_are_refused_as_a_whole(plain):
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": big_schema(900)}} for i in range(120)]
    r = check_held(plain, "120 tools x 900 properties", lambda: raw_post(plain, URL, json.dumps(chat(tools=tools))))
    assert r.status_code == 400


# ---- finding 3: the grammar is bounded -------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["^((a?){0,30}){0,30}$", "^([ab]?[ab]?){0,40}$", "^(a?){0,60}(a?){0,60}$"])
def test_a_pattern_whose_grammar_explodes_is_refused(plain, pattern):
    body = json.dumps(chat(response_format={"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "string", "pattern": pattern}}}))
    r = check_held(plain, f"exploding pattern {pattern}", lambda: raw_post(plain, URL, body))
    assert r.status_code == 400 and "grammar" in r.json()["error"]["message"]


def test_nested_ambiguous_any_of_is_refused(plain):
    schema: dict = {"type": "string"}
    for _ in range(9):
        schema = {"anyOf": [schema, schema, schema]}
    r = check_held(plain, "nested anyOf 3^9", lambda: raw_post(plain, URL, schema_format(schema)))
    assert r.status_code == 400


# ---- finding 9: 400 where 500 was --------------------------------------------------------------------


@pytest.mark.parametrize("schema", [
    '{"type": "integer", "minimum": 1e999}',
    '{"type": "integer", "maximum": -1e999}',
    '{"type": "number", "minimum": 1e999}',
    '{"type": "integer", "minimum": NaN}',
    '{"type": "integer", "minimum": -Infinity}',
    '{"type": "array", "items": {"type": "integer"}, "minItems": 1000000000}',
    '{"type": "array", "items": {"type": "integer"}, "maxItems": 1000000000}',
    '{"type": "string", "maxLength": 1000000000}',
    '{"type": "string", "minLength": 1000000000}',
    '{"type": "string", "pattern": "^(a)\\\\1$"}',
    '{"type": "string", "pattern": "^(?P<x>a)(?P=x)$"}',
    '{"type": "string", "pattern": "^(?=a)a$"}',
    '{"type": "string", "pattern": "^a{1000000}$"}',
    '{"type": "string", "pattern": "["}',
])
def test_bad_schemas_are_400_not_500(plain, schema):
    r = raw_post(plain, URL, schema_format(schema))
    record("bad schema", schema=schema, status=r.status_code)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["message"].strip()


@pytest.mark.parametrize("body", [
    '{"model": "tiny-target", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"model": "tiny-target", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "user": '
    + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}",
    '{"model": "tiny-target", "max_tokens": NaN, "messages": []}',
])
def test_absurd_bodies_are_400_not_500(plain, body):
    r = check_held(plain, "absurd body", lambda: raw_post(plain, URL, body))
    assert r.status_code == 400, r.text[:300]


def test_a_gguf_claiming_a_2g_token_context_loads_and_answers(model_dir, tmp_path):
    from tests.fixtures import ggufs

    model = ggufs.write_tiny_llama(model_dir / "tiny-hugectx.gguf", ggufs.TinySpec(seed=0, n_ctx_train=2**31 - 1))
    server = ServeProcess(model, "--ctx", "512", "--parallel", "1", "--temperature", "0", home=tmp_path / "home")
    try:
        r = httpx.post(server.url + URL, json={**chat(), "model": "tiny-hugectx"}, timeout=HANG_S * 2)
        assert r.status_code == 200, r.text
    finally:
        server.stop()


def test_health_tells_the_truth_within_a_second_of_the_engine_dying(plain):
    import os
    import signal
    import time

    (pid,) = engine_pids(plain.proc.pid)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while httpx.get(plain.url + "/health", timeout=HANG_S).status_code == 200:
        assert time.monotonic() - t0 < HANG_S
        time.sleep(0.01)
    noticed = time.monotonic() - t0
    while httpx.get(plain.url + "/health", timeout=HANG_S).status_code != 200:
        assert time.monotonic() - t0 < HANG_S * 2
        time.sleep(0.05)
    record("engine SIGKILLed", health_not_ok_after_s=round(noticed, 3), ok_again_after_s=round(time.monotonic() - t0, 3))
    assert normal_request(plain.url)[0] == 200
