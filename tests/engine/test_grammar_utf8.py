"""The grammar keeps the output valid UTF-8 byte by byte, on a real vocabulary with byte tokens (tiny
model): a sampled answer that had written the first two bytes of a surrogate's encoding (ED B0) had
no token left that fitted, and the request failed ("no token fits the grammar here"), found by
running random settings against the live loop."""
from __future__ import annotations

import numpy as np
import pytest

from ggufdesk.engine.batching.sampling import make_sampler
from ggufdesk.engine.structured.grammar import GrammarConstraint, schema_to_gbnf
from tests.engine.live import Live
from tests.engine.test_live_speculation import SETTINGS
from tests.fixtures import ggufs


@pytest.fixture(scope="module")
def live(model_dir):
    lv = Live(ggufs.write_tiny_llama(model_dir / "utf8.gguf", ggufs.TinySpec(seed=0)), SETTINGS)
    yield lv
    lv.close()


def byte_token(live: Live, b: int) -> int:
    return next(t for t in range(live.lm.n_vocab) if live.vocab.piece(t) == bytes([b]))


def string_field(live: Live) -> GrammarConstraint:
    """A JSON schema's grammar, its output standing inside the string value of "name"."""
    gbnf = schema_to_gbnf({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})
    c = GrammarConstraint(live.lm.vocab, live.lm.n_vocab, gbnf, piece=live.vocab.piece)
    for t in (byte_token(live, b) for b in b'{"name":"'):  # (a byte a token: no tokenizer's spaces)
        assert c.allows(t)
        c.accept(t)
    return c


def favouring(live: Live, *tokens: int) -> np.ndarray:
    """Logits that rank `tokens` first, in that order."""
    logits = np.zeros(live.lm.n_vocab, dtype=np.float32)
    for i, t in enumerate(tokens):
        logits[t] = 100.0 - i
    return logits


def test_the_second_byte_of_a_surrogate_is_refused_and_a_valid_one_taken(live):
    c = string_field(live)
    ed, b0, x9f, x80 = (byte_token(live, b) for b in (0xED, 0xB0, 0x9F, 0x80))
    assert c.sample(favouring(live, ed), None) == ed  # a lead byte: U+D000-U+D7FF or a surrogate may follow
    assert not c.allows(b0)  # ED B0 ..: a surrogate (U+DC00-U+DFFF), never valid UTF-8
    assert c.allows(x9f)
    assert c.sample(favouring(live, b0, x9f), None) == x9f  # greedy takes the best valid byte
    assert c.sample(favouring(live, x80), None) == x80  # ED 9F 80: U+D7C0, a character
    quote = byte_token(live, ord('"'))
    assert c.allows(quote)  # ... and the string can close after it
    c.close()


def test_a_sampled_answer_never_reaches_a_byte_no_token_can_follow(live):
    """Sampling (the chain, not greedy) after a rejection goes through the masked vocabulary; the
    surrogate's byte is refused there too, and the answer goes on."""
    ed, b0, x9f = (byte_token(live, b) for b in (0xED, 0xB0, 0x9F))
    smp = make_sampler(live.lm, live.sequence("x", 1, temperature=0.8, seed=3).sampling)
    for _ in range(20):  # the surrogate's byte the model's clear favourite every time, from just after ED
        c = string_field(live)
        c.accept(ed)
        try:
            assert c.sample(favouring(live, b0, x9f), smp) != b0
        finally:
            c.close()


def test_a_control_token_the_answer_shows_as_nothing_never_fits_a_string(live):
    """llama.cpp's grammar reads <unk> or <s> as their text, which a string takes; the answer shows
    nothing for them, so a string had passed minLength on characters that were not there (found by the
    random walks of tests/engine/test_schema_walks.py). An end of generation still ends a finished answer."""
    import llama_cpp

    vocab = live.lm.vocab
    hidden = [t for t in range(live.lm.n_vocab) if not live.vocab.piece(t) and not live.vocab.is_eog(t)]
    assert hidden  # <unk>, <s>
    c = string_field(live)
    try:
        assert not any(c.allows(t) for t in hidden)
        greedy = c.sample(favouring(live, *hidden, byte_token(live, ord("a"))), None)
        assert greedy == byte_token(live, ord("a"))
        for b in b'"}':
            c.accept(byte_token(live, b))
        assert c.allows(llama_cpp.llama_vocab_eos(vocab))
    finally:
        c.close()


def takes(live: Live, gbnf: str, text: str) -> bool:
    """Whether the grammar takes `text` byte by byte and then lets the answer end."""
    import llama_cpp

    c = GrammarConstraint(live.lm.vocab, live.lm.n_vocab, gbnf, piece=live.vocab.piece)
    try:
        for b in text.encode():
            t = byte_token(live, b)
            if not c.allows(t):
                return False
            c.accept(t)
        return c.allows(llama_cpp.llama_vocab_eos(live.lm.vocab))
    finally:
        c.close()


def test_named_then_additional_properties_end_or_go_on_after_a_comma(live):
    """Upstream required an additional property after the last optional named one, with no comma:
    {"a":1} could not end, and the answer glued the next key on (found by random walks through tool
    grammars: a Mistral call's arguments that no JSON reader took)."""
    for extra in (True, {"type": "integer"}):
        gbnf = schema_to_gbnf({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}},
                               "additionalProperties": extra})
        for text in ('{"a":1}', '{"a":1,"x":2}', '{"b":null,"x":3,"y":4}', '{"x":5}', '{}', '{"a":1,"b":null,"c":6}'):
            assert takes(live, gbnf, text), (extra, text)
        assert not takes(live, gbnf, '{"a":1"x":2}') and not takes(live, gbnf, '{"a":1,"a":2}')
