"""Readiness that heals, per-model readiness, the pass watchdog and non-finite outputs (service/batcher.py's
"Health"), against real servers and real ONNX Runtime passes.

The failures are real, not injected:
  * slow passes: pass_timeout_s set below what a large pass of long inputs takes on this machine (about 2 s for
    32 x 208 tokens of the embeddings model on 2 threads), far above what the canary takes (one short item,
    a few milliseconds). Long requests are stopped by the watchdog (ONNX Runtime's RunOptions.terminate), count
    against the model and take it out; its canary pass on a short shape succeeds and brings it back by itself --
    a model too slow for its bound under load, which recovers when the load is gone.
  * NaN: a copy of the sentiment bundle whose embedding row of one word is NaN (edited with the `onnx` package and
    re-stamped with write_manifest), so exactly the inputs holding that word give NaN logits.
The batcher-level tests at the top check the counting rule itself with a deterministic numpy model.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from export.bundle_writing import write_manifest
from service.batcher import Batcher, BatchPolicy, ItemFailed, NonFiniteOutput
from service.errors import from_batcher
from service.metrics import Metrics
from tasks.runtime.bundle import MANIFEST_FILE
from tasks.runtime.tokenizer import EncodedInput
from tests.service.conftest import ServerProcess
from tests.service.test_service_overload import metric_value

# -- the counting rule, on the batcher alone ------------------------------------------------------

POISON, NAN = 7, 9  # token ids: a row holding POISON makes the pass raise, one holding NAN gets NaN


class NumpyModel:
    """Row sums of the ids; a pass holding POISON raises (as ONNX Runtime's Gather out of bounds would), a row
    holding NAN is NaN; `broken`: every pass raises."""

    def __init__(self):
        self.broken = False

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = feeds["input_ids"]
        if self.broken or (ids == POISON).any():
            raise RuntimeError("boom")
        total = (ids * feeds["attention_mask"]).sum(axis=1, keepdims=True).astype(np.float32)
        total[(ids == NAN).any(axis=1)] = np.nan
        return {"total": total}


def item(*ids: int) -> EncodedInput:
    tokens = [101, *ids, 102]
    n = len(tokens)
    return EncodedInput(tokens, [0] * n, [(0, 0)] * n, [None] * n, [None] * n, False)


def sample(metrics: Metrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, {"model": "m", **labels}) or 0.0


def make(model, **policy) -> tuple[Batcher, Metrics]:
    metrics = Metrics()
    metrics.register_model("m", "classification", "fp32", "cpu")
    shape = dict(buckets=[8, 16], max_batch_size=8, max_batch_tokens=128, max_wait_s=0.0, max_queue_items=64,
                 max_consecutive_failures=2, canary_interval_s=0.1)
    shape.update(policy)
    batcher = Batcher("m", model, BatchPolicy(**shape), metrics, per_token=False)
    batcher.canary = item(5)
    return batcher, metrics


async def outcomes(batcher: Batcher, items: list[EncodedInput]) -> list:
    return await asyncio.gather(*batcher.submit(items, time.monotonic() + 30), return_exceptions=True)


def test_inputs_that_fail_do_not_count_against_a_model_that_computes_others_or_its_canary():
    async def scenario():
        batcher, metrics = make(NumpyModel())
        batcher.start()
        # one pass: two good items, one that fails the pass (retried by halves down to it), one NaN
        mixed = await outcomes(batcher, [item(1, 2), item(POISON, 2), item(3, 4), item(NAN, 4)])
        after_mixed = batcher.consecutive_failures
        lone = [await outcomes(batcher, [item(POISON, 1)]) for _ in range(3)]  # alone: the canary confirms
        lone += [await outcomes(batcher, [item(NAN, 1)]) for _ in range(3)]
        healthy_with_canary = batcher.healthy
        batcher.canary = None  # without a canary nothing can clear a lone failure: it counts
        await outcomes(batcher, [item(POISON, 1)])
        await outcomes(batcher, [item(POISON, 1)])
        healthy_without_canary = batcher.healthy
        await batcher.close(1)
        return mixed, after_mixed, lone, healthy_with_canary, healthy_without_canary, metrics

    mixed, after_mixed, lone, healthy_with_canary, healthy_without_canary, metrics = asyncio.run(scenario())
    assert mixed[0].outputs["total"][0] == 206 and mixed[2].outputs["total"][0] == 210
    assert type(mixed[1]) is ItemFailed and isinstance(mixed[3], NonFiniteOutput)
    assert from_batcher(mixed[3]).status == 500 and "NaN" in mixed[3].message
    assert after_mixed == 0
    assert all(isinstance(o[0], ItemFailed) for o in lone)
    assert healthy_with_canary
    assert sample(metrics, "berth_canary_passes_total", kind="confirm", outcome="passed") == 6
    assert sample(metrics, "berth_nonfinite_outputs_total") == 4
    assert not healthy_without_canary
    assert sample(metrics, "berth_model_failures_total", kind="error") == 2


def test_a_model_that_fails_everything_goes_unready_and_its_canary_brings_it_back():
    model = NumpyModel()

    async def scenario():
        batcher, metrics = make(model)
        batcher.start()
        model.broken = True
        for _ in range(2):
            assert isinstance((await outcomes(batcher, [item(1, 2), item(3)]))[0], ItemFailed)
        reason = batcher.unready_reason
        await asyncio.sleep(0.35)  # canary passes fail while the model is broken
        still_out = not batcher.healthy
        model.broken = False
        for _ in range(50):
            if batcher.healthy:
                break
            await asyncio.sleep(0.05)
        healed = batcher.healthy
        result = await outcomes(batcher, [item(1, 2)])
        await batcher.close(1)
        return reason, still_out, healed, result, metrics

    reason, still_out, healed, result, metrics = asyncio.run(scenario())
    assert reason.startswith("2 failures in a row (a forward pass raised an error)") and "canary" in reason
    assert still_out and healed
    assert result[0].outputs["total"][0] == 206
    assert sample(metrics, "berth_model_failures_total", kind="error") == 2
    assert sample(metrics, "berth_canary_passes_total", kind="confirm", outcome="failed") == 2
    assert sample(metrics, "berth_canary_passes_total", kind="probe", outcome="failed") >= 1
    assert sample(metrics, "berth_canary_passes_total", kind="probe", outcome="passed") == 1
    assert sample(metrics, "berth_model_ready") == 1


# -- real servers ------------------------------------------------------------------------------------

LONG = " ".join(["harbour"] * 200)  # 202 tokens: a 32-item pass of these takes ~2 s on 2 threads here
SHORT = "A man is playing a guitar."


def readyz(url: str) -> tuple[int, dict]:
    response = httpx.get(url + "/readyz", timeout=10)
    return response.status_code, response.json()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_the_watchdog_stops_a_slow_pass_and_the_canary_brings_the_model_back(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "watchdog.log", args=["--model", "embeddings"], env={
        "BERTH_WARMUP": "false",  # the canary is then the shortest input, [CLS] [SEP]
        "BERTH_PASS_TIMEOUT_S": "0.2", "BERTH_MAX_CONSECUTIVE_FAILURES": "2", "BERTH_CANARY_INTERVAL_S": "1.5",
        "BERTH_LENGTH_BUCKETS": "16,256", "BERTH_MAX_BATCH_SIZE": "32", "BERTH_MAX_BATCH_TOKENS": "8192",
        "BERTH_CPU_PASS_TOKENS": "0", "BERTH_MAX_PASS_OUTPUT_BYTES": str(2**30)})  # the 32 items in one pass
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.url, timeout=60) as c:
            for attempt in range(2):
                began = time.monotonic()
                response = c.post("/v1/embed", json={"inputs": [LONG] * 32})
                elapsed = time.monotonic() - began
                assert response.status_code == 500, response.text
                assert response.json()["error_type"] == "internal"
                assert "ran past pass_timeout_s (0.2 s)" in response.json()["error"]
                assert elapsed < 1.5, elapsed  # stopped, not run to its end (~2 s alone, more under load)
                status, body = readyz(proc.url)
                if attempt == 0:  # one failure of the two allowed in a row
                    assert status == 200 and body["models"]["embeddings"]["ready"] is True
            # two in a row: the model is out, and so is the pod (every model is required by default)
            status, body = readyz(proc.url)
            assert status == 503 and body["status"] == "not_ready"
            entry = body["models"]["embeddings"]
            assert entry["ready"] is False and entry["required"] is True
            assert "ran past pass_timeout_s" in entry["reason"] and "canary" in entry["reason"]
            refused = c.post("/v1/embed", json={"inputs": SHORT})
            assert refused.status_code == 503 and refused.json()["error_type"] == "overloaded"
            assert 1 <= int(refused.headers["retry-after"]) <= 2
            assert metric_value(proc.url, "berth_model_ready", model="embeddings") == 0
            assert httpx.get(proc.url + "/healthz").status_code == 200  # liveness is not readiness

            # nothing is sent to it now: the canary alone brings it back
            wait_for(lambda: readyz(proc.url)[0] == 200, 20, "the canary makes the model ready again")
            assert readyz(proc.url)[1]["models"]["embeddings"] == {"ready": True, "required": True, "reason": None}
            assert metric_value(proc.url, "berth_canary_passes_total", model="embeddings", kind="probe",
                                outcome="passed") == 1
            assert metric_value(proc.url, "berth_pass_timeouts_total", model="embeddings") == 2
            assert metric_value(proc.url, "berth_model_failures_total", model="embeddings", kind="timeout") == 2
            assert metric_value(proc.url, "berth_model_ready", model="embeddings") == 1
            # the stopped passes gave their compute slots back: short work runs at once
            began = time.monotonic()
            answered = c.post("/v1/embed", json={"inputs": [SHORT] * 4})
            assert answered.status_code == 200 and len(answered.json()["results"]) == 4
            assert time.monotonic() - began < 5
        log = proc.log_path.read_text()
        assert "past pass_timeout_s=0.2; terminating it" in log
        assert "model embeddings is NOT READY" in log
        assert "model embeddings is READY again: a canary pass succeeded" in log
    finally:
        proc.stop()


def test_ready_models_keep_the_pod_ready_while_another_model_is_out(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "ready-models.log", env={
        "BERTH_MODEL_NAMES": "sentiment,embeddings", "BERTH_READY_MODELS": "sentiment",
        "BERTH_PASS_TIMEOUT_S": "0.1", "BERTH_MAX_CONSECUTIVE_FAILURES": "1", "BERTH_CANARY_INTERVAL_S": "1",
        "BERTH_LENGTH_BUCKETS": "16,128", "BERTH_CPU_PASS_TOKENS": "0",  # 16 x 128 tokens: ~0.3 s a pass here
        "BERTH_MAX_BATCH_TOKENS": "2048",
        "BERTH_PARALLEL_PASSES": "1"})  # one session per model: half the warm-up
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.url, timeout=60) as c:
            status, body = readyz(proc.url)
            assert status == 200 and body == {"status": "ready", "models": {
                "embeddings": {"ready": True, "required": False, "reason": None},
                "sentiment": {"ready": True, "required": True, "reason": None}}}
            failed = c.post("/v1/embed", json={"inputs": [" ".join(["harbour"] * 120)] * 16})
            assert failed.status_code == 500 and "pass_timeout_s" in failed.json()["error"]
            status, body = readyz(proc.url)
            assert status == 200 and body["status"] == "ready"  # embeddings is not one the pod waits for
            assert body["models"]["embeddings"]["ready"] is False and body["models"]["sentiment"]["ready"] is True
            listed = {m["name"]: m["ready"] for m in c.get("/v1/models").json()["models"]}
            assert listed == {"embeddings": False, "sentiment": True}  # /v1/models says so too
            refused = c.post("/v1/embed", json={"inputs": SHORT})
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
            assert "not ready" in refused.json()["error"]
            assert c.post("/v1/classify", json={"inputs": SHORT}).status_code == 200
            # its canary (the smallest warm-up shape, 1 x 16) brings it back
            wait_for(lambda: readyz(proc.url)[1]["models"]["embeddings"]["ready"], 20, "embeddings ready again")
            assert c.post("/v1/embed", json={"inputs": SHORT}).status_code == 200
            assert metric_value(proc.url, "berth_canary_passes_total", model="embeddings", kind="probe",
                                outcome="passed") == 1
    finally:
        proc.stop()


def test_ready_models_must_name_served_models(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "bad-ready.log", args=["--model", "sentiment"],
                         env={"BERTH_READY_MODELS": "sentiment,reader"})
    assert proc.process.wait(60) == 2
    proc.stop()
    assert "ready_models names ['reader'], which this server does not serve; it serves ['sentiment']" in proc.log()


# -- NaN ---------------------------------------------------------------------------------------------

NAN_WORD = "zebra"
SAME_WIDTH = ["a fine film", "a dull film", f"a {NAN_WORD} film", "a great film"]  # one pass: same padded width


@pytest.fixture(scope="module")
def nan_repository(bundle_repository, tmp_path_factory) -> Path:
    """The sentiment bundle with the embedding row of NAN_WORD set to NaN, re-stamped (a valid bundle)."""
    import onnx
    from onnx import numpy_helper

    repository = tmp_path_factory.mktemp("nan") / "repository"
    bundle = repository / "sentiment"
    shutil.copytree(bundle_repository / "sentiment", bundle)
    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    word_id = tokenizer.token_to_id(NAN_WORD)
    assert word_id is not None  # a whole word of the vocabulary
    model = onnx.load(str(bundle / "model.onnx"))
    rows = tokenizer.get_vocab_size()
    table = next(t for t in model.graph.initializer if len(t.dims) == 2 and t.dims[0] == rows)
    weights = numpy_helper.to_array(table).copy()
    weights[word_id] = np.nan
    table.CopyFrom(numpy_helper.from_array(weights, table.name))
    onnx.save(model, str(bundle / "model.onnx"))
    write_manifest(bundle, json.loads((bundle / MANIFEST_FILE).read_text()))
    return repository


def test_nan_outputs_fail_their_input_with_500_and_are_counted(nan_repository, tmp_path):
    proc = ServerProcess(nan_repository, tmp_path / "nan.log", env={"BERTH_MAX_CONSECUTIVE_FAILURES": "2"})
    try:
        proc.wait_ready()
        with httpx.Client(base_url=proc.url, timeout=60) as c:
            alone = c.post("/v1/classify", json={"inputs": SAME_WIDTH[2]})
            assert alone.status_code == 500, alone.text
            assert alone.json() == {"error": "the model produced NaN or infinite outputs for this input",
                                    "error_type": "internal"}
            assert metric_value(proc.url, "berth_nonfinite_outputs_total", model="sentiment") == 1
            # alone, every item of its pass failed: a canary pass confirmed the model works, so it did not count
            assert metric_value(proc.url, "berth_canary_passes_total", model="sentiment", kind="confirm",
                                outcome="passed") == 1
            # in one pass with three others: only that item is NaN (a request fails with any of its inputs)
            assert c.post("/v1/classify", json={"inputs": SAME_WIDTH}).status_code == 500
            assert metric_value(proc.url, "berth_nonfinite_outputs_total", model="sentiment") == 2
            assert metric_value(proc.url, "berth_canary_passes_total", model="sentiment", kind="confirm") == 1
            good = c.post("/v1/classify", json={"inputs": [t for t in SAME_WIDTH if NAN_WORD not in t]})
            assert good.status_code == 200 and len(good.json()["results"]) == 3
            for _ in range(3):  # more than max_consecutive_failures: an input cannot take the model out
                assert c.post("/v1/classify", json={"inputs": SAME_WIDTH[2]}).status_code == 500
            assert readyz(proc.url)[0] == 200
            assert metric_value(proc.url, "berth_nonfinite_outputs_total", model="sentiment") == 5
            assert metric_value(proc.url, "berth_model_failures_total", model="sentiment") == 0
            assert metric_value(proc.url, "berth_items_failed_total", model="sentiment") == 5
        assert "NaN or infinite outputs for 1 of the 4 item(s) of a forward pass" in proc.log_path.read_text()
    finally:
        proc.stop()
