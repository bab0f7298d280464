"""Loopback means this machine's own programs: the Host check (DNS rebinding), Origin and content-type checks (CSRF).

A web page the user opens can make the browser send requests to 127.0.0.1. Three ways it could use the
server, and what stops each (Ollama fixed the same holes after CVE-2024-28224 and its DNS-rebinding
reports; its allowedHostsMiddleware and CORS origins are the model):

- DNS rebinding: the page's own name is pointed at 127.0.0.1, so the browser sends `Host: attacker.example`.
  A server listening on a loopback address answers only Host names of this machine: `localhost`,
  `*.localhost`, loopback addresses, or the `--host` it was started with. A server listening beyond
  loopback has an API key (runner.check_exposure) and is reached under names we cannot know: no check.
- A cross-site request (form post or fetch) carries an `Origin`: it is refused unless that origin is in
  the `--cors-origin` allow-list (or is the server's own).
- The request types a page may send without asking first (CORS "simple requests") have the content
  types text/plain, application/x-www-form-urlencoded or multipart/form-data: refused on every POST,
  which all take JSON here (415).

CORS itself (Starlette's CORSMiddleware, off unless `--cors-origin` is given) sits outside the API-key
check, so a browser's preflight OPTIONS is answered without a key, as browsers send none.
"""
from __future__ import annotations

import ipaddress
from typing import Iterable

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from ggufdesk.server.errors import ApiError, error_response

SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
BODY_METHODS = ("POST", "PUT", "PATCH")
# What a browser adds to a request a web page makes (fetch, a form): Origin on every cross-origin POST, the
# Sec-Fetch-* metadata since 2019-2023 (Chrome 76, Firefox 90, Safari 16.4), Referer unless a policy hides it.
BROWSER_HEADERS = ("origin", "sec-fetch-mode", "sec-fetch-site", "sec-fetch-dest", "referer")


def from_a_browser(headers: Headers) -> bool:
    """Whether a request shows a browser's marks. A body of a type a web page may send unasked (text/plain, a
    form) is refused only then: `curl -d '{...}'`, as Ollama's own docs write it, sends a form type with JSON in it
    and no browser header, and is served (Ollama parses any body as JSON too)."""
    return any(h in headers for h in BROWSER_HEADERS)


def is_loopback_host(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The name in a Host header (or an origin's authority), without port or IPv6 brackets, lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def origin_authority(origin: str) -> str:
    return origin.split("://", 1)[-1].rstrip("/").lower()


class Guard:
    """ASGI middleware: Host, Origin and content-type checks, in the caller's error shape (OpenAI's here:
    it runs before routing; Anthropic's clients read the status)."""

    def __init__(self, app: ASGIApp, *, bound_host: str, cors_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.bound = host_name(bound_host)
        self.check_host = is_loopback_host(self.bound)
        self.origins = {o.rstrip("/").lower() for o in cors_origins}

    def host_ok(self, host: str | None) -> bool:
        if not self.check_host or host is None:  # HTTP/1.0 without Host: not a browser
            return True
        name = host_name(host)
        return is_loopback_host(name) or name == self.bound

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        if origin is None:
            return True  # not from a web page (curl, SDKs, scripts)
        o = origin.rstrip("/").lower()
        return o in self.origins or (host is not None and origin_authority(o) == host.strip().lower())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        err = self.refusal(scope["method"], headers)
        if err is not None:
            await error_response(scope["path"], err)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, method: str, headers: Headers) -> ApiError | None:
        host = headers.get("host")
        if not self.host_ok(host):
            return ApiError(403, f"the Host header {host!r} does not name this machine; this server answers "
                                 "only requests addressed to localhost, a loopback address or its --host",
                            code="forbidden_host", reason="forbidden")
        origin = headers.get("origin")
        if not self.origin_ok(origin, host):
            return ApiError(403, f"requests from the web page at {origin} are not allowed; start the server "
                                 f"with --cors-origin {origin} to allow them", code="forbidden_origin",
                            reason="forbidden")
        if method in BODY_METHODS and from_a_browser(headers):
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind in SIMPLE_TYPES:
                return ApiError(415, f"the body must be JSON, sent with 'Content-Type: application/json' "
                                     f"(not {kind})", code="unsupported_media_type", reason="invalid")
        return None


def with_cors(app: ASGIApp, origins: Iterable[str]) -> ASGIApp:
    """Starlette's CORS middleware for the allowed origins (none: no CORS, app returned as it is)."""
    allowed = [o.rstrip("/") for o in origins]
    if not allowed:
        return app
    return CORSMiddleware(app, allow_origins=allowed, allow_methods=["GET", "POST", "OPTIONS"],
                          allow_headers=["*"], expose_headers=["Retry-After"], max_age=600)
