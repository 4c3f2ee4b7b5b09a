"""The outermost of the app's request layers (service/app.py): every request gets its id (service/request_ids.py),
returned in `X-Request-ID` on every response (errors included: an unexpected 500, which FastAPI's error middleware,
inside this layer, answers) and carried by every log line written while it runs; with `access_log`, one line per
request; with tracing on (service/tracing.py), the request's server span. An exception that escapes the layers
inside before any response was sent (a bug in the guard or the fast path themselves, which no error middleware
wraps) is answered here with the JSON 500, then re-raised so the server logs its traceback.

The access log line (logger `berth.access`, INFO) holds what a request was, never what it said: method, route
template, model, status, inputs and model items, tokens, tokenize / queue / inference seconds where the request
reached inference, the total seconds, and the request id (`client_request_id: "refused"` when the client sent one
that was not safe to use). Never the body, a text, the query string or a header value.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import request_ids, tracing
from service.errors import ErrorType, ServiceError, error_response
from service.middleware import match_route

access = logging.getLogger("berth.access")


class RequestTrace:
    def __init__(self, app: ASGIApp, access_log: bool = False):
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id, refused = request_ids.from_headers(scope.get("headers", ()))
        token = request_ids.REQUEST_ID.set(request_id)
        header = (request_ids.HEADER, request_id.encode("ascii"))
        status = [0]  # 0: no response started yet

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        started = time.perf_counter() if self.access_log or tracing.ACTIVE else 0.0
        span = tracing.start_request(scope, started, request_id) if tracing.ACTIVE else None
        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            if not status[0]:
                await error_response(ServiceError(ErrorType.INTERNAL, "internal error"))(scope, receive, send_with_id)
            raise  # with the id still set (in this request's own context) for the server's traceback line
        finally:
            if started:
                self._finish(scope, span, started, status[0] or 500, refused)
        request_ids.REQUEST_ID.reset(token)

    def _finish(self, scope: Scope, span: Any, started: float, status: int, refused: bool) -> None:
        ended = time.perf_counter()
        route = getattr(scope.get("route"), "path", None) or match_route(scope)
        fields = request_fields(scope)
        if span is not None:
            tracing.end_request(span[0], span[1], ended, route, status, fields)
        if self.access_log:
            line = {"method": scope["method"], "route": route or "unmatched", "model": fields.pop("model", None),
                    "status": status, **fields, "seconds": round(ended - started, 6)}
            if refused:
                line["client_request_id"] = "refused"
            access.info("request", extra={"fields": line})


def request_fields(scope: Scope) -> dict[str, Any]:
    """What the request path recorded about a request (service/inference.py): model, counts, stage seconds."""
    state = scope.get("state") or {}
    fields: dict[str, Any] = {"model": state.get("berth_model")}
    timings = state.get("berth_timings")
    if timings is not None:
        fields.update(inputs=timings.inputs, items=timings.items, tokens=timings.tokens,
                      tokenize_seconds=round(timings.tokenize_s, 6), queue_seconds=round(timings.queue_s, 6),
                      inference_seconds=round(timings.inference_s, 6))
    return fields
