"""Request ids: each request's `X-Request-ID`, taken from the client when it is a safe token, else made here, and
kept in a context variable so that every log line written while the request runs carries it.

A client's id is used as it is only when it is 1 to `MAX_LENGTH` visible ASCII characters (0x21-0x7E) other than
`"` and `\\`: nothing that could break a log line, a JSON field or a response header. Anything else (too long,
empty, spaces, control or non-ASCII characters) is replaced by a new id and never written anywhere, so a client
cannot inject text into the logs through it.
"""

from __future__ import annotations

import logging
import os
import random
import re
from contextvars import ContextVar

HEADER = b"x-request-id"
MAX_LENGTH = 128
_SAFE = re.compile(rb"[!#-\[\]-~]{1,%d}" % MAX_LENGTH)  # 0x21-0x7E without '"' (0x22) and '\' (0x5C)

REQUEST_ID: ContextVar[str | None] = ContextVar("berth_request_id", default=None)


# Ids need to be unique, not secret: a generator seeded from os.urandom (re-seeded in a forked child, so server
# processes never share a sequence) costs a fifth of an os.urandom call per request.
_random = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(32)))


def new_id() -> str:
    """A fresh id: 32 hex digits (128 random bits, as a UUID4 has 122)."""
    return f"{_random.getrandbits(128):032x}"


def from_headers(headers: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]) -> tuple[str, bool]:
    """(the request's id, whether the client's own was refused): the client's X-Request-ID when it is safe,
    else a new one (also when there is none: then refused is False)."""
    for name, value in headers:
        if name == HEADER and value:  # an empty header is no id
            if _SAFE.fullmatch(value):
                return value.decode("ascii"), False
            return new_id(), True
    return new_id(), False


def current() -> str | None:
    """The id of the request this code runs for (None outside a request)."""
    return REQUEST_ID.get()


class RequestIdFilter(logging.Filter):
    """Puts the current request's id on every record (`record.request_id`, None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True
