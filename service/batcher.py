"""Dynamic batching for one model: a bounded queue of *items* and worker threads that run its forward passes.

An item is one model input (a text, a pair, a QA or NER window). A request of 64 texts and 64 requests of one text
enter the queue alike, as 64 items, and are admitted, batched and refused alike. A *batch* is what one forward
pass sees; the items taken from the queue at once (a *take*) run as one batch per padded width, planned, padded,
run and split into each item's rows by the one inference path (tasks/inference.py) that training's dev metrics
and the parity gate use too. The batcher only queues: it raises its own errors (BatcherError), and the service
maps them to HTTP (service/errors.py).

The batcher is a small state machine (after text-embeddings-inference's `queue.rs`):

    ACCEPTING --begin_draining()--> DRAINING --queue empty (or close() timeout)--> STOPPED

    ACCEPTING: `submit` admits items while the queue has room; else QueueFull (with retry_after).
    DRAINING:  `submit` refuses with NotAccepting; what is queued still runs.
    STOPPED:   the loop has ended; anything still queued failed with NotAccepting.

Its loop, while not STOPPED:

    IDLE     queue empty: sleep until an item arrives. Items that find the batcher idle (nothing running or
             prepared, no other request for the model being tokenized) are taken by a plain event-loop callback,
             after whatever else is ready to run, without waking this loop: one hop less on the one-client path.
    FILLING  only while requests for this model are being tokenized (`expect`) and no pass runs: wait for their
             items until the budget is full or the oldest item's t0 + max_wait has passed. With nothing known to
             be coming, a take starts at once: an idle server adds no wait.
    TAKING   fair share: the queue is one sub-queue per request, served round-robin, one item per request per
             turn, while the items fit one pass's budget (the batch size for their padded width, measured or
             max_batch_size, and max_batch_tokens). A request of 1,000 windows and a one-sentence request that
             arrives behind it share the next take. Items whose client has gone (future cancelled) or whose
             deadline passed are dropped here, before any compute, and counted by reason.
    RUNNING  in a worker thread, holding units of the process's compute slots (one per ONNX Runtime thread): the
             take's batches, padded in the event loop beforehand (CPU: to the longest item rounded up to
             `pad_multiple`; CUDA: to its length bucket). A pass that raises is retried by halves down to the
             item(s) that fail it (ItemFailed). A *lone* pass (nothing else running or queued, in any model) runs
             on the wide engine, every thread on it, for latency; when more work is there and a narrow engine is
             given (CPU), up to `slots // narrow_threads` takes run at once, each on `narrow_threads` threads:
             independent single-threaded passes keep both cores busy without waiting on each other (measured
             1.2-1.7x the items/s of one 2-thread pass on 2 cores, docs/SERVICE.md). With `pipeline`, items that
             arrive while every worker is busy are taken and padded into the next take, which starts the moment
             a worker is free: one take ahead, never more. A finished take is answered by its future's callback on
             the event loop, at once; the loop is woken only when it has more to start.

Each item's lifecycle: QUEUED -> DROPPED (cancelled | expired | shutdown) or BATCHED -> done/failed.
An item too long for the model or for the token budget is refused at admission (ItemTooLarge), so nothing
in the queue can stall it.

Health. The model is judged per *planned pass* (one padded batch as the event loop planned it, however often it
was retried by halves); an item that fails gets ItemFailed (500) either way, and what counts toward
`max_consecutive_failures` is:

    the watchdog stopped it (ran past pass_timeout_s)  counts, at once; its items fail (PassTimedOut), no retry
                                                       (its halves would hold the cores about as long again)
    some items computed, others failed (raised even    does not count: the computed ones show the model works, so
      alone, or NaN/inf outputs)                       the failing inputs are at fault; the count restarts at 0
    every item failed (one item or many)               a canary pass confirms it right away, in the same worker:
                                                       it counts only if the canary fails too; a canary that
                                                       passes restarts the count (the inputs were at fault)
    every item computed                                the count restarts at 0

So no input, however often sent, takes a working model out of rotation, and a broken model (its canary fails
too) is out after max_consecutive_failures passes; a model too slow for pass_timeout_s is out as well. The
*canary* is one item of the model's smallest warm-up shape ([CLS] [UNK]... [SEP], `canary`; without warm-up the
shortest item, [CLS] [SEP]), run through the same compute path as any pass (compute slots, watchdog, finiteness
check). Not ready (`healthy` False: /readyz lists why, the model's requests get 503 + Retry-After) -> a canary pass
every canary_interval_s, off the event loop (`_probe`); the first that passes makes the model ready again. Both
transitions are logged; berth_canary_passes_total, berth_model_failures_total count them.

Why 500 and not 422 for an input the model fails on: the input passed every check the API documents; what fails is
the served model on it (a tokenizer whose ids the model cannot embed, weights that overflow). A 4xx tells the client
to change a request it has no way to know how to change, and hides a model defect from 5xx alerting.

Watchdog: each pass holds its own onnxruntime.RunOptions (the runner's `new_run_options`) while it runs; one check
on the event loop every min(1 s, pass_timeout_s / 4) sets `terminate` on those past pass_timeout_s, and
`session.run` raises in its worker thread within one operator: the compute slots are freed, the items answered
500, berth_pass_timeouts_total counted. Warm-up (before the event loop serves) is not watched.

Non-finite outputs: after every pass the worker thread checks the outputs with np.isfinite (whole arrays: ~0.15 ms
a million floats); only when something is not finite are the items told apart, each on its own rows (per-token
outputs trimmed to its length), and those fail with NonFiniteOutput (500; berth_nonfinite_outputs_total).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from service.cpu import ComputeSlots
from service.metrics import Metrics
from tasks.inference import (
    Batch,
    BatchShape,
    Keep,
    ModelItem,
    Runner,
    output_names_of,
    pad,
    plan_batches,
    run_batch,
)

log = logging.getLogger("berth.service.batcher")


# -- the batcher's own errors (the service maps them to HTTP statuses in service/errors.py) ---------------


class BatcherError(Exception):
    """Why an item was refused or not computed. `retry_after` (seconds): when trying again may succeed."""

    retry_after: int | None = None

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class NotAccepting(BatcherError):
    """Draining or stopped: the model takes no new work (or dropped queued work at shutdown)."""


class QueueFull(BatcherError):
    """The queue has no room for the request's items right now."""


