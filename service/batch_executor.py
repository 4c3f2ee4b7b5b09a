"""The compute of one model's batcher: forward passes through the one inference path (tasks/runtime/inference.py), each
returning every member's outcome, its rows (`Computed`) or the error that failed it.

A take runs as one batch per padded width, planned and padded beforehand (`pad_take`; CPU: to the longest item
rounded up to `pad_multiple`, CUDA: to its length bucket), in a worker thread holding units of the process's compute
slots (one per ONNX Runtime thread). A pass that raises is retried by halves, each padded anew, down to the item(s)
that fail it (ItemFailed). A narrow pass runs on the narrow engine (`run_narrow`, `narrow_threads`); a wide one holds
every thread for the wide engine, or runs narrow when another model took cores since the event loop decided (not
warm-up's: `exact`).

Watchdog: each pass holds its own onnxruntime.RunOptions (the runner's `new_run_options`) while it runs; the batcher
calls `stop_late_passes` on the event loop every min(1 s, pass_timeout_s / 4), which sets `terminate` on those past
pass_timeout_s, and `session.run` raises in its worker thread within one operator: the compute slots are freed, the
items fail with PassTimedOut (no retry: its halves would hold the cores about as long again),
berth_pass_timeouts_total counts it. Warm-up (before the event loop serves) is not watched.

Non-finite outputs: after every pass the worker thread checks the outputs with np.isfinite (whole arrays: ~0.15 ms
a million floats); only when something is not finite are the items told apart, each on its own rows (per-token
outputs trimmed to its length), and those fail with NonFiniteOutput (berth_nonfinite_outputs_total).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.batch_errors import NonFiniteOutput, PassTimedOut
from service.compute_slots import ComputeSlots
from service.metrics import Metrics
from tasks.runtime.inference import (
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


@dataclass(frozen=True, slots=True)
class Computed:
    """One item's share of a forward pass."""

    outputs: dict[str, np.ndarray]  # its rows; per-token outputs trimmed to its length
    run_id: int  # which forward pass (so a request can add up distinct passes)
    seconds: float  # duration of the pass
    pad_seconds: float  # building the padded feeds of the pass
    finished_at: float  # time.perf_counter() when the pass ended


Outcome = Computed | BaseException


@dataclass(frozen=True, slots=True)
class Padded:
    """A take's forward passes, planned and padded (in the event loop, so with `pipeline` that work overlaps the
    pass before)."""

    items: list[ModelItem]
    keeps: list[Keep | None]
    passes: list[tuple[Batch, dict[str, np.ndarray], float]]  # (batch, its feeds, seconds padding them)


def pad_take(items: Sequence[ModelItem], keeps: Sequence[Keep | None], shape: BatchShape) -> Padded:
    passes = []
    for batch in plan_batches([len(x) for x in items], shape):
        begin = time.perf_counter()
        feeds = pad(items, batch)
        passes.append((batch, feeds, time.perf_counter() - begin))
    return Padded(list(items), list(keeps), passes)


class _Guard:
    """One forward pass as the watchdog sees it (from the moment it holds its cores), and what it found in the pass's
    outputs: the runner `run_batch` calls. `bad`: the members (indices into `items`) whose outputs are not finite;
    `stopped_at`: the pass_timeout_s it ran past, once the watchdog stopped it."""

    __slots__ = ("executor", "runner", "new_options", "items", "batch", "options", "started", "stopped_at", "bad")

    def __init__(self, executor: PassExecutor, runner: Runner, new_options: Callable[[], Any] | None,
                 items: Sequence[ModelItem], batch: Batch):
        self.executor, self.runner, self.new_options, self.items, self.batch = \
            executor, runner, new_options, items, batch
        self.options: Any = None
        self.started = 0.0
        self.stopped_at: float | None = None
        self.bad: list[int] = []

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        executor = self.executor
        self.options = self.new_options() if self.new_options is not None else None
        self.started = time.monotonic()
        with executor.lock:
            executor.watched.add(self)
        try:
            out = self.runner(feeds) if self.options is None else self.runner(feeds, run_options=self.options)
        finally:
            with executor.lock:
                executor.watched.discard(self)
        if not all(np.isfinite(value).all() for value in out.values() if value.dtype.kind in "fc"):
            self.bad = self._nonfinite_members(out)
        return out

    def _nonfinite_members(self, out: dict[str, np.ndarray]) -> list[int]:
        """The members whose own rows (per-token outputs trimmed to their length, as split_rows does) are not finite."""
        per_token, width = self.executor.per_token, self.batch.width
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


