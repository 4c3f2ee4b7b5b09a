"""Dynamic batching for one model: a bounded queue of *items* and one worker thread.

An item is one model input (a text, a pair, a QA or NER window). A request of 64 texts and 64
requests of one text enter the queue alike, as 64 items, and are admitted, batched and refused alike.

The batcher is a small state machine (after text-embeddings-inference's `queue.rs`):

    ACCEPTING --begin_draining()--> DRAINING --queue empty (or close() timeout)--> STOPPED

    ACCEPTING: `submit` admits items while the queue has room; else 429 with Retry-After.
    DRAINING:  `submit` refuses with 503 (shutting down); what is queued still runs.
    STOPPED:   the loop has ended; anything still queued failed with 503.

Its loop, while not STOPPED:

    IDLE     queue empty: sleep until an item arrives.
    FILLING  the oldest waiting item arrived at t0: wait for more until the batch budget is full or
             t0 + max_wait has passed (items that waited during the previous forward pass start at once).
    TAKING   pop items in arrival order while they fit max_batch_size and max_batch_tokens (padded:
             items x the length bucket of the longest); items whose client has gone (future cancelled)
             or whose deadline passed are dropped here, before any compute, and counted by reason.
    RUNNING  in the model's worker thread: sort the batch by length, pad each group to its length
             bucket (so ONNX Runtime sees few shapes), run, and hand each item its own rows.

Each item's lifecycle: QUEUED -> DROPPED (cancelled | expired | shutdown) or BATCHED -> done/failed.
An item too long for any bucket or for the token budget is refused at admission (413), so nothing
in the queue can stall it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import numpy as np

from service.errors import ErrorType, ServiceError
from service.metrics import Metrics
from tasks.batching import pad_batch

log = logging.getLogger("berth.service.batcher")

RunFn = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class ModelInput(Protocol):
    """What the task layer produces: EncodedInput, QAWindow."""

    input_ids: Any
    token_type_ids: Any

    def __len__(self) -> int: ...


class BatcherState(Enum):
    ACCEPTING = "accepting"
    DRAINING = "draining"
    STOPPED = "stopped"


class ItemState(Enum):
    QUEUED = "queued"
    DROPPED = "dropped"
    BATCHED = "batched"


@dataclass(frozen=True, slots=True)
class ItemResult:
    outputs: dict[str, np.ndarray]  # this item's rows; per-token outputs trimmed to its length
    queue_seconds: float  # admission -> start of its forward pass
    inference_seconds: float  # duration of the forward pass it was part of
    run_id: int  # which forward pass (so a request can add up distinct passes)


@dataclass(eq=False, slots=True)
class _Item:
    encoded: ModelInput
    length: int
    deadline: float  # time.monotonic() after which computing it is pointless
    future: asyncio.Future
    enqueued_at: float
    state: ItemState = ItemState.QUEUED


@dataclass(slots=True)
class BatchPolicy:
    buckets: list[int]  # sorted padded lengths; the last is the longest item accepted
    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    max_wait_s: float = 0.002
    max_queue_items: int = 2048
    min_retry_after_s: int = 1

    def bucket_for(self, length: int) -> int | None:
        i = bisect_left(self.buckets, length)
        return self.buckets[i] if i < len(self.buckets) else None

    def fits(self, count: int, longest: int) -> bool:
        bucket = self.bucket_for(longest)
        return bucket is not None and count <= self.max_batch_size and count * bucket <= self.max_batch_tokens


def clip_buckets(buckets: Sequence[int], max_length: int) -> list[int]:
    """The buckets below a model's max sequence length, plus that length itself."""
    return sorted({b for b in buckets if b < max_length} | {max_length})


@dataclass
class _Throughput:
    """Items per second, smoothed, to tell refused clients how long to wait."""

    items_per_s: float = 0.0
    alpha: float = field(default=0.2)

    def update(self, items: int, seconds: float) -> None:
        rate = items / max(seconds, 1e-6)
        self.items_per_s = rate if self.items_per_s == 0 else (1 - self.alpha) * self.items_per_s + self.alpha * rate


