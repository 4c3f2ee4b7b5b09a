"""Back-pressure and shutdown against real servers: a tiny queue under a burst refuses some requests
with 429 + Retry-After and answers every accepted one right; SIGTERM lets admitted work finish."""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading
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
        assert set(statuses) <= {200, 429}, statuses  # overload is 429; 503 only when not ready or draining
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


def _poll_readyz(url: str, stop: threading.Event, seen: list[tuple[float, str]]) -> None:
    """A load balancer's view: /readyz every 50 ms, recording 200 / 503 / refused (connection refused)."""
    with httpx.Client(timeout=5) as c:
        while not stop.is_set():
            try:
                state = str(c.get(url + "/readyz").status_code)
            except httpx.TransportError:
                state = "refused"
            seen.append((time.monotonic(), state))
            time.sleep(0.05)


def test_sigterm_drain_delay_keeps_serving_with_readyz_503_then_refuses_and_exits(bundle_repository, tmp_path):
    """The drain sequence: SIGTERM -> /readyz 503 while requests are still admitted for drain_delay_s -> the
    listener closes (new connections refused) -> in-flight requests finish -> exit 0."""
    delay = 2.0
    proc = ServerProcess(bundle_repository, tmp_path / "drain.log", args=["--model", "sentiment"],
                         env={"BERTH_MAX_BATCH_SIZE": "4", "BERTH_DRAIN_DELAY_S": str(delay),
                              "BERTH_SHUTDOWN_TIMEOUT_S": "60"})
    proc.wait_ready()
    texts = [f"{TEXTS[i % 4]} ({i})" for i in range(64)]
    stop, seen = threading.Event(), []
    poller = threading.Thread(target=_poll_readyz, args=(proc.url, stop, seen))
    try:
        poller.start()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            in_flight = [pool.submit(httpx.post, proc.url + "/v1/classify", json={"inputs": texts}, timeout=120)
                         for _ in range(3)]
            deadline = time.monotonic() + 60
            while metric_value(proc.url, "berth_request_inputs_total") < 3 * len(texts):
                assert time.monotonic() < deadline, proc.log()
                time.sleep(0.02)
            signalled = time.monotonic()
            proc.process.send_signal(signal.SIGTERM)
            time.sleep(delay / 4)
            during = httpx.post(proc.url + "/v1/classify", json={"inputs": TEXTS[0]}, timeout=60)  # still admitted
            responses = [f.result() for f in in_flight]
        assert during.status_code == 200
        assert [r.status_code for r in responses] == [200] * 3
        assert all(len(r.json()["results"]) == len(texts) for r in responses)
        assert proc.process.wait(60) == 0, proc.log()
        exited = time.monotonic()
    finally:
        stop.set()
        poller.join()
        proc.stop()
    before = [s for t, s in seen if t < signalled]
    drain = [s for t, s in seen if signalled + 0.2 < t < signalled + delay - 0.2]
    after = [s for t, s in seen if signalled + delay + 0.5 < t < exited - 0.1]
    assert before and set(before) == {"200"}, before
    assert drain and set(drain) == {"503"}, drain  # load balancers see not-ready while it still serves
    assert set(after) <= {"refused"}, after  # after the delay: no new connections


def test_shutdown_timeout_zero_does_not_wait_for_in_flight_work(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "nowait.log", args=["--model", "sentiment"],
                         env={"BERTH_MAX_BATCH_SIZE": "1", "BERTH_SHUTDOWN_TIMEOUT_S": "0",
                              "BERTH_MAX_INPUTS_PER_REQUEST": "2000", "BERTH_MAX_ITEMS_PER_REQUEST": "2000",
                              "BERTH_MAX_TOKENS_PER_REQUEST": "1000000",
                              "BERTH_REQUEST_TIMEOUT_S": "600"})
    proc.wait_ready()
    texts = [f"{TEXTS[i % 4]} {TEXTS[(i + 1) % 4]} ({i})" for i in range(2000)]  # 2,000 passes: 10+ s of work
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(httpx.post, proc.url + "/v1/classify", json={"inputs": texts}, timeout=120)
            deadline = time.monotonic() + 60
            while metric_value(proc.url, "berth_items_inferred_total") < 5:
                assert time.monotonic() < deadline and not pending.done(), proc.log()
                time.sleep(0.02)
            begin = time.monotonic()
            proc.process.send_signal(signal.SIGTERM)
            code = proc.process.wait(30)
            stopped_in = time.monotonic() - begin
            try:
                outcome = pending.result().status_code
            except httpx.HTTPError:
                outcome = "closed"
        assert code == 0, proc.log()
        assert outcome != 200  # not finished: it was not waited for
        assert stopped_in < 5, stopped_in  # the ~1,995 passes left alone take longer than that
    finally:
        proc.stop()
