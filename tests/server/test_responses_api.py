"""OpenAI's Responses API with the real `openai` SDK (and Codex's recorded request) against ggufdesk serve."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from ggufdesk.server.responses import ResponseStore, Stored
from tests.server.conftest import SCRIPTED_CALL

TOOLS = [{"type": "function", "name": "get_weather", "description": "the weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


@pytest.fixture(scope="module")
def client(scripted):
    with openai.OpenAI(base_url=scripted.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def sse_events(r: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_a_text_answer_streamed_and_not(client):
    r = client.responses.create(model="gpt-4.1", input="hi", instructions="be brief")
    assert r.id.startswith("resp_") and r.status == "completed" and r.output[0].id.startswith("msg_")
    assert r.output_text == SCRIPTED_CALL  # no tools: the model's text as it is
    assert r.usage.input_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    with client.responses.stream(model="gpt-4.1", input="hi", instructions="be brief") as s:
        kinds, text = [], ""
        for e in s:
            kinds.append(e.type)
            text += e.delta if e.type == "response.output_text.delta" else ""
        final = s.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert text == final.output_text == SCRIPTED_CALL


def test_llama_servers_telemetry_extensions(scripted):
    """timings_per_token and return_progress (llama-server's): timings on each delta, response.in_progress
    events with prompt_progress; the final event has llama-server's timings beside the response either way."""
    body = {"input": "This is a test " * 10, "stream": True, "max_output_tokens": 8}
    with httpx.stream("POST", scripted.url + "/v1/responses", timeout=120,
                      json={**body, "timings_per_token": True, "return_progress": True}) as r:
        events = sse_events(r)
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    last = progress[-1]["prompt_progress"]
    assert last["total"] > 0 and last["processed"] == last["total"] >= last["cache"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all({"prompt_per_second", "predicted_per_second"} <= set(e["timings"]) for e in deltas)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    end = events[-1]
    assert end["type"] in ("response.completed", "response.incomplete")  # (OpenAI's: incomplete at the limit)
    assert end["timings"]["predicted_n"] == end["response"]["usage"]["output_tokens"] > 0
    with httpx.stream("POST", scripted.url + "/v1/responses", json=body, timeout=120) as r:
        plain = sse_events(r)
    assert not [e for e in plain if "prompt_progress" in e or (e["type"].endswith(".delta") and "timings" in e)]
    assert "timings" in plain[-1]


def test_max_output_tokens_makes_it_incomplete(client):
    r = client.responses.create(model="m", input="hi", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_a_function_call_round_trip_through_previous_response_id(client):
    first = client.responses.create(model="m", input="weather in Paris?", tools=TOOLS)
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    second = client.responses.create(model="m", previous_response_id=first.id, tools=TOOLS, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert second.previous_response_id == first.id and second.output[-1].type == "function_call"
    # the stored conversation grew: the second prompt holds the first call and its result
    assert second.usage.input_tokens > first.usage.input_tokens
    assert client.responses.retrieve(second.id).id == second.id
    with client.responses.stream(model="m", input="weather?", tools=TOOLS) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" not in kinds
    assert final.output[0].type == "function_call"


def test_the_same_conversation_sent_whole_as_codex_does(client):
    first = client.responses.create(model="m", input="weather?", tools=TOOLS, store=False)
    call = first.output[-1]
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    r = client.responses.create(model="m", input=items, tools=TOOLS, store=False)
    assert r.status == "completed"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)  # store: false keeps nothing


def test_unknown_built_in_tools_are_ignored_and_named(scripted):
    body = {"model": "m", "input": "hi", "tools": [*TOOLS, {"type": "web_search"}, {"type": "file_search"},
                                                   {"type": "namespace", "name": "x", "tools": []}]}
    r = httpx.post(scripted.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["x-ggufdesk-ignored-tools"] == "file_search, namespace, web_search"
    only_builtin = httpx.post(scripted.url + "/responses", json={**body, "tools": [{"type": "web_search"}]}, timeout=60)
    assert only_builtin.status_code == 200 and only_builtin.json()["output"][0]["type"] == "message"


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.responses.create(model="m", input="answer", max_output_tokens=40,
                                text={"format": {"type": "json_schema", "name": "x", "schema": schema}})
    assert r.output_text.lstrip().startswith("{")


def test_retrieve_and_delete(client, scripted):
    r = client.responses.create(model="m", input="hi", max_output_tokens=2)
    assert client.responses.retrieve(r.id).output_text == r.output_text
    assert httpx.delete(f"{scripted.url}/v1/responses/{r.id}").json() == {"id": r.id, "object": "response",
                                                                         "deleted": True}
    for call in (lambda: client.responses.retrieve(r.id), lambda: client.responses.create(
            model="m", input="x", previous_response_id="resp_nope")):
        with pytest.raises(openai.NotFoundError):
            call()


def test_codexs_recorded_request_gets_a_well_formed_stream(agent_fake_server):
    body = json.loads((CLIENTS / "codex_0.171.0_exec.json").read_text())
    with httpx.stream("POST", agent_fake_server.url + "/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["x-ggufdesk-ignored-tools"] == "namespace, web_search"
        events = sse_events(r)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]
    assert done["id"].startswith("resp_") and done["usage"]["input_tokens"] > 100
    assert done["output"][0]["content"][0]["text"].startswith("Echo:")


def test_the_store_keeps_the_newest():
    st = ResponseStore(limit=2)
    for i in range(3):
        st.put(f"r{i}", Stored(body={"i": i}))
    assert st.get("r0") is None and st.get("r2").body == {"i": 2}
    assert st.delete("r1") and not st.delete("r1")


@pytest.mark.parametrize("body", [
    {"input": 5}, {"input": [{"type": "message", "role": "robot", "content": "x"}]},
    {"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
    {"input": [{"type": "function_call", "name": 5}]}, {"input": [{"type": "item_reference", "id": "x"}]},
    {"input": "x", "tools": [{"type": "function", "name": "bad name!"}]}, {"input": "x", "tool_choice": "required"},
    {"input": "x", "tool_choice": {"type": "allowed_tools"}}, {"input": "x", "max_output_tokens": 0},
    {"input": "x", "text": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}},
    {"input": [{"type": "message", "role": "user", "content": "x"}] * 5000}, {"input": []},
    {"input": "x", "temperature": "hot"}, {"input": "x", "stream": "yes"},
])
def test_hostile_bodies_are_400_in_openais_shape(scripted, body):
    r = httpx.post(scripted.url + "/v1/responses", json={"model": "m", **body}, timeout=60)
    assert r.status_code in (400, 413), r.text[:300]
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(scripted.url + "/health").status_code == 200
