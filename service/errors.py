"""One error type, one status mapping, one JSON shape.

Every error the service returns is `{"error": "<human-readable message>", "error_type": "<type>"}`
(plus `detail` for field-level validation errors), whatever raised it: our own checks, pydantic,
Starlette routing, or an unexpected exception (500, logged with its traceback, never shown).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.batch_errors import BatcherError, Expired, ItemFailed, ItemTooLarge, NotAccepting, QueueFull

log = logging.getLogger("berth.service")


class ErrorType(StrEnum):
    VALIDATION = "validation"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    UNAUTHORIZED = "unauthorized"
    INTERNAL = "internal"


STATUS_CODES: dict[ErrorType, int] = {
    ErrorType.VALIDATION: 422,
    ErrorType.NOT_FOUND: 404,
    ErrorType.TOO_LARGE: 413,
    ErrorType.OVERLOADED: 429,  # 503 while starting or shutting down (ServiceError.status overrides)
    ErrorType.TIMEOUT: 504,
    ErrorType.UNAUTHORIZED: 401,
    ErrorType.INTERNAL: 500,
}


class ServiceError(Exception):
    """An error answered to the client. `status` overrides the type's default code (429 vs 503)."""

    def __init__(
        self,
        error_type: ErrorType,
        message: str,
        *,
        status: int | None = None,
        retry_after: int | None = None,
        detail: list[dict[str, Any]] | None = None,
    ):
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = status or STATUS_CODES[error_type]
        self.retry_after = retry_after
        self.detail = detail

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message, "error_type": self.error_type.value}
        if self.detail:
            out["detail"] = self.detail
        return out

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.error_type is ErrorType.UNAUTHORIZED:
            headers["WWW-Authenticate"] = "Bearer"
        return headers


# The batcher's own errors as HTTP errors: (type, status).
BATCHER_ERRORS: dict[type[BatcherError], tuple[ErrorType, int]] = {
    QueueFull: (ErrorType.OVERLOADED, 429),
    NotAccepting: (ErrorType.OVERLOADED, 503),
    ItemTooLarge: (ErrorType.TOO_LARGE, 413),
    Expired: (ErrorType.TIMEOUT, 504),
    ItemFailed: (ErrorType.INTERNAL, 500),
}


def from_batcher(error: BatcherError) -> ServiceError:
    """The HTTP error for a batcher error (the one place that knows both)."""
    error_type, status = BATCHER_ERRORS.get(type(error), (ErrorType.INTERNAL, 500))
    return ServiceError(error_type, error.message, status=status, retry_after=error.retry_after)


def error_response(error: ServiceError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def _is_union_tag(part: Any) -> bool:
    """Pydantic names the union member it tried in `loc` ("str", "list[TextPair]"); callers never wrote those."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper() or part in ("str", "int", "float", "bool"))


def clean_validation_detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's error list without the offending input values (they may be huge, or private) and
    without union member tags; the most specific (deepest) problem first."""
    cleaned = [{"loc": [p for p in e.get("loc", ()) if not _is_union_tag(p)], "msg": str(e.get("msg", "")),
                "type": str(e.get("type", ""))} for e in errors[:20]]
    return sorted(cleaned, key=lambda e: -len(e["loc"]))


def validation_message(detail: list[dict[str, Any]]) -> str:
    if not detail:
        return "invalid request"
    first = detail[0]
    where = ".".join(str(part) for part in first["loc"] if part != "body") or "body"
    more = f" (and {len(detail) - 1} more problems)" if len(detail) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def response_for(exc: Exception, request: Request) -> JSONResponse:
    """The error response for anything an endpoint raised: the one mapping FastAPI's exception handlers and
    the fast path (service/fastpath.py) share."""
    if isinstance(exc, ServiceError):
        return error_response(exc)
    if isinstance(exc, BatcherError):
        return error_response(from_batcher(exc))
    if isinstance(exc, RequestValidationError):
        detail = clean_validation_detail(list(exc.errors()))
        message = validation_message(detail)
        content_type = request.headers.get("content-type", "")
        if request.method == "POST" and "json" not in content_type:
            message = f"send the body as JSON with Content-Type: application/json (got {content_type!r}); {message}"
        # a body that is not JSON at all is malformed (400); JSON that does not fit the schema is 422
        malformed = any(e["type"] == "json_invalid" for e in detail)
        return error_response(ServiceError(ErrorType.VALIDATION, message, detail=detail,
                                           status=400 if malformed else None))
    if isinstance(exc, StarletteHTTPException):
        return error_response(_from_http(exc, request))
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(ServiceError(ErrorType.INTERNAL, "internal error; see the server log"))


def _from_http(exc: StarletteHTTPException, request: Request) -> ServiceError:
    if exc.status_code == 404:
        return ServiceError(ErrorType.NOT_FOUND, f"no route {request.url.path}")
    if exc.status_code == 405:
        return ServiceError(ErrorType.VALIDATION, f"method {request.method} not allowed on {request.url.path}",
                            status=405)
    if exc.status_code == 413:
        return ServiceError(ErrorType.TOO_LARGE, str(exc.detail))
    if exc.status_code == 400:  # FastAPI's own "There was an error parsing the body" (e.g. nested too deep)
        return ServiceError(ErrorType.VALIDATION, f"the body could not be parsed as JSON: {exc.detail}", status=400)
    if exc.status_code < 500:
        return ServiceError(ErrorType.VALIDATION, str(exc.detail), status=exc.status_code)
    return ServiceError(ErrorType.INTERNAL, "internal error", status=exc.status_code)


def install_error_handlers(app: FastAPI,
                           reshape: Callable[[str, JSONResponse], JSONResponse] | None = None) -> None:
    """Every exception an endpoint raises answered by `response_for`. An unexpected one (`Exception`) is answered by
    FastAPI's error middleware, which then re-raises it so that the server logs its traceback; the request-id layer
    (service/request_trace.py) is outside that middleware, so the id is set for the log line and added to the 500.
    `reshape(path, response)`: another server's error shape on that server's paths (routing's own 404 and 405
    are raised before any route's handler runs)."""
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        response = response_for(exc, request)
        return reshape(request.url.path, response) if reshape else response

    for raised in (ServiceError, BatcherError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(raised, handle)