class PassExecutor:
    """Runs one model's forward passes (from any thread) and returns each member's outcome. `slots` is shared by the
    models of one process: a pass on `run` holds `threads` units, one on `run_narrow` (the same model on fewer ORT
    threads) `narrow_threads`, so the models' ONNX Runtime pools never run more threads at once than the cores
    allow."""

    def __init__(self, model: str, run: Runner, shape: BatchShape, metrics: Metrics, per_token: Any,
                 slots: ComputeSlots, threads: int, run_narrow: Runner | None, narrow_threads: int,
                 output_names: Sequence[str]):
        self.model, self.shape, self.per_token = model, shape, per_token
        self.slots = slots
        self.output_names = tuple(output_names)  # what `run` returns by default; an item's Keep may need fewer
        self._run, self._run_narrow = run, run_narrow
        self._threads, self._narrow_threads = threads, narrow_threads
        self._metrics = metrics
        self._per_model = metrics.for_model(model)
        self.lock = threading.Lock()
        self.watched: set[_Guard] = set()  # the passes running now
        self._run_counter = 0

    @property
    def has_narrow(self) -> bool:
        return self._run_narrow is not None

    @property
    def parallel(self) -> int:
        """How many passes of this model can run at once: one per narrow engine's share of the slots."""
        return max(1, self.slots.units // self._narrow_threads) if self._run_narrow is not None else 1

    def run_pass(self, items: Sequence[ModelItem], batch: Batch, feeds: dict[str, np.ndarray] | None = None,
                 pad_seconds: float = 0.0, keeps: Sequence[Keep | None] | None = None, narrow: bool = False,
                 record: bool = True, exact: bool = False) -> dict[int, Outcome]:
        """One forward pass of `batch` (padded now unless `feeds`), retried by halves when it raises: each member's
        outcome. `record`: count it in the pass and item metrics (not warm-up's, not a canary's)."""
        if narrow and self._run_narrow is not None:
            holding = self.slots.hold(self._narrow_threads)
        else:
            fallback = self._narrow_threads if self._run_narrow is not None and not exact else None
            holding = self.slots.hold(self._threads, fallback)
        guard: _Guard | None = None
        try:
            with holding as units:
                run = self._run_narrow if self._run_narrow is not None and units < self._threads else self._run
                begin = time.perf_counter()  # a pass's time starts when it has its cores
                if feeds is None:
                    feeds = pad(items, batch)
                    pad_seconds = time.perf_counter() - begin
                    begin = time.perf_counter()
                names = None if keeps is None or not self.output_names else \
                    output_names_of([keeps[i] for i in batch.members], self.output_names)
                # fetch fewer outputs only when the members need fewer (a runner may not take output_names)
                runner = run if names is None or len(names) == len(self.output_names) else \
                    functools.partial(run, output_names=names)
                guard = _Guard(self, runner, getattr(run, "new_run_options", None), items, batch)
                rows = run_batch(guard, items, batch, self.per_token, feeds, keeps)
        except Exception as error:
            return self._failed_pass(error, guard, items, batch, keeps, narrow, record, exact)
        finished = time.perf_counter()
        seconds = finished - begin
        with self.lock:
            self._run_counter += 1
            run_id = self._run_counter
        if record:
            self._per_model.inference_duration.observe(seconds)
            self._per_model.batch_size.observe(len(batch.members))
            self._per_model.batch_tokens.observe(len(batch.members) * batch.width)
            self._per_model.items_inferred.inc(len(batch.members))
        outcomes: dict[int, Outcome] = {i: Computed(row, run_id, seconds, pad_seconds, finished)
                                        for i, row in zip(batch.members, rows)}
        if guard.bad:
            outcomes.update(self._nonfinite(guard.bad, len(batch.members), record))
        return outcomes

    def _failed_pass(self, error: Exception, guard: _Guard | None, items: Sequence[ModelItem], batch: Batch,
                     keeps: Sequence[Keep | None] | None, narrow: bool, record: bool,
                     exact: bool) -> dict[int, Outcome]:
        self._metrics.inference_failures.labels(self.model).inc()
        members = batch.members
        if guard is not None and guard.stopped_at is not None:  # the watchdog stopped it: no retry
            self._metrics.pass_timeouts.labels(self.model).inc()
            if record:
                self._metrics.items_failed.labels(self.model).inc(len(members))
            return {i: PassTimedOut(f"the forward pass ran past pass_timeout_s ({guard.stopped_at:g} s) and was "
                                    f"stopped") for i in members}
        if len(members) > 1:
            middle = len(members) // 2
            log.warning("forward pass of %d items failed for model %s (%s); retrying by halves",
                        len(members), self.model, type(error).__name__)
            outcomes: dict[int, Outcome] = {}
            for half in (members[:middle], members[middle:]):
                width = self.shape.width_for(max(len(items[i]) for i in half)) or batch.width
                outcomes.update(self.run_pass(items, Batch(half, width), None, 0.0, keeps, narrow, record, exact))
            return outcomes
        if guard is not None and guard.bad:  # its Keep could not reduce NaN rows: the outputs are what failed
            return self._nonfinite(list(members), 1, record)
        log.error("inference failed for model %s on one item of %d tokens: %s",
                  self.model, len(items[members[0]]), error, exc_info=error)
        if record:
            self._metrics.items_failed.labels(self.model).inc()
        return {members[0]: error}

    def _nonfinite(self, bad: list[int], size: int, record: bool) -> dict[int, Outcome]:
        log.error("model %s produced NaN or infinite outputs for %d of the %d item(s) of a forward pass", self.model,
                  len(bad), size)
        if record:
            self._metrics.nonfinite_outputs.labels(self.model).inc(len(bad))
            self._metrics.items_failed.labels(self.model).inc(len(bad))
        return {i: NonFiniteOutput("the model produced NaN or infinite outputs for this input") for i in bad}

    def run_items(self, items: Sequence[ModelItem], narrow: bool = False) -> list[Outcome]:
        """Items planned, padded and run in the caller's thread on exactly the engine asked for (warm-up), outside
        the metrics: each item's outcome, in order."""
        outcomes: list[Outcome] = [None] * len(items)  # type: ignore[list-item]
        for batch in plan_batches([len(x) for x in items], self.shape):
            for i, outcome in self.run_pass(items, batch, narrow=narrow, record=False, exact=True).items():
                outcomes[i] = outcome
        return outcomes

    def run_canary(self, canary: ModelItem) -> Outcome:
        """One pass of the canary input through the compute path of every pass (compute slots, the watchdog, the
        finiteness check), outside the item metrics."""
        width = self.shape.width_for(len(canary)) or self.shape.buckets[-1]
        return self.run_pass([canary], Batch((0,), width), record=False)[0]

    def stop_late_passes(self, now: float, limit: float) -> None:
        """Stop the passes running longer than `limit` seconds (pass_timeout_s)."""
        with self.lock:
            late = [g for g in self.watched if g.stopped_at is None and now - g.started > limit]
            for guard in late:
                guard.stopped_at = limit
                if guard.options is not None:
                    guard.options.terminate = True  # session.run raises in its thread, between two operators
        for guard in late:
            log.error("model %s: a forward pass of %d item(s) x %d tokens has run %.2f s, past pass_timeout_s=%g; "
                      "%s", self.model, len(guard.batch.members), guard.batch.width, now - guard.started, limit,
                      "terminating it" if guard.options is not None else "its runner cannot be stopped")
