"""`berth serve --workers 2`: two real server processes on one loopback port. Requests are answered
(labels from transformers' pipeline on the same checkpoint), /metrics adds up both workers' counters (each
worker's own count read from its file in the multiprocess folder), and SIGTERM drains: in-flight requests
finish, the port then refuses connections, the server exits 0 and removes its metrics folder. A model failing in
one worker is not ready in what every worker's /readyz reads (service/workers.py)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import signal
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from service.settings import ServiceSettings
from service.workers import WorkerBoard
from tests.service import reference
from tests.service.conftest import ServerProcess

TEXTS = ["A charming and often affecting journey.", "Unflinchingly bleak and desperate.",
         "It is a film of great beauty.", "The plot is a dull, tedious mess."]
SENT = 48


def requests_counted(text: str, route: str = "/v1/classify") -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "berth_requests_total" and s.labels.get("route") == route)


def inputs_admitted(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "berth_request_inputs_total")


def worker_pids(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def metrics_folder(pid: int) -> Path:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    value = next(entry for entry in environ if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
    return Path(value.split(b"=", 1)[1].decode())


def own_count(folder: Path, pid: int) -> float:
    """One worker's /v1/classify requests, from its own counter file (not through /metrics)."""
    metrics = MultiProcessCollector.merge([str(folder / f"counter_{pid}.db")], accumulate=True)
    return sum(s.value for m in metrics for s in m.samples
               if s.name == "berth_requests_total" and s.labels.get("route") == "/v1/classify")


@pytest.fixture(scope="module")
def two_workers(bundle_repository, tmp_path_factory):
    proc = ServerProcess(bundle_repository, tmp_path_factory.mktemp("logs") / "workers.log",
                         args=["--model", "sentiment", "--workers", "2"],
                         env={"BERTH_SHUTDOWN_TIMEOUT_S": "60", "BERTH_REQUEST_TIMEOUT_S": "120"})
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def test_the_default_is_one_process_below_eight_cores():
    assert [ServiceSettings().worker_count(cores) for cores in (1, 2, 4, 7, 8, 16)] == [1, 1, 1, 1, 2, 4]
    assert ServiceSettings(workers=3).worker_count(2) == 3


def test_a_model_failing_in_one_worker_is_not_ready_in_the_others():
    """What /readyz reads in every worker: another worker's unready model, with its reason, written by that
    worker's own process."""
    context = multiprocessing.get_context("spawn")
    board = WorkerBoard(3, ["sentiment", "reader"], context)
    why = "2 failures in a row (a forward pass ran past pass_timeout_s); a canary pass retries every 1.5 s"
    writer = context.Process(target=board.publish, args=(2, "reader", why))
    writer.start()
    writer.join(60)
    assert writer.exitcode == 0
    assert board.unready_elsewhere(0, "reader") == board.unready_elsewhere(1, "reader") == \
        f"in server process 2: {why}"
    assert board.unready_elsewhere(2, "reader") is None  # its own state is its batcher's, not the board's
    assert board.unready_elsewhere(0, "sentiment") is None
    board.publish(2, "reader", None)
    assert board.unready_elsewhere(0, "reader") is None


def test_two_workers_answer_and_their_counters_add_up(two_workers, checkpoints):
    pids = worker_pids(two_workers.process.pid)
    assert len(pids) == 2, two_workers.log()
    folder = metrics_folder(pids[0])
    assert folder.is_dir()
    expected = [e["label"] for e in reference.classify(checkpoints["sentiment"], TEXTS)]

    def one(i: int) -> httpx.Response:  # a new connection each: the kernel hands them to either worker
        return httpx.post(two_workers.url + "/v1/classify", json={"inputs": TEXTS[i % 4]}, timeout=60,
                          headers={"Connection": "close"})

    before = requests_counted(httpx.get(two_workers.url + "/metrics").text)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(one, range(SENT)))
    assert [r.status_code for r in responses] == [200] * SENT
    assert [r.json()["results"][0]["label"] for r in responses] == [expected[i % 4] for i in range(SENT)]

    assert requests_counted(httpx.get(two_workers.url + "/metrics").text) - before == SENT
    per_worker = [own_count(folder, pid) for pid in pids]
    assert sum(per_worker) == before + SENT, per_worker
    assert min(per_worker) > 0, f"one worker answered every request: {per_worker}"


def test_sigterm_drains_every_worker_then_exits_zero(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "drain.log",
                         args=["--model", "sentiment", "--workers", "2"],
                         env={"BERTH_MAX_BATCH_SIZE": "2", "BERTH_SHUTDOWN_TIMEOUT_S": "60",
                              "BERTH_REQUEST_TIMEOUT_S": "120"})
    try:
        proc.wait_ready()
        folder = metrics_folder(worker_pids(proc.process.pid)[0])
        texts = [f"{TEXTS[i % 4]} ({i})" for i in range(64)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            in_flight = [pool.submit(httpx.post, proc.url + "/v1/classify", json={"inputs": texts},
                                     timeout=120, headers={"Connection": "close"}) for _ in range(4)]
            deadline = time.monotonic() + 60
            while inputs_admitted(proc.url) < 4 * len(texts):  # all four in flight
                assert time.monotonic() < deadline, proc.log()
                time.sleep(0.02)
            proc.process.send_signal(signal.SIGTERM)
            responses = [f.result() for f in in_flight]
        assert [r.status_code for r in responses] == [200] * 4, [r.text[:200] for r in responses]
        assert all(len(r.json()["results"]) == len(texts) for r in responses)
        assert proc.process.wait(60) == 0, proc.log()
        with pytest.raises(httpx.TransportError):
            httpx.get(proc.url + "/healthz", timeout=5)
        assert not folder.exists()
    finally:
        proc.stop()