class ItemTooLarge(BatcherError):
    """An item, or the request's item count, can never fit the batch budget or the queue."""


class Expired(BatcherError):
    """The item's deadline passed while it was queued; it was not computed."""


class ItemFailed(BatcherError):
    """The forward pass failed for this item alone (retried by halves down to it)."""


class PassTimedOut(ItemFailed):
    """The item's forward pass ran past pass_timeout_s and the watchdog stopped it."""


class NonFiniteOutput(ItemFailed):
    """The model's outputs for this item hold NaN or infinity."""


FAILURE_TEXT = {"timeout": "a forward pass ran past pass_timeout_s", "error": "a forward pass raised an error",
                "nonfinite": "a forward pass produced NaN or infinite outputs"}  # the kinds of berth_model_failures


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
    encoded: ModelItem
    length: int
    deadline: float  # time.monotonic() after which computing it is pointless
    future: asyncio.Future
    enqueued_at: float
    keep: Keep | None = None  # what the item keeps of its pass (tasks/inference.py)
    state: ItemState = ItemState.QUEUED


@dataclass(eq=False, slots=True)
class _RequestQueue:
    """The not-yet-taken items of one request, in order: one round-robin turn takes one of them."""

    items: deque[_Item]

    def head(self) -> _Item | None:
        while self.items and self.items[0].state is not ItemState.QUEUED:
            self.items.popleft()
        return self.items[0] if self.items else None


@dataclass(slots=True)
class BatchPolicy(BatchShape):
    """The batch shape (tasks/inference.py: widths, batch size per width, token budget) and the queue's limits."""

    max_wait_s: float = 0.002
    max_queue_items: int = 2048
    min_retry_after_s: int = 1
    max_consecutive_failures: int = 5
    pipeline: bool = True  # take and pad the next batches while the current pass runs (one take ahead)
    pass_timeout_s: float = 60.0  # the watchdog stops a pass running longer
    canary_interval_s: float = 5.0  # seconds between canary passes while the model is not ready

    def bucket_for(self, length: int) -> int | None:
        return self.width_for(length)


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


@dataclass(eq=False, slots=True)
class _Take:
    """Items taken from the queue at once, and their forward passes (planned and padded in the event loop,
    so with `pipeline` that work overlaps the pass before)."""

    items: list[_Item]
    batches: list[Batch] = field(default_factory=list)
    feeds: list[dict[str, np.ndarray]] = field(default_factory=list)
    pad_seconds: list[float] = field(default_factory=list)
    launched: bool = False  # its passes were handed to the worker thread

    def prepare(self, shape: BatchShape) -> None:
        encoded = [item.encoded for item in self.items]
        self.batches = plan_batches([item.length for item in self.items], shape)
        self.feeds, self.pad_seconds = [], []
        for batch in self.batches:
            begin = time.perf_counter()
            self.feeds.append(pad(encoded, batch))
            self.pad_seconds.append(time.perf_counter() - begin)


