"""Worker lists, the layer split over workers, and the RPC probe against broken and hostile servers."""
from __future__ import annotations

import socket
import struct
import threading

import pytest

from ggufdesk.core import distributed, gguf_meta, rpc_wire
from ggufdesk.core.errors import SettingsError
from ggufdesk.core.hardware import CPUInfo, HardwareInfo
from ggufdesk.core.rpc_wire import WorkerInfo
from ggufdesk.core.settings import LoadSettings, Settings

MiB = 1 << 20
GiB = 1 << 30


@pytest.mark.parametrize("text, want", [
    ("127.0.0.1:50052", "127.0.0.1:50052"), (" box.lan:1 ", "box.lan:1"), ("[::1]:8080", "[::1]:8080"),
])
def test_endpoints_are_parsed(text, want):
    assert rpc_wire.parse_endpoint(text) == want


@pytest.mark.parametrize("bad", ["", "host", "host:", ":50052", "host:0", "host:70000", "host:12ab",
                                 "a b:1", "-x:1", 5, None])
def test_bad_endpoints_are_refused_with_the_form_to_use(bad):
    with pytest.raises(SettingsError, match="host:port"):
        rpc_wire.parse_endpoint(bad)


def test_worker_lists_in_settings_are_checked():
    assert LoadSettings(rpc=["a:1", "b:2"]).rpc == ["a:1", "b:2"]
    assert distributed.parse_workers("a:1, b:2,") == ["a:1", "b:2"]
    with pytest.raises(SettingsError, match="listed twice"):
        LoadSettings(rpc=["a:1", "a:1"])
    with pytest.raises(SettingsError, match="host:port"):
        LoadSettings(rpc=["a"])
    with pytest.raises(SettingsError, match="list"):
        LoadSettings(rpc="a:1")
    s = Settings.from_dict({"load": {"rpc": ["10.0.0.2:50052"]}})
    assert Settings.from_dict(s.to_dict()).load.rpc == ["10.0.0.2:50052"]


def hw(ram_available: int = 64 * GiB) -> HardwareInfo:
    cpu = CPUInfo(name="test", arch="x86_64", cores_physical=2, cores_logical=2, flags=("avx2",))
    return HardwareInfo(gpus=(), cpu=cpu, ram_total=max(ram_available, 2 * GiB), ram_available=ram_available,
                        ram_bandwidth_gbs=20.0, ram_bandwidth_source="assumed")


def worker(ep: str, free: int, rtt: float = 0.001, gbs: float = 1.0) -> WorkerInfo:
    return WorkerInfo(endpoint=ep, version="7.0.0", devices=[(free, free)], rtt_s=rtt, link_gbs=gbs)


@pytest.fixture
def info(tiny_model):
    return gguf_meta.read_gguf(str(tiny_model))


def test_layers_go_to_workers_by_free_memory_and_llama_cpp_counts_match(info):
    cb = distributed.planner.compute_buffer(info, n_ctx=512, n_ubatch=64, flash=True)
    room = cb + distributed.WORKER_MARGIN
    sp = distributed.split(info, hw(), [worker("a:1", room + 10 * MiB), worker("b:1", room + 30 * MiB)],
                           n_ctx=512, n_ubatch=64)
    assert sp.fits and sp.n_gpu_layers == info.n_layer + 1 and sp.cpu_layers == 0
    a, b = sp.places
    assert a.layers and b.layers and max(a.layers) < min(b.layers)  # contiguous, in device order
    assert sp.tensor_split == [float(len(a.layers)), float(len(b.layers))]
    assert info.n_layer in b.layers  # the output layer is the last offloaded one
    assert 0 < sp.pred_decode_tok_s < sp.pred_local_tok_s  # the network costs something


def test_what_the_workers_cannot_hold_stays_local(info):
    cb = distributed.planner.compute_buffer(info, n_ctx=512, n_ubatch=64, flash=True)
    costs = distributed._layer_costs(info, distributed.planner.kv_bytes_per_layer(info, 512, n_ubatch=64))
    small = cb + distributed.WORKER_MARGIN + costs[-1] + 1  # room for the output layer only
    sp = distributed.split(info, hw(), [worker("a:1", small)], n_ctx=512, n_ubatch=64)
    assert sp.fits and sp.n_gpu_layers == 1 and sp.cpu_layers == info.n_layer
    sp = distributed.split(info, hw(), [worker("a:1", cb)], n_ctx=512, n_ubatch=64)
    assert sp.n_gpu_layers == 0 and any("gets no layers" in n for n in sp.notes)


