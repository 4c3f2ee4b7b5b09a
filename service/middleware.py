"""Pure ASGI middleware around every request: the body size limit and the request metrics.

The body is read here, counted as it arrives and refused with 413 as soon as it passes
`max_body_bytes` (or at once when Content-Length says so), before any JSON parsing; the app then
reads it from memory. Later `receive()` calls go to the server, so handlers can still hear the
client disconnect.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ErrorType, ServiceError, error_response
from service.metrics import Metrics

BODY_METHODS = {"POST", "PUT", "PATCH"}


class RequestGuard:
    def __init__(self, app: ASGIApp, metrics: Metrics, max_body_bytes: int):
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_and_record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if scope["method"] in BODY_METHODS:
                body = await self._read_body(scope, receive)
                if body is None:
                    too_large = ServiceError(ErrorType.TOO_LARGE, f"request body larger than {self.max_body_bytes} "
                                             "bytes (max_body_bytes)")
                    await error_response(too_large)(scope, receive, send_and_record)
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send_and_record)
        finally:
            self._record(scope, status["code"], time.perf_counter() - started)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it is known to exceed the limit."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    if int(value) > self.max_body_bytes:
                        return None
                except ValueError:
                    pass
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        if route == "/metrics":
            return
        state: dict[str, Any] = scope.get("state") or {}
        model = str(state.get("berth_model", ""))
        self.metrics.requests.labels(route, model, str(status)).inc()
        self.metrics.request_duration.labels(route, model).observe(seconds)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
