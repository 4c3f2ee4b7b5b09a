"""The one code path every /v1 inference request takes, whether `inputs` is one input or a list:

    resolve the model -> check limits (characters, and tokens by a lower bound) -> encode (in the tokenizer
    thread when large) -> check budgets (items, tokens, the answer's estimated bytes) -> submit all items to
    the model's batcher -> await them (or the timeout, or the client leaving) -> decode and JSON (orjson; both
    in the tokenizer thread when the request or its answer is large)

The steps around the batcher are the bundle's engine's (tasks/engine.py: its items, and their decode), the
ones `berth predict` and `berth.load` run; what is this module's own is HTTP: limits, budgets, timeouts,
cancellation, timings and the response.

What a request holds is bounded before any inference: each item keeps only what its task needs of its
forward pass (tasks/runtime/inference.py `Keep`, reduced in the pass's worker thread), and the answer's JSON bytes,
estimated by the task, must fit `max_response_bytes` (else 413) and, with every other request in progress,
`max_inflight_response_bytes` (else 429; 413 when the request alone is larger).

A client that disconnects or a request that times out cancels its items' futures, so the batcher
drops whatever of it is still queued instead of computing it. Every stage is timed and reported in
the `Server-Timing` header (milliseconds), so the per-request overhead can be read off any response.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request, Response
from pydantic import TypeAdapter, ValidationError

from service import tracing
from service.errors import ErrorType, ServiceError
from service.handlers import TaskHandler
from service.middleware import STARTED_AT
from service.models import ServedModel
from service.runtime import Runtime
from service.settings import ServiceSettings
from tasks.engine import items_of

log = logging.getLogger("berth.service.inference")

CLIENT_GONE_STATUS = 499  # nginx's "client closed request": nobody reads it, the metrics count it


@dataclass(slots=True)
class Timings:
    parse_s: float = 0.0  # body received -> handler called (JSON parsing, validation)
    tokenize_s: float = 0.0
    queue_s: float = 0.0  # the longest wait of the request's items before their forward pass
    pad_s: float = 0.0
    inference_s: float = 0.0  # the time the forward passes the request's items were in ran (overlaps once)
    wake_s: float = 0.0  # the last forward pass's end -> the request resumes on the event loop
    decode_s: float = 0.0
    serialize_s: float = 0.0
    # what the access log and the trace's stage spans read (service/request_trace.py, service/tracing.py)
    inputs: int = 0
    items: int = 0
    tokens: int = 0
    tokenize_at: float = 0.0  # perf_counter() when tokenizing began
    decode_at: float = 0.0  # perf_counter() when decoding began

    def server_timing(self, total_s: float) -> str:
        stages = [("parse", self.parse_s), ("tokenize", self.tokenize_s), ("queue", self.queue_s),
                  ("pad", self.pad_s), ("inference", self.inference_s), ("wake", self.wake_s),
                  ("decode", self.decode_s), ("serialize", self.serialize_s), ("total", total_s)]
        return ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in stages)


async def infer(request: Request, handler: TaskHandler, body: Any,
                payload_shape: Callable[[str, list[Any]], dict[str, Any]] | None = None) -> Response:
    """`payload_shape(model name, results)` replaces the `{"model", "results"}` body (e.g. OpenAI's shape)."""
    started = time.perf_counter()
    runtime: Runtime = request.app.state.runtime
    received = request.scope.get("state", {}).get(STARTED_AT, started)
    model = runtime.resolve(body.model, handler.task)
    request.state.berth_model = model.name
    inputs = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    handler.check_inputs(inputs, runtime.settings)
    handler.check_body(body, runtime.settings)

    timeout = runtime.settings.request_timeout_s
    deadline = time.monotonic() + timeout
    this = asyncio.current_task()
    assert this is not None
    watcher = asyncio.ensure_future(_cancel_when_gone(request.receive, this))
    reserved = Reservation(runtime)
    try:
        async with asyncio.timeout(timeout):
            results, timings, pool = await _compute(model, handler, inputs, body, deadline, runtime, reserved)
            request.state.berth_timings = timings
            timings.parse_s = started - received
            begin = time.perf_counter()

            def serialize() -> bytes:
                shaped = payload_shape(model.name, results) if payload_shape else {"model": model.name,
                                                                                   "results": results}
                check_response(request, shaped)
                return orjson.dumps(shaped, option=orjson.OPT_SERIALIZE_NUMPY)

            payload = await _maybe_in_thread(pool, serialize)
    except TimeoutError:
        raise ServiceError(ErrorType.TIMEOUT, f"not answered within {timeout:g} s (request_timeout_s)") from None
    except asyncio.CancelledError:
        client_left = watcher.done() and not watcher.cancelled()  # the watcher ends only when it cancelled us
        if client_left and this.uncancel() == 0:  # and nobody else cancelled: nobody reads this answer
            return Response(status_code=CLIENT_GONE_STATUS)
        raise
    finally:
        watcher.cancel()
        reserved.release()
    end = time.perf_counter()
    timings.serialize_s = end - begin
    total = end - received
    return Response(payload, media_type="application/json", headers={
        "x-total-time": _ms(total),
        "x-tokenization-time": _ms(timings.tokenize_s),
        "x-queue-time": _ms(timings.queue_s),
        "x-inference-time": _ms(timings.inference_s),
        "server-timing": timings.server_timing(total),
        "x-model": model.name,
    })


def check_response(request: Request, body: dict[str, Any]) -> None:
    """Validate a response against the response model its route declares (and /docs shows), so the
    OpenAPI page cannot drift from what is sent: a mismatch is a 500 naming the schema, never sent."""
    declared = getattr(request.scope.get("route"), "response_model", None)
    if declared is None:
        return
    try:
        _adapter(declared).validate_python(body)
    except ValidationError as error:
        log.error("response of %s does not match %s: %s", request.url.path, declared.__name__, error)
        raise ServiceError(ErrorType.INTERNAL, f"the response does not match its declared schema "
                           f"{declared.__name__} ({error.error_count()} problem(s)); this is a bug") from None


@functools.cache
def _adapter(declared: type) -> TypeAdapter:
    return TypeAdapter(declared)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


class Reservation:
    """A request's share of `max_inflight_response_bytes`, held from admission until its answer is serialized."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.nbytes = 0

    def take(self, nbytes: int) -> None:
        settings = self.runtime.settings
        if nbytes > settings.max_response_bytes:
            raise ServiceError(ErrorType.TOO_LARGE, f"the answer would be about {_mib(nbytes)} of JSON; the limit "
                               f"is {_mib(settings.max_response_bytes)} (max_response_bytes); send fewer inputs, a "
                               "smaller top_k or fewer layers")
        if nbytes > settings.max_inflight_response_bytes:
            raise ServiceError(ErrorType.TOO_LARGE, f"the answer would be about {_mib(nbytes)} of JSON; the server "
                               f"holds at most {_mib(settings.max_inflight_response_bytes)} of answers at once "
                               "(max_inflight_response_bytes)")
        held = self.runtime.response_bytes_in_flight
        if held + nbytes > settings.max_inflight_response_bytes:
            raise ServiceError(ErrorType.OVERLOADED, f"answers of {_mib(held)} are being computed; with this one "
                               f"({_mib(nbytes)}) they would pass {_mib(settings.max_inflight_response_bytes)} "
                               "(max_inflight_response_bytes)", retry_after=settings.retry_after_s)
        self.runtime.response_bytes_in_flight = held + nbytes
        self.nbytes = nbytes

    def release(self) -> None:
        self.runtime.response_bytes_in_flight -= self.nbytes
        self.nbytes = 0


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


# Answers estimated larger than this are decoded and serialized in the tokenizer thread, off the event loop.
DECODE_IN_THREAD_BYTES = 256 * 1024


_WORD_CHARACTER = re.compile(r"\w")


def fewest_tokens(texts: Iterable[str]) -> int:
    """A lower bound on the tokens of these texts as model inputs: a whitespace-separated word with a letter, digit
    or underscore in it is at least one token (the normalizer never removes those; a word of only format
    characters may vanish), and every text has at least its [SEP]. A request over max_tokens_per_request by this
    bound is refused before it is tokenized at all."""
    return sum(sum(1 for word in text.split() if _WORD_CHARACTER.search(word)) + 1 for text in texts)


def check_budget(prepared: list[Any], settings: ServiceSettings, handler: TaskHandler | None = None) -> None:
    """The exact per-request budgets, after tokenizing and before any inference (413 naming the limit; the
    handler's item limit and hint where it has its own)."""
    items = sum(len(p.items) for p in prepared)
    limit, named = (settings.max_items_per_request, "max_items_per_request") if handler is None \
        else handler.item_limit(prepared, settings)
    hint = "" if handler is None else handler.budget_hint
    if items > limit:
        raise ServiceError(ErrorType.TOO_LARGE, f"the request makes {items} model inputs (sequences or windows); "
                           f"the limit is {limit} ({named}){hint}")
    tokens = sum(len(item) for p in prepared for item in p.items)
    if tokens > settings.max_tokens_per_request:
        raise ServiceError(ErrorType.TOO_LARGE, f"the request makes {tokens} tokens (windows included); the limit "
                           f"is {settings.max_tokens_per_request} (max_tokens_per_request){hint}")


async def _compute(model: ServedModel, handler: TaskHandler, inputs: list[Any], body: Any, deadline: float,
                   runtime: Runtime, reserved: Reservation) -> tuple[list[Any], Timings, Executor | None]:
    settings = runtime.settings
    timings = Timings()
    texts = [text for raw in inputs for _, text in handler.texts(raw)]
    chars = sum(len(text) for text in texts)
    # Small requests are tokenized inline (a thread hop costs more than they do); large ones in the
    # tokenizer thread, where `encode_batch` releases the GIL and the event loop keeps serving.
    pool = runtime.pool_for(chars)

    def prepare() -> list[Any]:
        if chars > settings.max_tokens_per_request:  # only then can the words alone pass the token budget
            least = fewest_tokens(texts)
            if least > settings.max_tokens_per_request:
                raise ServiceError(ErrorType.TOO_LARGE, f"the request makes at least {least} tokens; the limit is "
                                   f"{settings.max_tokens_per_request} (max_tokens_per_request)")
        return handler.prepare(model, inputs, body)

    assert model.batcher is not None
    begin = time.perf_counter()
    with model.batcher.incoming() as arrival:  # the batcher may wait up to max_wait for these items, not longer
        prepared = await _maybe_in_thread(pool, prepare)
        timings.tokenize_s = time.perf_counter() - begin
        timings.tokenize_at = begin
        check_budget(prepared, settings, handler)
        handler.check_prepared(model, prepared, body, settings)
        nbytes = handler.response_bytes(model, prepared, body)
        reserved.take(nbytes)
        futures = arrival.submit(items_of(prepared), deadline, handler.keep(model, body))
    if pool is None and nbytes > DECODE_IN_THREAD_BYTES:
        pool = runtime.tokenizer_pool
    runtime.metrics.request_inputs.labels(handler.route, model.name).inc(len(inputs))
    timings.inputs, timings.items = len(inputs), len(futures)
    timings.tokens = sum(len(item) for p in prepared for item in p.items)
    try:  # one item (most requests) is awaited as it is: gather would add a step of the event loop
        item_results = [await futures[0]] if len(futures) == 1 else await asyncio.gather(*futures)
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    timings.queue_s = max(r.queue_seconds for r in item_results)
    timings.inference_s = covered_seconds({r.run_id: (r.finished_at - r.inference_seconds, r.finished_at)
                                           for r in item_results}.values())
    timings.pad_s = sum({r.run_id: r.pad_seconds for r in item_results}.values())
    timings.wake_s = max(0.0, time.perf_counter() - max(r.finished_at for r in item_results))

    kept = [r.outputs for r in item_results]
    finish = functools.partial(handler.finish, model, body=body)
    begin = time.perf_counter()
    results = await _maybe_in_thread(pool, lambda: model.task_engine.decode(prepared, kept, body, finish))
    timings.decode_s = time.perf_counter() - begin
    timings.decode_at = begin
    if tracing.ACTIVE:
        tracing.record_stages(timings, item_results)
    return results, timings, pool


def covered_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """The time covered by the (start, end) intervals: passes of one request that ran side by side count once."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


async def _maybe_in_thread(pool: Executor | None, fn: Callable[[], Any]) -> Any:
    if pool is None:
        return fn()
    # in the request's context, so what the thread logs carries the request's id (service/request_ids.py)
    return await asyncio.get_running_loop().run_in_executor(pool, contextvars.copy_context().run, fn)


async def _cancel_when_gone(receive: Callable[[], Awaitable[dict]], request_task: asyncio.Task) -> None:
    """Cancel the request's task when its client disconnects (its queued items are then dropped, not computed)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            request_task.cancel()
            return