class _Guard:
    """One forward pass as the watchdog sees it (from the moment it holds its cores), and what it found in the pass's
    outputs: the runner `run_batch` calls. `bad`: the items (indices into the take) whose outputs are not finite."""

    __slots__ = ("batcher", "runner", "new_options", "items", "batch", "options", "started", "timed_out", "bad")

    def __init__(self, batcher: Batcher, runner: Runner, new_options: Callable[[], Any] | None,
                 items: Sequence[ModelItem], batch: Batch):
        self.batcher, self.runner, self.new_options, self.items, self.batch = batcher, runner, new_options, items, batch
        self.options: Any = None
        self.started = 0.0
        self.timed_out = False
        self.bad: list[int] = []

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batcher = self.batcher
        self.options = self.new_options() if self.new_options is not None else None
        self.started = time.monotonic()
        with batcher._counter_lock:
            batcher._passes.add(self)
        try:
            out = self.runner(feeds) if self.options is None else self.runner(feeds, run_options=self.options)
        finally:
            with batcher._counter_lock:
                batcher._passes.discard(self)
        if not all(np.isfinite(value).all() for value in out.values() if value.dtype.kind in "fc"):
            self.bad = self._nonfinite_members(out)
        return out

    def _nonfinite_members(self, out: dict[str, np.ndarray]) -> list[int]:
        """The members whose own rows (per-token outputs trimmed to their length, as split_rows does) are not finite."""
        per_token, width = self.batcher.per_token, self.batch.width
        bad = []
        for row, i in enumerate(self.batch.members):
            length = len(self.items[i])
            for name, value in out.items():
                if value.dtype.kind not in "fc":
                    continue
                tokens = (per_token if isinstance(per_token, bool) else name in per_token) or (
                    value.ndim >= 3 and value.shape[1] == width)
                if not np.isfinite(value[row, :length] if tokens else value[row]).all():
                    bad.append(i)
                    break
        return bad


