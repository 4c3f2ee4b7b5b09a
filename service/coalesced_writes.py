"""A connection's transport that sends a response's head and its body in one system call.

uvicorn writes a response in two `transport.write` calls, the head (status line and headers) when the app sends
`http.response.start`, then the body: two `send()` calls on the socket, each a trip through the kernel's TCP stack
(on loopback the receiver's side runs in the same call), and two reads for the client. Profiled under 32 clients on
2 cores, those two writes were 13% of the event loop's time, against 10% for tokenizing the request. Here a
write that is a response head (`HTTP/1.1 ...` ending in the blank line) is held back and sent together with
the next write, the body, which uvicorn makes in the same step of the event loop; a head whose body does not
follow in that step (a streamed answer, `100 Continue`) goes out by itself at the end of the step. Bytes go
out in the order they were written; `close` sends what is held first, `abort` drops it with the rest.
"""

from __future__ import annotations

import asyncio
from typing import Any

_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"


class CoalescedWrites:
    """Wraps an asyncio transport; everything but writing, closing and the buffer size is the transport's own
    (a websocket upgrade's protocol writes through it too: `writelines` sends a held head first)."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif isinstance(data, bytes) and data.startswith(_HEAD_START) and data.endswith(_HEAD_END):
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def writelines(self, chunks: Any) -> None:
        self._flush()
        self._transport.writelines(chunks)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
