"""A hostile RPC worker gets a clear error, quickly (issue 34, finding 7): a device count of 0xFFFFFFFF, answers of
the wrong size, a worker that dribbles its answer, as `probe_worker` and as `ggufdesk run --rpc`."""
from __future__ import annotations

import struct
import time

import pytest

from ggufdesk.core import rpc_wire
from tests.core.test_distributed import read_request, serve_once

HELLO = bytes([rpc_wire.PROTO_MAJOR, 0, 0]) + bytes(rpc_wire.CONN_CAPS - 3)


def answer(conn, payload: bytes) -> None:
    conn.sendall(struct.pack("<Q", len(payload)) + payload)


def worker(*answers: bytes, forever: bytes | None = None):
    """A worker that says hello, then gives these answers in order (then `forever` to every request)."""
    def handler(conn) -> None:
        read_request(conn)
        answer(conn, HELLO)
        for a in answers:
            read_request(conn)
            answer(conn, a)
        while forever is not None:
            try:
                read_request(conn)
                answer(conn, forever)
            except (OSError, struct.error):
                return
    return serve_once(handler)


def probe(ep: str) -> tuple[str, float]:
    t0 = time.monotonic()
    with pytest.raises(rpc_wire.WorkerDown) as e:
        rpc_wire.probe_worker(ep, timeout=2, budget=5)
    return str(e.value), time.monotonic() - t0


def test_a_worker_claiming_four_billion_devices_is_refused_at_once():
    ep, t = worker(struct.pack("<I", 0xFFFFFFFF), forever=struct.pack("<QQ", 1, 1))
    msg, took = probe(ep)
    assert "4294967295 devices" in msg and took < 5
    t.join(5)


@pytest.mark.parametrize("reply", [b"\x01\x00", b"", b"\x00" * 5])
def test_a_device_count_of_the_wrong_size_is_a_clear_error(reply):
    ep, t = worker(reply)
    msg, _ = probe(ep)
    assert f"malformed message of {len(reply)} bytes (4 bytes expected)" in msg and "unpack" not in msg
    t.join(5)


def test_a_device_memory_of_the_wrong_size_is_a_clear_error():
    ep, t = worker(struct.pack("<I", 1), b"\x00" * 8)
    msg, _ = probe(ep)
    assert "(16 bytes expected)" in msg
    t.join(5)


def test_a_worker_that_dribbles_its_answer_is_cut_off_at_the_budget():
    def handler(conn) -> None:
        read_request(conn)
        answer(conn, HELLO)
        read_request(conn)
        conn.sendall(struct.pack("<Q", 4))
        for b in struct.pack("<I", 1) * 100:  # one byte per second: under the per-answer timeout, for ever
            time.sleep(1.0)
            try:
                conn.sendall(bytes([b]))
            except OSError:
                return

    ep, t = serve_once(handler)
    t0 = time.monotonic()
    with pytest.raises(rpc_wire.WorkerDown, match="in time"):
        rpc_wire.probe_worker(ep, timeout=2, budget=2.5)
    assert time.monotonic() - t0 < 30
    t.join(10)


def test_run_with_a_hostile_worker_says_so_and_exits(tiny_model, capsys):
    from ggufdesk.cli import main

    ep, t = worker(struct.pack("<I", 0xFFFFFFFF), forever=struct.pack("<QQ", 1, 1))
    t0 = time.monotonic()
    rc = main(["run", str(tiny_model), "--prompt", "hi", "--max-tokens", "2", "--rpc", ep])
    err = capsys.readouterr().err
    assert rc != 0 and "devices" in err and "internal error" not in err, err
    assert time.monotonic() - t0 < 60
    t.join(5)