class Batcher:
    """One model's queue and worker thread. Create it, `start()` it inside the event loop, `submit`
    items from request handlers and await their futures, `close()` it on shutdown."""

    def __init__(self, model: str, run: RunFn, policy: BatchPolicy, metrics: Metrics, per_token: bool):
        self.model = model
        self.policy = policy
        self.per_token = per_token
        self._run_model = run
        self._metrics = metrics
        self._queue: deque[_Item] = deque()
        self._depth = 0  # QUEUED items (the deque may also hold DROPPED ones until they are popped)
        self._state = BatcherState.ACCEPTING
        self._wakeup: asyncio.Event | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"berth-{model}")
        self._throughput = _Throughput()
        self._run_counter = 0

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def state(self) -> BatcherState:
        return self._state

    @property
    def depth(self) -> int:
        return self._depth

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._loop_ref = asyncio.get_running_loop()
        self._task = self._loop_ref.create_task(self._loop(), name=f"batcher-{self.model}")

    def begin_draining(self) -> None:
        """Stop admitting; queued items still run. Safe to call from a signal handler."""
        if self._state is BatcherState.ACCEPTING:
            self._state = BatcherState.DRAINING
        if self._wakeup is not None and self._loop_ref is not None and not self._loop_ref.is_closed():
            self._loop_ref.call_soon_threadsafe(self._wakeup.set)

    async def close(self, timeout: float) -> None:
        """Drain: run what is queued for up to `timeout` seconds, then fail the rest and stop."""
        self.begin_draining()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                self._task.cancel()
                try:
                    await self._task
                except asyncio.CancelledError:
                    pass
        self._state = BatcherState.STOPPED
        while self._queue:
            self._drop(self._queue.popleft(), "shutdown")
        self._executor.shutdown(wait=False, cancel_futures=True)

    def run_now(self, items: Sequence[ModelInput]) -> list[dict[str, np.ndarray]]:
        """Run items synchronously in the caller's thread (warm-up), bypassing the queue and the metrics."""
        return self._compute(list(items), record=False)[0]

    # -- admission -----------------------------------------------------------------------------

    def retry_after(self) -> int:
        rate = self._throughput.items_per_s
        wait = self._depth / rate if rate > 0 else 0.0
        return int(min(60, max(self.policy.min_retry_after_s, math.ceil(wait))))

    def submit(self, items: Sequence[ModelInput], deadline: float) -> list[asyncio.Future]:
        """Admit all of `items` or none. Raises ServiceError: 503 when not accepting, 413 when an item or
        the request can never fit, 429 (+ Retry-After) when the queue is full right now."""
        count = len(items)
        if self._state is not BatcherState.ACCEPTING:
            self._reject(count, "not_accepting")
            raise ServiceError(ErrorType.OVERLOADED, f"model {self.model!r} is shutting down; not accepting work",
                               status=503, retry_after=self.policy.min_retry_after_s)
        lengths = [len(x) for x in items]
        longest = max(lengths, default=0)
        if lengths and not self.policy.fits(1, longest):
            self._reject(count, "too_large")
            raise ServiceError(ErrorType.TOO_LARGE, f"an input of {longest} tokens exceeds the batch budget of model "
                               f"{self.model!r} ({self.policy.max_batch_tokens} tokens, longest bucket "
                               f"{self.policy.buckets[-1]})")
        if count > self.policy.max_queue_items:
            self._reject(count, "too_large")
            raise ServiceError(ErrorType.TOO_LARGE, f"the request makes {count} model inputs; the queue of model "
                               f"{self.model!r} holds at most {self.policy.max_queue_items}")
        if self._depth + count > self.policy.max_queue_items:
            self._reject(count, "queue_full")
            raise ServiceError(ErrorType.OVERLOADED, f"model {self.model!r} is overloaded ({self._depth} inputs queued)",
                               retry_after=self.retry_after())
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        futures = []
        for encoded, length in zip(items, lengths):
            item = _Item(encoded, length, deadline, loop.create_future(), now)
            item.future.add_done_callback(lambda _f, it=item: self._on_cancel(it))
            self._queue.append(item)
            futures.append(item.future)
        self._depth += count
        self._metrics.queue_depth.labels(self.model).set(self._depth)
        if self._wakeup is not None:
            self._wakeup.set()
        return futures

    def _reject(self, count: int, reason: str) -> None:
        self._metrics.items_rejected.labels(self.model, reason).inc(count)

    def _on_cancel(self, item: _Item) -> None:
        """A client went away (or its request timed out): its queued items will not be computed."""
        if item.state is ItemState.QUEUED and item.future.cancelled():
            self._drop(item, "cancelled")

    def _drop(self, item: _Item, reason: str) -> None:
        if item.state is not ItemState.QUEUED:
            return
        item.state = ItemState.DROPPED
        self._depth -= 1
        self._metrics.queue_depth.labels(self.model).set(self._depth)
        self._metrics.items_dropped.labels(self.model, reason).inc()
        if not item.future.done():
            if reason == "expired":
                item.future.set_exception(ServiceError(ErrorType.TIMEOUT, "the request timed out in the queue"))
            else:
                item.future.set_exception(ServiceError(ErrorType.OVERLOADED, "the server is shutting down",
                                                       status=503, retry_after=self.policy.min_retry_after_s))

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._wakeup is not None
        while True:
            self._discard_dead_head()
            if not self._queue:  # IDLE
                if self._state is not BatcherState.ACCEPTING:
                    break
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            fill_until = self._queue[0].enqueued_at + self.policy.max_wait_s  # FILLING
            while self._state is BatcherState.ACCEPTING and not self._batch_full():
                remaining = fill_until - time.monotonic()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except TimeoutError:
                    break
            batch = self._take_batch()  # TAKING
            if batch:
                await self._run(batch)  # RUNNING
        self._state = BatcherState.STOPPED

    def _discard_dead_head(self) -> None:
        while self._queue and self._queue[0].state is ItemState.DROPPED:
            self._queue.popleft()

    def _batch_full(self) -> bool:
        """Would the next batch taken now be as large as the budget allows?"""
        count, longest = 0, 0
        for item in self._queue:
            if item.state is not ItemState.QUEUED:
                continue
            if not self.policy.fits(count + 1, max(longest, item.length)):
                return True
            count, longest = count + 1, max(longest, item.length)
        return False

    def _take_batch(self) -> list[_Item]:
        """Pop, in arrival order, the items that fit the budget; drop dead ones on the way."""
        now = time.monotonic()
        batch: list[_Item] = []
        longest = 0
        while self._queue:
            item = self._queue[0]
            if item.state is ItemState.DROPPED:
                self._queue.popleft()
                continue
            if item.future.done():  # cancelled: the done-callback may not have run yet
                self._queue.popleft()
                self._drop(item, "cancelled")
                continue
            if item.deadline <= now:
                self._queue.popleft()
                self._drop(item, "expired")
                continue
            if not self.policy.fits(len(batch) + 1, max(longest, item.length)):
                break
            self._queue.popleft()
            batch.append(item)
            longest = max(longest, item.length)
        for item in batch:
            item.state = ItemState.BATCHED
        self._depth -= len(batch)
        self._metrics.queue_depth.labels(self.model).set(self._depth)
        return batch

    async def _run(self, batch: list[_Item]) -> None:
        started = time.monotonic()
        for item in batch:
            self._metrics.queue_wait.labels(self.model).observe(started - item.enqueued_at)
        loop = asyncio.get_running_loop()
        try:
            outputs, timings = await loop.run_in_executor(self._executor, self._compute, [i.encoded for i in batch])
        except asyncio.CancelledError:  # close() gave up waiting: nobody will read this batch's results
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(ServiceError(ErrorType.OVERLOADED, "the server is shutting down",
                                                           status=503, retry_after=self.policy.min_retry_after_s))
            raise
        except Exception:
            log.exception("inference failed for model %s (batch of %d)", self.model, len(batch))
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(ServiceError(ErrorType.INTERNAL, "inference failed; see the server log"))
            return
        self._throughput.update(len(batch), time.monotonic() - started)
        for item, out, (run_id, seconds) in zip(batch, outputs, timings):
            if not item.future.done():
                item.future.set_result(ItemResult(out, started - item.enqueued_at, seconds, run_id))

    def _compute(self, items: list[ModelInput], record: bool = True
                 ) -> tuple[list[dict[str, np.ndarray]], list[tuple[int, float]]]:
        """Worker thread: run items sorted by length, one forward pass per length bucket.

        Returns each item's outputs (in the order given) and (run id, seconds) of the pass it was in.
        """
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        groups: dict[int, list[int]] = {}
        for i in order:
            bucket = self.policy.bucket_for(len(items[i]))
            if bucket is None:
                raise ValueError(f"an item of {len(items[i])} tokens is longer than every bucket")
            groups.setdefault(bucket, []).append(i)
        outputs: list[dict[str, np.ndarray]] = [{} for _ in items]
        timings: list[tuple[int, float]] = [(0, 0.0)] * len(items)
        for bucket, members in groups.items():
            feeds = pad_batch([items[i] for i in members], pad_to=bucket)
            begin = time.perf_counter()
            result = self._run_model(feeds)
            seconds = time.perf_counter() - begin
            self._run_counter += 1
            if record:
                self._metrics.inference_duration.labels(self.model).observe(seconds)
                self._metrics.batch_size.labels(self.model).observe(len(members))
                self._metrics.batch_tokens.labels(self.model).observe(len(members) * bucket)
                self._metrics.items_inferred.labels(self.model).inc(len(members))
            for row, i in enumerate(members):
                length = len(items[i])
                outputs[i] = {name: (value[row, :length] if self.per_token else value[row])
                              for name, value in result.items()}
                timings[i] = (self._run_counter, seconds)
        return outputs, timings
