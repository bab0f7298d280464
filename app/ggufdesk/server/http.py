"""Helpers the routes share: the body under a size limit, who is calling, SSE framing."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ggufdesk.server.errors import ApiError
from ggufdesk.server.service import Service


def service(request: Request) -> Service:
    return request.app.state.service


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or a 413 as soon as it is known to exceed `limit` bytes."""
    too_large = ApiError(413, f"the request body is larger than {limit} bytes", code="request_too_large",
                         reason="too_large")
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
