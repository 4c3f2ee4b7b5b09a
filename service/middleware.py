"""Pure ASGI middleware around every request: what is refused before any work, and the request metrics.

In order, before the body is read or parsed:
1. the API key (when one is configured) on /v1 routes: a request without the right key gets 401 and
   costs the server nothing; its body is never read;
2. the concurrency limit on /v1 routes (`max_concurrent_requests`): beyond it, 503 + Retry-After;
3. the body: counted as it arrives and refused with 413 as soon as it passes `max_body_bytes` (or at
   once when Content-Length says so), and with 408 when it has not fully arrived within
   `body_read_timeout_s`. The app then reads it from memory; later `receive()` calls go to the
   server, so handlers can still hear the client disconnect.

Every response is counted under its route template, also those refused here.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ErrorType, ServiceError, error_response
from service.metrics import Metrics

BODY_METHODS = {"POST", "PUT", "PATCH"}
PROTECTED_PREFIX = "/v1/"
STARTED_AT = "berth_started_at"  # scope["state"] key: perf_counter() when the request reached the app


class RequestGuard:
    def __init__(self, app: ASGIApp, metrics: Metrics, max_body_bytes: int, api_key: str | None = None,
                 max_concurrent: int = 256, body_read_timeout_s: float = 10.0, retry_after_s: int = 1):
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key.encode() if api_key else None
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self.body_read_timeout_s = body_read_timeout_s
        self.retry_after_s = retry_after_s
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}  # the request metrics' labelled children

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        scope.setdefault("state", {})[STARTED_AT] = started
        status = {"code": 500}

        async def send_and_record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        protected = scope["path"].startswith(PROTECTED_PREFIX)
        counted = False
        try:
            refusal = self._refuse_early(scope, protected)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send_and_record)
                return
            if protected:
                self.in_flight += 1
                counted = True
            if scope["method"] in BODY_METHODS:
                try:
                    async with asyncio.timeout(self.body_read_timeout_s):  # no task per request, as wait_for makes
                        body = await self._read_body(scope, receive)
                except TimeoutError:
                    slow = ServiceError(ErrorType.TIMEOUT, f"request body not received within "
                                        f"{self.body_read_timeout_s:g} s (body_read_timeout_s)", status=408)
                    await error_response(slow)(scope, receive, send_and_record)
                    return
                if body is None:
                    too_large = ServiceError(ErrorType.TOO_LARGE, f"request body larger than {self.max_body_bytes} "
                                             "bytes (max_body_bytes)")
                    await error_response(too_large)(scope, receive, send_and_record)
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send_and_record)
        finally:
            if counted:
                self.in_flight -= 1
            self._record(scope, status["code"], time.perf_counter() - started)

    def _refuse_early(self, scope: Scope, protected: bool) -> ServiceError | None:
        """401 or 503 decided from the request line and headers alone."""
        if not protected:
            return None
        if self.api_key is not None and not self._authorized(scope):
            return ServiceError(ErrorType.UNAUTHORIZED, "missing or wrong API key (send Authorization: Bearer <key>)")
        if self.in_flight >= self.max_concurrent:
            return ServiceError(ErrorType.OVERLOADED, f"{self.in_flight} requests in progress; the limit is "
                                f"{self.max_concurrent} (max_concurrent_requests)", status=503,
                                retry_after=self.retry_after_s)
        return None

    def _authorized(self, scope: Scope) -> bool:
        assert self.api_key is not None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.api_key)
        return False

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
        route = getattr(scope.get("route"), "path", None) or _match_route(scope) or "unmatched"
        if route == "/metrics":
            return
        state: dict[str, Any] = scope.get("state") or {}
        model = str(state.get("berth_model", ""))
        children = self._children.get((route, model, status))
        if children is None:  # bounded: route templates x models x status codes
            children = self._children[(route, model, status)] = (
                self.metrics.requests.labels(route, model, str(status)), self.metrics.request_duration.labels(route, model))
        children[0].inc()
        children[1].observe(seconds)


def _match_route(scope: Scope) -> str | None:
    """The route template of a request refused before routing (401, 408, 413, 503), so it is counted there.
    Our routes have no path parameters, so a template is a path the app documents; any other path is not
    a label value (labels stay bounded whatever clients send)."""
    app = scope.get("app")
    if app is None or not hasattr(app, "openapi"):
        return None
    paths = getattr(app.state, "berth_route_paths", None)
    if paths is None:
        paths = app.state.berth_route_paths = frozenset(app.openapi().get("paths", {}))
    return scope["path"] if scope["path"] in paths else None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
