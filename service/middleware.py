"""Pure ASGI middleware around every request: what is refused before any work, and the request metrics.

In order, before the body is parsed:
1. the API key (when one is configured) on the protected routes (/v1, /v2/rerank, and the paths the app adds:
   the other servers' formats of service/compat, /models/..., TEI's /embed, /predict...): a request without
   the right key gets 401 and costs the server nothing; its body is never read;
2. the body, under its own limit: at most `max_body_reads` requests may be receiving a body that did not
   arrive whole with its first chunk (beyond: 429 + Retry-After, the rest not read; a small body that came
   with its headers is never refused for this). It is counted as it arrives and refused with 413 as
   soon as it passes `max_body_bytes` (or at once when Content-Length says so), and with 408 when it has
   not fully arrived within `body_read_timeout_s`. The app then reads it from memory; later `receive()`
   calls go to the server, so handlers can still hear the client disconnect;
3. the concurrency limit on the protected routes (`max_concurrent_requests`), taken only once the body is in
   memory, so slow uploads cannot hold the slots of requests ready to run: beyond it, 429 + Retry-After.

429 means "this replica is busy now, retry later" (nginx passes it to the client and keeps the replica);
503 is kept for a server that is not ready, loading or shutting down (nginx retries another replica).
A client that leaves while its body is arriving is counted as 499. Every response is counted under its
route template, also those refused here. A refusal is answered by `error_response_for(path, error)`:
berth's error shape by default; the app gives TEI's routes TEI's (service/compat/errors.py).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from typing import Any

from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ErrorType, ServiceError, error_response
from service.metrics import Metrics

BODY_METHODS = {"POST", "PUT", "PATCH"}
PROTECTED_PREFIXES = ("/v1/", "/v2/")  # /v2/rerank: Cohere's v2 path
STARTED_AT = "berth_started_at"  # scope["state"] key: perf_counter() when the request reached the app
CLIENT_GONE_STATUS = 499  # nginx's "client closed request", as service/inference.py counts it


class ClientGone(Exception):
    """The client disconnected while its body was arriving."""


class BodyReadsFull(Exception):
    """More than max_body_reads requests are receiving a body that did not come whole at once."""


class RequestGuard:
    def __init__(self, app: ASGIApp, metrics: Metrics, max_body_bytes: int, api_key: str | None = None,
                 max_concurrent: int = 256, body_read_timeout_s: float = 10.0, retry_after_s: int = 1,
                 max_body_reads: int = 64, protected_prefixes: tuple[str, ...] = (),
                 protected_paths: frozenset[str] = frozenset(),
                 error_response_for: Callable[[str, ServiceError], ASGIApp] | None = None):
        """`protected_prefixes` and `protected_paths`: more paths under the key and the concurrency limit."""
        self.app = app
        self.protected_prefixes = PROTECTED_PREFIXES + tuple(protected_prefixes)
        self.protected_paths = protected_paths
        self.error_response_for = error_response_for or (lambda path, error: error_response(error))
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key.encode() if api_key else None
        self.max_concurrent = max_concurrent
        self.in_flight = 0  # protected requests past their body, in the app
        self.max_body_reads = max_body_reads
        self.body_reads = 0  # requests whose body is arriving (every path)
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

        protected = scope["path"].startswith(self.protected_prefixes) or scope["path"] in self.protected_paths
        counted = False
        try:
            if protected and self.api_key is not None and not self._authorized(scope):
                await self._refuse(ServiceError(ErrorType.UNAUTHORIZED, "missing or wrong API key (send "
                                           "Authorization: Bearer <key>)"), scope, receive, send_and_record)
                return
            if scope["method"] in BODY_METHODS:
                self.body_reads += 1
                try:
                    async with asyncio.timeout(self.body_read_timeout_s):  # no task per request, as wait_for makes
                        body = await self._read_body(scope, receive)
                except BodyReadsFull:
                    await self._refuse(self._busy(f"{self.body_reads - 1} request bodies arriving; the limit is "
                                                  f"{self.max_body_reads} (max_body_reads)"),
                                       scope, receive, send_and_record)
                    return
                except ClientGone:
                    status["code"] = CLIENT_GONE_STATUS
                    return
                except TimeoutError:
                    await self._refuse(ServiceError(ErrorType.TIMEOUT, f"request body not received within "
                                               f"{self.body_read_timeout_s:g} s (body_read_timeout_s)", status=408),
                                  scope, receive, send_and_record)
                    return
                finally:
                    self.body_reads -= 1
                if body is None:
                    await self._refuse(ServiceError(ErrorType.TOO_LARGE, f"request body larger than "
                                               f"{self.max_body_bytes} bytes (max_body_bytes)"),
                                  scope, receive, send_and_record)
                    return
                receive = _replay(body, receive)
            if protected:
                if self.in_flight >= self.max_concurrent:
                    await self._refuse(self._busy(f"{self.in_flight} requests in progress; the limit is "
                                             f"{self.max_concurrent} (max_concurrent_requests)"),
                                  scope, receive, send_and_record)
                    return
                self.in_flight += 1
                counted = True
            await self.app(scope, receive, send_and_record)
        finally:
            if counted:
                self.in_flight -= 1
            self._record(scope, status["code"], time.perf_counter() - started)

    async def _refuse(self, error: ServiceError, scope: Scope, receive: Receive, send: Send) -> None:
        await self.error_response_for(scope["path"], error)(scope, receive, send)

    def _busy(self, message: str) -> ServiceError:
        return ServiceError(ErrorType.OVERLOADED, message, status=429, retry_after=self.retry_after_s)

    def _authorized(self, scope: Scope) -> bool:
        assert self.api_key is not None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.api_key)
        return False

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it is known to exceed the limit; ClientGone if the client left."""
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
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
            # A body that came whole with its first message (most: small JSON) never waits on the client; one
            # that keeps arriving holds a read slot, and is refused when more than max_body_reads do so.
            if len(chunks) == 1 and self.body_reads > self.max_body_reads:
                raise BodyReadsFull
        return b"".join(chunks)

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", None) or match_route(scope) or "unmatched"
        if route == "/metrics":
            return
        state: dict[str, Any] = scope.get("state") or {}
        model = str(state.get("berth_model", ""))
        children = self._children.get((route, model, status))
        if children is None:  # bounded: route templates x models x status codes
            children = self._children[(route, model, status)] = (
                self.metrics.requests.labels(route, model, str(status)),
                self.metrics.request_duration.labels(route, model))
        children[0].inc()
        children[1].observe(seconds)


def match_route(scope: Scope) -> str | None:
    """The route template of a request refused before routing (401, 408, 413, 429), so it is counted there:
    a path the app documents, `/models/{name}` for any name (labels stay bounded whatever clients send);
    None for any other path."""
    app = scope.get("app")
    if app is None or not hasattr(app, "openapi"):
        return None
    templates = getattr(app.state, "berth_route_templates", None)
    if templates is None:
        templates = app.state.berth_route_templates = [(compile_path(path)[0], path)
                                                       for path in app.openapi().get("paths", {})]
    return next((template for pattern, template in templates if pattern.match(scope["path"])), None)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
