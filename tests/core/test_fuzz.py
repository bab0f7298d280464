"""Fuzzing (Hypothesis, derandomized so it cannot flake): thousands of mutated GGUF headers and engine
protocol lines; the readers answer with our clear errors only, in bounded time and memory."""
from __future__ import annotations

import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import parse_header, read_gguf
from ggufdesk.engine.link import protocol as P
from tests.fixtures import hostile

SEED = hostile.valid_small()
HEADER_LEN = len(hostile.header(hostile.llama_kvs(), hostile.small_tensors()))


def fuzz(n: int) -> settings:
    return settings(derandomize=True, max_examples=n, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def _mutate(data: bytes, edits: list[tuple[int, int, bytes]], cut: int | None) -> bytes:
    b = bytearray(data)
    for pos, kind, chunk in edits:
        pos %= HEADER_LEN  # aim at the header: that is what the reader interprets
        if kind == 0:  # overwrite
            b[pos:pos + len(chunk)] = chunk
        elif kind == 1:  # insert
            b[pos:pos] = chunk
        else:  # delete
            del b[pos:pos + len(chunk) + 1]
    return bytes(b[:cut] if cut is not None else b)


INTERESTING = st.sampled_from([b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff",
                               b"\x01\x00\x00\x00", b"\x09\x00\x00\x00", b"\x08\x00\x00\x00",
                               b"\x00\x00\x80\x7f", b"\x00\x00\xc0\x7f", b"GGUF"])
CHUNKS = st.one_of(st.binary(min_size=1, max_size=8), INTERESTING)
EDITS = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 2), CHUNKS), min_size=1, max_size=6)


@fuzz(1000)
@given(edits=EDITS, cut=st.none() | st.integers(0, len(SEED)))
def test_gguf_reader_survives_mutations(tmp_path_factory, edits, cut):
    data = _mutate(SEED, edits, cut)
    try:
        parse_header(io.BytesIO(data), label="fuzz", limit=1 << 20)
    except KnownError:
        pass
    path = tmp_path_factory.getbasetemp() / "fuzz.gguf"
    path.write_bytes(data)
    try:
        info = read_gguf(path)
    except KnownError:
        return
    assert info.n_layer >= 1 and all(t.n_bytes > 0 for t in info.tensors)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=12)
TYPES = sorted(P._ALL) + ["", "nope"]


@fuzz(300)
@given(kind=st.sampled_from(TYPES), fields=st.dictionaries(
    st.sampled_from(["id", "model", "settings", "prompt", "messages", "sampling", "text", "kind",
                     "message", "pid", "x", "type"]), JSON_VALUES, max_size=5))
def test_protocol_decode_structured(kind, fields):
    line = json.dumps({"type": kind, **fields})
    try:
        msg = P.decode(line)
    except P.ProtocolError:
        return
    assert msg.TYPE == kind


@fuzz(300)
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200),
                     st.integers(1, 50_000).map(lambda n: "[" * n), st.integers(1, 50_000).map(lambda n: "{\"a\":" * n)))
def test_protocol_decode_garbage(raw):
    try:
        P.decode(raw)
    except P.ProtocolError:
        pass
