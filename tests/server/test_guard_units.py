"""The pieces of the server's defences on their own: Host and Origin rules, rate-limited logs, body parsing limits."""
from __future__ import annotations

import logging

import pytest
from starlette.datastructures import Headers

from ggufdesk.core.schema import MAX_TOOL_VALUES, SchemaError, check_pattern, check_schema, check_size
from ggufdesk.server.errors import ApiError
from ggufdesk.server.guard import Guard, host_name
from ggufdesk.server.logs import RepeatLimit
from ggufdesk.server.schemas import MAX_BODY_DEPTH, load_json
from ggufdesk.server.structured import openai_tools


def guard(host: str = "127.0.0.1", origins=()) -> Guard:
    return Guard(lambda *a: None, bound_host=host, cors_origins=origins)  # type: ignore[arg-type]


def refusal(g: Guard, method: str = "POST", **headers: str) -> ApiError | None:
    return g.refusal(method, Headers({k.replace("_", "-"): v for k, v in headers.items()}))


@pytest.mark.parametrize("value,name", [("localhost:8080", "localhost"), ("[::1]:80", "::1"), ("[::1]", "::1"),
                                        ("Example.COM", "example.com"), ("::1", "::1"), ("127.0.0.1", "127.0.0.1")])
def test_host_names(value, name):
    assert host_name(value) == name


def test_a_loopback_server_answers_only_its_own_names():
    g = guard()
    for ok in ("localhost:1", "127.0.0.1:1", "127.9.9.9", "[::1]:1", "x.localhost"):
        assert refusal(g, host=ok, content_type="application/json") is None, ok
    for bad in ("attacker.example", "127.0.0.1.nip.io", "localhost.attacker.example", "10.0.0.1", "0.0.0.0"):
        err = refusal(g, host=bad)
        assert err is not None and err.status == 403, bad
    assert refusal(guard("0.0.0.0"), host="attacker.example") is None  # beyond loopback: a key guards it
    assert refusal(guard("192.168.1.5"), host="192.168.1.5:8080") is None


def test_origins_other_than_the_allowed_and_our_own_are_refused():
    g = guard(origins=("http://app.example",))
    assert refusal(g, host="127.0.0.1:8080", origin="http://app.example") is None
    assert refusal(g, host="127.0.0.1:8080", origin="http://127.0.0.1:8080") is None  # the server's own pages
    err = refusal(g, host="127.0.0.1:8080", origin="http://localhost:3000")
    assert err is not None and err.status == 403 and "--cors-origin http://localhost:3000" in err.message


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=1"])
def test_simple_request_types_from_a_browser_are_415_on_posts_only(kind):
    err = refusal(guard(), host="localhost", content_type=kind, sec_fetch_mode="no-cors")
    assert err is not None and err.status == 415
    assert refusal(guard(), "GET", host="localhost", content_type=kind, sec_fetch_mode="no-cors") is None
    # no browser's marks (curl -d): served, JSON is read from the body whatever its declared type
    assert refusal(guard(), host="localhost", content_type=kind) is None


def test_repeated_log_lines_are_limited_and_counted():
    now = [0.0]
    f = RepeatLimit(burst=3, window=10, clock=lambda: now[0])

    def rec(msg: str, *args) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, "x", 1, msg, args, None)

    shown = [f.filter(rec("Invalid HTTP request received.")) for _ in range(1000)]
    assert sum(shown) == 3
    assert f.filter(rec("another message %s", 1))  # other templates have their own budget
    now[0] = 11
    r = rec("Invalid HTTP request received.")
    assert f.filter(r) and "997 more like this" in r.getMessage()


def test_bodies_are_parsed_strictly():
    assert load_json(b'{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    for bad, word in [(b'{"a": NaN}', "NaN"), (b'{"a": -Infinity}', "Infinity"), (b'{"a": 1e999}', "out of range"),
                      (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
                      (b"[" * (MAX_BODY_DEPTH + 1) + b"]" * (MAX_BODY_DEPTH + 1), "nested too deeply")]:
        with pytest.raises(ApiError, match=word) as e:
            load_json(bad)
        assert e.value.status == 400


def test_size_is_counted_without_recursion_and_before_the_meta_check(monkeypatch):
    deep: list = []
    node = deep
    for _ in range(50_000):
        node.append([])
        node = node[0]
    with pytest.raises(SchemaError, match="nested more than"):
        check_size(deep, what="x")
    from ggufdesk.core import schema

    monkeypatch.setattr(schema, "_meta_check", lambda s: pytest.fail("the meta check ran on a schema too large"))
    with pytest.raises(SchemaError, match="too large"):
        check_schema({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(100_000)}})


def test_all_tools_together_are_bounded():
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(200)}}}} for i in range(100)]
    assert 100 * 200 * 2 > MAX_TOOL_VALUES  # each tool is under a schema's own limit, all of them are not
    with pytest.raises(ApiError, match="tool list is too large"):
        openai_tools(tools, None, None)


@pytest.mark.parametrize("pattern,word", [("^(a)\\1$", "backreferences"), ("^(?=a)$", "lookarounds"),
                                          ("^(?:a)$", "groups"), ("^a{5000}$", "repeats"),
                                          ("(" * 40 + ")" * 40, "nests"), ("[", "not a valid"), ("x" * 5000, "longer")])
def test_patterns_are_checked_by_name(pattern, word):
    with pytest.raises(SchemaError, match=word):
        check_pattern(pattern, "#")


@pytest.mark.parametrize("pattern", ["^[A-Z]{2}-[0-9]{3}$", "^\\\\1$", "^[(]{3}$", "^a|b$", "^\\d{1,3}$"])
def test_ordinary_patterns_pass(pattern):
    check_pattern(pattern, "#")
