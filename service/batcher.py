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
    FILLING  only while requests for this model are being tokenized (`expect`): wait for their items
             until the batch budget is full or the oldest item's t0 + max_wait has passed. With nothing
             known to be coming, a batch starts at once: an idle server adds no wait.
    TAKING   fair share: the queue is one sub-queue per request, served round-robin, one item per request
             per turn, while items fit max_batch_size and max_batch_tokens (padded: items x the padded
             length of the longest). A request of 1,000 windows and a one-sentence request that arrives
             behind it share the next batch. Items whose client has gone (future cancelled) or whose
             deadline passed are dropped here, before any compute, and counted by reason.
    RUNNING  in the model's worker thread, holding one of the process's compute slots: sort the batch by
             length, pad each group (CPU: to its longest item rounded up to `pad_multiple`; CUDA: to its
             length bucket, so the GPU sees few shapes), run, and hand each item its own rows. A pass
             that raises is retried by halves down to the item(s) that fail it; only those fail.

Each item's lifecycle: QUEUED -> DROPPED (cancelled | expired | shutdown) or BATCHED -> done/failed.
An item too long for the model or for the token budget is refused at admission (413), so nothing
in the queue can stall it. After `max_consecutive_failures` failed passes in a row (no success in
between) the batcher reports itself unhealthy, and /readyz turns 503 until a pass succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
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
    pad_seconds: float = 0.0  # building the padded feeds of its pass
    finished_at: float = 0.0  # time.perf_counter() when its pass ended (the hop back to the request is timed)


@dataclass(eq=False, slots=True)
class _Item:
    encoded: ModelInput
    length: int
    deadline: float  # time.monotonic() after which computing it is pointless
    future: asyncio.Future
    enqueued_at: float
    state: ItemState = ItemState.QUEUED


@dataclass(eq=False, slots=True)
class _RequestQueue:
    """The not-yet-batched items of one request, in order: one round-robin turn takes one of them."""

    items: deque[_Item]

    def head(self) -> _Item | None:
        while self.items and self.items[0].state is not ItemState.QUEUED:
            self.items.popleft()
        return self.items[0] if self.items else None


