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

    def __init__(self, service: Service, *, host: str = "127.0.0.1", port: int = 8080) -> None:
        check_exposure(host, service.config.api_keys)
        self.service = service
        self.host, self.port = host, port
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def bind(self) -> str:
        """Bind and listen; returns the base URL. Raises KnownError when the port is taken."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise KnownError(f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self._sock = sock
        self.port = sock.getsockname()[1]
        return self.url

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
            await self._make_server().serve(sockets=[self._sock])
        finally:
            self._close_socket()

    def start_thread(self) -> str:
        """Serve on a daemon thread with its own event loop (the GUI); returns the URL."""
        url = self.bind() if self._sock is None else self.url
        server, sock = self._make_server(), self._sock
        assert sock is not None

        async def serve() -> None:
            self.service.ensure_background()  # the router's idle reaper, in this loop
            await server.serve(sockets=[sock])

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
        if self._sock is not None:
            self._sock.close()
            self._sock = None
