"""Helpers the routes share: the body under a size limit, checks off the event loop, who is calling, SSE framing."""
from __future__ import annotations

import asyncio
import functools
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ggufdesk.server.errors import ApiError
from ggufdesk.server.service import Service

T = TypeVar("T")
CHECK_DEADLINE_S = 15.0  # parsing and validating one body, queueing included; the work itself is bounded
CHECK_WORKERS = 2  # a flood of hostile bodies waits here, not in the pool that starts generations
_checks: ThreadPoolExecutor | None = None
_checks_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _checks
    with _checks_lock:
        if _checks is None:
            _checks = ThreadPoolExecutor(CHECK_WORKERS, thread_name_prefix="ggufdesk-checks")
        return _checks


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on the checks threads: JSON parsing, schema and tool validation are CPU-bound, and on the
    event loop one large schema had frozen /health for 74 s (issue 34). Past CHECK_DEADLINE_S the caller
    gets a 503 (the check finishes in the background: its work is bounded, it cannot be interrupted)."""
    fut = asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(fn, *args))
    try:
        return await asyncio.wait_for(fut, CHECK_DEADLINE_S)
    except asyncio.TimeoutError:
        raise ApiError(503, f"checking the request took more than {CHECK_DEADLINE_S:g} s; the server is busy, "
                            "try again later", code="overloaded", retry_after=5, reason="overloaded") from None


async def parse_body(request: Request, model: type[T], limit: int | None = None) -> T:
    """The request's body read under the size limit (max_body, or `limit`: a chat body may carry images)
    and parsed into `model` (schemas.parse) off the loop."""
    from ggufdesk.server.schemas import parse

    max_body = service(request).config.max_body
    body = await read_body(request, limit or max_body)
    if len(body) > max_body and b"image" not in body:  # the larger limit is for images only
        raise body_too_large(f"the request body is larger than {max_body} bytes")
    request.state.body_size = len(body)  # (server/images.py: without its images, a body keeps to max_body)
    parsed: T = await off_loop(parse, model, body)
    return parsed


def body_too_large(message: str) -> ApiError:
    return ApiError(413, message, code="request_too_large", reason="too_large")


def service(request: Request) -> Service:
    svc: Service = request.app.state.service  # Starlette's State holds untyped attributes
    return svc


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or a 413 as soon as it is known to exceed `limit` bytes."""
    too_large = body_too_large(f"the request body is larger than {limit} bytes")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def caller(request: Request) -> str:
    """Whom the rate limit counts against: the API key when keys are in use, else the client address."""
    key: str | None = getattr(request.state, "api_key", None)
    if key:
        return "key:" + key
    return "addr:" + (request.client.host if request.client else "unknown")


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


KEEPALIVE_S = 5.0  # a stream that has been silent this long (a long prompt being read) sends a keep-alive
COMMENT = ": keep-alive\n\n"  # an SSE comment: every SSE parser skips it, every idle timer sees bytes


def event_stream(body: AsyncIterator[str], beat: Callable[[], str | None] = lambda: COMMENT,
                 every: float = KEEPALIVE_S) -> StreamingResponse:
    """An SSE response; while `body` is silent for `every` seconds, `beat()` is sent (None: nothing
    yet), so clients with an idle timeout (Claude Code, Codex) do not give up during a long prefill."""
    return StreamingResponse(keepalive(body, beat, every), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def keepalive(body: AsyncIterator[str], beat: Callable[[], str | None], every: float) -> AsyncIterator[str]:
    it = body.__aiter__()
    nxt: asyncio.Future[str] = asyncio.ensure_future(it.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({nxt}, timeout=every)
            if not done:
                line = beat()
                if line:
                    yield line
                continue
            try:
                item = nxt.result()
            except StopAsyncIteration:
                return
            yield item
            nxt = asyncio.ensure_future(it.__anext__())
    finally:
        if not nxt.done():
            nxt.cancel()
            await asyncio.gather(nxt, return_exceptions=True)
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()
