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
    return request.app.state.service


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
    key = getattr(request.state, "api_key", None)
    if key:
        return "key:" + key
    return "addr:" + (request.client.host if request.client else "unknown")


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def event_stream(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
