"""The typed protocol: kinds are checked on decode, ids are strings, any text can be encoded."""
from __future__ import annotations

import json

import pytest

from ggufdesk.engine.link import protocol as P


def test_every_error_kind_the_engine_and_client_use_is_declared():
    assert {"load", "settings", "template", "draft", "generate", "context", "overloaded", "crash",
            "hung", "protocol", "bug"} <= P.ERROR_KINDS
    assert P.STOP_KINDS <= P.ERROR_KINDS and P.LOAD_NOTICE_KINDS <= P.ERROR_KINDS


@pytest.mark.parametrize("data", [
    {"type": "error", "kind": "oops", "message": "x"},
    {"type": "done", "id": "r", "finish_reason": "tired"},
    {"type": "lifecycle", "state": "dancing"},
    {"type": "token", "id": 7, "text": "x"},
    {"type": ["token"], "id": "r", "text": "x"},
    {"type": "overflow", "id": "r", "policy": "maybe", "truncated_tokens": 3},
])
def test_values_outside_the_literals_are_protocol_errors(data):
    with pytest.raises(P.ProtocolError):
        P.decode(json.dumps(data))


def test_a_deeply_nested_line_is_a_protocol_error():
    with pytest.raises(P.ProtocolError):
        P.decode("[" * 100000 + "]" * 100000)


def test_decode_event_refuses_requests():
    assert isinstance(P.decode_event(P.encode(P.Pong(id="p1"))), P.Pong)
    with pytest.raises(P.ProtocolError, match="not an event"):
        P.decode_event(P.encode(P.Ping(id="p1")))


def test_invalid_unicode_is_encoded_as_replacement_characters():
    bad = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")
    line = P.encode(P.Generate(id="r", prompt=bad))
    line.encode("utf-8")  # always writable
    assert P.decode(line) == P.Generate(id="r", prompt="caf\ufffd \ufffd")


def test_new_messages_round_trip():
    for msg in (P.Ping(id="p"), P.Pong(id="p"), P.Loading(id="l", stage="draft", path="/d.gguf"),
                P.Lifecycle(state="ready", reason="why", restarted=True), P.Load(id="l1", model="/m"),
                P.Unloaded(id="u1"), P.Error(kind="hung", message="m", out_of_memory=False)):
        assert P.decode(P.encode(msg)) == msg