class Batcher:
    """One model's queue and worker threads. Create it, `start()` it inside the event loop, `submit`
    items from request handlers and await their futures, `close()` it on shutdown.

    `compute_slots` is shared by the batchers of one process: a pass on `run` holds `threads` units of it,
    one on `run_narrow` (the same model on fewer ORT threads) `narrow_threads`, so the models' ONNX Runtime
    pools never run more threads at once than the cores allow. Without `run_narrow`, one pass at a time."""

    def __init__(self, model: str, run: Runner, policy: BatchPolicy, metrics: Metrics, per_token: bool,
                 compute_slots: ComputeSlots | None = None, threads: int = 1, run_narrow: Runner | None = None,
                 narrow_threads: int = 1, output_names: Sequence[str] = ()):
        self.model = model
        self.output_names = tuple(output_names)  # what `run` returns by default; an item's Keep may need fewer
        self.policy = policy
        self.per_token = per_token
        self._run_model = run
        self._run_narrow = run_narrow
        self._slots = compute_slots or ComputeSlots(1)
        self._threads, self._narrow_threads = threads, narrow_threads
        self.parallel = max(1, self._slots.units // narrow_threads) if run_narrow is not None else 1
        self._metrics = metrics
        self._per_model = metrics.for_model(model)
        self._requests: deque[_RequestQueue] = deque()  # round-robin order of requests with queued items
        self._depth = 0  # QUEUED items
        self._incoming = 0  # requests being tokenized for this model right now (their items are coming)
        self._filling = False  # the loop is waiting for those items (FILLING)
        self._start_pending = False  # submit scheduled `_start_if_idle`
        self._state = BatcherState.ACCEPTING
        self._wakeup: asyncio.Event | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix=f"berth-{model}")
        self._throughput = _Throughput()
        self._run_counter = 0
        self._counter_lock = threading.Lock()
        self._running: dict[asyncio.Future, _Take] = {}  # launched and not yet answered
        self._ahead: _Take | None = None  # taken and padded, waiting for a free worker
        self.consecutive_failures = 0
        # health (the module's docstring): the canary input, the passes running now (for the watchdog), the tasks
        self.canary: ModelItem | None = None
        self._passes: set[_Guard] = set()
        self._last_failure = "error"
        self._last_canary = ""
        self._next_canary_at: float | None = None
        self._probe_task: asyncio.Task | None = None
        self._watchdog_task: asyncio.Task | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def state(self) -> BatcherState:
        return self._state

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def healthy(self) -> bool:
        """False after max_consecutive_failures passes in a row counted against the model (the module's docstring),
        until a pass or a canary pass succeeds."""
        return self.consecutive_failures < self.policy.max_consecutive_failures

    @property
    def unready_reason(self) -> str | None:
        """Why the model is not ready (fixed phrases, no error text: /readyz is unauthenticated); None when it is."""
        if self.healthy:
            return None
        reason = f"{self.consecutive_failures} failures in a row ({FAILURE_TEXT[self._last_failure]})"
        if self.canary is None:
            return reason + "; ready again once a forward pass succeeds"
        reason += f"; a canary pass retries every {self.policy.canary_interval_s:g} s"
        return reason + (f" (last canary: {self._last_canary})" if self._last_canary else "")

    def next_canary_in(self) -> float:
        """Seconds until the next canary pass (Retry-After for a model that is not ready)."""
        at = self._next_canary_at
        return self.policy.canary_interval_s if at is None else max(0.0, at - time.monotonic())

    def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._loop_ref = asyncio.get_running_loop()
        self._task = self._loop_ref.create_task(self._loop(), name=f"batcher-{self.model}")
        self._watchdog_task = self._loop_ref.create_task(self._watchdog(), name=f"watchdog-{self.model}")
        if not self.healthy:
            self._became_unready()

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
        # takes whose passes close() gave up on, and one prepared ahead (never computed)
        for take in [*self._running.values(), *([self._ahead] if self._ahead else [])]:
            if not take.launched:
                self._metrics.items_dropped.labels(self.model, "shutdown").inc(len(take.items))
            self._fail(take.items, self._shutting_down())
        self._running.clear()
        self._ahead = None
        for task in (self._probe_task, self._watchdog_task):
            if task is not None:
                task.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def run_now(self, items: Sequence[ModelItem], narrow: bool = False) -> list[dict[str, np.ndarray]]:
        """Run items synchronously in the caller's thread (warm-up), bypassing the queue and the metrics. Raises the
        first item's error, except NonFiniteOutput, which is left in place of that item's outputs."""
        encoded = list(items)
        outputs: list = [None] * len(encoded)
        timings: list = [None] * len(encoded)
        for batch in plan_batches([len(x) for x in encoded], self.policy):
            self._run_batch(encoded, batch, None, 0.0, outputs, timings, record=False, narrow=narrow, exact=True)
        for out in outputs:
            if isinstance(out, BaseException) and not isinstance(out, NonFiniteOutput):
                raise out
        return outputs

    # -- admission -----------------------------------------------------------------------------

    def retry_after(self) -> int:
        rate = self._throughput.items_per_s
        wait = self._depth / rate if rate > 0 else 0.0
        return int(min(60, max(self.policy.min_retry_after_s, math.ceil(wait))))

    def expect(self, delta: int) -> None:
        """A request for this model started (+1) or ended (-1) tokenizing: the batch may wait for it."""
        self._incoming = max(0, self._incoming + delta)
        if delta < 0 and self._filling and self._wakeup is not None:
            self._wakeup.set()

    def submit(self, items: Sequence[ModelItem], deadline: float, keep: Keep | None = None) -> list[asyncio.Future]:
        """Admit all of `items` (one request's) or none; `keep` says what each item keeps of its pass (its task's
        outputs for this request, reduced in the worker thread; None: every output, as views). Raises NotAccepting (draining or stopped),
        ItemTooLarge (an item or the request can never fit), QueueFull (no room right now, with retry_after)."""
        count = len(items)
        if self._state is not BatcherState.ACCEPTING:
            self._reject(count, "not_accepting")
            raise NotAccepting(f"model {self.model!r} is shutting down; not accepting work",
                               retry_after=self.policy.min_retry_after_s)
        lengths = [len(x) for x in items]
        longest = max(lengths, default=0)
        if lengths and not self.policy.fits(1, longest):
            self._reject(count, "too_large")
            raise ItemTooLarge(f"an input of {longest} tokens exceeds the batch budget of model {self.model!r} "
                               f"({self.policy.max_batch_tokens} tokens, longest sequence {self.policy.buckets[-1]})")
        if count > self.policy.max_queue_items:
            self._reject(count, "too_large")
            raise ItemTooLarge(f"the request makes {count} model inputs; the queue of model {self.model!r} holds at "
                               f"most {self.policy.max_queue_items}")
        if self._depth + count > self.policy.max_queue_items:
            self._reject(count, "queue_full")
            raise QueueFull(f"model {self.model!r} is overloaded ({self._depth} inputs queued)",
                            retry_after=self.retry_after())
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        request = _RequestQueue(deque())
        futures = []
        for encoded, length in zip(items, lengths):
            item = _Item(encoded, length, deadline, loop.create_future(), now, keep)
            item.future.add_done_callback(lambda _f, it=item: self._on_cancel(it))
            request.items.append(item)
            futures.append(item.future)
        if request.items:
            self._requests.append(request)
        self._depth += count
        self._per_model.queue_depth.set(self._depth)
        if self._wakeup is not None:
            if self._idle() and not self._start_pending:
                # Nothing runs: start the take from a plain callback rather than by waking the loop task. It runs
                # after what is ready on the event loop now, so requests that arrived together still go together.
                self._start_pending = True
                loop.call_soon(self._start_if_idle)
            elif not self._start_pending:
                self._wakeup.set()
        return futures

    def _idle(self) -> bool:
        """No take running or prepared and the loop not FILLING."""
        return not self._running and self._ahead is None and not self._filling and self._state is BatcherState.ACCEPTING

    def _start_if_idle(self) -> None:
        self._start_pending = False
        take = self._take_now() if self._idle() and self._incoming == 0 else None
        if take is not None:
            self._start(take)
        elif self._wakeup is not None:  # more is coming (FILLING decides how long to wait) or a take runs already
            self._wakeup.set()

    def _reject(self, count: int, reason: str) -> None:
        self._metrics.items_rejected.labels(self.model, reason).inc(count)

    def _on_cancel(self, item: _Item) -> None:
        """A client went away (or its request timed out): its queued items will not be computed."""
        if item.state is ItemState.QUEUED and item.future.cancelled():
            # the request's timeout fires at its deadline: a cancellation from then on is an expiry (504)
            self._drop(item, "expired" if time.monotonic() >= item.deadline - 0.005 else "cancelled")

    def _shutting_down(self) -> NotAccepting:
        return NotAccepting("the server is shutting down", retry_after=self.policy.min_retry_after_s)

    def _drop(self, item: _Item, reason: str) -> None:
        if item.state is not ItemState.QUEUED:
            return
        item.state = ItemState.DROPPED
        self._depth -= 1
        self._per_model.queue_depth.set(self._depth)
        self._metrics.items_dropped.labels(self.model, reason).inc()
        if not item.future.done():
            item.future.set_exception(Expired("the request timed out in the queue") if reason == "expired"
                                      else self._shutting_down())

    @staticmethod
    def _fail(items: list[_Item], error: BatcherError) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        """IDLE / FILLING / TAKING as the module says; RUNNING in the worker threads, whose takes are answered by
        their futures' callbacks (`_finished`), not by this task. A take starts as soon as a worker is free (up to
        `parallel` at once). With `pipeline`, while every worker is busy, the next take is taken and padded as
        items arrive (topped up to the budget until a worker frees): one take ahead."""
        assert self._wakeup is not None
        running = self._running
        while True:
            if self._ahead is not None and len(running) < self.parallel:  # prepared ahead: start it at once
                take, self._ahead = self._ahead, None
                self._start(take)
                continue
            oldest = self._oldest_queued()
            if running:
                if oldest is not None and len(running) < self.parallel:  # a free worker: take what is queued now
                    self._ahead = self._take_now()
                    continue
                if oldest is not None and self.policy.pipeline and self._top_up():
                    continue
                self._wakeup.clear()
                await self._wakeup.wait()  # an item arrived or a take finished
                continue
            if oldest is None:  # IDLE
                if self._state is not BatcherState.ACCEPTING:
                    break
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            fill_until = oldest + self.policy.max_wait_s  # FILLING, only while more is known to be coming
            self._filling = True
            try:
                while self._state is BatcherState.ACCEPTING and self._incoming > 0 and not self._batch_full():
                    remaining = fill_until - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wakeup.clear()
                    try:
                        await asyncio.wait_for(self._wakeup.wait(), remaining)
                    except TimeoutError:
                        break
            finally:
                self._filling = False
            self._ahead = self._take_now()  # TAKING
        self._state = BatcherState.STOPPED

    def _take_now(self) -> _Take | None:
        take = _Take(self._take([]))
        if not take.items:
            return None
        take.prepare(self.policy)
        return take

    def _top_up(self) -> bool:
        """Take queued items into the take prepared ahead (a new one if none) while the budget allows, and
        pad it again; False when nothing was added (it is full, or nothing queued fits)."""
        ahead = self._ahead
        added = self._take(ahead.items if ahead else [])
        if not added:
            return False
        if ahead is None:
            ahead = self._ahead = _Take([])
        ahead.items += added
        ahead.prepare(self.policy)
        return True

    def _launch(self, take: _Take) -> asyncio.Future:
        """Start a take's passes in a worker thread; items whose client left meanwhile are left out. The pass
        runs narrow when other work is there (this model's or another's), wide when it is alone."""
        take.launched = True
        live = [item for item in take.items if not item.future.done()]
        if len(live) != len(take.items):
            now = time.monotonic()
            for item in take.items:
                if item.future.done():  # its request timed out (expired) or its client left (cancelled)
                    reason = "expired" if now >= item.deadline - 0.005 else "cancelled"
                    self._metrics.items_dropped.labels(self.model, reason).inc()
            take.items = live
            take.prepare(self.policy)
        started = time.monotonic()
        for item in take.items:
            self._per_model.queue_wait.observe(started - item.enqueued_at)
        narrow = self._run_narrow is not None and (bool(self._running) or self._depth > 0 or self._slots.busy > 0)
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, self._compute, take, started, narrow)

    def _start(self, take: _Take) -> None:
        running = self._launch(take)
        self._running[running] = take
        running.add_done_callback(functools.partial(self._finished, take))

    def _finished(self, take: _Take, running: asyncio.Future) -> None:
        """A take's passes ended (event loop thread): answer its items at once, then wake the loop for the next take.
        A take that close() already failed is no longer in `_running` and is not answered twice."""
        if self._running.pop(running, None) is not None:
            self._answer(take, running)
        if self._wakeup is not None and (self._depth > 0 or self._ahead is not None
                                         or self._state is not BatcherState.ACCEPTING):
            self._wakeup.set()

    def _answer(self, take: _Take, running: asyncio.Future) -> None:
        """Hand each item of a finished take its rows, or its error."""
        if running.cancelled() or running.exception() is not None:
            self._fail(take.items, self._shutting_down() if running.cancelled() else
                       ItemFailed("inference failed for this input; see the server log"))
            return
        outputs, timings, started, seconds = running.result()
        # passes still running ran beside this one: the model's rate (for Retry-After) is about that many times its own
        self._throughput.update(len(take.items) * max(1, len(self._running) + 1), seconds)
        self._per_model.model_ready.set(1 if self.healthy else 0)
        for item, out, (run_id, pass_seconds, pad_seconds, finished_at) in zip(take.items, outputs, timings):
            if item.future.done():
                continue
            if isinstance(out, BaseException):
                item.future.set_exception(out if isinstance(out, BatcherError) else
                                          ItemFailed("inference failed for this input; see the server log"))
            else:
                item.future.set_result(ItemResult(out, started - item.enqueued_at, pass_seconds, run_id, pad_seconds,
                                                  finished_at))

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
        """Would the next take taken now be as large as the budget allows?"""
        count, longest = 0, 0
        for request in self._requests:
            for item in request.items:
                if item.state is not ItemState.QUEUED:
                    continue
                if not self.policy.fits(count + 1, max(longest, item.length)):
                    return True
                count, longest = count + 1, max(longest, item.length)
        return False

    def _take(self, already: list[_Item]) -> list[_Item]:
        """Round-robin over the requests, one item per request per turn, while the items (with `already`,
        those of the take being topped up) fit one pass's budget; drop dead items on the way. The rotation
        carries over to the next take."""
        now = time.monotonic()
        taken: list[_Item] = []
        count, longest = len(already), max((item.length for item in already), default=0)
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
            if not self.policy.fits(count + 1, max(longest, item.length)):
                if count >= self.policy.max_batch_size:
                    break
                self._requests.rotate(-1)
                stalled += 1
                continue
            request.items.popleft()
            item.state = ItemState.BATCHED
            taken.append(item)
            count, longest = count + 1, max(longest, item.length)
            stalled = 0
            self._requests.rotate(-1)
        self._depth -= len(taken)
        self._per_model.queue_depth.set(self._depth)
        return taken

    # -- the worker thread ---------------------------------------------------------------------

    def _compute(self, take: _Take, started: float, narrow: bool) -> tuple[list, list, float, float]:
        """Worker thread: the take's passes (padded already). Returns each item's outputs or the exception
        that failed it, in take order, and (run id, seconds, padding seconds, end time) of its pass."""
        encoded = [item.encoded for item in take.items]
        keeps = [item.keep for item in take.items]
        outputs: list = [None] * len(encoded)
        timings: list = [(0, 0.0, 0.0, 0.0)] * len(encoded)
        verdict: tuple[bool, str] | None = None  # a confirming canary's, at most one per take
        for batch, feeds, pad_seconds in zip(take.batches, take.feeds, take.pad_seconds):
            self._run_batch(encoded, batch, feeds, pad_seconds, outputs, timings, record=True, narrow=narrow,
                            keeps=keeps)
            verdict = self._judge([outputs[i] for i in batch.members], verdict)
        return outputs, timings, started, time.monotonic() - started

    def _run_batch(self, encoded: list[ModelItem], batch: Batch, feeds: dict[str, np.ndarray] | None,
                   pad_seconds: float, outputs: list, timings: list, record: bool, narrow: bool = False,
                   exact: bool = False, keeps: Sequence[Keep | None] | None = None) -> None:
        """One forward pass; when it raises, retry each half (padded anew), down to the failing item. A wide pass
        runs narrow instead when another model took cores since the event loop decided (unless `exact`: warm-up)."""
        if narrow and self._run_narrow is not None:
            holding = self._slots.hold(self._narrow_threads)
        else:
            fallback = self._narrow_threads if self._run_narrow is not None and not exact else None
            holding = self._slots.hold(self._threads, fallback)
        guard: _Guard | None = None
        try:
            with holding as units:
                run = self._run_narrow if self._run_narrow is not None and units < self._threads else self._run_model
                begin = time.perf_counter()  # a pass's time starts when it has its cores
                if feeds is None:
                    feeds = pad(encoded, batch)
                    pad_seconds = time.perf_counter() - begin
                    begin = time.perf_counter()
                names = None if keeps is None or not self.output_names else \
                    output_names_of([keeps[i] for i in batch.members], self.output_names)
                # fetch fewer outputs only when the members need fewer (a runner may not take output_names)
                runner = run if names is None or len(names) == len(self.output_names) else \
                    functools.partial(run, output_names=names)
                guard = _Guard(self, runner, getattr(run, "new_run_options", None), encoded, batch)
                rows = run_batch(guard, encoded, batch, self.per_token, feeds, keeps)
        except Exception as error:
            self._metrics.inference_failures.labels(self.model).inc()
            members = batch.members
            if guard is not None and guard.timed_out:  # the watchdog stopped it
                self._timed_out(members, outputs, record)
                return
            if len(members) > 1:
                middle = len(members) // 2
                log.warning("forward pass of %d items failed for model %s (%s); retrying by halves",
                            len(members), self.model, type(error).__name__)
                for half in (members[:middle], members[middle:]):
                    width = self.policy.width_for(max(len(encoded[i]) for i in half)) or batch.width
                    self._run_batch(encoded, Batch(half, width), None, 0.0, outputs, timings, record, narrow, exact,
                                    keeps)
                return
            if guard is not None and guard.bad:  # its Keep could not reduce NaN rows: the outputs are what failed
                self._nonfinite(list(members), 1, outputs, record)
                return
            log.error("inference failed for model %s on one item of %d tokens: %s",
                      self.model, len(encoded[members[0]]), error, exc_info=error)
            if record:
                self._metrics.items_failed.labels(self.model).inc()
            outputs[members[0]] = error
            return
        finished = time.perf_counter()
        seconds = finished - begin
        with self._counter_lock:
            self._run_counter += 1
            run_id = self._run_counter
        if record:
            self._per_model.inference_duration.observe(seconds)
            self._per_model.batch_size.observe(len(batch.members))
            self._per_model.batch_tokens.observe(len(batch.members) * batch.width)
            self._per_model.items_inferred.inc(len(batch.members))
        for i, row in zip(batch.members, rows):
            outputs[i] = row
            timings[i] = (run_id, seconds, pad_seconds, finished)
        if guard.bad:  # after the rows are placed: those items' rows are replaced by their error
            self._nonfinite(guard.bad, len(batch.members), outputs, record)

    # -- health: failures, canary passes, the watchdog (the module's docstring) -----------------

    def _timed_out(self, members: Sequence[int], outputs: list, record: bool) -> None:
        """Worker thread: the watchdog stopped this pass; its items fail, and it is not retried."""
        self._metrics.pass_timeouts.labels(self.model).inc()
        if record:
            self._metrics.items_failed.labels(self.model).inc(len(members))
        for i in members:
            outputs[i] = PassTimedOut(f"the forward pass ran past pass_timeout_s "
                                      f"({self.policy.pass_timeout_s:g} s) and was stopped")

    @staticmethod
    def _nonfinite_error() -> NonFiniteOutput:
        return NonFiniteOutput("the model produced NaN or infinite outputs for this input")

    def _nonfinite(self, bad: list[int], size: int, outputs: list, record: bool) -> None:
        log.error("model %s produced NaN or infinite outputs for %d of the %d item(s) of a forward pass", self.model,
                  len(bad), size)
        if record:
            self._metrics.nonfinite_outputs.labels(self.model).inc(len(bad))
            self._metrics.items_failed.labels(self.model).inc(len(bad))
        for i in bad:
            outputs[i] = self._nonfinite_error()

    def _judge(self, results: list, verdict: tuple[bool, str] | None) -> tuple[bool, str] | None:
        """Worker thread, after a planned pass (and its retries): does it count against the model? The rule is the
        module docstring's. `verdict`: the canary's, when one confirmed an earlier pass of the same take."""
        failed = [r for r in results if isinstance(r, BaseException)]
        if not failed:
            self._passed()
        elif any(isinstance(r, PassTimedOut) for r in failed):
            self._failed("timeout")
        elif len(failed) < len(results):  # others of the pass were computed: these inputs are at fault
            self._passed()
        else:
            if verdict is None:
                verdict = self._canary_pass("confirm")
            if verdict[0]:
                log.warning("model %s: every item of a forward pass (%d) failed, but a canary pass succeeded: the "
                            "inputs are at fault, not counted against the model", self.model, len(results))
                self._passed()
            else:
                self._failed("nonfinite" if all(isinstance(r, NonFiniteOutput) for r in failed) else "error")
        return verdict

    def _canary_pass(self, kind: str) -> tuple[bool, str]:
        """Worker thread: one pass of the canary input through the compute path of every pass (compute slots, the
        watchdog, the finiteness check). (passed, why not)."""
        if self.canary is None:
            return False, "no canary input"
        outputs: list = [None]
        width = self.policy.width_for(len(self.canary)) or self.policy.buckets[-1]
        self._run_batch([self.canary], Batch((0,), width), None, 0.0, outputs, [None], record=False)
        out = outputs[0]
        passed = not isinstance(out, BaseException)
        self._metrics.canary_passes.labels(self.model, kind, "passed" if passed else "failed").inc()
        why = ("" if passed else "it ran past pass_timeout_s" if isinstance(out, PassTimedOut) else
               "NaN or infinite outputs" if isinstance(out, NonFiniteOutput) else f"it raised {type(out).__name__}")
        self._last_canary = "passed" if passed else f"failed: {why}"
        return passed, why

    def _passed(self, how: str = "a forward pass succeeded") -> None:
        with self._counter_lock:
            was_ready = self.healthy
            self.consecutive_failures = 0
        if not was_ready:
            self._notify(self._became_ready, how)

    def _failed(self, kind: str) -> None:
        with self._counter_lock:
            self.consecutive_failures += 1
            count = self.consecutive_failures
            self._last_failure = kind
        self._metrics.model_failures.labels(self.model, kind).inc()
        log.error("model %s: %s; it counts against the model (%d of max_consecutive_failures=%d in a row)",
                  self.model, FAILURE_TEXT[kind], count, self.policy.max_consecutive_failures)
        if count == self.policy.max_consecutive_failures:
            self._notify(self._became_unready)

    def _notify(self, callback: Callable[..., None], *args: Any) -> None:
        """Run `callback` on the event loop (from a worker thread or the loop itself); not before `start`."""
        loop = self._loop_ref
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(callback, *args)

    def _became_unready(self) -> None:
        if self.healthy:  # a pass succeeded meanwhile
            return
        self._per_model.model_ready.set(0)
        log.error("model %s is NOT READY: %s", self.model, self.unready_reason)
        if self.canary is not None and self._state is BatcherState.ACCEPTING and (
                self._probe_task is None or self._probe_task.done()):
            self._probe_task = asyncio.get_running_loop().create_task(self._probe(), name=f"canary-{self.model}")

    def _became_ready(self, how: str) -> None:
        if not self.healthy:
            return
        self._per_model.model_ready.set(1)
        log.warning("model %s is READY again: %s", self.model, how)

    async def _probe(self) -> None:
        """While the model is not ready: a canary pass every canary_interval_s, in a worker thread; the first that
        passes makes it ready again."""
        loop = asyncio.get_running_loop()
        interval = self.policy.canary_interval_s
        try:
            while not self.healthy and self._state is BatcherState.ACCEPTING:
                self._next_canary_at = time.monotonic() + interval
                await asyncio.sleep(interval)
                if self.healthy or self._state is not BatcherState.ACCEPTING:
                    break
                passed, why = await loop.run_in_executor(self._executor, self._canary_pass, "probe")
                if passed:
                    self._passed("a canary pass succeeded")
                else:
                    log.warning("model %s: the canary pass failed (%s); still not ready, next canary in %g s",
                                self.model, why, interval)
        finally:
            self._next_canary_at = None

    async def _watchdog(self) -> None:
        """Every min(1 s, pass_timeout_s / 4): stop the passes running past pass_timeout_s."""
        period = min(1.0, max(0.005, self.policy.pass_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            if self._passes:
                self._stop_late_passes(time.monotonic())

    def _stop_late_passes(self, now: float) -> None:
        limit = self.policy.pass_timeout_s
        with self._counter_lock:
            late = [g for g in self._passes if not g.timed_out and now - g.started > limit]
            for guard in late:
                guard.timed_out = True
                if guard.options is not None:
                    guard.options.terminate = True  # session.run raises in its thread, between two operators
        for guard in late:
            log.error("model %s: a forward pass of %d item(s) x %d tokens has run %.2f s, past pass_timeout_s=%g; "
                      "%s", self.model, len(guard.batch.members), guard.batch.width, now - guard.started, limit,
                      "terminating it" if guard.options is not None else "its runner cannot be stopped")
