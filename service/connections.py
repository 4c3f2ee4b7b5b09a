"""Connection hygiene that uvicorn lacks: a deadline for request heads and a cap on open connections.

uvicorn arms no timer until a response has been sent (its keep-alive timeout), so a client that connects
and sends nothing, or a request head one byte at a time, holds its socket (a file descriptor) for as long
as it likes; a few hundred of them starve the process (slow-loris). `connection_protocol(settings)` returns
uvicorn's httptools protocol (what `berth serve` runs: `uvicorn[standard]` brings httptools) with:

- a head deadline: a connection must complete a request's head (request line and headers) within
  `header_timeout_s` of connecting, and each later request within `header_timeout_s` of its first
  byte; otherwise it is closed (nothing is answered: nginx does the same). The same deadline runs
  after a response sent before its request's body had fully arrived (401, 408, 413, 429): the rest of
  that body and the next head must come within it. A head larger than `MAX_HEAD_BYTES` gets 431 and
  the connection is closed (httptools sets no limit of its own);
- a connection cap: a connection accepted while `max_connections` are open is not served: it gets
  503 + Retry-After in the JSON error shape once its request head has arrived (within
  `REFUSED_WAIT_S`), and is closed. It costs a file descriptor for at most that long. (uvicorn's own
  `limit_concurrency` counts connections and tasks together, answers plain text, and only once the
  head is complete, so a slow-loris still holds its socket: not used.)

- a write deadline and a cap on bytes queued to slow readers: an answer the client does not read stays in the
  connection's write buffer (uvicorn writes a body whole). When the buffer passes asyncio's high-water mark,
  the connection must drain it below the low mark within `write_timeout_s`, else it is aborted (its buffer
  freed at once); and while the buffers of all such stalled connections hold more than
  `max_queued_response_bytes`, a connection that stalls is aborted at once. Both are counted in
  berth_connections_closed_total (write_timeout, write_queue_full);
- parser errors (a malformed request line or header) get the JSON error shape with 400, not uvicorn's plain
  text, and the connection is closed;
- a response's head and body in one write to the socket, not two (service/coalesced_writes.py).

Idle keep-alive connections are uvicorn's own `timeout_keep_alive` (`keep_alive_timeout_s`), armed after
each response. The /v1 limits (body reads, requests in progress) are the request guard's
(service/middleware.py).

The hooks are httptools' parser callbacks and asyncio's protocol methods, which uvicorn's
`HttpToolsProtocol` implements (checked below at import, so a uvicorn that renamed them stops `berth serve`
instead of silently serving without deadlines); tests/service/test_connections.py checks the behaviour
against a real server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.coalesced_writes import CoalescedWrites
from service.errors import ErrorType
from service.metrics import Metrics
from service.settings import ServiceSettings

log = logging.getLogger("berth.service")

MAX_HEAD_BYTES = 64 * 1024  # request line + headers; beyond, 431 and closed (nginx's default is 4 x 8 KiB)
REFUSED_WAIT_S = 1.0  # how long a connection beyond the cap may take to send its head before it is closed
_HOOKS = ("connection_made", "connection_lost", "data_received", "on_message_begin", "on_headers_complete",
          "on_message_complete", "on_response_complete")
_missing = [name for name in _HOOKS if not callable(getattr(HttpToolsProtocol, name, None))]
if _missing:  # pragma: no cover - only with a uvicorn this module was not written for
    raise ImportError(f"uvicorn's HttpToolsProtocol has no {', '.join(_missing)}: service/connections.py needs "
                      "updating for this uvicorn version")


def raw_error(status: int, reason: str, error_type: ErrorType, message: str, retry_after: int | None = None) -> bytes:
    """A complete `Connection: close` response in the service's JSON error shape, written outside the app."""
    body = json.dumps({"error": message, "error_type": error_type.value}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head deadline and the connection cap (see the module doc).
    `connection_protocol` sets the class attributes from the settings."""

    header_timeout_s: float = 10.0
    write_timeout_s: float = 30.0
    max_queued_response_bytes: int = 256 * 1024 * 1024
    max_connections: int = 1024
    retry_after_s: int = 1
    metrics: Metrics | None = None  # berth_open_connections, berth_connections_closed_total
    _last_refusal_log = 0.0  # class-wide: at most one warning about refused connections per 10 s
    _refusals_unlogged = 0
    _stalled: set[GuardedHttpToolsProtocol] = set()  # class-wide: connections whose client reads too slowly

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_pending = True  # waiting for a request head (none begun, or the last message complete)
        self._head_bytes = 0  # of the head being received
        self._heads = 0  # heads completed on this connection
        self._refused: bytearray | None = None  # beyond the cap: what arrived of the head, to answer 503
        self._write_timer: asyncio.TimerHandle | None = None  # armed while the write buffer is over its high mark

    # -- asyncio protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:  # `connections`: uvicorn's set of open ones
            self._refuse(transport)
            return
        super().connection_made(transport)
        self.transport = CoalescedWrites(transport, self.loop)  # type: ignore[assignment]
        if self.metrics is not None:
            self.metrics.open_connections.inc()
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            self._refused += data
            if b"\r\n\r\n" in self._refused or len(self._refused) > MAX_HEAD_BYTES:
                self._answer_refused()
            return
        waiting, heads = self._head_pending, self._heads
        if waiting:
            self._arm()  # the first byte of a head (or stray bytes between requests) starts the deadline
            end = data.find(b"\r\n\r\n")
            if end >= 0 and self._head_bytes + end + 4 > MAX_HEAD_BYTES:  # a whole large head in one read
                self._head_too_large()
                return
        super().data_received(data)
        if waiting and self._head_pending and self._heads == heads and not self.transport.is_closing():
            self._head_bytes += len(data)  # all of `data` was head (no body in it, no head completed)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._head_too_large()

    def _head_too_large(self) -> None:
        self._disarm()
        self._count_closed("head_too_large")
        self.transport.write(raw_error(431, "Request Header Fields Too Large", ErrorType.TOO_LARGE,
                                       f"request head larger than {MAX_HEAD_BYTES} bytes"))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:  # uvicorn: the parser refused the bytes
        if self.transport.is_closing():
            return
        self._disarm()
        self.transport.write(raw_error(400, "Bad Request", ErrorType.VALIDATION,
                                       "malformed HTTP request (request line or headers)"))
        self.transport.close()

    # -- slow readers: asyncio's flow control calls these around the transport's high / low water marks
    def pause_writing(self) -> None:
        super().pause_writing()
        cls = GuardedHttpToolsProtocol
        queued = sum(c.transport.get_write_buffer_size() for c in cls._stalled | {self})
        if queued > self.max_queued_response_bytes:
            self._abort_writer("write_queue_full")
            return
        cls._stalled.add(self)
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._abort_writer, "write_timeout")

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        GuardedHttpToolsProtocol._stalled.discard(self)
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _abort_writer(self, reason: str) -> None:
        self._write_timer = None
        self._unstall()
        if not self.transport.is_closing() or self.transport.get_write_buffer_size():
            self._count_closed(reason)
            log.warning("connection closed: its client read %s (%d bytes unsent)",
                        "nothing within write_timeout_s" if reason == "write_timeout"
                        else "too slowly while max_queued_response_bytes were queued to slow readers",
                        self.transport.get_write_buffer_size())
            self.transport.abort()  # drops the unsent bytes now; close() would wait for the client to read them

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        if self._refused is not None:
            return  # never joined uvicorn's connections
        if self.metrics is not None:
            self.metrics.open_connections.dec()
        super().connection_lost(exc)

    # -- httptools parser callbacks (the parser calls them on this object)
    def on_message_begin(self) -> None:
        self._head_pending = True
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_pending = False
        self._head_bytes = 0
        self._heads += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._head_pending = True  # the next bytes begin the next request; no timer until they come
        super().on_message_complete()

    # -- uvicorn: a response has been sent
    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer when the connection is idle
        if not self._head_pending and not self.transport.is_closing():
            self._arm()  # answered before its body arrived: the rest of it (and the next head) get the deadline

    # -- the deadline
    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self._count_closed("header_timeout")
            self.transport.close()

    def _count_closed(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason).inc()

    # -- beyond the cap
    def _refuse(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._refused = bytearray()
        self._count_closed("over_limit")
        self._head_timer = self.loop.call_later(min(REFUSED_WAIT_S, self.header_timeout_s), transport.close)
        cls = GuardedHttpToolsProtocol
        cls._refusals_unlogged += 1
        now = time.monotonic()
        if now - cls._last_refusal_log >= 10:
            log.warning("%d connection(s) refused with 503: %d open, the limit is %d (max_connections)",
                        cls._refusals_unlogged, len(self.connections), self.max_connections)
            cls._last_refusal_log, cls._refusals_unlogged = now, 0

    def _answer_refused(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(raw_error(503, "Service Unavailable", ErrorType.OVERLOADED,
                                           f"too many open connections; the limit is {self.max_connections} "
                                           "(max_connections)", retry_after=self.retry_after_s))
            self.transport.close()


def connection_protocol(settings: ServiceSettings, metrics: Metrics | None = None) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`, with the settings' deadline and cap, counting into
    `metrics`."""
    return type("BerthHttpProtocol", (GuardedHttpToolsProtocol,), {
        "header_timeout_s": settings.header_timeout_s,
        "write_timeout_s": settings.write_timeout_s,
        "max_queued_response_bytes": settings.max_queued_response_bytes,
        "max_connections": settings.max_connections,
        "retry_after_s": settings.retry_after_s,
        "metrics": metrics,
    })
