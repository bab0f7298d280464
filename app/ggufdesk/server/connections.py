"""Connection limits uvicorn lacks: a read deadline for each request, a hard cap on open connections.

Why ours (uvicorn 0.54): `timeout_keep_alive` only covers the idle time between requests and stops at a
request's first byte, so a client sending one header byte at a time held a connection for ever
(slowloris); `limit_concurrency` answers 503 only once a request's head has arrived and keeps the
connection open, so 1,100 silent sockets ran the process out of file descriptors and every request
timed out (issue 34). This protocol is uvicorn's own h11 protocol plus:

- a read deadline: a new connection's first request, and every request from its first byte, must
  arrive whole (head and body) within `read_timeout` seconds, or the client gets a 408 and is closed;
- a cap on open connections: past `max_connections`, one connection without a request in progress is
  closed to make room: first the one whose request head has been arriving longest (a client's head comes
  in one packet; a head still incomplete after SLOW_HEAD_S is a slow client's), then the one idle the
  longest, if for at least IDLE_EVICT_S (so a brand-new connection is not evicted in the burst it came
  in, before it could send anything). When none qualifies, the new one gets a 503 with Retry-After.

A connection closed before it sent anything is closed silently (an idle keep-alive connection must not
read an unasked 408 as the answer to its next request); one closed in the middle of a request gets a 408.

uvicorn's own settings still apply (runner.py): h11's 16 KiB limit on a request head, the keep-alive
timeout, limit_concurrency on requests in progress.
"""
from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

READ_TIMEOUT_S = 30.0
SLOW_HEAD_S = 0.1
IDLE_EVICT_S = 0.5
MAX_CONNECTIONS = 1024
BACKLOG = 64  # uvicorn's `backlog`: asyncio accepts up to this many connections at once, before any is evicted
# Descriptors kept for everything but connections (the engine's pipes, files, logs: about 40) and for
# what accept bursts add before the evicted connections are closed, one or two event-loop turns later.
FD_RESERVE = 64 + 2 * BACKLOG
NOFILE_WANTED = 65536


def raise_descriptor_limit() -> int:
    """Raise the soft limit on open descriptors toward the hard one (as Go's runtime does; Linux desktops
    start at a soft 1024 under a far higher hard limit); returns the soft limit now in force."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(hard, NOFILE_WANTED)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    except (OSError, ValueError):
        return 1024
    return NOFILE_WANTED if soft == resource.RLIM_INFINITY else soft


def default_max_connections() -> int:
    """MAX_CONNECTIONS, or what the descriptor limit (raised first) leaves after FD_RESERVE: one each."""
    return max(16, min(MAX_CONNECTIONS, raise_descriptor_limit() - FD_RESERVE))


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    read_timeout: float = READ_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS


def raw_response(status: int, reason: str, message: str, *, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, with an OpenAI-shaped error body."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}",
            "Connection: close"]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with a read deadline per request and a cap on open connections."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._deadline: asyncio.TimerHandle | None = None
        self.idle_since = time.monotonic()  # when it last had no request in progress
        self.head_since: float | None = None  # when the first byte of the request now arriving came
        self._partial = False  # bytes of a request have come, not all of it

    # ---- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._close_with(raw_response(503, "Service Unavailable", "the server has too many open connections; "
                                          "try again shortly", retry_after=1), always=True)
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        if not self._partial:
            self._partial, self.head_since = True, time.monotonic()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self.head_since = None  # the head is in
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the whole request is in
            self._partial = False

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        self.idle_since = time.monotonic()
        super().on_response_complete()

    # ---- the read deadline -------------------------------------------------------------------------

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.read_timeout, self._read_timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        started = cycle is not None and not cycle.response_complete and cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() now says http.disconnect
            cycle.message_event.set()
        if started:
            self.transport.close()
            return
        self._close_with(raw_response(408, "Request Timeout", f"the request did not arrive within "
                                      f"{self.limits.read_timeout:g} s"))

    def _close_with(self, response: bytes, *, always: bool = False) -> None:
        """Close, answering `response` if a request had begun (or `always`), else silently."""
        self._disarm()
        try:
            if self._partial or always:
                self.transport.write(response)
        finally:
            self.transport.close()

    # ---- the connection cap ------------------------------------------------------------------------

    def waiting(self) -> bool:
        """No request in progress on this connection: half-open, or idle between requests."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def eviction_key(self, now: float) -> tuple[int, float] | None:
        """How this connection ranks for eviction (lowest first), or None while it may not be evicted."""
        if not self.waiting() or self.transport.is_closing():
            return None
        if self.head_since is not None:
            return (0, self.head_since) if now - self.head_since >= SLOW_HEAD_S else None
        return (1, self.idle_since) if now - self.idle_since >= IDLE_EVICT_S else None

    def _make_room(self) -> bool:
        """Close one connection without a request in progress (see the module's docstring); False if none may be."""
        now = time.monotonic()
        ranked = [(key, p) for p in self.connections if p is not self and isinstance(p, GuardedH11Protocol)
                  for key in [p.eviction_key(now)] if key is not None]
        if not ranked:
            return False
        oldest = min(ranked, key=lambda kp: kp[0])[1]
        oldest._close_with(raw_response(408, "Request Timeout", "the connection was closed to make room for "
                                        "another (the server has too many open connections)"))
        return True
