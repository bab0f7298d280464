"""The Starlette application: routes, API-key check, errors in the callers' shapes, /health and /metrics."""
from __future__ import annotations

import hmac
import logging

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ggufdesk.server import anthropic, embeddings, llamacpp, ollama, ollama_pull, openai, responses
from ggufdesk.server.docs import DocsRetrieval
from ggufdesk.server.errors import ApiError, error_response, is_anthropic
from ggufdesk.server.guard import Guard, with_cors
from ggufdesk.server.service import ClientGone, Service

log = logging.getLogger("ggufdesk.server")
OPEN_PATHS = ("/health",)


__all__ = ["build_app", "error_response", "is_anthropic"]


class ApiKeys:
    """ASGI middleware: with keys configured, every path but /health needs one (Bearer or x-api-key)."""

    def __init__(self, app: ASGIApp, *, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keys = self.service.config.api_keys
        if scope["type"] != "http" or not keys or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        auth = headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
        if not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
            self.service.metrics.failures.labels("auth").inc()
            what = "no API key was given" if not given else "the API key is not valid"
            err = ApiError(401, f"{what}; send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                           code="invalid_api_key", reason="auth")
            await error_response(scope["path"], err)(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = given
        await self.app(scope, receive, send)


async def health(request: Request) -> Response:
    status, body = request.app.state.service.health()
    return JSONResponse(body, status_code=status, headers={} if status == 200 else {"Retry-After": "5"})


async def metrics(request: Request) -> Response:
    svc = request.app.state.service
    if not svc.config.metrics:
        raise ApiError(501, "this server was started with --no-metrics", code="not_supported", reason="invalid")
    response = Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)
    # llama-server's header: when the server started, in unix seconds (written in its capitals, as the rest of
    # /metrics' llama-server part; Starlette writes names in lower case)
    response.raw_headers.append((b"Process-Start-Time-Unix", str(svc.created).encode()))
    return response


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    request.app.state.service.metrics.failures.labels(exc.reason).inc()
    return error_response(request.url.path, exc)


async def on_client_gone(request: Request, exc: Exception) -> Response:
    request.app.state.service.metrics.failures.labels("disconnected").inc()
    return Response(status_code=499)  # nobody is listening any more


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = "no such endpoint" if exc.status_code == 404 else exc.detail
    return error_response(request.url.path, ApiError(exc.status_code, f"{what}: {request.method} {request.url.path}",
                                                     reason="invalid"))


async def on_bug(request: Request, exc: Exception) -> Response:
    log.exception("request failed", exc_info=exc)
    request.app.state.service.metrics.failures.labels("bug").inc()
    return error_response(request.url.path, ApiError(500, f"internal error: {exc}", reason="bug"))


def build_app(service: Service, *, host: str = "127.0.0.1") -> ASGIApp:
    """The routes behind, from the outside in: CORS (answers preflights without a key), the Host/Origin/
    content-type guard (server/guard.py), the API-key check."""
    app = Starlette(
        routes=[Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]),
                *openai.ROUTES, *anthropic.ROUTES, *embeddings.ROUTES,
                *ollama.ROUTES, *ollama_pull.ROUTES, *responses.ROUTES, *llamacpp.ROUTES],
        exception_handlers={ApiError: on_api_error, ClientGone: on_client_gone, ClientDisconnect: on_client_gone,
                            HTTPException: on_http_error, Exception: on_bug},
    )
    app.state.service = service
    origins = service.config.cors_origins
    docs = DocsRetrieval(app, service=service)  # a request naming a document collection (server/docs.py)
    return with_cors(Guard(ApiKeys(docs, service=service), bound_host=host, cors_origins=origins), origins)


