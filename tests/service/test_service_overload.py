"""Back-pressure and shutdown against real servers: a tiny queue under a burst refuses some requests
with 429 + Retry-After and answers every accepted one right; SIGTERM lets admitted work finish."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.service import reference
from tests.service.conftest import ServerProcess

TEXTS = ["A charming and often affecting journey.", "Unflinchingly bleak and desperate.",
         "It's slow -- very, very slow.", "The acting and music are astounding."]


def metric_value(url: str, sample_name: str, **labels) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_a_burst_on_a_tiny_queue_gets_429s_and_right_answers(bundle_repository, checkpoints, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "overload.log", args=["--model", "sentiment"],
                         env={"BERTH_MAX_QUEUE_ITEMS": "4", "BERTH_MAX_BATCH_SIZE": "2", "BERTH_MAX_WAIT_MS": "0"})
    try:
        proc.wait_ready()
        requests = [[TEXTS[i % 4]] * (1 + i % 3) if i % 2 else TEXTS[i % 4] for i in range(80)]

        async def burst():
            limits = httpx.Limits(max_connections=80, max_keepalive_connections=80)
            async with httpx.AsyncClient(base_url=proc.url, timeout=60, limits=limits) as c:
                return await asyncio.gather(*(c.post("/v1/classify", json={"inputs": r}) for r in requests))

        responses = asyncio.run(burst())
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429, 503}, statuses
        refused = [r for r in responses if r.status_code != 200]
        assert refused, "a burst of 80 requests on a queue of 4 items should refuse some"
        for r in refused:
            assert r.json()["error_type"] == "overloaded" and int(r.headers["retry-after"]) >= 1
        expected = {t: e["label"] for t, e in zip(TEXTS, reference.classify(checkpoints["sentiment"], TEXTS))}
        for sent, response in zip(requests, responses):
            if response.status_code == 200:
                texts = sent if isinstance(sent, list) else [sent]
                assert [r["label"] for r in response.json()["results"]] == [expected[t] for t in texts]
        assert metric_value(proc.url, "berth_items_rejected_total", reason="queue_full") >= len(refused)
        assert metric_value(proc.url, "berth_requests_total", status="429") == statuses.count(429)
        assert httpx.get(proc.url + "/readyz").status_code == 200
    finally:
        proc.stop()


def test_items_of_a_client_that_left_are_not_computed(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "gone.log", args=["--model", "sentiment"],
                         env={"BERTH_MAX_BATCH_SIZE": "1"})
    try:
        proc.wait_ready()
        texts = [f"{TEXTS[i % 4]} ({i})" for i in range(60)]  # 60 forward passes of one item each
        with httpx.Client(base_url=proc.url) as impatient:
            try:
                impatient.post("/v1/classify", json={"inputs": texts}, timeout=httpx.Timeout(10, read=0.05))
            except httpx.ReadTimeout:
                pass  # the client hangs up while its items wait in the queue
        deadline = time.monotonic() + 30
        while metric_value(proc.url, "berth_requests_total", status="499") < 1:
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.05)
        dropped = metric_value(proc.url, "berth_items_dropped_total", reason="cancelled")
        inferred = metric_value(proc.url, "berth_items_inferred_total")
        assert dropped > 0 and dropped + inferred == len(texts)
        assert httpx.post(proc.url + "/v1/classify", json={"inputs": "still here"}).status_code == 200
    finally:
        proc.stop()


def test_sigterm_finishes_admitted_requests_then_exits(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "shutdown.log", args=["--model", "sentiment"],
                         env={"BERTH_MAX_BATCH_SIZE": "4", "BERTH_SHUTDOWN_TIMEOUT_S": "60"})
    proc.wait_ready()
    texts = [f"{TEXTS[i % 4]} ({i})" for i in range(32)]
    count = 8
    try:
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(httpx.post, proc.url + "/v1/classify", json={"inputs": texts}, timeout=120)
                       for _ in range(count)]
            deadline = time.monotonic() + 60
            while metric_value(proc.url, "berth_request_inputs_total") < count * len(texts):
                assert time.monotonic() < deadline, proc.log()
                time.sleep(0.02)
            assert metric_value(proc.url, "berth_items_inferred_total") < count * len(texts), "finished too soon"
            proc.process.send_signal(15)  # SIGTERM while most of the work is still queued
            responses = [f.result() for f in futures]
        assert [r.status_code for r in responses] == [200] * count
        assert all(len(r.json()["results"]) == len(texts) for r in responses)
        assert proc.process.wait(60) == 0, proc.log()
    finally:
        proc.stop()
