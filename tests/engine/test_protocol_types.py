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


# ---- settings travel as their dataclasses, validated from the annotations (issue 30) ----------


def test_settings_dataclasses_round_trip():
    from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings

    load = P.Load(id="l", model="/m", settings=LoadSettings(n_ctx=512, flash_attn="on", type_v="q8_0"),
                  speculation=SpeculationSettings(mode="lookup", k_max=8))
    gen = P.Generate(id="r", prompt="x", sampling=SamplingSettings(temperature=0, stop=["\n"], think="off"))
    assert P.decode(P.encode(load)) == load
    assert P.decode(P.encode(gen)) == gen
    assert isinstance(P.decode(P.encode(load)).settings, LoadSettings)  # type: ignore[union-attr]


@pytest.mark.parametrize(("data", "names"), [
    ({"type": "load", "model": "/m", "settings": {"n_ctx": "4096"}}, "settings.n_ctx"),  # no "12" for 12
    ({"type": "load", "model": "/m", "settings": {"flash_attn": "maybe"}}, "settings.flash_attn"),
    ({"type": "load", "model": "/m", "settings": {"type_k": 8}}, "settings.type_k"),
    ({"type": "load", "model": "/m", "settings": {"use_mmap": "yes"}}, "settings.use_mmap"),
    ({"type": "load", "model": "/m", "settings": {"n_ctx": 1}}, "n_ctx"),  # the dataclass's own check
    ({"type": "load", "model": "/m", "settings": {"n_ubatch": 1024, "n_batch": 512}}, "n_ubatch"),
    ({"type": "load", "model": "/m", "settings": "fast"}, "settings"),
    ({"type": "load", "model": "/m", "speculation": {"mode": "telepathy"}}, "speculation.mode"),
    ({"type": "load", "model": "/m", "speculation": {"k_min": 9, "k_max": 4}}, "K min"),
    ({"type": "generate", "id": "r", "sampling": {"temperature": "hot"}}, "sampling.temperature"),
    ({"type": "generate", "id": "r", "sampling": {"temperature": 99}}, "temperature"),
    ({"type": "generate", "id": "r", "sampling": {"think": "hard"}}, "sampling.think"),
    ({"type": "generate", "id": "r", "sampling": {"stop": "\n"}}, "sampling.stop"),
    ({"type": "generate", "id": "r", "sampling": {"max_tokens": None}}, "sampling.max_tokens"),
    ({"type": "generate", "id": "r", "logprobs": 2.5}, "logprobs"),
    ({"type": "load", "settings": {}}, "model"),  # missing
])
def test_nonsense_settings_on_the_wire_name_the_field(data, names):
    with pytest.raises(P.ProtocolError, match=f"bad {data['type']} message") as e:
        P.decode(json.dumps(data))
    assert names in str(e.value)


def test_unknown_fields_are_refused_in_messages_and_settings():
    # both ends are the same version: a field one does not know is a bug, named
    with pytest.raises(P.ProtocolError, match="newer_knob"):
        P.decode(json.dumps({"type": "load", "model": "/m", "settings": {"n_ctx": 256, "newer_knob": True}}))
    with pytest.raises(P.ProtocolError, match="future"):
        P.decode(json.dumps({"type": "load", "model": "/m", "future": 1}))


def test_a_type_that_is_not_first_still_decodes():
    assert P.decode('{"id": "p", "type": "pong"}') == P.Pong(id="p")
    with pytest.raises(P.ProtocolError, match="unknown message"):
        P.decode('{"id": "p"}')


def test_settings_of_takes_dataclasses_dicts_and_none():
    from ggufdesk.core.errors import SettingsError
    from ggufdesk.core.settings import LoadSettings

    assert P.settings_of(LoadSettings, None) == LoadSettings()
    assert P.settings_of(LoadSettings, {"n_ctx": 256}).n_ctx == 256
    with pytest.raises(SettingsError, match="no_such"):
        P.settings_of(LoadSettings, {"no_such": 1})
    with pytest.raises(SettingsError, match="n_ctx"):
        P.settings_of(LoadSettings, {"n_ctx": 0})
