"""Chat completions that name a document collection ("docs": NAME) get its sources and return citations."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ggufdesk.core.docs.indexer import Indexer
from ggufdesk.core.docs.store import Collection
from tests.server.test_service import InProcess

CHAT = {"model": "fake-model", "max_tokens": 8}


@pytest.fixture
def server(tmp_path):
    docs = tmp_path / "notes"
    docs.mkdir()
    (docs / "otters.md").write_text("# Otters\n\nRiver otters eat mostly fish and crayfish.\n", encoding="utf-8")
    (docs / "herons.md").write_text("# Herons\n\nGrey herons nest in colonies.\n", encoding="utf-8")
    with Collection.open("nature", create=True) as coll:
        Indexer(coll).run([docs])
    s = InProcess()
    yield s
    s.close()


def ask(question: str, **extra) -> dict:
    return dict(CHAT, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": question}],
                **extra)


def test_a_request_naming_a_collection_gets_its_sources_and_citations(server):
    r = httpx.post(server.url + "/v1/chat/completions", json=ask("What do otters eat?", docs="nature"), timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    cites = body["citations"]
    assert [Path(c["source"]).name for c in cites] == ["otters.md"]
    assert cites[0]["index"] == 1 and cites[0]["lines"] == [1, 3] and "crayfish" in cites[0]["text"]
    assert body["sources_left_out"] == []
    # the fake engine echoes the user message it was given: the sources went into it
    assert "Echo: Answer the question using the numbered sources" in body["choices"][0]["message"]["content"]


def test_streaming_sends_the_citations_in_a_chunk_before_done(server):
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json=ask("Where do herons nest?", docs="nature", stream=True), timeout=30) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    cited = chunks[-1]
    assert cited["choices"] == [] and [Path(c["source"]).name for c in cited["citations"]] == ["herons.md"]
    assert cited["id"] == chunks[0]["id"] and cited["object"] == "chat.completion.chunk"
    assert all("citations" not in c for c in chunks[:-1])


def test_the_openai_sdk_reads_the_answer_and_keeps_the_extra_field(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    out = client.chat.completions.create(model="fake-model", max_tokens=8, extra_body={"docs": "nature"},
                                         messages=[{"role": "user", "content": "What do otters eat?"}])
    assert out.choices[0].message.content
    assert out.model_extra["citations"][0]["source"].endswith("otters.md")


def test_requests_without_docs_are_untouched(server):
    r = httpx.post(server.url + "/v1/chat/completions", json=ask("What do otters eat?"), timeout=30)
    assert r.status_code == 200 and "citations" not in r.json()
    assert r.json()["choices"][0]["message"]["content"].startswith("Echo: What do otters eat?")


@pytest.mark.parametrize("extra, status, text", [
    ({"docs": "nope"}, 404, "no document collection 'nope'"),
    ({"docs": "../etc"}, 400, "not a collection name"),
    ({"docs": 7}, 400, "not a collection name"),
])
def test_a_bad_collection_is_refused_in_openais_shape(server, extra, status, text):
    r = httpx.post(server.url + "/v1/chat/completions", json=ask("x", **extra), timeout=30)
    assert r.status_code == status and text in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "docs"


def test_docs_without_a_user_message_is_refused(server):
    body = dict(CHAT, docs="nature", messages=[{"role": "system", "content": "only this"}])
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and "user message" in r.json()["error"]["message"]


def test_a_body_too_large_is_still_refused_by_the_route(server):
    big = ask("x" * (5 * 1024 * 1024), docs="nature")
    r = httpx.post(server.url + "/v1/chat/completions", json=big, timeout=60)
    assert r.status_code == 413


def test_a_deeply_nested_body_naming_docs_is_left_to_the_route(server):
    body = '{"docs": "nature", "model": "fake-model", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(server.url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400
