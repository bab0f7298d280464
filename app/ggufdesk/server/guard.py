"""Loopback means this machine's own programs: the Host check (DNS rebinding), Origin and content-type checks (CSRF).

A web page the user opens can make the browser send requests to 127.0.0.1. Three ways it could use the
server, and what stops each (Ollama fixed the same holes after CVE-2024-28224 and its DNS-rebinding
reports; its allowedHostsMiddleware and CORS origins are the model):

- DNS rebinding: the page's own name is pointed at 127.0.0.1, so the browser sends `Host: attacker.example`.
  A server listening on a loopback address answers only Host names of this machine: `localhost`,
  `*.localhost`, loopback addresses, or the `--host` it was started with. A server listening beyond
  loopback has an API key (runner.check_exposure) and is reached under names we cannot know: no check.
- A cross-site request (form post or fetch) carries an `Origin`: it is refused unless that origin is in
  the `--cors-origin` allow-list (or is the server's own). The list may hold llama-server's two keywords:
  `localhost` (any http(s) origin on localhost or a loopback address, any port) and `*` (any origin: an
  explicit opt-in that lets every web page the user opens drive the server).
- The request types a page may send without asking first (CORS "simple requests") have the content
  types text/plain, application/x-www-form-urlencoded or multipart/form-data: refused on every POST,
  which all take JSON here (415).

CORS itself (Cors below, off unless `--cors-origin` is given) sits outside the Guard and the API-key
check, so a browser's preflight OPTIONS is answered without a key, as browsers send none.
"""
from __future__ import annotations

import ipaddress
from typing import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


ANY, LOCALHOST = "*", "localhost"  # llama-server's --cors-origins keywords


def is_localhost_origin(origin: str) -> bool:
    """An http(s) origin whose host is localhost or a loopback address (any port), as llama-server's
    `--cors-origins localhost`: not `localhost.evil.com`, not `notlocalhost`, not a bare name."""
    try:
        url = urlsplit(origin.strip())
        url.port  # noqa: B018  (reading it checks it: a port that is not a number raises)
    except ValueError:
        return False
    if url.scheme.lower() not in ("http", "https") or url.username is not None or url.path not in ("", "/") \
            or url.query or url.fragment or not url.hostname:
        return False
    if url.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(url.hostname).is_loopback
    except ValueError:
        return False


class Origins:
    """The `--cors-origin` allow-list: origins (scheme and host), `localhost` and `*` (see the module docstring)."""

    def __init__(self, origins: Iterable[str] = ()) -> None:
        listed = {o.strip().rstrip("/").lower() for o in origins if o.strip()}
        self.any = ANY in listed
        self.localhost = LOCALHOST in listed
        self.exact = listed - {ANY, LOCALHOST}

    def __bool__(self) -> bool:
        return self.any or self.localhost or bool(self.exact)

    def allows(self, origin: str) -> bool:
        o = origin.strip().rstrip("/").lower()
        return self.any or o in self.exact or (self.localhost and is_localhost_origin(o))


class Guard:
    """ASGI middleware: Host, Origin and content-type checks, in the caller's error shape (OpenAI's here:
    it runs before routing; Anthropic's clients read the status)."""

    def __init__(self, app: ASGIApp, *, bound_host: str, cors_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.bound = host_name(bound_host)
        self.check_host = is_loopback_host(self.bound)
        self.origins = Origins(cors_origins)

    def host_ok(self, host: str | None) -> bool:
        if not self.check_host or host is None:  # HTTP/1.0 without Host: not a browser
            return True
        name = host_name(host)
        return is_loopback_host(name) or name == self.bound

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        if origin is None:
            return True  # not from a web page (curl, SDKs, scripts)
        own = host is not None and origin_authority(origin.rstrip("/").lower()) == host.strip().lower()
        return own or self.origins.allows(origin)

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


PREFLIGHT_HEADERS = {"Access-Control-Allow-Credentials": "true",
                     "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                     "Access-Control-Allow-Headers": "*", "Access-Control-Max-Age": "600"}


class Cors:
    """ASGI middleware: CORS answers for the `--cors-origin` allow-list, as llama-server gives them.

    A preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered here, before the Guard
    and the key check: 200 with Access-Control-Allow-Origin = the request's origin (as sent, even a bare
    name), credentials allowed, llama-server's methods, and for headers llama-server's `*` under
    `--cors-origin '*'`; under a list (names, `localhost`) the requested headers are named back instead:
    browsers never let `*` cover `Authorization` (the Fetch standard), so an allowed web page that sends an
    API key keeps working (under `*` it cannot send one, as with llama-server). A preflight from an origin not
    allowed gets 200 and no Access-Control-Allow-* header, which the browser refuses as llama-server's
    answer; the request itself is then refused by the Guard (403). A response to an allowed origin's
    request carries Access-Control-Allow-Origin (and credentials, and Retry-After readable).

    Why not Starlette's CORSMiddleware (used before): it answers a disallowed preflight with 400, cannot
    answer `*` for headers while reflecting the origin, and takes no `localhost` rule.
    """

    def __init__(self, app: ASGIApp, origins: Origins) -> None:
        self.app, self.origins = app, origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        allowed = self.origins.allows(origin)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self.preflight(origin, allowed, headers)(scope, receive, send)
            return
        if not allowed:
            await self.app(scope, receive, send)  # the Guard refuses it, unless it is the server's own page
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out.add_vary_header("Origin")
                out.raw.extend(raw({"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true",
                                    "Access-Control-Expose-Headers": "Retry-After"}))
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def preflight(self, origin: str, allowed: bool, headers: Headers) -> ASGIApp:
        out = {"Vary": "Origin", "Content-Length": "0"}
        if allowed:
            out.update({"Access-Control-Allow-Origin": origin, **PREFLIGHT_HEADERS})
            asked = headers.get("access-control-request-headers")
            if asked and not self.origins.any:
                out["Access-Control-Allow-Headers"] = asked

        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            await send({"type": "http.response.start", "status": 200, "headers": raw(out)})
            await send({"type": "http.response.body", "body": b""})

        return answer


def raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """Headers as ASGI's raw pairs, their names in the usual capitals (Starlette writes them in lower case;
    HTTP ignores the case, some clients compare names as written)."""
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def with_cors(app: ASGIApp, origins: Iterable[str]) -> ASGIApp:
    """CORS for the allowed origins (none: no CORS, app returned as it is)."""
    allowed = Origins(origins)
    return Cors(app, allowed) if allowed else app
