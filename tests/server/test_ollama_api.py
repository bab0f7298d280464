"""The official `ollama` Python client (and raw NDJSON) against a live `ggufdesk serve` on a scripted model."""
from __future__ import annotations

import json
import re

import httpx
import ollama
import pytest

from tests.server.conftest import SCRIPTED_CALL as CALL

NAME = "hermes-tools"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(scripted):
    return scripted


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


def test_version_list_show_and_ps(client, server):
    assert httpx.get(server.url + "/api/version").json()["version"]
    models = client.list().models
    assert [m.model for m in models] == [f"{NAME}:latest"]
    m = models[0]
    assert m.size > 0 and len(m.digest) == 64 and m.details.format == "gguf" and m.details.family == "llama"
    assert m.details.quantization_level == "F32" and m.details.parameter_size
    shown = client.show(NAME)
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert "<tool_call>" in shown.template and "num_ctx" in shown.parameters
    assert shown.modelinfo["general.architecture"] == "llama"
    running = client.ps().models
    assert [r.model for r in running] == [f"{NAME}:latest"] and running[0].size > 0
    assert running[0].size_vram == 0 and running[0].expires_at is not None


def test_chat_streaming_and_not_agree(client):
    plain = client.chat(model=NAME, messages=[{"role": "user", "content": "hi"}])
    assert plain.message.role == "assistant" and plain.message.content == CALL  # no tools: the text as it is
    assert plain.done and plain.done_reason == "stop"
    assert plain.prompt_eval_count > 0 and plain.eval_count > 0
    assert plain.total_duration >= plain.eval_duration > 0 and plain.prompt_eval_duration > 0  # nanoseconds
    parts = list(client.chat(model=f"{NAME}:latest", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(p.message.content for p in parts) == CALL
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done and parts[-1].eval_count == plain.eval_count


def test_generate_templated_raw_and_streamed(client):
    g = client.generate(model=NAME, prompt="hi", system="be brief")
    assert g.response == CALL and g.done_reason == "stop"
    streamed = "".join(p.response for p in client.generate(model=NAME, prompt="hi", system="be brief", stream=True))
    assert streamed == CALL
    raw = client.generate(model=NAME, prompt="hi", raw=True, options={"num_predict": 3})
    assert raw.done_reason == "length" and raw.eval_count == 3
    loaded = client.generate(model=NAME)  # an empty prompt loads the model
    assert loaded.done and loaded.done_reason == "load"


def test_options_are_mapped(client):
    r = client.chat(model=NAME, messages=USER, options={"num_predict": 2, "temperature": 0.7, "top_k": 5,
                                                        "top_p": 0.9, "min_p": 0.1, "repeat_penalty": 1.1,
                                                        "seed": 7, "num_ctx": 2048, "num_thread": 3})
    assert r.done_reason == "length" and r.eval_count == 2
    stopped = client.chat(model=NAME, messages=USER, options={"stop": ['"arguments"']})
    # (a chat answer's trailing space is trimmed, as main's step loop does)
    assert stopped.message.content == CALL[:CALL.index('"arguments"')].rstrip() and stopped.done_reason == "stop"


def test_tools_round_trip(client):
    first = client.chat(model=NAME, messages=USER, tools=TOOLS)
    calls = first.message.tool_calls
    assert first.message.content == "" and len(calls) == 1
    assert calls[0].function.name == "get_weather" and calls[0].function.arguments == {"city": "Paris"}
    history = [*USER, first.message, {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}]
    again = client.chat(model=NAME, messages=history, tools=TOOLS)
    assert again.message.tool_calls[0].function.arguments == {"city": "Paris"}  # the script calls again
    parts = list(client.chat(model=NAME, messages=history, tools=TOOLS, stream=True))
    assert [p.message.tool_calls[0].function.name for p in parts if p.message.tool_calls] == ["get_weather"]
    assert "".join(p.message.content for p in parts) == ""  # the call's text is not streamed as content


def test_format_json_gives_json(client):
    r = client.chat(model=NAME, messages=USER, format="json", options={"num_predict": 40})
    assert r.message.content.lstrip().startswith("{")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = client.generate(model=NAME, prompt="answer", format=schema, options={"num_predict": 40})
    if r.done_reason == "stop":
        assert set(json.loads(r.response)) == {"ok"}


def test_embed_and_the_older_embeddings(client):
    e = client.embed(model=NAME, input=["hello", "world", "hello"])
    assert len(e.embeddings) == 3 and e.embeddings[0] == e.embeddings[2] and e.prompt_eval_count > 0
    assert abs(sum(x * x for x in e.embeddings[1]) - 1) < 1e-6
    old = client.embeddings(model=NAME, prompt="hello")
    assert list(old.embedding) == e.embeddings[0]


def test_ndjson_lines_and_the_second_port(server):
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}  # stream defaults to true
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and all(not x["done"] for x in lines[:-1])
    assert all(x["created_at"].endswith("Z") and x["model"] == NAME for x in lines)
    port = next(int(re.search(r"on port (\d+)", line).group(1)) for line in server.output if "also listening" in line)
    assert httpx.get(f"http://127.0.0.1:{port}/api/tags").json()["models"][0]["name"] == f"{NAME}:latest"


def test_bad_requests_get_ollamas_error_shape(client, server):
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="llama3.2", messages=USER)
    assert err.value.status_code == 404 and "llama3.2" in err.value.error
    for call in (lambda: client.show("nope"), lambda: client.embed(model="nope", input="x")):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 404
    for options in ({"temperature": "hot"}, {"num_predict": "many"}, {"presence_penalty": 1.5}, {"mirostat": 2},
                    {"top_p": 7}, {"stop": [""]}):
        with pytest.raises(ollama.ResponseError) as err:
            client.chat(model=NAME, messages=USER, options=options)
        assert err.value.status_code == 400, options
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=NAME, messages=[{"role": "user", "content": "what is this?", "images": [b"\x89PNG"]}])
    assert err.value.status_code == 400 and "images" in err.value.error
    r = httpx.post(server.url + "/api/generate", json={"model": NAME, "prompt": "x", "suffix": "y"})
    assert r.status_code == 400 and set(r.json()) == {"error"}


