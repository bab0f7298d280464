"""Hostile HTTP against a live server (issue 34, findings 4 and 5): DNS rebinding, cross-site posts, CORS,
slow and half-open connections, a flood of connections past the descriptor limit, and the log they make."""
from __future__ import annotations

import resource
import socket
import threading
import time

import httpx
import pytest

from tests.server.hostile_live import HANG_S, MODEL, NORMAL, Watch, during, log_bytes, normal_request, record
from tests.server.serving import ServeProcess

KEY = "k-hostile"
APP = "http://app.example"


@pytest.fixture(scope="module")
def guarded(tiny_model, tmp_path_factory):
    server = ServeProcess(tiny_model, "--ctx", "512", "--parallel", "2", "--temperature", "0",
                          home=tmp_path_factory.mktemp("guard-home"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cors(tiny_model, tmp_path_factory):
    server = ServeProcess(tiny_model, "--ctx", "512", "--parallel", "1", "--temperature", "0", "--api-key", KEY,
                          "--cors-origin", APP, home=tmp_path_factory.mktemp("cors-home"))
    yield server
    server.stop()


def host_port(server) -> tuple[str, int]:
    rest = server.url.split("://", 1)[1]
    host, port = rest.rsplit(":", 1)
    return host, int(port)


# ---- finding 4: DNS rebinding and cross-site requests --------------------------------------------------


@pytest.mark.parametrize("method,path", [("POST", "/v1/chat/completions"), ("GET", "/metrics"), ("GET", "/v1/models"),
                                         ("POST", "/v1/messages"), ("GET", "/health")])
def test_a_foreign_host_header_is_refused(guarded, method, path):
    r = httpx.request(method, guarded.url + path, json=NORMAL if method == "POST" else None,
                      headers={"Host": "attacker.example"}, timeout=HANG_S)
    assert r.status_code == 403 and "Host" in r.text, r.text


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.2", "app.localhost", "[::1]"])
def test_loopback_host_names_are_answered(guarded, host):
    _, port = host_port(guarded)
    r = httpx.get(guarded.url + "/v1/models", headers={"Host": f"{host}:{port}"}, timeout=HANG_S)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("kind", ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x"])
@pytest.mark.parametrize("browser", [{"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "cross-site"},
                                     {"Referer": "http://attacker.example/page"}])
def test_the_posts_a_web_page_may_send_unasked_are_refused(guarded, kind, browser):
    import json

    r = httpx.post(guarded.url + "/v1/chat/completions", content=json.dumps(NORMAL),
                   headers={"Content-Type": kind, **browser}, timeout=HANG_S)
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_curl_d_with_json_in_a_form_type_is_served(guarded):
    """`curl URL -d '{...}'` (Ollama's docs) sends application/x-www-form-urlencoded and no browser header."""
    import json

    r = httpx.post(guarded.url + "/v1/chat/completions", content=json.dumps(NORMAL),
                   headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=HANG_S * 2)
    assert r.status_code == 200, r.text


def test_json_and_a_missing_content_type_are_served(guarded):
    import json

    assert httpx.post(guarded.url + "/v1/chat/completions", content=json.dumps(NORMAL), timeout=HANG_S * 2).status_code == 200
    r = httpx.post(guarded.url + "/v1/chat/completions", content=json.dumps(NORMAL),
                   headers={"Content-Type": "application/json; charset=utf-8"}, timeout=HANG_S * 2)
    assert r.status_code == 200


def test_a_cross_site_origin_is_refused_without_cors(guarded):
    r = httpx.post(guarded.url + "/v1/chat/completions", json=NORMAL, headers={"Origin": "http://evil.example"},
                   timeout=HANG_S)
    assert r.status_code == 403 and "--cors-origin" in r.json()["error"]["message"]
    pre = httpx.options(guarded.url + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}, timeout=HANG_S)
    assert "access-control-allow-origin" not in pre.headers


def test_cors_preflight_is_answered_before_the_key_check(cors):
    pre = httpx.options(cors.url + "/v1/chat/completions", headers={
        "Origin": APP, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"}, timeout=HANG_S)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == APP
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    r = httpx.post(cors.url + "/v1/chat/completions", json=NORMAL, timeout=HANG_S * 2,
                   headers={"Origin": APP, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == APP
    assert httpx.post(cors.url + "/v1/chat/completions", json=NORMAL, headers={"Origin": APP},
                      timeout=HANG_S).status_code == 401  # the key is still needed for the request itself
    other = httpx.options(cors.url + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}, timeout=HANG_S)
    assert "access-control-allow-origin" not in other.headers


# ---- finding 5: slow and half-open connections ---------------------------------------------------------


def descriptor_limit(n: int):
    """For preexec_fn: the child may open n descriptors, soft and hard (it cannot raise them)."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


@pytest.fixture
def fd_starved(tiny_model, tmp_path):
    """A server whose process may open only 256 descriptors (fewer than the attack's sockets; a typical
    desktop soft limit is 1024), reading requests under a 3 s deadline."""
    server = ServeProcess(tiny_model, "--ctx", "512", "--parallel", "2", "--temperature", "0",
                          "--read-timeout", "3", home=tmp_path / "home", preexec_fn=descriptor_limit(256))
    yield server
    server.stop()


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


class Slowloris:
    """n connections that each send a request head byte by byte and never finish it (some send garbage,
    which uvicorn logs); a connection the server closes is opened again, as an attacker would."""

    def __init__(self, server, n: int) -> None:
        self.addr = host_port(server)
        self.n = n
        self.stop = threading.Event()
        self.closed_by_server = 0
        self.refused = 0
        self.answers: list[bytes] = []
        self.socks: list[tuple[socket.socket, int]] = []

    def _open(self, i: int) -> tuple[socket.socket, int] | None:
        try:
            s = socket.create_connection(self.addr, timeout=2)
        except OSError:
            self.refused += 1
            return None
        s.setblocking(False)
        try:
            s.send(b"GARBAGE / HTTP/9\r\n\r\n" if i % 10 == 0 else HEAD[:8])
        except OSError:
            pass
        return s, 8

    def run(self, seconds: float) -> None:
        for i in range(self.n):
            got = self._open(i)
            if got:
                self.socks.append(got)
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.stop.is_set():
            for k, (s, sent) in enumerate(list(self.socks)):
                try:
                    data = s.recv(4096)
                    if data:
                        self.answers.append(data[:12])
                    self.closed_by_server += 1
                    s.close()
                    again = self._open(k)
                    if again:
                        self.socks[k] = again
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed_by_server += 1
                    continue
                try:
                    s.send(HEAD[sent:sent + 1] or b"X")
                    self.socks[k] = (s, sent + 1)
                except OSError:
                    pass
            time.sleep(0.5)

    def close(self) -> None:
        for s, _ in self.socks:
            s.close()


def test_300_half_open_connections_do_not_starve_the_server_or_flood_the_log(fd_starved):
    server = fd_starved
    log0 = log_bytes(server)
    attack = Slowloris(server, 300)
    try:
        out = during(server.url, lambda: attack.run(8.0), settle_s=1.5)
    finally:
        attack.close()
    grown = log_bytes(server) - log0
    record("slowloris 300 half-open sockets, 256 descriptors", worst_health_s=round(out.worst_health_s, 3),
           health_asked=out.health_asked, normal_status=out.normal_status, normal_s=round(out.normal_s, 3),
           log_bytes=grown, closed_by_server=attack.closed_by_server, refused=attack.refused,
           answers=sorted({a.decode(errors="replace") for a in attack.answers}))
    assert out.worst_health_s < HANG_S and out.normal_status == 200, server.stderr[-20:]
    assert grown < 1_000_000
    assert attack.closed_by_server > 0  # evicted (408) and timed out (408), never left to hang
    assert all(a.startswith((b"HTTP/1.1 408", b"HTTP/1.1 400", b"HTTP/1.1 503")) for a in attack.answers)
    assert httpx.get(server.url + "/health", timeout=HANG_S).json() == {"status": "ok"}


def test_a_request_head_that_never_ends_is_closed_with_408(fd_starved):
    s = socket.create_connection(host_port(fd_starved), timeout=HANG_S)
    s.sendall(HEAD)
    t0 = time.monotonic()
    data = s.recv(4096)
    waited = time.monotonic() - t0
    record("half-open request head", read_timeout_s=3, closed_after_s=round(waited, 2))
    assert data.startswith(b"HTTP/1.1 408") and waited < HANG_S
    s.close()


def test_a_body_that_never_ends_is_closed_and_the_server_goes_on(fd_starved):
    s = socket.create_connection(host_port(fd_starved), timeout=HANG_S)
    s.sendall(HEAD + b"Content-Length: 1000\r\n\r\n" + b'{"model": ')
    data = s.recv(4096)
    assert data == b"" or data.startswith(b"HTTP/1.1 408")
    s.close()
    assert normal_request(fd_starved.url)[0] == 200


def test_past_the_cap_busy_connections_are_kept_and_a_new_one_is_refused_gracefully(tiny_model, tmp_path):
    server = ServeProcess(tiny_model, "--ctx", "512", "--parallel", "2", "--temperature", "0", "--read-timeout", "4",
                          "--max-connections", "20", home=tmp_path / "home")
    try:
        busy = []
        for _ in range(20):  # requests in progress: their bodies are still arriving
            s = socket.create_connection(host_port(server), timeout=HANG_S)
            s.sendall(HEAD + b"Content-Length: 1000\r\n\r\n{")
            busy.append(s)
        time.sleep(0.5)
        extra = socket.create_connection(host_port(server), timeout=HANG_S)
        answer = extra.recv(4096)
        record("connection cap 20, all busy", answer=answer[:40].decode(errors="replace"))
        assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer
        for s in busy:
            s.close()
        with Watch(server.url) as w:
            time.sleep(1.0)
        assert w.statuses and w.statuses[-1] == 200
        assert normal_request(server.url)[0] == 200
    finally:
        server.stop()


def test_a_normal_request_still_works_after_the_flood_on_a_keep_alive_connection(fd_starved):
    with httpx.Client(base_url=fd_starved.url, timeout=HANG_S * 2) as c:
        for _ in range(3):
            assert c.post("/v1/chat/completions", json={**NORMAL, "model": MODEL}).status_code == 200
            time.sleep(0.2)
