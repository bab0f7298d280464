"""Embeddings in the real engine: a chat model (mean-pooled through its KV cache) and a tiny BERT (llama.cpp's pooling)."""
from __future__ import annotations

import math

import pytest

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient, EngineError
from tests.engine.conftest import TINY_LOAD
from tests.engine.helpers import collect, greedy
from tests.fixtures import ggufs

TEXTS = ["hello cat", "the dog was in the red house", "water and fire", "hello cat"]


def norm(v: list[float]) -> float:
    return math.sqrt(math.fsum(x * x for x in v))


def cosine(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b))


def test_vectors_are_unit_length_deterministic_and_batch_equals_singles(engine):
    e = engine.embeddings(TEXTS)
    assert e.pooling == "mean" and len(e.vectors) == 4 and e.n_tokens[0] == e.n_tokens[3] > 1
    assert len(e.vectors[0]) == engine.loaded.n_embd == 64
    assert all(abs(norm(v) - 1) < 1e-9 for v in e.vectors)
    assert e.vectors[0] == e.vectors[3]  # the same text, twice in one batch
    assert e.n_decode >= 4  # each input its own decode calls (/metrics' llamacpp:n_decode_total)
    singles = [engine.embed([t])[0] for t in TEXTS]
    assert singles == e.vectors  # exactly: each input is decoded alone, in a cleared cache
    assert engine.embed(TEXTS) == e.vectors  # and again, after generations and other inputs
    assert cosine(e.vectors[0], e.vectors[1]) < 0.999  # different texts, different vectors


def test_token_ids_are_embedded_like_text(engine):
    ids = [1, 300, 301, 302]
    a = engine.embed([ids])[0]
    assert abs(norm(a) - 1) < 1e-9 and engine.embed([ids])[0] == a
    with pytest.raises(EngineError) as err:
        engine.embed([[1, 10**9]])
    assert err.value.event.kind == "settings" and "token ids" in str(err.value)


def test_too_long_input_is_refused_or_truncated(engine):
    long = "the cat " * 400  # well past the 512-token context of the fixture
    with pytest.raises(EngineError) as err:
        engine.embed([long])
    assert err.value.event.kind == "context" and "at most 512" in str(err.value)
    e = engine.embeddings([long, "hello"], truncate=True)
    assert e.n_tokens[0] == 512 and e.truncated == [True, False]
    assert abs(norm(e.vectors[0]) - 1) < 1e-9


def test_bad_requests_are_settings_errors(engine):
    for inputs in ([], [3.5], [["a"]], ["ok", {"x": 1}]):
        rid = engine.start_embed(inputs)  # type: ignore[arg-type]
        events = list(engine.stream(rid, timeout=60))
        last = events[-1]
        assert isinstance(last, P.Error), inputs
        # a wrong type is refused by the typed protocol (naming the field), an empty list by the engine
        assert (last.kind, "inputs" in last.message) in (("settings", True), ("settings", False), ("protocol", True)), \
            (inputs, last)
    assert engine.embed(["still fine"])  # the engine lives on


def test_embeddings_interleave_with_a_running_generation(engine):
    rid = engine.generate(prompt="the cat and the dog", sampling=greedy(40))
    vectors = engine.embed(TEXTS[:2])
    r = collect(engine, rid)
    assert r.error is None and r.done.finish_reason == "length" and r.tokens > 0
    assert vectors == engine.embed(TEXTS[:2])


def test_a_cancelled_embedding_request_ends_with_cancelled(engine):
    # each input fits the embedding context (a longer one is refused before the cancel may be read)
    rid = engine.start_embed(["the cat " * 60] * 200)
    engine.cancel(rid)
    events = list(engine.stream(rid, timeout=60))
    assert isinstance(events[-1], P.Done) and events[-1].finish_reason == "cancelled"
    assert engine.embed(["after the cancel"])


def test_embed_works_with_an_event_listener_too(tiny_model):
    seen: list[P.Event] = []
    client = EngineClient(on_event=seen.append)
    try:
        client.start()
        client.load(str(tiny_model), settings=TINY_LOAD)
        v = client.embed(["hello cat"])
        assert len(v) == 1 and abs(norm(v[0]) - 1) < 1e-9
        assert not any(isinstance(ev, P.Embeddings) for ev in seen)  # the blocking call took its answer
    finally:
        client.shutdown()


def test_embedding_without_a_model_is_an_error():
    client = EngineClient()
    try:
        client.start()
        with pytest.raises(EngineError, match="no model is loaded"):
            client.embed(["hello"])
    finally:
        client.shutdown()
    with pytest.raises(KnownError):
        client.embed(["after shutdown"])


@pytest.fixture(scope="module")
def bert(model_dir):
    path = ggufs.write_tiny_bert(model_dir / "tiny-bert.gguf")
    cls = ggufs.write_tiny_bert(model_dir / "tiny-bert-cls.gguf", pooling=2)
    client = EngineClient()
    client.start()
    yield client, path, cls
    client.shutdown()


def test_an_embedding_model_uses_its_own_pooling_and_cannot_generate(bert):
    client, path, cls = bert
    ld = client.load(str(path), settings=LoadSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1,
                                                       n_threads_batch=1))
    assert ld.arch == "bert" and ld.embedding_only and ld.n_embd == 64
    e = client.embeddings(TEXTS)
    assert e.pooling == "mean" and all(abs(norm(v) - 1) < 1e-9 for v in e.vectors)
    assert e.vectors[0] == e.vectors[3] and [client.embed([t])[0] for t in TEXTS] == e.vectors
    r = collect(client, client.generate(prompt="hello", sampling=greedy(4)))
    assert r.error is not None and r.error.kind == "settings" and "embedding model" in r.error.message
    client.load(str(cls), settings=LoadSettings(n_ctx=512, n_threads=1, n_threads_batch=1))
    c = client.embeddings(TEXTS[:2])
    assert c.pooling == "cls" and c.vectors[0] != e.vectors[0]


# ---- Tokenize (count_tokens, llama-server's /tokenize, /detokenize, /apply-template) -------------------


def test_tokenize_text_messages_and_back(engine):
    t = engine.tokenize(text="hello cat", with_pieces=True)
    assert t.tokens[0] == 1 and len(t.tokens) == len(t.pieces) > 1  # BOS first
    bare = engine.tokenize(text="hello cat", add_special=False)
    assert bare.tokens == t.tokens[1:]
    assert engine.tokenize(tokens=bare.tokens).text.strip() == "hello cat"
    chat = engine.tokenize(messages=[{"role": "user", "content": "hello cat"}])
    assert "User: hello cat" in chat.text and chat.text.endswith("Assistant:")  # the built-in plain template
    r = collect(engine, engine.generate(messages=[{"role": "user", "content": "hello cat"}], sampling=greedy(2)))
    assert r.done.usage["prompt_tokens"] == len(chat.tokens)  # the same count a generation sees
    with pytest.raises(EngineError) as err:
        engine.tokenize(tokens=[5, -1])
    assert err.value.event.kind == "settings"


def test_a_final_assistant_message_is_continued(engine):
    msgs = [{"role": "user", "content": "hello cat"}, {"role": "assistant", "content": "the dog"}]
    rendered = engine.tokenize(messages=msgs).text
    assert rendered.endswith("Assistant: the dog")  # no new turn after it
    whole = engine.tokenize(messages=msgs[:1]).text
    assert rendered == whole + " the dog"
