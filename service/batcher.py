"""Dynamic batching for one model: the asyncio scheduler between a bounded queue of *items* and the worker threads
that run its forward passes, and the canary passes that tell the model's health.

An item is one model input (a text, a pair, a QA or NER window); the items taken from the queue at once (a *take*)
run as one batch per padded width through the one inference path (tasks/runtime/inference.py) that training's dev
metrics and the parity gate use too. The queue and its fair take are service/batch_queue.py (no event loop), the forward
passes service/batch_executor.py (retry by halves, watchdog, finiteness check). The batcher only queues: it raises
its own errors (service/batch_errors.py), and the service maps them to HTTP (service/errors.py).

The batcher is a small state machine (after text-embeddings-inference's `queue.rs`):

    ACCEPTING --begin_draining()--> DRAINING --queue empty (or close() timeout)--> STOPPED

    ACCEPTING: `submit` admits items while the queue has room; else QueueFull (with retry_after).
    DRAINING:  `submit` refuses with NotAccepting; what is queued still runs.
    STOPPED:   the loop has ended; anything still queued failed with NotAccepting.

Its loop, while not STOPPED:

    IDLE     queue empty: sleep until an item arrives. Items that find the batcher idle (nothing running or
             prepared, no other request for the model being tokenized) are taken by a plain event-loop callback,
             after whatever else is ready to run, without waking this loop: one hop less on the one-client path.
    FILLING  only while requests for this model are being tokenized (`incoming`) and no pass runs: wait for their
             items until the budget is full or the oldest item's t0 + max_wait has passed. With nothing known to
             be coming, a take starts at once: an idle server adds no wait.
    TAKING   the queue's round-robin take across requests (batch_queue.py); items whose client has gone (future
             cancelled) or whose deadline passed are dropped there, before any compute, and counted by reason.
    RUNNING  in a worker thread, the take's batches, padded in the event loop beforehand (batch_executor.py). A
             *lone* pass (nothing else running or queued, in any model) runs on the wide engine, every thread on
             it, for latency; when more work is there and a narrow engine is given (CPU), up to
             `slots // narrow_threads` takes run at once, each on `narrow_threads` threads: independent
             single-threaded passes keep both cores busy without waiting on each other (measured 1.2-1.7x the
             items/s of one 2-thread pass on 2 cores, docs/SERVICE.md). With `pipeline`, items that arrive while
             every worker is busy are taken and padded into the next take, which starts the moment a worker is
             free: one take ahead, never more. The worker thread that ran a take posts its outcomes to the
             event loop, which answers its items at once; the loop task is woken only when it has more to start.

An item too long for the model or for the token budget is refused at admission (ItemTooLarge), so nothing in the
queue can stall it.

Health. The model is judged per *planned pass* (one padded batch as the event loop planned it, however often it
was retried by halves) by service/model_health.py, which holds the rule of what counts toward
`max_consecutive_failures` (a timeout counts at once; failing inputs beside computed ones do not; a pass whose
every item failed counts only if a canary pass fails too); an item that fails gets ItemFailed (500) either way.
So no input, however often sent, takes a working model out of rotation, and a broken model (its canary fails
too) is out after max_consecutive_failures passes; a model too slow for pass_timeout_s is out as well. The
*canary* is one item of the model's smallest warm-up shape ([CLS] [UNK]... [SEP], `canary`; without warm-up the
shortest item, [CLS] [SEP]), run through the same compute path as any pass (compute slots, watchdog, finiteness
check). Not ready (`healthy` False: /readyz lists why, the model's requests get 503 + Retry-After) -> a canary pass
every canary_interval_s, off the event loop (`_probe`); the first that passes makes the model ready again. Both
transitions are logged; berth_canary_passes_total, berth_model_failures_total count them. The watchdog checks on
the event loop every min(1 s, pass_timeout_s / 4) for passes past pass_timeout_s (batch_executor.py stops them).

Why 500 and not 422 for an input the model fails on: the input passed every check the API documents; what fails is
the served model on it (a tokenizer whose ids the model cannot embed, weights that overflow). A 4xx tells the client
to change a request it has no way to know how to change, and hides a model defect from 5xx alerting.

Why one file of ~600 lines: what remains is the one `Batcher` state machine, whose admission, loop, passes and
health transitions read and change the same state; every piece that needs none of it is already its own module
(the queue, the executor, the errors, the health rule), and a tenth of the file is this description.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from service.batch_errors import (
    BatcherError,
    Expired,
    ItemFailed,
    ItemTooLarge,
    NonFiniteOutput,
    NotAccepting,
    PassTimedOut,
    QueueFull,
)
from service.batch_executor import Computed, Outcome, Padded, PassExecutor, pad_take
from service.batch_queue import Item, ItemQueue
from service.compute_slots import ComputeSlots
from service.metrics import Metrics
from service.model_health import FAILURE_TEXT, Change, ModelHealth, Transition
from tasks.runtime.inference import BatchShape, Keep, ModelItem, Runner

log = logging.getLogger("berth.service.batcher")

class BatcherState(Enum):
    ACCEPTING = "accepting"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ItemResult:
    outputs: dict[str, np.ndarray]  # this item's rows; per-token outputs trimmed to its length
    queue_seconds: float  # admission -> start of its forward pass
    inference_seconds: float  # duration of the forward pass it was part of
    run_id: int  # which forward pass (so a request can add up distinct passes)
    pad_seconds: float = 0.0  # building the padded feeds of its pass
    finished_at: float = 0.0  # time.perf_counter() when its pass ended (the hop back to the request is timed)


@dataclass(slots=True)
class BatchPolicy(BatchShape):
    """The batch shape (tasks/runtime/inference.py: widths, batch size per width, token budget) and the queue's
    limits."""

    max_wait_s: float = 0.002
    max_queue_items: int = 2048
    min_retry_after_s: int = 1
    max_consecutive_failures: int = 5
    pipeline: bool = True  # take and pad the next batches while the current pass runs (one take ahead)
    pass_timeout_s: float = 60.0  # the watchdog stops a pass running longer
    canary_interval_s: float = 5.0  # seconds between canary passes while the model is not ready


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
    """Items taken from the queue at once, and their forward passes (padded in the event loop)."""

    items: list[Item]
    padded: Padded | None = None
    launched: bool = False  # its passes were handed to a worker thread

    def prepare(self, shape: BatchShape) -> None:
        self.padded = pad_take([item.encoded for item in self.items], [item.keep for item in self.items], shape)


class Arrival:
    """A request for the model being tokenized, from `Batcher.incoming()`: while one is, the next take may wait
    for its items (FILLING). It ends when it submits them or leaves its `with` block, whichever comes first."""

    __slots__ = ("_batcher",)

    def __init__(self, batcher: Batcher):
        self._batcher = batcher

    def __enter__(self) -> Arrival:
        self._batcher._arrivals.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._batcher._arrived(self)

    def submit(self, items: Sequence[ModelItem], deadline: float, keep: Keep | None = None) -> list[asyncio.Future]:
        """`Batcher.submit`, and this arrival is over."""
        try:
            return self._batcher.submit(items, deadline, keep)
        finally:
            self._batcher._arrived(self)


class Batcher:
    """One model's queue and worker threads. Create it, `start()` it inside the event loop, `submit` items from
    request handlers (or `with incoming() as arrival: ... arrival.submit(...)` around tokenizing them) and await
    their futures, `close()` it on shutdown.

    `compute_slots` is shared by the batchers of one process (batch_executor.py). Without `run_narrow`, one pass at
    a time."""

    def __init__(self, model: str, run: Runner, policy: BatchPolicy, metrics: Metrics,
                 per_token: bool | Collection[str], compute_slots: ComputeSlots | None = None, threads: int = 1,
                 run_narrow: Runner | None = None, narrow_threads: int = 1, output_names: Sequence[str] = ()):
        self.model = model
        self.policy = policy
        self.executor = PassExecutor(model, run, policy, metrics, per_token, compute_slots or ComputeSlots(1),
                                     threads, run_narrow, narrow_threads, output_names)
        self.parallel = self.executor.parallel
        self._metrics = metrics
        self._per_model = metrics.for_model(model)
        self._queue = ItemQueue(policy, wanted=lambda item: not item.future.done())
        self._arrivals: set[Arrival] = set()  # requests being tokenized for this model right now
        self._filling = False  # the loop is waiting for their items (FILLING)
        self._start_pending = False  # submit scheduled `_start_if_idle`
        self._state = BatcherState.ACCEPTING
        self._wakeup: asyncio.Event | None = None
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._workers = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix=f"berth-{model}")
        self._throughput = _Throughput()
        self._running: dict[asyncio.Future, _Take] = {}  # launched and not yet answered
        self._ahead: _Take | None = None  # taken and padded, waiting for a free worker
        self._handoff = threading.Lock()  # `_ahead` between the event loop and a worker claiming it (_claim_ahead)
        # health (the module's docstring)
        self.canary: ModelItem | None = None
        self.health_changed: Callable[[], None] | None = None  # called (from any thread) after the health or the
        #                                                       unready reason may have changed (--workers N)
        self.health = ModelHealth(policy.max_consecutive_failures)
        self._next_canary_at: float | None = None
        self._probe_task: asyncio.Task | None = None
        self._watchdog_task: asyncio.Task | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def state(self) -> BatcherState:
        return self._state

    @property
    def depth(self) -> int:
        return self._queue.depth

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
        for item in self._queue.clear():
            self._dropped(item, "shutdown")
        # takes whose passes close() gave up on, and one prepared ahead (never computed)
        ahead = self._pop_ahead()
        for take in [*self._running.values(), *([ahead] if ahead else [])]:
            if not take.launched:
                self._metrics.items_dropped.labels(self.model, "shutdown").inc(len(take.items))
            self._fail(take.items, self._shutting_down())
        self._running.clear()
        for task in (self._probe_task, self._watchdog_task):
            if task is not None:
                task.cancel()
        self._workers.shutdown(wait=False, cancel_futures=True)

    def run_now(self, items: Sequence[ModelItem], narrow: bool = False) -> list[dict[str, np.ndarray]]:
        """Run items synchronously in the caller's thread (warm-up), bypassing the queue and the metrics. Raises the
        first item's error, except NonFiniteOutput, which is left in place of that item's outputs."""
        outcomes = self.executor.run_items(list(items), narrow)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, NonFiniteOutput):
                raise outcome
        return [o.outputs if isinstance(o, Computed) else o for o in outcomes]  # type: ignore[misc]

    # -- admission -----------------------------------------------------------------------------

    def retry_after(self) -> int:
        rate = self._throughput.items_per_s
        wait = self.depth / rate if rate > 0 else 0.0
        return int(min(60, max(self.policy.min_retry_after_s, math.ceil(wait))))

    def incoming(self) -> Arrival:
        """`with batcher.incoming() as arrival:` around tokenizing a request, then `arrival.submit(...)`: the
        batcher may wait up to max_wait for its items, not longer, and never once the block is left."""
        return Arrival(self)

    def _arrived(self, arrival: Arrival) -> None:
        if arrival in self._arrivals:
            self._arrivals.discard(arrival)
            if self._filling and self._wakeup is not None:
                self._wakeup.set()

    def submit(self, items: Sequence[ModelItem], deadline: float, keep: Keep | None = None) -> list[asyncio.Future]:
        """Admit all of `items` (one request's) or none; `keep` says what each item keeps of its pass (its task's
        outputs for this request, reduced in the worker thread; None: every output, as views). Raises NotAccepting
        (draining or stopped), ItemTooLarge (an item or the request can never fit), QueueFull (no room right now,
        with retry_after)."""
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
        if self.depth + count > self.policy.max_queue_items:
            self._reject(count, "queue_full")
            raise QueueFull(f"model {self.model!r} is overloaded ({self.depth} inputs queued)",
                            retry_after=self.retry_after())
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        queued = [Item(encoded, length, deadline, now, keep, loop.create_future())
                  for encoded, length in zip(items, lengths)]
        for item in queued:
            item.future.add_done_callback(lambda _f, it=item: self._on_cancel(it))
        self._queue.add(queued)
        self._per_model.queue_depth.set(self.depth)
        if self._wakeup is not None:
            if self._idle() and not self._start_pending:
                # Nothing runs: start the take from a plain callback rather than by waking the loop task. It runs
                # after what is ready on the event loop now, so requests that arrived together still go together.
                self._start_pending = True
                loop.call_soon(self._start_if_idle)
            elif not self._start_pending:
                self._wakeup.set()
        return [item.future for item in queued]

    def _idle(self) -> bool:
        """No take running or prepared and the loop not FILLING."""
        return not self._running and self._ahead is None and not self._filling and self._state is BatcherState.ACCEPTING

    def _start_if_idle(self) -> None:
        self._start_pending = False
        take = self._take_now() if self._idle() and not self._arrivals else None
        if take is not None:
            self._start(take)
        elif self._wakeup is not None:  # more is coming (FILLING decides how long to wait) or a take runs already
            self._wakeup.set()

    def _reject(self, count: int, reason: str) -> None:
        self._metrics.items_rejected.labels(self.model, reason).inc(count)

    def _on_cancel(self, item: Item) -> None:
        """A client went away (or its request timed out): its queued items will not be computed."""
        if item.future.cancelled() and self._queue.discard(item):
            # the request's timeout fires at its deadline: a cancellation from then on is an expiry (504)
            self._dropped(item, "expired" if time.monotonic() >= item.deadline - 0.005 else "cancelled")

    def _shutting_down(self) -> NotAccepting:
        return NotAccepting("the server is shutting down", retry_after=self.policy.min_retry_after_s)

    def _dropped(self, item: Item, reason: str) -> None:
        """Count an item the queue dropped, and answer it if its request still waits."""
        self._per_model.queue_depth.set(self.depth)
        self._metrics.items_dropped.labels(self.model, reason).inc()
        if not item.future.done():
            item.future.set_exception(Expired("the request timed out in the queue") if reason == "expired"
                                      else self._shutting_down())

    @staticmethod
    def _fail(items: list[Item], error: BatcherError) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(error)

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        """IDLE / FILLING / TAKING as the module says; RUNNING in the worker threads, whose takes are answered by
        the call each posts to the event loop when done (`_finished`), not by this task. A take starts as soon as a
        worker is free (up to `parallel` at once). With `pipeline`, while every worker is busy, the next take is
        taken and padded as items arrive (topped up to the budget until a worker frees): one take ahead."""
        assert self._wakeup is not None
        running = self._running
        while True:
            if self._ahead is not None and len(running) < self.parallel:  # prepared ahead: start it at once
                take = self._pop_ahead()
                if take is not None:  # (unless a worker claimed it meanwhile)
                    self._start(take)
                continue
            oldest = self._queue.oldest()
            if running:
                if oldest is not None and len(running) < self.parallel:  # a free worker: take what is queued now
                    self._set_ahead(self._take_now())
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
                while self._state is BatcherState.ACCEPTING and self._arrivals and not self._queue.full():
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
            self._set_ahead(self._take_now())  # TAKING
        self._state = BatcherState.STOPPED

    def _take(self, already: Sequence[Item] = ()) -> list[Item]:
        taken, dropped = self._queue.take(time.monotonic(), already)
        for item, reason in dropped:
            self._dropped(item, reason)
        self._per_model.queue_depth.set(self.depth)
        return taken

    def _take_now(self) -> _Take | None:
        take = _Take(self._take())
        if not take.items:
            return None
        take.prepare(self.policy)
        return take

    def _top_up(self) -> bool:
        """Take queued items into the take prepared ahead (a new one if none) while the budget allows, and
        pad it again; False when nothing was added (it is full, or nothing queued fits). A worker may claim the
        take ahead at any moment: the grown take replaces it whole, under the hand-off lock."""
        with self._handoff:
            ahead = self._ahead
            added = self._take(ahead.items if ahead else [])
            if not added:
                return False
            grown = _Take([*(ahead.items if ahead else []), *added])
            grown.prepare(self.policy)
            self._ahead = grown
        return True

    def _set_ahead(self, take: _Take | None) -> None:
        with self._handoff:
            self._ahead = take

    def _pop_ahead(self) -> _Take | None:
        with self._handoff:
            take, self._ahead = self._ahead, None
        return take

    def _claim_ahead(self) -> _Take | None:
        """Worker thread, its take just done: the take prepared ahead, to run at once in this thread rather than
        after a round trip through the event loop (which, busy answering requests, left the workers idle ~17%
        of the time under 32 clients); None when there is none or the batcher has stopped."""
        if self._ahead is None or self._state is BatcherState.STOPPED:
            return None
        take = self._pop_ahead()
        if take is not None:
            take.launched = True
        return take

    def _ready(self, take: _Take) -> float:
        """Any thread, as a take starts: items whose client left meanwhile are left out (the take padded again),
        the others' queue wait recorded; when it started."""
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
        return started

    def _narrow(self, running: int) -> bool:
        """Run narrow when other work is there (this model's or another's), wide when the pass is alone."""
        return self.executor.has_narrow and (running > 0 or self.depth > 0 or self.executor.slots.busy > 0)

    def _launch(self, take: _Take) -> asyncio.Future:
        """Start a take's passes in a worker thread (`_ready`, `_narrow`)."""
        take.launched = True
        started = self._ready(take)
        narrow = self._narrow(len(self._running))
        loop = asyncio.get_running_loop()
        running = loop.create_future()
        self._workers.submit(self._compute_and_answer, loop, take, running, started, narrow)
        return running

    def _compute_and_answer(self, loop: asyncio.AbstractEventLoop, take: _Take, running: asyncio.Future,
                            started: float, narrow: bool) -> None:
        """Worker thread: the take's passes, their outcomes handed straight to `_finished` on the event loop (one
        wake-up of the loop, not run_in_executor's two steps), and on to the take prepared ahead, if any, at once."""
        while True:
            try:
                result, error = self._compute(take.padded, started, narrow), None
            except BaseException as raised:  # noqa: BLE001 - the items fail with ItemFailed; the worker lives on
                result, error = None, raised
            claimed = self._claim_ahead()
            claimed_running = loop.create_future() if claimed is not None else None
            try:
                loop.call_soon_threadsafe(self._finished, take, running, result, error, claimed, claimed_running)
            except RuntimeError:  # the loop is closed: close() has failed the take's items already
                return
            if claimed is None or claimed_running is None:
                return
            take, running = claimed, claimed_running
            started = self._ready(take)
            narrow = self._narrow(len(self._running) - 1)  # this take's predecessor may still be listed

    def _compute(self, padded: Padded, started: float, narrow: bool) -> tuple[list[Outcome], float, float]:
        """Worker thread: the take's passes, each judged (Health); each item's outcome in take order, when they
        started and how long they took."""
        outcomes: list[Outcome] = [None] * len(padded.items)  # type: ignore[list-item]
        verdicts: list[tuple[bool, str]] = []  # a confirming canary's, at most one per take

        def confirm() -> tuple[bool, str]:
            if not verdicts:
                verdicts.append(self._canary_pass("confirm"))
            return verdicts[0]

        for batch, feeds, pad_seconds in padded.passes:
            results = self.executor.run_pass(padded.items, batch, feeds, pad_seconds, padded.keeps, narrow=narrow)
            for i, outcome in results.items():
                outcomes[i] = outcome
            self._apply(self.health.record(list(results.values()), confirm), len(results))
        return outcomes, started, time.monotonic() - started

    def _start(self, take: _Take) -> None:
        self._running[self._launch(take)] = take

    def _finished(self, take: _Take, running: asyncio.Future, result: Any, error: BaseException | None,
                  claimed: _Take | None = None, claimed_running: asyncio.Future | None = None) -> None:
        """A take's passes ended (event loop thread): answer its items at once, then wake the loop for the next take.
        `claimed`: the take prepared ahead that the same worker started next (listed as running before this one
        leaves, so the loop never sees a free worker that is not). A take that close() already failed is no longer
        in `_running` and is not answered twice."""
        if claimed is not None and claimed_running is not None:
            self._running[claimed_running] = claimed
        if self._running.pop(running, None) is not None:
            if error is None:
                running.set_result(result)
            else:
                running.set_exception(error)
            self._answer(take, running)
        if self._wakeup is not None and (self.depth > 0 or self._ahead is not None
                                         or self._state is not BatcherState.ACCEPTING):
            self._wakeup.set()

    def _answer(self, take: _Take, running: asyncio.Future) -> None:
        """Hand each item of a finished take its rows, or its error."""
        if running.cancelled() or running.exception() is not None:
            self._fail(take.items, self._shutting_down() if running.cancelled() else
                       ItemFailed("inference failed for this input; see the server log"))
            return
        outcomes, started, seconds = running.result()
        # passes still running ran beside this one: the model's rate (for Retry-After) is about that many times its own
        self._throughput.update(len(take.items) * max(1, len(self._running) + 1), seconds)
        self._per_model.model_ready.set(1 if self.healthy else 0)
        for item, out in zip(take.items, outcomes):
            if item.future.done():
                continue
            if isinstance(out, BaseException):
                item.future.set_exception(out if isinstance(out, BatcherError) else
                                          ItemFailed("inference failed for this input; see the server log"))
            else:
                item.future.set_result(ItemResult(out.outputs, started - item.enqueued_at, out.seconds, out.run_id,
                                                  out.pad_seconds, out.finished_at))

    # -- health (the module's docstring) -------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False after max_consecutive_failures passes in a row counted against the model (service/model_health.py),
        until a pass or a canary pass succeeds."""
        return self.health.healthy

    @property
    def consecutive_failures(self) -> int:
        return self.health.consecutive_failures

    @property
    def unready_reason(self) -> str | None:
        """Why the model is not ready (fixed phrases, no error text: /readyz is unauthenticated); None when it is."""
        return self.health.unready_reason(self.canary is not None, self.policy.canary_interval_s)

    def next_canary_in(self) -> float:
        """Seconds until the next canary pass (Retry-After for a model that is not ready)."""
        at = self._next_canary_at
        return self.policy.canary_interval_s if at is None else max(0.0, at - time.monotonic())

    def _apply(self, change: Change, items: int, how: str = "a forward pass succeeded") -> None:
        """Worker thread or event loop: log, count and announce what a recorded pass changed."""
        if change.excused:
            log.warning("model %s: every item of a forward pass (%d) failed, but a canary pass succeeded: the "
                        "inputs are at fault, not counted against the model", self.model, items)
        if change.counted is not None:
            self._tell_health()
            self._metrics.model_failures.labels(self.model, change.counted).inc()
            log.error("model %s: %s; it counts against the model (%d of max_consecutive_failures=%d in a row)",
                      self.model, FAILURE_TEXT[change.counted], change.failures, self.policy.max_consecutive_failures)
        if change.transition is Transition.READY:
            self._tell_health()
            self._notify(self._became_ready, how)
        elif change.transition is Transition.UNREADY:
            self._notify(self._became_unready)

    def _canary_pass(self, kind: str) -> tuple[bool, str]:
        """Worker thread: one pass of the canary input. (passed, why not)."""
        if self.canary is None:
            return False, "no canary input"
        out = self.executor.run_canary(self.canary)
        passed = not isinstance(out, BaseException)
        self._metrics.canary_passes.labels(self.model, kind, "passed" if passed else "failed").inc()
        why = ("" if passed else "it ran past pass_timeout_s" if isinstance(out, PassTimedOut) else
               "NaN or infinite outputs" if isinstance(out, NonFiniteOutput) else f"it raised {type(out).__name__}")
        self.health.canary_result(passed, why)
        if not self.healthy:  # the unready reason names the last canary
            self._tell_health()
        return passed, why

    def _tell_health(self) -> None:
        if self.health_changed is not None:
            self.health_changed()

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
                passed, why = await loop.run_in_executor(self._workers, self._canary_pass, "probe")
                if passed:
                    self._apply(self.health.passed(), 1, "a canary pass succeeded")
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
            if self.executor.watched:
                self.executor.stop_late_passes(time.monotonic(), self.policy.pass_timeout_s)
