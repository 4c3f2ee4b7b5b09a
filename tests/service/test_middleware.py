"""HTTP-level limits decided before any work, against real servers: the API key checked before the body is
read, an empty key refused at start, the concurrency limit, the body read timeout, and the metrics of
requests refused that early (counted under their route)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx

from tests.service.conftest import BASE_ENV, REPO, ServerProcess
from tests.service.test_service_overload import metric_value


def _raw_request(url: str, head: bytes, body_part: bytes, read_timeout: float = 10) -> tuple[bytes, float]:
    """Send the request line and headers and only `body_part` of the body; return what the server answers
    and when (seconds after the headers went out)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as s:
        begin = time.perf_counter()
        s.sendall(head + body_part)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer, time.perf_counter() - begin


def test_an_unauthenticated_10_mb_body_gets_401_without_being_read(server):
    size = 10 * 1024 * 1024
    head = (f"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    before = metric_value(server.url, "berth_requests_total", route="/v1/classify", status="401")
    answer, _ = _raw_request(server.url, head, b"{" + b" " * 65535)  # 64 KiB of the 10 MiB ever sent
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"www-authenticate: bearer" in answer.lower()
    assert metric_value(server.url, "berth_requests_total", route="/v1/classify", status="401") == before + 1
    # the same with a wrong key, and 3 MB of invalid JSON actually sent: 401, never 422
    wrong = httpx.post(server.url + "/v1/classify", content=b"{" * (3 * 1024 * 1024),
                       headers={"Authorization": "Bearer nope", "Content-Type": "application/json"}, timeout=30)
    assert wrong.status_code == 401 and wrong.json()["error_type"] == "unauthorized"
    empty_key = (b'POST /v1/classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \r\n'
                 b'Content-Type: application/json\r\nContent-Length: 13\r\n\r\n')
    answer, _ = _raw_request(server.url, empty_key, b'{"inputs":"x"}'[:13])
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_an_empty_api_key_is_refused_at_start(bundle_repository):
    for key in ("", "   "):
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("BERTH_")}
        env.update(BASE_ENV, BERTH_API_KEY=key)
        done = subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--models", str(bundle_repository),
                               "--port", "0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert "BERTH_API_KEY is set but empty" in done.stderr and "Unset BERTH_API_KEY" in done.stderr


def test_a_key_saved_with_a_trailing_newline_is_the_key_and_one_with_inner_whitespace_is_refused(bundle_repository,
                                                                                                tmp_path):
    # what `kubectl create secret generic --from-file=key` makes of a file an editor saved: "s3cret\n"
    proc = ServerProcess(bundle_repository, tmp_path / "key.log", args=["--model", "sentiment"],
                         env={"BERTH_API_KEY": "s3cret-key\n"})
    try:
        proc.wait_ready()
        ok = httpx.post(proc.url + "/v1/classify", json={"inputs": "fine"},
                        headers={"Authorization": "Bearer s3cret-key"}, timeout=30)
        assert ok.status_code == 200, ok.text
        wrong = httpx.post(proc.url + "/v1/classify", json={"inputs": "fine"},
                           headers={"Authorization": "Bearer other"}, timeout=30)
        assert wrong.status_code == 401
    finally:
        proc.stop()
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("BERTH_")}
    env.update(BASE_ENV, BERTH_API_KEY="two words")
    done = subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--models", str(bundle_repository),
                           "--port", "0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "whitespace or control characters" in done.stderr, done.stderr[-2000:]


def test_token_budget_concurrency_limit_and_body_read_timeout(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "limits.log", args=["--model", "sentiment"],
                         env={"BERTH_MAX_CONCURRENT_REQUESTS": "2", "BERTH_BODY_READ_TIMEOUT_S": "1",
                              "BERTH_MAX_TOKENS_PER_REQUEST": "4000"})
    try:
        proc.wait_ready()
        over = httpx.post(proc.url + "/v1/classify", json={"inputs": [" ".join(["harbour"] * 70)] * 64})
        assert over.status_code == 413 and "max_tokens_per_request" in over.json()["error"], over.text  # 64 x 64
        slow_body = {"inputs": [" ".join(["a long sentence about the harbour"] * 10)] * 64}

        async def crowd():
            async with httpx.AsyncClient(base_url=proc.url, timeout=60) as c:
                return await asyncio.gather(*(c.post("/v1/classify", json=slow_body) for _ in range(6)))

        statuses = [r.status_code for r in asyncio.run(crowd())]
        assert statuses.count(200) >= 2 and set(statuses) <= {200, 429}, statuses  # busy is 429, not 503
        refused = [r for r in asyncio.run(crowd()) if r.status_code == 429]
        for r in refused:
            assert "max_concurrent_requests" in r.json()["error"] and int(r.headers["retry-after"]) >= 1
        assert metric_value(proc.url, "berth_requests_total", route="/v1/classify", status="429") >= 1
        assert httpx.get(proc.url + "/readyz").status_code == 200  # probes are not limited

        head = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        answer, seconds = _raw_request(proc.url, head, b'{"inputs": ')  # and then nothing more
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert 0.9 < seconds < 10
        assert metric_value(proc.url, "berth_requests_total", route="/v1/classify", status="408") == 1

        too_big = httpx.post(proc.url + "/v1/classify", content=b"x" * (5 * 1024 * 1024),
                             headers={"Content-Type": "application/json"})
        assert too_big.status_code == 413
        assert metric_value(proc.url, "berth_requests_total", route="/v1/classify", status="413") == 2  # both 413s
    finally:
        proc.stop()


def test_metrics_count_what_the_docs_say(bundle_repository, tmp_path):
    """Warm-up is not traffic; inputs are counted at admission only; a 504 counts its items as expired."""
    proc = ServerProcess(bundle_repository, tmp_path / "metrics.log", args=["--model", "sentiment"],
                         env={"BERTH_REQUEST_TIMEOUT_S": "0.3", "BERTH_MAX_BATCH_SIZE": "1"})
    try:
        proc.wait_ready()
        assert metric_value(proc.url, "berth_items_inferred_total", model="sentiment") == 0  # after warm-up
        refused = httpx.post(proc.url + "/v1/classify", json={"inputs": ["x"] * 65})  # over max_inputs (64)
        assert refused.status_code == 413
        assert metric_value(proc.url, "berth_request_inputs_total", model="sentiment") == 0
        text = " ".join(["a long sentence about the harbour"] * 10)
        timed_out = httpx.post(proc.url + "/v1/classify", json={"inputs": [text] * 64}, timeout=30)
        assert timed_out.status_code == 504 and timed_out.json()["error_type"] == "timeout"
        assert metric_value(proc.url, "berth_request_inputs_total", model="sentiment") == 64
        time.sleep(0.5)
        expired = metric_value(proc.url, "berth_items_dropped_total", model="sentiment", reason="expired")
        cancelled = metric_value(proc.url, "berth_items_dropped_total", model="sentiment", reason="cancelled")
        assert expired >= 1 and cancelled == 0, (expired, cancelled)
    finally:
        proc.stop()
