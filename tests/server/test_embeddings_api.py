"""POST /v1/embeddings with the real `openai` SDK against a live `ggufdesk serve` on the tiny model."""
from __future__ import annotations

import base64
import math
import struct

import httpx
import openai
import pytest

MODEL = "tiny-target"
TEXTS = ["hello cat", "the dog was red", "water and fire"]


@pytest.fixture(scope="module")
def client(served):
    with openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_float_vectors_are_unit_length_and_batch_equals_singles(client):
    r = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert r.object == "list" and r.model == MODEL and [d.index for d in r.data] == [0, 1, 2]
    vectors = [d.embedding for d in r.data]
    assert all(len(v) == 64 and abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-6 for v in vectors)
    singles = [client.embeddings.create(model=MODEL, input=t, encoding_format="float").data[0].embedding
               for t in TEXTS]
    assert singles == vectors
    assert r.usage.prompt_tokens == r.usage.total_tokens > 3


def test_base64_is_little_endian_float32(served, client):
    floats = client.embeddings.create(model=MODEL, input="hello cat", encoding_format="float").data[0].embedding
    raw = httpx.post(served.url + "/v1/embeddings", json={"model": MODEL, "input": "hello cat",
                                                          "encoding_format": "base64"}).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(packed) // 4}f", packed)
    assert len(decoded) == 64 and all(abs(a - b) < 1e-6 for a, b in zip(decoded, floats))
    sdk = client.embeddings.create(model=MODEL, input="hello cat")  # the SDK asks for base64 and decodes it
    assert all(abs(a - b) < 1e-6 for a, b in zip(sdk.data[0].embedding, floats))


def test_token_ids_and_llama_server_paths(served):
    by_ids = httpx.post(served.url + "/embeddings", json={"input": [[1, 300, 301], [1, 302]]}).json()
    assert [d["index"] for d in by_ids["data"]] == [0, 1] and by_ids["usage"]["prompt_tokens"] == 5
    one = httpx.post(served.url + "/v1/embeddings", json={"content": [1, 300, 301]}).json()
    assert one["data"][0]["embedding"] == by_ids["data"][0]["embedding"]


def test_dimensions_other_than_the_models_are_refused(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=MODEL, input="hello", dimensions=16)
    assert "dimensions" in str(err.value)
    same = client.embeddings.create(model=MODEL, input="hello", dimensions=64, encoding_format="float")
    assert len(same.data[0].embedding) == 64


@pytest.mark.parametrize("body", [
    {"model": MODEL}, {"model": MODEL, "input": ""}, {"model": MODEL, "input": []}, {"model": MODEL, "input": 5},
    {"model": MODEL, "input": ["ok", ""]}, {"model": MODEL, "input": ["x"] * 2049},
    {"model": MODEL, "input": [[[1]]]}, {"model": MODEL, "input": "x", "encoding_format": "int8"},
    {"model": MODEL, "input": [[1, 10**9]]}, {"model": MODEL, "input": "the cat " * 2000},
    {"model": MODEL, "input": ["a", 1]}, {"model": 5, "input": "x"},
])
def test_hostile_bodies_are_400_in_openais_shape(served, body):
    r = httpx.post(served.url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_deep_nesting_is_400_and_the_server_lives(served):
    r = httpx.post(served.url + "/v1/embeddings", content=b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                   timeout=60)
    assert r.status_code in (400, 413)
    assert httpx.get(served.url + "/health").status_code == 200
