"""OpenAI-style error bodies: every error a client sees goes through `error_response`."""

from __future__ import annotations

from starlette.responses import JSONResponse

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}


class APIError(Exception):
    """A request that cannot be served; `status` is the HTTP status, `param` the offending field (or None)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error" if status < 500
                                                             else "server_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param=param, code=code), status_code=status, headers=headers)


def api_error_response(exc: APIError) -> JSONResponse:
    return error_response(exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers)