@pytest.mark.parametrize("path,body", [
    ("/api/chat", {"model": NAME, "messages": "hi"}), ("/api/chat", {"model": NAME, "messages": [{"role": 5}]}),
    ("/api/chat", {"model": NAME, "messages": [{"role": "robot", "content": "x"}]}),
    ("/api/chat", {"model": 5, "messages": USER}), ("/api/chat", {"messages": USER}),
    ("/api/chat", {"model": NAME, "messages": USER, "format": "xml"}),
    ("/api/chat", {"model": NAME, "messages": USER, "tools": [{"type": "function"}]}),
    ("/api/chat", {"model": NAME, "messages": USER * 100_000}),
    ("/api/generate", {"model": NAME, "prompt": ["x"]}), ("/api/generate", {"model": NAME, "prompt": "x", "raw": "no"}),
    ("/api/embed", {"model": NAME, "input": []}), ("/api/embed", {"model": NAME, "input": [["x"]]}),
    ("/api/embed", {"model": NAME, "input": ["x"] * 3000}), ("/api/embed", {"model": NAME, "input": [""]}),
    ("/api/embeddings", {"model": NAME, "prompt": 5}), ("/api/show", {"model": ["x"]}),
])
def test_hostile_bodies_are_400s_and_the_server_lives(server, path, body):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code in (400, 413), (path, r.status_code, r.text[:200])
    assert set(r.json()) == {"error"}
    assert httpx.get(server.url + "/api/version").status_code == 200


def test_deep_nesting_and_garbage(server):
    for body in (b"[" * 100_000, b"{not json", b"\xff\xfe", b""):
        r = httpx.post(server.url + "/api/chat", content=body, timeout=60)
        assert r.status_code == 400 and set(r.json()) == {"error"}
    deep = {"model": NAME, "messages": USER, "format": {"type": "object", "properties": {"a": {}}}}
    node = deep["format"]["properties"]
    for _ in range(200):
        node["a"] = {"type": "object", "properties": {}}
        node = node["a"]["properties"]
    r = httpx.post(server.url + "/api/chat", json=deep, timeout=60)
    assert r.status_code == 400 and "error" in r.json()


def test_keep_alive_unloads_and_loads(client, server):
    """Ollama clients' empty requests: keep_alive 0 unloads the model, a duration loads it for that long."""
    r = httpx.post(server.url + "/api/generate", json={"model": NAME, "keep_alive": 0}, timeout=120)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload"
    assert client.ps().models == []
    r = httpx.post(server.url + "/api/chat", json={"model": NAME, "messages": [], "keep_alive": "5m"}, timeout=300)
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
    running = client.ps().models
    assert [m.model for m in running] == [f"{NAME}:latest"] and running[0].expires_at.year < 2100
    bad = httpx.post(server.url + "/api/chat", json={"model": NAME, "messages": [], "keep_alive": "soon"})
    assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]
    assert client.generate(NAME, "Hi", options={"num_predict": 2}).done
