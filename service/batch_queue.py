"""One model's queue of items and its take policy: plain records and functions of `now`, no event loop.

An item is one model input (a text, a pair, a QA or NER window); a request of 64 texts and 64 requests of one text
are 64 items alike. A *take* is the items taken from the queue at once for the next forward passes.

Fair share: the queue is one sub-queue per request, served round-robin, one item per request per turn, while the
items fit one pass's budget (the batch size for their padded width, measured or max_batch_size, and
max_batch_tokens: `BatchShape.fits`). A request of 1,000 windows and a one-sentence request that arrives behind it
share the next take. A request whose next item does not fit is skipped for that take; within a request, items keep
their order; the rotation carries over from take to take.

Items no longer wanted (the queue's `wanted` predicate: their client has gone) or past their deadline are dropped
when a take reaches them, before any compute, and handed back with their reason ("cancelled", "expired").

Each item's lifecycle: QUEUED -> DROPPED (cancelled | expired | shutdown) or BATCHED.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from tasks.runtime.inference import BatchShape, Keep, ModelItem


class ItemState(Enum):
    QUEUED = "queued"
    DROPPED = "dropped"
    BATCHED = "batched"


@dataclass(eq=False, slots=True)
class Item:
    encoded: ModelItem
    length: int
    deadline: float  # time.monotonic() after which computing it is pointless
    enqueued_at: float
    keep: Keep | None = None  # what the item keeps of its pass (tasks/runtime/inference.py)
    future: Any = None  # whoever waits for it (the batcher's asyncio future); the queue never looks at it
    state: ItemState = ItemState.QUEUED


class Take(NamedTuple):
    items: list[Item]  # taken (now BATCHED), in round-robin order
    dropped: list[tuple[Item, str]]  # met on the way and dropped: (item, "cancelled" | "expired")


def _head(request: deque[Item]) -> Item | None:
    """The request's next queued item, forgetting those dropped meanwhile."""
    while request and request[0].state is not ItemState.QUEUED:
        request.popleft()
    return request[0] if request else None


class ItemQueue:
    """The QUEUED items of one model, one sub-queue per request in round-robin order."""

    def __init__(self, shape: BatchShape, wanted: Callable[[Item], bool] = lambda item: True):
        self.shape = shape
        self.wanted = wanted
        self.depth = 0  # QUEUED items
        self._requests: deque[deque[Item]] = deque()

    def add(self, items: Sequence[Item]) -> None:
        """Queue one request's items, behind the requests already queued."""
        if items:
            self._requests.append(deque(items))
        self.depth += len(items)

    def discard(self, item: Item) -> bool:
        """Drop a queued item (its client left; shutdown). False when it was no longer queued."""
        if item.state is not ItemState.QUEUED:
            return False
        item.state = ItemState.DROPPED
        self.depth -= 1
        return True

    def clear(self) -> list[Item]:
        """Drop every queued item (shutdown) and return them."""
        dropped = [item for request in self._requests for item in request if self.discard(item)]
        self._requests.clear()
        return dropped

    def oldest(self) -> float | None:
        """Arrival time of the oldest queued item; forgets requests with nothing queued."""
        self._requests = deque(request for request in self._requests if _head(request) is not None)
        return min((request[0].enqueued_at for request in self._requests), default=None)

    def full(self) -> bool:
        """Would a take taken now be as large as the budget allows?"""
        count, longest = 0, 0
        for request in self._requests:
            for item in request:
                if item.state is not ItemState.QUEUED:
                    continue
                if not self.shape.fits(count + 1, max(longest, item.length)):
                    return True
                count, longest = count + 1, max(longest, item.length)
        return False

    def take(self, now: float, already: Sequence[Item] = ()) -> Take:
        """Round-robin over the requests, one item per request per turn, while the items (with `already`, those of
        a take being topped up) fit one pass's budget; drop unwanted and expired items on the way."""
        taken: list[Item] = []
        dropped: list[tuple[Item, str]] = []
        count, longest = len(already), max((item.length for item in already), default=0)
        stalled = 0  # requests in a row whose next item did not fit
        requests = self._requests
        while requests and stalled < len(requests):
            request = requests[0]
            item = _head(request)
            if item is None:
                requests.popleft()
                continue
            gone = "cancelled" if not self.wanted(item) else "expired" if item.deadline <= now else None
            if gone is not None:
                self.discard(item)
                dropped.append((item, gone))
                continue
            if not self.shape.fits(count + 1, max(longest, item.length)):
                if count >= self.shape.max_batch_size:
                    break
                requests.rotate(-1)
                stalled += 1
                continue
            request.popleft()
            item.state = ItemState.BATCHED
            taken.append(item)
            count, longest = count + 1, max(longest, item.length)
            stalled = 0
            requests.rotate(-1)
        self.depth -= len(taken)
        return Take(taken, dropped)
