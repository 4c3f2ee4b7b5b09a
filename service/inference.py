"""The one code path every /v1 inference request takes, whether `inputs` is one input or a list:

    resolve the model -> check limits -> encode (in a thread when large) -> submit all items to the
    model's batcher -> await them (or the timeout, or the client leaving) -> decode -> JSON

A client that disconnects or a request that times out cancels its items' futures, so the batcher
drops whatever of it is still queued instead of computing it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request, Response

from service.errors import ErrorType, ServiceError
from service.handlers import TaskHandler
from service.models import ROUTES, ServedModel
from service.runtime import Runtime
from service.settings import ServiceSettings

CLIENT_GONE_STATUS = 499  # nginx's "client closed request": nobody reads it, the metrics count it


@dataclass(slots=True)
class Timings:
    tokenize_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0


class _ClientGone(Exception):
    pass


async def infer(request: Request, runtime: Runtime, handler: TaskHandler, body: Any,
                payload_shape: Callable[[str, list[Any]], dict[str, Any]] | None = None) -> Response:
    """`payload_shape(model name, results)` replaces the `{"model", "results"}` body (e.g. OpenAI's shape)."""
    started = time.perf_counter()
    model = runtime.resolve(body.model, handler.task)
    request.state.berth_model = model.name
    inputs = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    check_inputs(inputs, handler, runtime.settings)
    runtime.metrics.request_inputs.labels(handler.route or ROUTES[handler.task], model.name).inc(len(inputs))

    timeout = runtime.settings.request_timeout_s
    deadline = time.monotonic() + timeout
    work = asyncio.ensure_future(_compute(model, handler, inputs, body, deadline, runtime.settings))
    try:
        results, timings = await _until_done_or_gone(request.receive, work, timeout)
    except _ClientGone:
        return Response(status_code=CLIENT_GONE_STATUS)
    body_out = payload_shape(model.name, results) if payload_shape else {"model": model.name, "results": results}
    payload = json.dumps(body_out, ensure_ascii=False).encode("utf-8")
    total = time.perf_counter() - started
    return Response(payload, media_type="application/json", headers={
        "x-total-time": _ms(total),
        "x-tokenization-time": _ms(timings.tokenize_s),
        "x-queue-time": _ms(timings.queue_s),
        "x-inference-time": _ms(timings.inference_s),
        "x-model": model.name,
    })


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def check_inputs(inputs: list[Any], handler: TaskHandler, settings: ServiceSettings) -> None:
    """The request limits (413) and what pydantic cannot say about the texts (422)."""
    if not inputs:
        raise ServiceError(ErrorType.VALIDATION, "inputs: the list is empty; send at least one input")
    if len(inputs) > settings.max_inputs_per_request:
        raise ServiceError(ErrorType.TOO_LARGE, f"inputs: {len(inputs)} inputs in one request; the limit is "
                           f"{settings.max_inputs_per_request} (max_inputs_per_request)")
    for index, raw in enumerate(inputs):
        for field, text in handler.texts(raw):
            where = f"inputs[{index}]" + ("" if isinstance(raw, str) else f".{field}")
            if not text.strip():
                raise ServiceError(ErrorType.VALIDATION, f"{where}: empty or only whitespace")
            if len(text) > settings.max_chars_per_input:
                raise ServiceError(ErrorType.TOO_LARGE, f"{where}: {len(text)} characters; the limit is "
                                   f"{settings.max_chars_per_input} (max_chars_per_input)")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ServiceError(ErrorType.VALIDATION, f"{where}: not valid Unicode text (an unpaired surrogate "
                                   f"at character {error.start})") from None


async def _compute(model: ServedModel, handler: TaskHandler, inputs: list[Any], body: Any, deadline: float,
                   settings: ServiceSettings) -> tuple[list[Any], Timings]:
    timings = Timings()
    chars = sum(len(text) for raw in inputs for _, text in handler.texts(raw))
    offload = chars > settings.tokenize_in_thread_chars  # keep the event loop free of big tokenizations

    begin = time.perf_counter()
    prepared = await _maybe_in_thread(offload, lambda: [handler.prepare(model, raw, body, i)
                                                        for i, raw in enumerate(inputs)])
    timings.tokenize_s = time.perf_counter() - begin

    assert model.batcher is not None
    futures = model.batcher.submit([item for p in prepared for item in p.items], deadline)
    try:
        item_results = await asyncio.gather(*futures)
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    timings.queue_s = max(r.queue_seconds for r in item_results)
    timings.inference_s = sum({r.run_id: r.inference_seconds for r in item_results}.values())

    outputs, at = [], 0
    for p in prepared:
        outputs.append([r.outputs for r in item_results[at : at + len(p.items)]])
        at += len(p.items)
    results = await _maybe_in_thread(offload, lambda: handler.finish(model, prepared, outputs, body))
    return results, timings


async def _maybe_in_thread(offload: bool, fn: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(fn) if offload else fn()


async def _until_done_or_gone(receive: Callable[[], Awaitable[dict]], work: asyncio.Future,
                              timeout: float) -> tuple[list[Any], Timings]:
    """The work's result, unless the timeout passes first (504) or the client disconnects."""
    gone = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        async with asyncio.timeout(timeout):
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        raise ServiceError(ErrorType.TIMEOUT, f"not answered within {timeout:g} s (request_timeout_s)") from None
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
    if work in done:
        return work.result()
    raise _ClientGone()


async def _wait_for_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return

