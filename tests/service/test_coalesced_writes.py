"""service/coalesced_writes.py on a real TCP connection on 127.0.0.1: a response head and the body written after
it in the same event-loop step reach the socket in one write; a head alone, or one followed by close, still goes
out, and bytes arrive in the order they were written. A real berth server answering through it is
tests/service/test_connections.py and the other end-to-end batteries."""

from __future__ import annotations

import asyncio

from service.coalesced_writes import CoalescedWrites

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n"
BODY = b'{"ok":true}'


class _Counted:
    """The real transport, with the sizes of the writes that reach it recorded."""

    def __init__(self, transport: asyncio.Transport):
        self.transport = transport
        self.writes: list[int] = []

    def write(self, data: bytes) -> None:
        self.writes.append(len(data))
        self.transport.write(data)

    def __getattr__(self, name: str):
        return getattr(self.transport, name)


async def _connected(scenario) -> tuple[bytes, list[int]]:
    """Run `scenario(coalesced transport, loop)` on the server side of a real connection; what the client read
    until the server closed, and the writes that reached the socket's transport."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    class Server(asyncio.Protocol):
        def connection_made(self, transport):
            counted = _Counted(transport)
            done.set_result(counted)
            scenario(CoalescedWrites(counted, loop), loop)  # type: ignore[arg-type]

    server = await loop.create_server(Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    server.close()
    return received, (await done).writes


def test_a_head_and_its_body_in_one_step_are_one_write():
    def answer(transport, loop):
        transport.write(HEAD)
        transport.write(BODY)
        loop.call_soon(transport.close)

    received, writes = asyncio.run(_connected(answer))
    assert received == HEAD + BODY
    assert writes == [len(HEAD) + len(BODY)]


def test_a_head_alone_goes_out_at_the_end_of_the_step_and_order_is_kept():
    def answer(transport, loop):
        transport.write(HEAD)  # a streamed answer: its body comes in a later step
        assert transport.get_write_buffer_size() >= len(HEAD)
        loop.call_later(0.05, transport.write, b"later")
        loop.call_later(0.1, transport.close)

    received, writes = asyncio.run(_connected(answer))
    assert received == HEAD + b"later"
    assert writes == [len(HEAD), len(b"later")]


def test_close_sends_a_held_head_first_and_other_bytes_are_not_held():
    def answer(transport, loop):
        transport.write(b"not a head")
        transport.write(HEAD)
        transport.close()

    received, writes = asyncio.run(_connected(answer))
    assert received == b"not a head" + HEAD
    assert writes == [len(b"not a head"), len(HEAD)]


def test_writelines_sends_a_held_head_first():
    def answer(transport, loop):
        transport.write(HEAD)
        transport.writelines([b"a", b"b"])
        transport.close()

    received, _ = asyncio.run(_connected(answer))
    assert received == HEAD + b"ab"