def test_too_little_everywhere_says_what_is_missing(info):
    sp = distributed.split(info, hw(ram_available=0), [], n_ctx=512, n_ubatch=64)
    assert not sp.fits and any("more RAM" in n for n in sp.notes)


def test_a_slow_link_lowers_the_prediction(info):
    fast = distributed.split(info, hw(), [worker("a:1", GiB, rtt=0.0001, gbs=10)], n_ctx=512, n_ubatch=64)
    slow = distributed.split(info, hw(), [worker("a:1", GiB, rtt=0.01, gbs=0.01)], n_ctx=512, n_ubatch=64)
    assert slow.network_s_per_token > fast.network_s_per_token
    assert slow.pred_decode_tok_s < fast.pred_decode_tok_s


# ---- the wire probe against servers that are not well-behaved ggml workers ------------------------


def serve_once(handler) -> tuple[str, threading.Thread]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            try:
                handler(conn)
            except OSError:
                pass  # the client hung up: what a hostile-worker test ends with
        srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return f"127.0.0.1:{srv.getsockname()[1]}", t


def recv_exactly(conn, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:  # the client closed: recv returns b"" at once, forever (a loop here spun a core
            raise ConnectionError("the client closed the connection")  # for the rest of the test run)
        data += chunk
    return data


def read_request(conn) -> tuple[int, bytes]:
    cmd, size = struct.unpack("<BQ", recv_exactly(conn, 9))
    return cmd, recv_exactly(conn, size)


def test_nobody_listening_names_the_worker():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    ep = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    with pytest.raises(rpc_wire.WorkerDown, match=ep.replace(".", r"\.")):
        rpc_wire.probe_worker(ep, timeout=2)
    assert not rpc_wire.reachable(ep)


def test_a_silent_server_is_reported_busy_not_hung():
    release = threading.Event()
    ep, t = serve_once(lambda conn: release.wait(10))
    with pytest.raises(rpc_wire.WorkerBusy, match="another engine"):
        rpc_wire.probe_worker(ep, timeout=0.5)
    release.set()
    t.join(5)


def test_a_server_that_hangs_up_is_down():
    ep, t = serve_once(lambda conn: read_request(conn))
    with pytest.raises(rpc_wire.WorkerDown, match="closed the connection"):
        rpc_wire.probe_worker(ep, timeout=2)
    t.join(5)


def test_another_protocol_version_is_refused_plainly():
    def handler(conn) -> None:
        cmd, body = read_request(conn)
        assert cmd == rpc_wire.CMD_HELLO and len(body) == rpc_wire.CONN_CAPS
        rsp = bytes([6, 0, 0, 0]) + bytes(rpc_wire.CONN_CAPS)
        conn.sendall(struct.pack("<Q", len(rsp)) + rsp)

    ep, t = serve_once(handler)
    with pytest.raises(rpc_wire.WorkerDown, match="protocol 6.0.0"):
        rpc_wire.probe_worker(ep, timeout=2)
    t.join(5)


def test_a_huge_announced_answer_is_refused_without_reading_it():
    def handler(conn) -> None:
        read_request(conn)
        conn.sendall(struct.pack("<Q", 1 << 40))

    ep, t = serve_once(handler)
    with pytest.raises(rpc_wire.WorkerDown, match="malformed"):
        rpc_wire.probe_worker(ep, timeout=2)
    t.join(5)


def closed_endpoint() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    ep = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    return ep


@pytest.mark.parametrize("ram, fits", [(64 * GiB, True), (0, False)])
def test_after_a_lost_worker_reload_locally_only_if_it_fits(tiny_model, monkeypatch, ram, fits):
    from ggufdesk.core import hardware

    monkeypatch.setattr(hardware, "probe", lambda **kw: hw(ram_available=ram))
    ep = closed_endpoint()
    note, settings = distributed.after_worker_loss(str(tiny_model), {"n_ctx": 512, "rpc": [ep]})
    assert f"lost RPC worker {ep}" in note
    if fits:
        assert "reloading on this machine alone" in note and settings["rpc"] == [] and settings["n_ctx"] == 512
    else:
        assert settings is None
        assert "does not fit on this machine alone" in note and "more RAM" in note and "start the worker" in note


def test_no_lost_worker_no_note(tiny_model):
    assert distributed.after_worker_loss(str(tiny_model), {"rpc": []}) == ("", {"rpc": []})
