"""API errors with an HTTP status, written in OpenAI's or Anthropic's error shape."""
from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

# Our error kinds -> (OpenAI type, Anthropic type).
_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("invalid_request_error", "authentication_error"),
    403: ("invalid_request_error", "permission_error"),
    404: ("invalid_request_error", "not_found_error"),
    408: ("invalid_request_error", "invalid_request_error"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "invalid_request_error"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    503: ("server_error", "overloaded_error"),
    504: ("server_error", "timeout_error"),
}


class ApiError(Exception):
    """An answer other than success: status, a machine code, and a message for people."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 retry_after: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after
        self.reason = reason or code or str(status)  # the metrics label

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}

    def openai(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, _TYPES[500])[0]
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def anthropic(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, _TYPES[500])[1]
        return {"type": "error", "error": {"type": kind, "message": self.message}}


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(path: str, err: ApiError) -> JSONResponse:
    body = err.anthropic() if is_anthropic(path) else err.openai()
    return JSONResponse(body, status_code=err.status, headers=err.headers())


def invalid(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code, reason="invalid")


def not_supported(what: str) -> ApiError:
    return ApiError(400, f"{what} is not supported by this server", param=what.split()[0],
                    code="unsupported", reason="invalid")
