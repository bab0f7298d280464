"""A few commands of ggml's RPC protocol in pure Python: is a worker up, its memory, the link's speed.

llama.cpp's own client calls abort() when a worker cannot be reached (ggml-rpc.cpp `GGML_ABORT("Failed
to connect ...")`), so we ask first, with timeouts, and name the worker that does not answer.
Wire format (ggml/src/ggml-rpc/ggml-rpc.cpp, protocol 7.x): request = command byte, u64 size, payload;
response = u64 size, payload. HELLO (14) must come first. A worker serves one client at a time: while
an engine holds the connection, a second client is accepted only when the first one leaves.

A worker is a program on the network, so nothing it says is trusted (issue 34): every answer must have
its command's exact size, a device count is at most MAX_DEVICES, and one probe has a total deadline
besides the per-answer timeout (a worker dribbling bytes cannot hold it longer than that).
"""
from __future__ import annotations

import re
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from ggufdesk.core.errors import KnownError, SettingsError

PROTO_MAJOR = 7
CMD_ALLOC_BUFFER = 0
CMD_BUFFER_GET_BASE = 3
CMD_FREE_BUFFER = 4
CMD_SET_TENSOR = 6
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CONN_CAPS = 24  # rpc_msg_hello_req: conn_caps[24]; all zero = plain TCP
TENSOR_SIZE = 296  # sizeof(struct rpc_tensor), packed
GGML_TYPE_I8 = 24
MAX_DEVICES = 64  # devices one worker may report (ggml's RPC server serves one backend device per process)
PROBE_BUDGET_S = 20.0  # one whole probe_worker, link measurement included
_HOST = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)$")


