"""The MCP host: connects to the configured servers on first use, lists their tools, calls them.

The official SDK is asyncio; everything it does runs on one event loop in a background thread,
started on the first request (importing this module imports neither `mcp` nor asyncio work).
Callers on any thread get `concurrent.futures.Future`s; cancelling one stops that call (the SDK
tells the server). Each stdio server runs in its own process group (the SDK starts it with a new
session and stops the whole group). A server that fails to start, hangs at initialize or listing,
or dies in the middle of a call is reported through McpFailure and stopped; the others go on.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Coroutine, Literal, TypeVar

from ggufdesk.core.errors import KnownError
from ggufdesk.core.mcp.config import McpConfig, ServerConfig
from ggufdesk.core.mcp.results import ToolResult, clean_text, convert_result

log = logging.getLogger("ggufdesk.mcp")
_T = TypeVar("_T")

ServerState = Literal["stopped", "starting", "ready", "failed"]
FailureKind = Literal["start", "timeout", "closed", "refused", "stopped"]
INIT_TIMEOUT_S = 60.0  # npx/uvx may fetch a package on a server's first start
LIST_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 8.0  # the SDK's own shutdown takes at most ~5 s per server (stdin close, TERM, KILL)
CALLS_KEPT = 20
STDERR_KEEP_BYTES = 1 << 20


class McpFailure(KnownError):
    """A server or a call failed; the message names the server and says what happened."""

    def __init__(self, message: str, *, server: str, kind: FailureKind) -> None:
        super().__init__(message)
        self.server, self.kind = server, kind


@dataclass(frozen=True, slots=True)
class McpTool:
    server: str
    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One call, for the server's log in the window: what was asked and how it ended."""

    tool: str
    arguments: str
    started: float
    seconds: float
    outcome: Literal["ok", "error", "failed", "cancelled"]
    summary: str


@dataclass(frozen=True, slots=True)
class ServerStatus:
    name: str
    state: ServerState
    message: str = ""
    tools: tuple[McpTool, ...] = ()
    calls: tuple[CallRecord, ...] = ()
    stderr: Path | None = None
    garbage_lines: int = 0


def _leaf(e: BaseException) -> BaseException:
    """The first real error inside anyio's exception groups."""
    inner = getattr(e, "exceptions", None)
    while isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
        e = inner[0]
        inner = getattr(e, "exceptions", None)
    return e