@dataclass(slots=True)
class BatchPolicy:
    buckets: list[int]  # sorted padded lengths; the last is the longest item accepted
    max_batch_size: int = 32
    max_batch_tokens: int = 8192
    max_wait_s: float = 0.002
    max_queue_items: int = 2048
    min_retry_after_s: int = 1
    pad_multiple: int | None = None  # CPU: pad to the longest item rounded up to this; None: to the bucket
    max_consecutive_failures: int = 5

    def bucket_for(self, length: int) -> int | None:
        """The padded length of a group whose longest item has `length` tokens; None when too long."""
        if length > self.buckets[-1]:
            return None
        if self.pad_multiple is not None:
            return min(self.buckets[-1], -(-max(length, 1) // self.pad_multiple) * self.pad_multiple)
        i = bisect_left(self.buckets, length)
        return self.buckets[i]

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
    items from request handlers and await their futures, `close()` it on shutdown.

    `compute_slots` is shared by the batchers of one process: a forward pass holds a slot, so the
    models' ONNX Runtime pools never run more threads at once than the cores allow."""

    def __init__(self, model: str, run: RunFn, policy: BatchPolicy, metrics: Metrics, per_token: bool,
                 compute_slots: threading.Semaphore | None = None):
        self.model = model
        self.policy = policy
        self.per_token = per_token
        self._run_model = run
        self._metrics = metrics
        self._requests: deque[_RequestQueue] = deque()  # round-robin order of requests with queued items
        self._depth = 0  # QUEUED items
        self._incoming = 0  # requests being tokenized for this model right now (their items are coming)
        self._state = BatcherState.ACCEPTING
        self._wakeup: asyncio.Event | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"berth-{model}")
        self._slots = compute_slots or threading.Semaphore(1)
        self._throughput = _Throughput()
        self._run_counter = 0
        self.consecutive_failures = 0

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def state(self) -> BatcherState:
        return self._state

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def healthy(self) -> bool:
        """False after max_consecutive_failures failed forward passes in a row (until one succeeds)."""
        return self.consecutive_failures < self.policy.max_consecutive_failures

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
        """Drain: run what is queued for up to `timeout` seconds (0: not at all), then fail the rest and stop."""
        self.begin_draining()
        if self._task is not None:
            try:
                if timeout <= 0:
                    raise TimeoutError
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                self._task.cancel()
                try:
                    await self._task
                except asyncio.CancelledError:
                    pass
        self._state = BatcherState.STOPPED
        for request in self._requests:
            for item in request.items:
                self._drop(item, "shutdown")
        self._requests.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def run_now(self, items: Sequence[ModelInput]) -> list[dict[str, np.ndarray]]:
        """Run items synchronously in the caller's thread (warm-up), bypassing the queue and the metrics."""
        outputs, _ = self._compute(list(items), record=False)
        for out in outputs:
            if isinstance(out, BaseException):
                raise out
        return outputs  # type: ignore[return-value]

    # -- admission -----------------------------------------------------------------------------

    def retry_after(self) -> int:
        rate = self._throughput.items_per_s
        wait = self._depth / rate if rate > 0 else 0.0
        return int(min(60, max(self.policy.min_retry_after_s, math.ceil(wait))))

    def expect(self, delta: int) -> None:
        """A request for this model started (+1) or ended (-1) tokenizing: the batch may wait for it."""
        self._incoming = max(0, self._incoming + delta)
        if delta < 0 and self._wakeup is not None:
            self._wakeup.set()

    def submit(self, items: Sequence[ModelInput], deadline: float) -> list[asyncio.Future]:
        """Admit all of `items` (one request's) or none. Raises ServiceError: 503 when not accepting, 413
        when an item or the request can never fit, 429 (+ Retry-After) when the queue is full right now."""
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
                               f"{self.model!r} ({self.policy.max_batch_tokens} tokens, longest sequence "
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
        request = _RequestQueue(deque())
        futures = []
        for encoded, length in zip(items, lengths):
            item = _Item(encoded, length, deadline, loop.create_future(), now)
            item.future.add_done_callback(lambda _f, it=item: self._on_cancel(it))
            request.items.append(item)
            futures.append(item.future)
        if request.items:
            self._requests.append(request)
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
            # the request's timeout fires at its deadline: a cancellation from then on is an expiry (504)
            self._drop(item, "expired" if time.monotonic() >= item.deadline - 0.005 else "cancelled")

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
            oldest = self._oldest_queued()
            if oldest is None:  # IDLE
                if self._state is not BatcherState.ACCEPTING:
                    break
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            fill_until = oldest + self.policy.max_wait_s  # FILLING, only while more is known to be coming
            while self._state is BatcherState.ACCEPTING and self._incoming > 0 and not self._batch_full():
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

    def _oldest_queued(self) -> float | None:
        """Arrival time of the oldest queued item; forgets requests with nothing queued."""
        oldest = None
        for request in list(self._requests):
            head = request.head()
            if head is None:
                self._requests.remove(request)
            elif oldest is None or head.enqueued_at < oldest:
                oldest = head.enqueued_at
        return oldest

    def _batch_full(self) -> bool:
        """Would the next batch taken now be as large as the budget allows?"""
        count, longest = 0, 0
        for request in self._requests:
            for item in request.items:
                if item.state is not ItemState.QUEUED:
                    continue
                if not self.policy.fits(count + 1, max(longest, item.length)):
                    return True
                count, longest = count + 1, max(longest, item.length)
        return False

    def _take_batch(self) -> list[_Item]:
        """Round-robin over the requests, one item per request per turn, while items fit the budget; drop
        dead items on the way. The rotation carries over to the next batch."""
        now = time.monotonic()
        batch: list[_Item] = []
        longest = 0
        stalled = 0  # requests in a row whose next item did not fit
        while self._requests and stalled < len(self._requests):
            request = self._requests[0]
            item = request.head()
            if item is None:
                self._requests.popleft()
                continue
            if item.future.done():  # cancelled: the done-callback may not have run yet
                self._drop(item, "cancelled")
                continue
            if item.deadline <= now:
                self._drop(item, "expired")
                continue
            if not self.policy.fits(len(batch) + 1, max(longest, item.length)):
                if len(batch) >= self.policy.max_batch_size:
                    break
                self._requests.rotate(-1)
                stalled += 1
                continue
            request.items.popleft()
            item.state = ItemState.BATCHED
            batch.append(item)
            longest = max(longest, item.length)
            stalled = 0
            self._requests.rotate(-1)
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
        self._throughput.update(len(batch), time.monotonic() - started)
        self._metrics.model_ready.labels(self.model).set(1 if self.healthy else 0)
        for item, out, (run_id, seconds, pad_seconds, finished_at) in zip(batch, outputs, timings):
            if item.future.done():
                continue
            if isinstance(out, BaseException):
                item.future.set_exception(ServiceError(ErrorType.INTERNAL, "inference failed for this input; "
                                                       "see the server log"))
            else:
                item.future.set_result(ItemResult(out, started - item.enqueued_at, seconds, run_id, pad_seconds,
                                                  finished_at))

    def _compute(self, items: list[ModelInput], record: bool = True
                 ) -> tuple[list[dict[str, np.ndarray] | BaseException], list[tuple[int, float, float, float]]]:
        """Worker thread: run items sorted by length, one forward pass per padded length.

        Returns each item's outputs, or the exception that failed it, in the order given, and (run id,
        seconds, padding seconds, end time) of the pass it was in.
        """
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        groups: dict[int, list[int]] = {}
        for i in order:
            bucket = self.policy.bucket_for(len(items[i]))
            if bucket is None:
                raise ValueError(f"an item of {len(items[i])} tokens is longer than every bucket")
            groups.setdefault(bucket, []).append(i)
        outputs: list[dict[str, np.ndarray] | BaseException] = [{} for _ in items]
        timings: list[tuple[int, float, float, float]] = [(0, 0.0, 0.0, 0.0)] * len(items)
        for bucket, members in groups.items():
            self._run_group(items, members, bucket, outputs, timings, record)
        return outputs, timings

    def _run_group(self, items: list[ModelInput], members: list[int], bucket: int,
                   outputs: list, timings: list, record: bool) -> None:
        """One forward pass over `members`; when it raises, retry each half, down to the failing item."""
        begin = time.perf_counter()
        feeds = pad_batch([items[i] for i in members], pad_to=bucket)
        padded = time.perf_counter()
        try:
            with self._slots:
                result = self._run_model(feeds)
        except Exception as error:
            self._metrics.inference_failures.labels(self.model).inc()
            if len(members) > 1:
                middle = len(members) // 2
                log.warning("forward pass of %d items failed for model %s (%s); retrying by halves",
                            len(members), self.model, type(error).__name__)
                for half in (members[:middle], members[middle:]):
                    self._run_group(items, half, self.policy.bucket_for(max(len(items[i]) for i in half)) or bucket,
                                    outputs, timings, record)
                return
            self.consecutive_failures += 1
            log.error("inference failed for model %s on one item of %d tokens (%d failure(s) in a row): %s",
                      self.model, len(items[members[0]]), self.consecutive_failures, error, exc_info=error)
            self._metrics.items_failed.labels(self.model).inc()
            outputs[members[0]] = error
            return
        finished = time.perf_counter()
        seconds = finished - padded
        self.consecutive_failures = 0
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
            timings[i] = (self._run_counter, seconds, padded - begin, finished)