def parse_endpoint(text: str) -> str:
    """'host:port' checked (a hostname, IPv4 or [IPv6], port 1-65535); raises SettingsError."""
    if not isinstance(text, str):
        raise SettingsError(f"an RPC worker must be written host:port, got {text!r}")
    s = text.strip()
    host, sep, port = s.rpartition(":")
    if not sep or not host or not _HOST.match(host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise SettingsError(f"an RPC worker must be written host:port (port 1-65535), got {text!r}")
    return f"{host}:{int(port)}"


def parse_workers(spec: str | list[str] | None) -> list[str]:
    """'a:1,b:2' or ['a:1', 'b:2'] -> checked endpoints, duplicates refused."""
    if not spec:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = [parse_endpoint(x) for x in items if not (isinstance(x, str) and not x.strip())]
    dup = {e for e in out if out.count(e) > 1}
    if dup:
        raise SettingsError(f"RPC worker listed twice: {', '.join(sorted(dup))}")
    return out


class WorkerDown(KnownError):
    """A worker cannot be reached (refused, timed out, not an RPC server)."""

    def __init__(self, endpoint: str, why: str) -> None:
        super().__init__(f"RPC worker {endpoint} is not reachable: {why}")
        self.endpoint = endpoint


class WorkerBusy(WorkerDown):
    """The worker accepted the connection but serves another client (it serves one at a time)."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(slots=True, kw_only=True)
class WorkerInfo:
    """What one worker offers and how fast the link to it is."""

    endpoint: str
    version: str
    devices: list[tuple[int, int]] = field(default_factory=list)  # (free, total) bytes per device
    rtt_s: float = 0.0  # median round trip of a small command
    link_gbs: float = 0.0  # measured bulk transfer rate (0 = not measured)

    @property
    def memory_free(self) -> int:
        return sum(f for f, _ in self.devices)

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "version": self.version,
                "devices": [{"memory_free": f, "memory_total": t} for f, t in self.devices],
                "rtt_ms": round(self.rtt_s * 1e3, 3), "link_gbs": round(self.link_gbs, 3)}


class RpcConnection:
    """One connection to a worker, speaking just enough of the protocol for probing."""

    def __init__(self, endpoint: str, *, timeout: float = 3.0, budget: float | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.deadline = time.monotonic() + (budget if budget is not None else max(PROBE_BUDGET_S, timeout))
        host, port = split_endpoint(endpoint)
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise WorkerDown(endpoint, e.strerror or str(e)) from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            rsp = self.call(CMD_HELLO, bytes(CONN_CAPS))
        except WorkerDown as e:
            self.close()
            if "timed out" in str(e):
                raise WorkerBusy(endpoint, "it accepted the connection but did not answer in "
                                 f"{timeout:g} s (is another engine using it?)") from None
            raise
        if len(rsp) < 3 or rsp[0] != PROTO_MAJOR:
            self.close()
            got = ".".join(str(b) for b in rsp[:3]) or "nothing"
            raise WorkerDown(endpoint, f"speaks RPC protocol {got}, this llama.cpp needs {PROTO_MAJOR}.x "
                             "(run the same ggufdesk/llama.cpp version on every machine)")
        self.version = ".".join(str(b) for b in rsp[:3])

    def send(self, cmd: int, payload: bytes = b"") -> None:
        try:
            self.sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
        except OSError as e:
            raise WorkerDown(self.endpoint, e.strerror or str(e)) from None

    def call(self, cmd: int, payload: bytes = b"", *, expect: int | None = None) -> bytes:
        """Send a command and read its answer; `expect`: the answer's exact size (anything else is refused)."""
        self.send(cmd, payload)
        size = struct.unpack("<Q", self._recv(8))[0]
        if size > 1 << 20 or (expect is not None and size != expect):
            want = f" ({expect} bytes expected)" if expect is not None else ""
            raise WorkerDown(self.endpoint, f"it answered with a malformed message of {size} bytes{want}")
        return self._recv(size)

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        late = WorkerDown(self.endpoint, "it did not finish answering in time (timed out)")
        while len(buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise late
            try:
                self.sock.settimeout(min(self.timeout, left))
                chunk = self.sock.recv(n - len(buf))
            except TimeoutError:
                raise (late if left < self.timeout else WorkerDown(self.endpoint, "timed out")) from None
            except OSError as e:
                raise WorkerDown(self.endpoint, e.strerror or str(e)) from None
            if not chunk:
                raise WorkerDown(self.endpoint, "it closed the connection")
            buf += chunk
        return bytes(buf)

    def device_count(self) -> int:
        count: int = struct.unpack("<I", self.call(CMD_DEVICE_COUNT, expect=4))[0]
        if count > MAX_DEVICES:
            raise WorkerDown(self.endpoint, f"it claims {count} devices (at most {MAX_DEVICES} are believed)")
        return count

    def device_memory(self, device: int) -> tuple[int, int]:
        free, total = struct.unpack("<QQ", self.call(CMD_GET_DEVICE_MEMORY, struct.pack("<I", device), expect=16))
        return free, total

    def link_gbs(self, nbytes: int = 4 << 20) -> float:
        """Send nbytes into a scratch buffer on device 0 and time it (GB/s, round trip excluded)."""
        remote, size = struct.unpack("<QQ", self.call(CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, nbytes), expect=16))
        if not remote or size < nbytes:
            return 0.0
        try:
            base = struct.unpack("<Q", self.call(CMD_BUFFER_GET_BASE, struct.pack("<Q", remote), expect=8))[0]
            t0 = time.perf_counter()
            self.device_memory(0)
            rtt = time.perf_counter() - t0
            t0 = time.perf_counter()
            self.send(CMD_SET_TENSOR, _tensor(remote, base, nbytes) + b"\0" + struct.pack("<Q", 0) + bytes(nbytes))
            self.device_memory(0)  # answers once the data is in
            dt = max(time.perf_counter() - t0 - rtt, 1e-6)
            return nbytes / dt / 1e9
        finally:
            self.send(CMD_FREE_BUFFER, struct.pack("<Q", remote))
            self.device_memory(0)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _tensor(buffer: int, data: int, nbytes: int) -> bytes:
    """A packed rpc_tensor: a 1-D I8 tensor of nbytes at `data` in remote `buffer`."""
    t = struct.pack("<QIQ", 1, GGML_TYPE_I8, buffer)
    t += struct.pack("<4I", nbytes, 1, 1, 1) + struct.pack("<4I", 1, nbytes, nbytes, nbytes)
    t += struct.pack("<I", 0) + bytes(64) + struct.pack("<i", 0) + bytes(8 * 10)
    t += struct.pack("<QQQ", 0, 0, data) + b"probe".ljust(64, b"\0") + struct.pack("<i", 0)
    assert len(t) == TENSOR_SIZE
    return t


def probe_worker(endpoint: str, *, timeout: float = 3.0, measure_link: bool = True,
                 budget: float = PROBE_BUDGET_S) -> WorkerInfo:
    """Connect, check the protocol version, read each device's memory and time the link; WorkerDown for a
    worker that does not answer, answers nonsense, or takes more than `budget` seconds in all."""
    conn = RpcConnection(endpoint, timeout=timeout, budget=budget)
    try:
        n = conn.device_count()
        devices = [conn.device_memory(i) for i in range(n)]
        rtts = []
        for _ in range(5):
            t0 = time.perf_counter()
            conn.device_memory(0)
            rtts.append(time.perf_counter() - t0)
        gbs = conn.link_gbs() if measure_link and n else 0.0
        return WorkerInfo(endpoint=endpoint, version=conn.version, devices=devices,
                          rtt_s=sorted(rtts)[len(rtts) // 2], link_gbs=gbs)
    finally:
        conn.close()


def reachable(endpoint: str, *, timeout: float = 2.0) -> bool:
    """True when the worker answers a HELLO (or is busy with another client, so it is alive)."""
    try:
        RpcConnection(endpoint, timeout=timeout).close()
    except WorkerBusy:
        return True
    except WorkerDown:
        return False
    return True
