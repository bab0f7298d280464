"""Run the server: bind the socket (port 0 picks a free one), serve with uvicorn in the foreground or on a thread."""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
import threading

import uvicorn

from ggufdesk.core.errors import KnownError
from ggufdesk.server.app import build_app
from ggufdesk.server.connections import BACKLOG, ConnectionLimits, GuardedH11Protocol, default_max_connections
from ggufdesk.server.logs import limit_server_logs
from ggufdesk.server.service import Service

log = logging.getLogger("ggufdesk.server")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_keys: tuple[str, ...]) -> None:
    """Refuse to listen beyond this machine without an API key."""
    if not is_loopback(host) and not api_keys:
        raise KnownError(
            f"refusing to listen on {host} without an API key: anyone who can reach this machine could use "
            "the model; add --api-key KEY (clients then send 'Authorization: Bearer KEY'), "
            "or keep the default --host 127.0.0.1")


class ServerRunner:
    """One uvicorn server over a socket we bind ourselves, so port 0 works and the URL is known up front."""

    def __init__(self, service: Service, *, host: str = "127.0.0.1", port: int = 8080,
                 ollama_port: int | None = None) -> None:
        self.hosts = [h.strip() for h in host.split(",") if h.strip()] or ["127.0.0.1"]  # "a,b": both addresses
        for h in self.hosts:
            check_exposure(h, service.config.api_keys)
        self.service = service
        self.host, self.port = self.hosts[0], port
        self.ollama_port = ollama_port  # a second port with the same API, for clients that hard-code Ollama's
        self._sock: socket.socket | None = None
        self._extra: list[socket.socket] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def bind(self) -> str:
        """Bind and listen (and on the Ollama port, if any); returns the base URL. Raises KnownError
        when a port is taken."""
        self._sock = self._listen(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        try:
            self._extra = [self._listen(h, self.port) for h in self.hosts[1:]]
            if self.ollama_port is not None:
                first = self._listen(self.host, self.ollama_port)
                self.ollama_port = first.getsockname()[1]
                self._extra += [first] + [self._listen(h, self.ollama_port) for h in self.hosts[1:]]
        except KnownError:
            self._close_socket()
            raise
        return self.url

    @staticmethod
    def _listen(host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            raise KnownError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        sock.listen(BACKLOG)
        sock.setblocking(False)
        return sock

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _make_server(self) -> uvicorn.Server:
        cfg = self.service.config
        limits = ConnectionLimits(read_timeout=cfg.read_timeout,
                                  max_connections=cfg.max_connections or default_max_connections())
        config = uvicorn.Config(
            build_app(self.service, host=self.host), log_level="warning", access_log=False, lifespan="off",
            timeout_graceful_shutdown=2, timeout_keep_alive=30,
            # uvicorn's own limits: a request head over 16 KiB is refused (h11's); requests in progress are
            # capped by limit_concurrency (a 503 past it), set above the connection cap plus one accept burst
            # since it counts connections too, which our protocol caps (server/connections.py: uvicorn
            # lacks that); backlog bounds how many connections asyncio accepts in one go
            h11_max_incomplete_event_size=16 * 1024, backlog=BACKLOG,
            limit_concurrency=limits.max_connections + BACKLOG,
            http=functools.partial(GuardedH11Protocol, limits=limits),  # type: ignore[arg-type]
        )
        limit_server_logs()  # after uvicorn's dictConfig, which replaces its handlers
        self._server = uvicorn.Server(config)
        return self._server

    async def serve(self) -> None:
        """Serve until stop() (or Ctrl-C in the main thread)."""
        if self._sock is None:
            self.bind()
        assert self._sock is not None
        try:
            self.service.ensure_background()  # the router's idle reaper, in this loop
            await self._make_server().serve(sockets=[self._sock, *self._extra])
        finally:
            self._close_socket()

    def start_thread(self) -> str:
        """Serve on a daemon thread with its own event loop (the GUI); returns the URL."""
        url = self.bind() if self._sock is None else self.url
        assert self._sock is not None
        server, socks = self._make_server(), [self._sock, *self._extra]

        async def serve() -> None:
            self.service.ensure_background()  # the router's idle reaper, in this loop
            await server.serve(sockets=socks)

        self._thread = threading.Thread(target=lambda: asyncio.run(serve()), name="ggufdesk-server", daemon=True)
        self._thread.start()
        return url

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the server to finish (from any thread); on a thread, wait for it up to `timeout` s."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
            self._close_socket()

    def _close_socket(self) -> None:
        for sock in [self._sock, *self._extra]:
            if sock is not None:
                sock.close()
        self._sock, self._extra = None, []
