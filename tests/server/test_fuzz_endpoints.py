"""A fuzz pass over every endpoint's body against a live server (issue 34): no 500, no crash or restart of the
engine, /health truthful after each endpoint.

The endpoints are read from the app itself when the tests are collected, so routes added later (other APIs,
other paths) are fuzzed too without editing this file. Hypothesis is derandomized and bounded, so it
cannot flake or run long; bodies mix random JSON, bodies built from the field names the APIs use, and
valid requests with one field replaced.
"""
from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.hostile_live import HANG_S, MODEL, engine_pids, normal_request
from tests.server.serving import ServeProcess, fake_pool

EXAMPLES = 25  # per endpoint and method


def app_routes() -> list[tuple[str, str]]:
    """(method, path) of every route the server's app has, path parameters filled in."""
    from starlette.applications import Starlette

    from ggufdesk.server.app import build_app
    from ggufdesk.server.service import ServerConfig, Service

    app: Any = build_app(Service(pool=fake_pool(), config=ServerConfig()))
    while not isinstance(app, Starlette):
        app = app.app  # through the middleware
    out = set()
    for route in app.routes:
        path = getattr(route, "path", None)
        if not path:
            continue
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method != "HEAD":
                out.add((method, re.sub(r"\{[^}]+\}", "x", path)))
    return sorted(out)


ROUTES = app_routes()
POSTS = [(m, p) for m, p in ROUTES if m in ("POST", "PUT", "PATCH", "DELETE")]
GETS = [(m, p) for m, p in ROUTES if m == "GET"]

FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "stream", "stream_options", "tools",
          "tool_choice", "response_format", "temperature", "top_p", "top_k", "stop", "stop_sequences", "n", "seed",
          "logprobs", "top_logprobs", "system", "thinking", "metadata", "input", "options", "format", "keep_alive",
          "role", "content", "type", "text", "function", "name", "arguments", "parameters", "input_schema",
          "json_schema", "schema", "pattern", "minimum", "maximum", "maxLength", "minItems", "items", "properties",
          "anyOf", "$ref", "tool_calls", "tool_call_id", "n_predict", "grammar", "user", "suffix", "echo"]
LEAF = (st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=30) | st.sampled_from([MODEL, "user", "assistant", "system", "tool", "function",
                                                   "json_schema", "json_object", "text", "auto", "required"]))
KEYS = st.sampled_from(FIELDS) | st.text(max_size=8)
JSON = st.recursive(LEAF, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS, kids, max_size=5),
                    max_leaves=25)
VALID = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "max_tokens": 4,
         "stream": False}


@st.composite
def near_valid(draw) -> dict:
    """A valid-looking request with one field replaced (and small token budgets, so generations stay short)."""
    body = dict(VALID)
    key = draw(st.sampled_from(FIELDS))
    body[key] = draw(JSON)
    for k in ("max_tokens", "max_completion_tokens", "n_predict"):
        if not isinstance(body.get(k), int) or isinstance(body.get(k), bool) or not 0 < body[k] <= 8:
            body[k] = draw(st.sampled_from([1, 4, 8, -1, 0, "4", None]))
    return body


BODIES = st.one_of(
    near_valid().map(lambda b: json.dumps(b).encode()),
    st.dictionaries(KEYS, JSON, max_size=8).map(lambda b: json.dumps(b).encode()),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
)


@pytest.fixture(scope="module")
def fuzzed(tiny_model, tmp_path_factory):
    server = ServeProcess(tiny_model, "--ctx", "512", "--parallel", "2", "--temperature", "0",
                          home=tmp_path_factory.mktemp("fuzz-home"))
    server.engines = engine_pids(server.proc.pid)
    yield server
    server.stop()


def check_truthful(server) -> None:
    """The engine is the same process, /health says ok and a normal request is served."""
    assert engine_pids(server.proc.pid) == server.engines, "the engine crashed or was restarted"
    assert httpx.get(server.url + "/health", timeout=HANG_S).json() == {"status": "ok"}
    assert normal_request(server.url)[0] == 200


def test_the_routes_are_found():
    assert ("POST", "/v1/chat/completions") in ROUTES and ("GET", "/health") in ROUTES


@pytest.mark.parametrize("method,path", POSTS, ids=[f"{m} {p}" for m, p in POSTS])
def test_no_body_makes_a_500(fuzzed, method, path):
    with httpx.Client(base_url=fuzzed.url, timeout=HANG_S * 2, headers={"Content-Type": "application/json"}) as c:

        @settings(derandomize=True, max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(body=BODIES)
        def one(body: bytes) -> None:
            r = c.request(method, path, content=body)
            assert r.status_code != 500 and r.status_code < 600, (r.status_code, body[:300], r.text[:300])

        one()
    check_truthful(fuzzed)


@pytest.mark.parametrize("method,path", GETS, ids=[f"{m} {p}" for m, p in GETS])
def test_gets_answer_without_a_500(fuzzed, method, path):
    r = httpx.request(method, fuzzed.url + path, params={"x": "\x00" * 3, "limit": "-1"}, timeout=HANG_S)
    assert r.status_code != 500
    check_truthful(fuzzed)
