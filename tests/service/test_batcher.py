"""The batching queue: results reach their own item, budgets hold, dead items are never computed,
admission refuses cleanly, draining finishes queued work.

The model here is a deterministic numpy function of the padded inputs (the batcher's contract is
"feeds in, per-row outputs out"); the real ONNX Runtime engine is exercised in test_service_e2e.py.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from service.batcher import (
    Batcher,
    BatcherError,
    BatcherState,
    BatchPolicy,
    Expired,
    ItemFailed,
    ItemTooLarge,
    NotAccepting,
    QueueFull,
    clip_buckets,
)
from service.errors import ErrorType, from_batcher
from service.metrics import Metrics
from tasks.runtime.tokenizer import encode

TEXTS = [
    "Short.",
    "A slightly longer sentence about the harbour at dawn.",
    "Ships came in from the north, carrying timber, salt and news of the war in the eastern provinces.",
    "Ok",
    "The committee met on Tuesday and decided, after a long and heated debate, to postpone the vote.",
]


class SumModel:
    """Row sums of the ids (classification-like) and the ids themselves per token (NER-like);
    records the shape of every forward pass."""

    def __init__(self):
        self.shapes: list[tuple[int, int]] = []

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = feeds["input_ids"]
        self.shapes.append(ids.shape)
        masked = ids * feeds["attention_mask"]
        return {"total": masked.sum(axis=1, keepdims=True).astype(np.float32),
                "tokens": masked[:, :, None].astype(np.float32)}


def make_batcher(model, per_token=False, **policy) -> tuple[Batcher, Metrics]:
    metrics = Metrics()
    defaults = dict(buckets=[8, 16, 32, 64], max_batch_size=4, max_batch_tokens=128, max_wait_s=0.05,
                    max_queue_items=64)
    defaults.update(policy)
    return Batcher("m", model, BatchPolicy(**defaults), metrics, per_token=per_token), metrics


def metric(metrics: Metrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_clip_buckets_keeps_the_max_length():
    assert clip_buckets([16, 32, 64, 128, 256], 100) == [16, 32, 64, 100]
    assert clip_buckets([16, 32], 32) == [16, 32]


def test_each_item_gets_its_own_rows_and_budgets_hold(tokenizer):
    items = [encode(tokenizer, TEXTS[i % len(TEXTS)] + " x" * (i % 7)) for i in range(40)]
    model = SumModel()

    async def scenario():
        batcher, metrics = make_batcher(model, per_token=True)
        batcher.start()
        deadline = time.monotonic() + 30
        # Ten "requests" of four items each, submitted concurrently.
        futures = [batcher.submit(items[k : k + 4], deadline) for k in range(0, 40, 4)]
        results = [await f for group in futures for f in group]
        await batcher.close(5)
        return results, metrics

    results, metrics = asyncio.run(scenario())
    for item, result in zip(items, results):
        assert result.outputs["total"][0] == sum(item.input_ids)
        assert result.outputs["tokens"][:, 0].tolist() == item.input_ids  # trimmed to the item's length
        assert result.queue_seconds >= 0 and result.inference_seconds > 0
    for batch, length in model.shapes:
        assert length in (8, 16, 32, 64)
        assert batch <= 4 and batch * length <= 128
    assert metric(metrics, "berth_items_inferred_total", model="m") == 40
    assert metric(metrics, "berth_queue_depth", model="m") == 0


def test_one_list_and_many_singles_batch_alike(tokenizer):
    items = [encode(tokenizer, "same length text here") for _ in range(4)]

    async def scenario(as_list: bool):
        model = SumModel()
        batcher, _ = make_batcher(model)
        batcher.start()
        deadline = time.monotonic() + 30
        if as_list:
            futures = batcher.submit(items, deadline)
        else:
            futures = [batcher.submit([x], deadline)[0] for x in items]
        await asyncio.gather(*futures)
        await batcher.close(5)
        return model.shapes

    assert asyncio.run(scenario(True)) == asyncio.run(scenario(False)) == [(4, 8)]


def test_cancelled_and_expired_items_are_not_computed(tokenizer):
    items = [encode(tokenizer, t) for t in TEXTS[:4]]
    model = SumModel()

    async def scenario():
        batcher, metrics = make_batcher(model)
        now = time.monotonic()
        live = batcher.submit(items[:2], now + 30)
        gone = batcher.submit(items[2:3], now + 30)
        late = batcher.submit(items[3:], now - 1)  # its deadline has passed already
        gone[0].cancel()  # the client went away
        batcher.start()
        results = await asyncio.gather(*live)
        with pytest.raises(Expired) as info:
            await late[0]
        await batcher.close(5)
        return results, info.value, metrics

    results, timeout_error, metrics = asyncio.run(scenario())
    assert [r.outputs["total"][0] for r in results] == [sum(x.input_ids) for x in items[:2]]
    assert sum(b for b, _ in model.shapes) == 2  # only the two live items were computed
    assert from_batcher(timeout_error).error_type is ErrorType.TIMEOUT and from_batcher(timeout_error).status == 504
    assert metric(metrics, "berth_items_dropped_total", model="m", reason="cancelled") == 1
    assert metric(metrics, "berth_items_dropped_total", model="m", reason="expired") == 1


def test_admission_refuses_at_once_when_full_or_too_large(tokenizer):
    short = encode(tokenizer, "hello")
    too_long = encode(tokenizer, " ".join(["word"] * 80))  # 82 tokens: longer than every bucket (64)

    async def scenario():
        batcher, metrics = make_batcher(SumModel(), max_queue_items=3)  # not started: nothing drains
        deadline = time.monotonic() + 30
        batcher.submit([short, short], deadline)
        errors = []
        for items in ([short, short], [short] * 4, [too_long]):
            with pytest.raises(BatcherError) as info:
                batcher.submit(items, deadline)
            errors.append(info.value)
        batcher.submit([short], deadline)  # what still fits is admitted
        depth = batcher.depth
        await batcher.close(0)
        return errors, depth, metrics

    (full, bigger_than_queue, too_long_error), depth, metrics = asyncio.run(scenario())
    assert isinstance(full, QueueFull) and full.retry_after >= 1
    assert isinstance(bigger_than_queue, ItemTooLarge) and isinstance(too_long_error, ItemTooLarge)
    # ... and the service answers them as it always did
    assert from_batcher(full).status == 429 and from_batcher(full).error_type is ErrorType.OVERLOADED
    assert "Retry-After" in from_batcher(full).headers()
    assert from_batcher(bigger_than_queue).status == 413 and from_batcher(too_long_error).status == 413
    assert depth == 3
    assert metric(metrics, "berth_items_rejected_total", model="m", reason="queue_full") == 2
    assert metric(metrics, "berth_items_rejected_total", model="m", reason="too_large") == 5


def test_draining_refuses_new_work_but_finishes_queued_work(tokenizer):
    items = [encode(tokenizer, t) for t in TEXTS]

    async def scenario():
        batcher, _ = make_batcher(SumModel())
        batcher.start()
        futures = batcher.submit(items, time.monotonic() + 30)
        batcher.begin_draining()
        with pytest.raises(NotAccepting) as info:
            batcher.submit(items[:1], time.monotonic() + 30)
        await batcher.close(10)
        return [f.result() for f in futures], info.value, batcher.state

    results, refused, state = asyncio.run(scenario())
    assert [r.outputs["total"][0] for r in results] == [sum(x.input_ids) for x in items]
    assert from_batcher(refused).status == 503 and refused.retry_after >= 1
    assert state is BatcherState.STOPPED


def test_close_timeout_fails_what_is_left(tokenizer):
    release = threading.Event()

    def stuck_model(feeds):
        release.wait(10)
        return {"total": np.zeros((feeds["input_ids"].shape[0], 1), np.float32)}

    async def scenario():
        batcher, metrics = make_batcher(stuck_model, max_batch_size=1)
        batcher.start()
        futures = batcher.submit([encode(tokenizer, t) for t in TEXTS[:3]], time.monotonic() + 30)
        await asyncio.sleep(0.2)  # the first item is now running in the worker thread
        await batcher.close(0.1)
        release.set()
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        return outcomes, metrics

    outcomes, metrics = asyncio.run(scenario())
    failed = [o for o in outcomes if isinstance(o, BatcherError)]
    assert len(failed) >= 2 and all(isinstance(e, NotAccepting) and from_batcher(e).status == 503 for e in failed)
    assert metric(metrics, "berth_items_dropped_total", model="m", reason="shutdown") >= 2


def test_a_failing_forward_pass_fails_its_items_only(tokenizer):
    calls = []

    def flaky_model(feeds):
        calls.append(feeds["input_ids"].shape)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return {"total": feeds["input_ids"].sum(axis=1, keepdims=True).astype(np.float32)}

    async def scenario():
        batcher, _ = make_batcher(flaky_model)
        batcher.start()
        first = batcher.submit([encode(tokenizer, "one")], time.monotonic() + 30)
        first_outcome = await asyncio.gather(*first, return_exceptions=True)
        second = await batcher.submit([encode(tokenizer, "two")], time.monotonic() + 30)[0]
        await batcher.close(5)
        return first_outcome[0], second

    error, second = asyncio.run(scenario())
    assert isinstance(error, ItemFailed) and from_batcher(error).status == 500
    assert second.outputs["total"][0] > 0


def test_the_next_take_is_prepared_while_a_pass_runs_and_results_keep_their_rows(tokenizer):
    """Items that arrive while a pass runs are taken (and padded) then, and run once the worker is free; each
    still gets its own rows, and each request its results in its own order."""
    items = [encode(tokenizer, TEXTS[i % len(TEXTS)] + " x" * i) for i in range(12)]
    inner = SumModel()
    queued_at_end_of_pass: list[int] = []

    async def scenario(pipeline: bool):
        batcher = None

        def slow_model(feeds):
            time.sleep(0.4 if not queued_at_end_of_pass else 0.01)
            queued_at_end_of_pass.append(batcher.depth)  # items still waiting in the queue (not taken)
            return inner(feeds)

        batcher, _ = make_batcher(slow_model, per_token=True, max_batch_size=8, max_batch_tokens=512,
                                  pipeline=pipeline)
        batcher.start()
        deadline = time.monotonic() + 30
        first = batcher.submit(items[:4], deadline)
        await asyncio.sleep(0.05)  # the first pass is running now
        later = [batcher.submit(items[k : k + 2], deadline) for k in range(4, 12, 2)]
        results = [await f for group in [first, *later] for f in group]
        await batcher.close(5)
        return results

    for pipeline in (True, False):
        inner.shapes.clear()
        queued_at_end_of_pass.clear()
        results = asyncio.run(scenario(pipeline))
        for item, result in zip(items, results):
            assert result.outputs["total"][0] == sum(item.input_ids)
            assert result.outputs["tokens"][:, 0].tolist() == item.input_ids
        assert sum(b for b, _ in inner.shapes) == 12
        # with the pipeline, the 8 later items were taken during the first pass; without, they waited for it
        assert queued_at_end_of_pass[0] == (0 if pipeline else 8)


def test_the_worker_starts_the_take_prepared_ahead_without_waiting_for_the_event_loop(tokenizer):
    """A take padded ahead while a pass runs is started by the worker that ran the pass, at its end, even while the
    event loop is busy elsewhere (blocked here for 0.8 s); both takes keep their own rows."""
    items = [encode(tokenizer, text) for text in ("Short.", "Ok", "Yes.", "No.")]  # one width: one pass a take
    inner = SumModel()
    started: list[float] = []

    def slow_model(feeds):
        started.append(time.perf_counter())
        time.sleep(0.3)
        return inner(feeds)

    async def scenario():
        batcher, _ = make_batcher(slow_model, max_batch_size=8, max_batch_tokens=512)
        batcher.start()
        deadline = time.monotonic() + 30
        first = batcher.submit(items[:2], deadline)
        await asyncio.sleep(0.05)  # the first pass runs
        second = batcher.submit(items[2:], deadline)
        await asyncio.sleep(0.05)  # the loop takes and pads them ahead
        time.sleep(0.8)  # the event loop is busy: the first pass ends meanwhile
        unblocked = time.perf_counter()
        results = [await f for f in [*first, *second]]
        await batcher.close(5)
        return results, unblocked

    results, unblocked = asyncio.run(scenario())
    assert [r.outputs["total"][0] for r in results] == [sum(x.input_ids) for x in items]
    assert len(started) == 2 and started[1] < unblocked - 0.2, (started, unblocked)
    assert results[0].run_id != results[2].run_id


def test_measured_batch_sizes_per_length_are_honoured(tokenizer):
    from tasks.runtime.inference import BatchTable

    table = BatchTable(lengths=(8, 16, 32, 64), batch_sizes=(8, 4, 2, 1))  # long sequences: smaller passes
    items = [encode(tokenizer, " ".join(["word"] * n)) for n in (2, 3, 4, 5, 10, 11, 12, 13, 20, 21, 22, 40, 41, 50)]
    model = SumModel()

    async def scenario():
        batcher, _ = make_batcher(model, max_batch_size=16, max_batch_tokens=1024, table=table)
        batcher.start()
        results = await asyncio.gather(*batcher.submit(items, time.monotonic() + 30))
        await batcher.close(5)
        return results

    results = asyncio.run(scenario())
    assert [r.outputs["total"][0] for r in results] == [sum(x.input_ids) for x in items]
    for batch, width in model.shapes:
        assert batch <= table.best_batch_size(width), (batch, width)
    assert [len(x) for x in items] == [4, 5, 6, 7, 12, 13, 14, 15, 22, 23, 24, 42, 43, 52]
    assert sorted(model.shapes) == [(1, 32), (1, 64), (1, 64), (1, 64), (2, 32), (4, 8), (4, 16)]


def test_under_load_narrow_passes_run_side_by_side_and_a_lone_pass_runs_wide(tokenizer):
    """With a narrow engine and 2 compute units, queued work runs as two concurrent 1-unit passes on the narrow
    engine (never more units at once than there are); a pass alone in the process runs on the wide engine."""
    from service.compute_slots import ComputeSlots

    items = [encode(tokenizer, TEXTS[i % len(TEXTS)] + " x" * i) for i in range(16)]
    lock = threading.Lock()
    state = {"now": 0, "peak": 0, "calls": []}

    def engine(name):
        inner = SumModel()

        def run(feeds):
            with lock:
                state["now"] += 1
                state["peak"] = max(state["peak"], state["now"])
                state["calls"].append(name)
            time.sleep(0.15)
            with lock:
                state["now"] -= 1
            return inner(feeds)
        return run

    async def scenario():
        policy = BatchPolicy(buckets=[8, 16, 32, 64], max_batch_size=4, max_batch_tokens=256, max_wait_s=0.0,
                             max_queue_items=64)
        batcher = Batcher("m", engine("wide"), policy, Metrics(), per_token=True, compute_slots=ComputeSlots(2),
                          threads=2, run_narrow=engine("narrow"), narrow_threads=1)
        batcher.start()
        assert batcher.parallel == 2
        deadline = time.monotonic() + 30
        lone = await asyncio.gather(*batcher.submit(items[:1], deadline))
        alone_calls = list(state["calls"])
        burst = await asyncio.gather(*[f for k in range(0, 16, 2) for f in batcher.submit(items[k : k + 2], deadline)])
        await batcher.close(5)
        return lone, alone_calls, burst

    lone, alone_calls, burst = asyncio.run(scenario())
    assert alone_calls == ["wide"]
    assert lone[0].outputs["total"][0] == sum(items[0].input_ids)
    for item, result in zip(items, burst):  # each item its own rows, request order kept
        assert result.outputs["total"][0] == sum(item.input_ids)
        assert result.outputs["tokens"][:, 0].tolist() == item.input_ids
    assert state["peak"] == 2  # two passes overlapped, never three
    assert state["calls"][1:].count("narrow") >= 2


def test_a_request_being_tokenized_is_waited_for_and_an_idle_batcher_does_not_wait(tokenizer):
    """While a request is `incoming`, the take waits (at most max_wait) for its items, so both requests share one
    pass; once it has left its block (here by an error while tokenizing), nothing is waited for."""
    items = [encode(tokenizer, "same length text here") for _ in range(2)]
    model = SumModel()

    async def scenario():
        batcher, _ = make_batcher(model, max_wait_s=5.0)
        batcher.start()
        deadline = time.monotonic() + 30
        with batcher.incoming() as arrival:
            first = batcher.submit(items[:1], deadline)  # another request's item, queued meanwhile
            await asyncio.sleep(0.1)
            waited = not model.shapes
            second = arrival.submit(items[1:], deadline)
        await asyncio.gather(*first, *second)
        together = list(model.shapes)
        with pytest.raises(RuntimeError), batcher.incoming():
            raise RuntimeError("tokenizing failed")
        begin = time.monotonic()
        await asyncio.gather(*batcher.submit(items[:1], deadline))
        alone = time.monotonic() - begin
        await batcher.close(5)
        return waited, together, alone

    waited, together, alone = asyncio.run(scenario())
    assert waited and together == [(2, 8)]
    assert alone < 2.5  # nothing was coming: it did not wait for max_wait (5 s)