def _tail(path: Path | None, start: int = 0, lines: int = 3) -> str:
    """The last lines a server wrote to its stderr log since `start` (this run's first byte)."""
    if path is None:
        return ""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(start, f.tell() - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(kept)[:400]


def _is_parse_noise(record: logging.LogRecord) -> bool:
    # The SDK logs every stdout line that is not JSON-RPC with a trace; we count them per server.
    return not record.getMessage().startswith("Failed to parse JSONRPC message")


class _Connection:
    """One server: its transport and ClientSession live in one task on the host's loop."""

    def __init__(self, cfg: ServerConfig, stderr: Path | None, changed: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.stderr = stderr
        self._changed = changed
        self.state: ServerState = "stopped"
        self.message = ""
        self.tools: tuple[McpTool, ...] = ()
        self.calls: deque[CallRecord] = deque(maxlen=CALLS_KEPT)
        self.garbage = 0
        self.session: Any = None
        self._ready: asyncio.Future[tuple[McpTool, ...]] | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._errlog: Any = None
        self._stderr_start = 0
        self.failed_start = False  # it failed to start: not tried again until asked (restart, new config)

    def status(self) -> ServerStatus:
        return ServerStatus(self.cfg.name, self.state, self.message, self.tools, tuple(self.calls),
                            self.stderr, self.garbage)

    def _set(self, state: ServerState, message: str = "") -> None:
        self.state, self.message = state, message
        self._changed(self.cfg.name)

    async def ensure(self, init_timeout: float, list_timeout: float) -> tuple[McpTool, ...]:
        """Start the server if it is not running; its tools once it answers."""
        if self.state == "ready":
            return self.tools
        if self._ready is None or self._ready.done():
            self._ready = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._set("starting", "")
            self._task = asyncio.create_task(self._run(self._ready, self._stop, init_timeout, list_timeout))
        return await asyncio.shield(self._ready)

    def _transport(self) -> Any:
        cfg = self.cfg
        if cfg.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(command=cfg.command, args=list(cfg.args), env=cfg.env or None,
                                           cwd=cfg.cwd or None, encoding_error_handler="replace")
            self._errlog = self._open_stderr()
            return stdio_client(params, errlog=self._errlog)
        if cfg.transport == "sse":
            from mcp.client.sse import sse_client

            return sse_client(cfg.url, headers=cfg.headers or None)
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        return streamable_http_client(cfg.url, http_client=create_mcp_http_client(headers=cfg.headers or None))

    def _open_stderr(self) -> Any:
        """The server's stderr goes to its log file (a real file: the child writes to it directly)."""
        if self.stderr is None:
            return open(os.devnull, "w")
        try:
            self.stderr.parent.mkdir(parents=True, exist_ok=True)
            mode = "w" if self.stderr.exists() and self.stderr.stat().st_size > STDERR_KEEP_BYTES else "a"
            f = self.stderr.open(mode, encoding="utf-8", errors="replace")
            f.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.cfg.describe()}\n")
            f.flush()
            self._stderr_start = f.tell()
            return f
        except OSError:
            return open(os.devnull, "w")

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.garbage += 1
            if self.garbage == 1:
                log.info("MCP server %s wrote something that is not an MCP message: %s", self.cfg.name,
                         str(message).splitlines()[-1][:200] if str(message) else type(message).__name__)
            self._changed(self.cfg.name)

    async def _run(self, ready: asyncio.Future[tuple[McpTool, ...]], stop: asyncio.Event,
                   init_timeout: float, list_timeout: float) -> None:
        from mcp import ClientSession

        phase = "starting"
        self.failed_start = False
        try:
            async with AsyncExitStack() as stack:
                transport = self._transport()
                read, write = await stack.enter_async_context(transport)
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message))
                phase = "initialize"
                await asyncio.wait_for(session.initialize(), init_timeout)
                phase = "list"
                tools = await asyncio.wait_for(self._list(session), list_timeout)
                self.session, self.tools = session, tools
                self._set("ready", f"{len(tools)} tool{'s' * (len(tools) != 1)}")
                ready.set_result(tools)
                phase = "running"
                await stop.wait()
                phase = "stopping"
        except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - contained, reported (groups too)
            failure = self._explain(_leaf(e), phase, init_timeout, list_timeout)
            if not ready.done():
                ready.set_exception(failure)
            elif phase == "running":
                failure = McpFailure(f"the MCP server {self.cfg.name!r} stopped: {failure}", server=self.cfg.name,
                                     kind="closed")
            if phase != "stopping":
                self.session = None
                self.failed_start = phase != "running"
                self._set("failed", str(failure))
                return
        finally:
            if self._errlog is not None:
                self._errlog.close()
                self._errlog = None
        self.session = None
        if self.state != "failed":
            self._set("stopped", "")

    async def _list(self, session: Any) -> tuple[McpTool, ...]:
        from mcp_types import PaginatedRequestParams

        tools: list[McpTool] = []
        cursor = None
        for _ in range(100):  # pages; a server that pages for ever is cut off
            result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            for t in result.tools:
                schema = t.input_schema if isinstance(t.input_schema, dict) else {}
                tools.append(McpTool(self.cfg.name, clean_text(t.name), clean_text(t.description or ""), schema))
            cursor = result.next_cursor
            if not cursor:
                break
        return tuple(tools)

    def _explain(self, e: BaseException, phase: str, init_timeout: float, list_timeout: float) -> McpFailure:
        name, tail = self.cfg.name, _tail(self.stderr, self._stderr_start)
        said = f" (it said: {tail})" if tail else ""
        if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
            what = "initialize" if phase == "initialize" else "the tool list request"
            secs = init_timeout if phase == "initialize" else list_timeout
            return McpFailure(f"the MCP server {name!r} did not answer {what} within {secs:g} s and was "
                              f"stopped{said}", server=name, kind="timeout")
        if isinstance(e, FileNotFoundError):
            return McpFailure(f"the MCP server {name!r} cannot start: the command {self.cfg.command!r} was not "
                              "found", server=name, kind="start")
        if isinstance(e, asyncio.CancelledError):
            return McpFailure(f"the MCP server {name!r} was stopped", server=name, kind="stopped")
        text = getattr(e, "message", "") or str(e) or type(e).__name__
        if phase in ("starting", "initialize", "list"):
            return McpFailure(f"the MCP server {name!r} could not start: {text}{said}", server=name, kind="start")
        return McpFailure(f"{text}{said}", server=name, kind="closed")

    async def call(self, tool: str, arguments: dict[str, Any], timeout: float, init_timeout: float,
                   list_timeout: float) -> ToolResult:
        await self.ensure(init_timeout, list_timeout)
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        t0, started = time.monotonic(), time.time()
        args_text = clean_text(str(arguments))[:300]

        def record(outcome: Literal["ok", "error", "failed", "cancelled"], summary: str) -> None:
            self.calls.append(CallRecord(tool, args_text, started, time.monotonic() - t0, outcome, summary[:300]))
            self._changed(self.cfg.name)

        try:
            raw = await asyncio.wait_for(self.session.call_tool(tool, arguments), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            record("failed", f"no answer within {timeout:g} s")
            raise McpFailure(f"the tool {tool!r} of {self.cfg.name!r} did not answer within {timeout:g} s and was "
                             "stopped", server=self.cfg.name, kind="timeout") from None
        except asyncio.CancelledError:
            record("cancelled", "stopped by the user")
            raise
        except MCPError as e:
            if e.code == CONNECTION_CLOSED:
                tail = _tail(self.stderr, self._stderr_start)
                record("failed", "the server stopped during the call")
                failure = McpFailure(f"the MCP server {self.cfg.name!r} stopped during the call to {tool!r}"
                                     + (f" (it said: {tail})" if tail else ""), server=self.cfg.name, kind="closed")
                self._set("failed", str(failure))
                self.stop()
                raise failure from None
            record("failed", e.message)
            raise McpFailure(f"the MCP server {self.cfg.name!r} refused the call to {tool!r}: {e.message}",
                             server=self.cfg.name, kind="refused") from None
        except Exception as e:  # noqa: BLE001 - a transport error (or a group of them) ends this server only
            leaf = _leaf(e)
            record("failed", str(leaf))
            self.stop()
            raise McpFailure(f"the call to {tool!r} of {self.cfg.name!r} failed: {leaf}", server=self.cfg.name,
                             kind="closed") from None
        result = convert_result(raw)
        record("error" if result.is_error else "ok", result.text[:200])
        return result

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def stopped(self, timeout: float) -> None:
        self.stop()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except (TimeoutError, asyncio.TimeoutError):
                task.cancel()
                log.warning("MCP server %s did not stop within %.0f s", self.cfg.name, timeout)


class McpHost:
    """All the configured servers. Thread-safe; nothing starts before the first list or call.

    `on_change(server_name)` is called (on the host's thread) whenever a server's status changes.
    """

    def __init__(self, config: McpConfig, *, log_dir: Path | None = None,
                 init_timeout: float = INIT_TIMEOUT_S, list_timeout: float = LIST_TIMEOUT_S,
                 on_change: Callable[[str], None] | None = None) -> None:
        self._config = config
        self.log_dir = log_dir
        self.init_timeout, self.list_timeout = init_timeout, list_timeout
        self.on_change = on_change
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._conns: dict[str, _Connection] = {}
        self._closed = False

    @property
    def config(self) -> McpConfig:
        return self._config

    @property
    def started(self) -> bool:
        """Whether the host's loop runs (anything was ever listed or called)."""
        return self._loop is not None

    def _changed(self, name: str) -> None:
        if self.on_change is not None:
            try:
                self.on_change(name)
            except Exception:
                log.exception("MCP status callback failed")

    def _conn(self, name: str) -> _Connection:
        cfg = self._config.servers.get(name)
        if cfg is None:
            raise McpFailure(f"there is no MCP server named {name!r}", server=name, kind="start")
        conn = self._conns.get(name)
        if conn is None:
            stderr = self.log_dir / f"mcp-{name.replace(' ', '_')}.log" if self.log_dir is not None else None
            conn = self._conns[name] = _Connection(cfg, stderr, self._changed)
        return conn

    def _submit(self, make: Callable[[], Coroutine[Any, Any, _T]]) -> Future[_T]:
        with self._lock:
            if self._closed:
                done: Future[_T] = Future()
                done.set_exception(KnownError("the MCP servers were stopped (ggufdesk is closing)"))
                return done
            if self._loop is None:
                logging.getLogger("mcp.client.stdio").addFilter(_is_parse_noise)
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="mcp-host", daemon=True)
                self._thread.start()
                ready.wait(10)
                self._loop = loop
            loop = self._loop

        async def wrapped() -> _T:
            return await make()

        return asyncio.run_coroutine_threadsafe(wrapped(), loop)

    def status(self, name: str) -> ServerStatus:
        conn = self._conns.get(name)
        return conn.status() if conn is not None else ServerStatus(name, "stopped")

    def list_tools(self, names: list[str], *, retry: bool = False
                   ) -> Future[dict[str, tuple[McpTool, ...] | McpFailure]]:
        """The tools of each named server, starting those not running, all at once; a server that
        fails gives its McpFailure in place of tools (the others are not held up by it). A server
        that failed to start is not tried again (each answer would wait for it) unless `retry`."""

        async def run() -> dict[str, tuple[McpTool, ...] | McpFailure]:
            async def one(name: str) -> tuple[McpTool, ...] | McpFailure:
                try:
                    conn = self._conn(name)
                    if conn.failed_start and conn.state == "failed" and not retry:
                        return McpFailure(conn.message, server=name, kind="start")
                    return await conn.ensure(self.init_timeout, self.list_timeout)
                except McpFailure as e:
                    return e

            results = await asyncio.gather(*(one(n) for n in names))
            return dict(zip(names, results))

        return self._submit(run)

    def call(self, server: str, tool: str, arguments: dict[str, Any],
             timeout: float | None = None) -> Future[ToolResult]:
        """Call a tool (starting its server if needed); McpFailure when the server or the call fails.
        Cancelling the future stops the call."""

        async def run() -> ToolResult:
            conn = self._conn(server)
            return await conn.call(tool, arguments, timeout or conn.cfg.timeout, self.init_timeout,
                                   self.list_timeout)

        return self._submit(run)

    def update_config(self, config: McpConfig) -> None:
        """Use a changed configuration: servers removed or changed (not just their always-allowed
        tools) are stopped; they start again, as configured now, on their next use."""
        old = self._config
        self._config = config
        for name, conn in list(self._conns.items()):
            new = config.servers.get(name)
            if new is None or replace(new, always_allow=(), disabled=False) != replace(
                    old.servers.get(name, new), always_allow=(), disabled=False):
                self._conns.pop(name, None)
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(conn.stop)
            else:
                conn.cfg = new

    def stop(self, name: str) -> None:
        conn = self._conns.get(name)
        if conn is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(conn.stop)

    def close(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every server (each within `timeout`), then the loop. Safe to call twice."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        conns = list(self._conns.values())

        async def stop_all() -> None:
            await asyncio.gather(*(c.stopped(timeout) for c in conns))

        try:
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(timeout + 2)
        except Exception:
            log.exception("stopping the MCP servers")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=2)
