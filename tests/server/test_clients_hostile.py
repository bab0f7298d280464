"""Hostile bodies against every client endpoint (Ollama, Responses, count_tokens, llama-server's own): a 4xx
in the API's own error shape, never a 500, and the server answers on afterwards."""
from __future__ import annotations

import httpx
import pytest

from tests.server.serving import ServeProcess

MODEL = "tiny-target"
DEEP = ("[" * 5000 + "]" * 5000).encode()
# the bodies every endpoint must refuse (as bytes: some are not JSON at all)
COMMON = [b"{not json", b"[1, 2]", b"\xff\xfe", b"", b"null", b'"text"', DEEP, b'{"model": ' + b"9" * 5000 + b"}"]


def ollama(r: httpx.Response) -> bool:
    return isinstance(r.json().get("error"), str)


def openai(r: httpx.Response) -> bool:
    err = r.json().get("error")
    return isinstance(err, dict) and isinstance(err.get("message"), str) and isinstance(err.get("type"), str)


def anthropic(r: httpx.Response) -> bool:
    body = r.json()
    return body.get("type") == "error" and isinstance(body["error"].get("message"), str)


def llama(r: httpx.Response) -> bool:
    err = r.json().get("error")
    return isinstance(err, dict) and err.get("code") == r.status_code and isinstance(err.get("message"), str)


# (path, shape, endpoint-specific bodies)
ENDPOINTS = {
    "/api/chat": (ollama, [
        {"model": MODEL, "messages": "hi"}, {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]},
        {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, {"model": 5, "messages": []},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "options": {"num_predict": "many"}},
        b'{"model": "tiny-target", "messages": [{"role": "user", "content": "x"}], "options": {"temperature": 1e400}}',
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "format": {"type": "nonsense"}},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": "all of them"},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "think": {"deeply": True}},
        {"model": MODEL, "messages": [], "keep_alive": "forever and ever"},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "options": {"stop": [""] * 20}},
    ]),
    "/api/generate": (ollama, [
        {"model": MODEL, "prompt": ["a"]}, {"model": MODEL, "prompt": "x", "context": [1, 2]},
        {"model": MODEL, "prompt": "x", "options": {"seed": "x"}}, {"model": MODEL, "prompt": "x", "raw": "yes"},
        {"model": MODEL, "prompt": "x", "format": 12},
    ]),
    "/api/embed": (ollama, [
        {"model": MODEL, "input": 5}, {"model": MODEL, "input": [[1, 2]]}, {"model": MODEL, "input": [""] * 5000},
    ]),
    "/api/embeddings": (ollama, [{"model": MODEL, "prompt": {"a": 1}}]),
    "/api/show": (ollama, [{"model": ["x"]}, {"model": "../../etc/passwd"}]),
    "/api/pull": (ollama, [{"model": "llama3.2"}, {"model": 5}, {"model": "hf.co/../../x"}, {"model": "hf.co/../.."}]),
    "/v1/responses": (openai, [
        {"model": MODEL, "input": 5}, {"model": MODEL, "input": [{"type": "message", "role": "robot", "content": "x"}]},
        {"model": MODEL, "input": [{"type": "function_call", "name": 5}]}, {"model": MODEL, "input": [7]},
        {"model": MODEL, "input": [{"type": "item_reference", "id": "x"}]},
        {"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f", "parameters": "nope"}]},
        {"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "schema": 5}}},
        {"model": MODEL, "input": "x", "max_output_tokens": -1}, {"model": MODEL, "input": "x", "reasoning": "hard"},
        {"model": MODEL, "input": "x", "previous_response_id": "resp_nope"},
        {"model": MODEL, "input": [{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]},
    ]),
    "/v1/messages/count_tokens": (anthropic, [
        {"model": MODEL, "messages": "hi"}, {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"input_schema": {}}]},
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
    ]),
    "/completion": (llama, [
        {"prompt": 5}, {"prompt": [[1, ["a"]]]}, {"prompt": [-1, 2]}, {"prompt": [10 ** 12]}, {"prompt": ["x"] * 100},
        {"prompt": "x", "n_predict": "all"}, {"prompt": "x", "grammar": "root ::= (("},
        {"prompt": "x", "mirostat": 2}, {"prompt": "x", "logit_bias": {"nope": True}}, {"prompt": "x", "n_probs": -5},
        {"prompt": "x", "json_schema": {"type": "string", "maxLength": 10 ** 9}}, {"prompt": "x", "samplers": ["dry"]},
    ]),
    "/tokenize": (llama, [{"content": 5}, {"content": "x", "with_pieces": "yes"}]),
    "/detokenize": (llama, [{"tokens": "abc"}, {"tokens": [-1]}, {"tokens": [2 ** 40]}, {"tokens": [1.5]}]),
    "/apply-template": (llama, [{"messages": "x"}, {"messages": [{"role": "user", "content": {"a": 1}}]}]),
    "/chat/completions/input_tokens": (llama, [{"messages": 5}, {"messages": [{"content": "no role"}]}]),
}
CASES = [(path, body) for path in ENDPOINTS for body in COMMON] + [
    (path, body) for path, (_, bodies) in ENDPOINTS.items() for body in bodies]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    srv = ServeProcess(tiny_model, "--ctx", "512", "--max-body", "262144", "--temperature", "0",
                       home=tmp_path_factory.mktemp("hostile-home"))
    yield srv
    srv.stop()


@pytest.mark.parametrize("path,body", CASES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(CASES)])
def test_hostile_body_is_refused_in_the_apis_shape(server, path, body):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.url + path, headers={"Content-Type": "application/json"}, timeout=120, **kwargs)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert ENDPOINTS[path][0](r), r.text[:300]


def test_delete_refuses_what_it_does_not_own_and_the_server_lives_on(server):
    for body in ({"model": MODEL}, {"model": 5}, {"model": "hf.co/x/y"}, b"{"):
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.request("DELETE", server.url + "/api/delete", timeout=60, **kwargs)
        assert 400 <= r.status_code < 500 and ollama(r), (r.status_code, r.text[:300])
    assert httpx.get(server.url + "/health").status_code == 200
    r = httpx.post(server.url + "/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                  "stream": False, "options": {"num_predict": 2}}, timeout=120)
    assert r.status_code == 200 and r.json()["done"] is True
