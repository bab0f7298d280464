"""A reasoning model (scripted qwen3) through Ollama's API (`think`, message.thinking) and the Responses
API (a reasoning item before the message, streamed as reasoning_text events), streamed and not."""
from __future__ import annotations

import json

import httpx
import pytest

from tests.fixtures.scripted import write_scripted
from tests.server.serving import ServeProcess

SCRIPT = "<think>\nA greeting. Answer kindly.\n</think>\n\nHello! Nice to meet you."
THOUGHT, ANSWER = "A greeting. Answer kindly.", "Hello! Nice to meet you."
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_scripted(tmp_path_factory.mktemp("m") / "qwen3.gguf", "qwen3", SCRIPT)
    srv = ServeProcess(path, "--ctx", "2048", "--temperature", "0", home=tmp_path_factory.mktemp("home"))
    yield srv, path.stem
    srv.stop()


def _lines(r: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in r.iter_lines() if line.strip()]


def test_ollama_chat_gives_thinking_apart(server):
    srv, model = server
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        r = c.post("/api/chat", json={"model": model, "messages": USER, "stream": False, "think": True})
        assert r.status_code == 200, r.text
        msg = r.json()["message"]
        assert msg["thinking"].strip() == THOUGHT and msg["content"].strip() == ANSWER
        with c.stream("POST", "/api/chat", json={"model": model, "messages": USER, "think": True}) as s:
            parts = _lines(s)
    thinking = "".join(p["message"].get("thinking", "") for p in parts)
    content = "".join(p["message"]["content"] for p in parts)
    assert thinking.strip() == THOUGHT and content.strip() == ANSWER and parts[-1]["done"] is True


def test_ollama_generate_gives_thinking_and_takes_it_back(server):
    srv, model = server
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        r = c.post("/api/generate", json={"model": model, "prompt": "Hi", "stream": False})
        assert r.status_code == 200, r.text
        assert r.json()["thinking"].strip() == THOUGHT and r.json()["response"].strip() == ANSWER
        history = USER + [{"role": "assistant", "content": ANSWER, "thinking": THOUGHT}, {"role": "user", "content": "Hi"}]
        r = c.post("/api/chat", json={"model": model, "messages": history, "stream": False})
        assert r.status_code == 200, r.text
        bad = c.post("/api/chat", json={"model": model, "messages": USER, "think": "very"})
        assert bad.status_code == 400 and "think" in bad.json()["error"]


def test_responses_reasoning_item(server):
    srv, model = server
    body = {"model": model, "input": "Hi", "reasoning": {"effort": "medium", "summary": "auto"}}
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        r = c.post("/v1/responses", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert [o["type"] for o in out["output"]] == ["reasoning", "message"]
        assert out["output"][0]["content"][0]["text"].strip() == THOUGHT
        assert out["output"][1]["content"][0]["text"].strip() == ANSWER
        assert out["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
        with c.stream("POST", "/v1/responses", json={**body, "stream": True}) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = [e for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(e["delta"] for e in deltas).strip() == THOUGHT and {e["output_index"] for e in deltas} == {0}
    texts = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in texts).strip() == ANSWER and {e["output_index"] for e in texts} == {1}
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]["output"]
    assert [o["type"] for o in final] == ["reasoning", "message"]
    bad = httpx.post(srv.url + "/v1/responses", json={**body, "reasoning": {"effort": "extreme"}}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"
