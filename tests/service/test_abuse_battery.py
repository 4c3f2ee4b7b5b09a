"""What a black-box abuse battery found, each against a real `berth serve` on 127.0.0.1: clients that never read
their answer, a whole oversized head in one read, malformed request lines, a non-ASCII API key, a bundle whose
labels do not match its graph, a boolean where an integer belongs."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.service.conftest import BASE_ENV, REPO, ServerProcess


@pytest.fixture(scope="module")
def server_no_auth(bundle_repository, tmp_path_factory):
    proc = ServerProcess(bundle_repository, tmp_path_factory.mktemp("abuse") / "serve.log",
                         args=["--model", "sentiment"])
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def serve_refused(repository, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`berth serve` that must refuse to start: its exit status and output."""
    full_env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("BERTH_")}
    full_env.update(BASE_ENV, **env)
    return subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--port", "0"],
                          cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120)


def raw_exchange(port: int, request: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def closed_count(url: str, reason: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f'berth_connections_closed_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no berth_connections_closed_total for {reason}")


def test_a_non_ascii_api_key_is_refused_at_start(bundle_repository):
    done = serve_refused(bundle_repository, {"BERTH_API_KEY": "sécret"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "non-ASCII" in done.stderr and "Latin-1 or UTF-8" in done.stderr


def test_a_bundle_whose_labels_do_not_match_its_graph_never_loads(bundle_repository, tmp_path):
    repository = tmp_path / "repo"
    shutil.copytree(bundle_repository / "sentiment", repository / "sentiment")
    manifest_path = repository / "sentiment" / "bundle.json"
    manifest = json.loads(manifest_path.read_text())
    # A format-1 manifest (written before digests: an edit cannot be told) with one label too many.
    manifest.update(format_version=1, labels=["negative", "positive", "neutral"])
    for key in ("manifest_sha256", "signature"):
        manifest.pop(key, None)
    manifest_path.write_text(json.dumps(manifest))
    done = serve_refused(repository, {})
    assert done.returncode != 0
    assert "logits have 2 values a row but the manifest lists 3 labels" in done.stderr + done.stdout

    # The manifest's output shape edited too (a symbolic width): the graph itself is checked when it loads.
    manifest["outputs"][0]["shape"] = ["batch", "num_labels"]
    manifest_path.write_text(json.dumps(manifest))
    proc = ServerProcess(repository, tmp_path / "labels.log")
    try:
        code = proc.process.wait(timeout=120)  # the model fails to load: the server stops, it is never ready
        assert code != 0
        assert "logits have 2 values a row but the manifest lists 3 labels" in proc.log()
        assert "ready" not in [line.split()[-1] for line in proc.log().splitlines() if "model sentiment" in line]
    finally:
        proc.stop()


def test_a_boolean_is_not_an_integer_option(server_no_auth):
    for body in ({"inputs": "fine", "top_k": True}, {"inputs": "fine", "top_k": "2"}):
        answer = httpx.post(server_no_auth.url + "/v1/classify", json=body, timeout=30)
        assert answer.status_code == 422 and "top_k" in answer.text, answer.text


def test_a_whole_oversized_head_in_one_read_gets_431_and_a_malformed_request_json_400(server_no_auth):
    port = server_no_auth.port
    head = (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 990)
                                                                for i in range(70)) + b"\r\n")
    assert len(head) > 64 * 1024
    answer = raw_exchange(port, head)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error_type"] == "too_large"

    for bad in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n", b"\x16\x03\x01\x00\xa5\x01\r\n\r\n"):
        answer = raw_exchange(port, bad)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        head_part, body = answer.split(b"\r\n\r\n", 1)
        assert b"content-type: application/json" in head_part.lower()
        assert json.loads(body)["error_type"] == "validation"
    assert httpx.get(server_no_auth.url + "/healthz", timeout=10).status_code == 200


def token_vectors_request(inputs: int) -> bytes:
    text = " ".join(["the harbour master signed the papers at dawn"] * 40)  # truncated to the model's length
    body = json.dumps({"model": "embeddings", "inputs": [text] * inputs, "output": "tokens"}).encode()
    return (b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def stalled_readers(port: int, count: int, inputs: int) -> list[socket.socket]:
    """Clients that ask for a large answer and never read it (a tiny receive buffer)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(token_vectors_request(inputs))
        sockets.append(sock)
    return sockets


def drained_until_closed(sock: socket.socket, timeout: float = 20) -> int:
    """Read what the server left in flight until it closes (or resets) the connection: the bytes received."""
    sock.settimeout(timeout)
    received = 0
    try:
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    return received


def test_clients_that_never_read_their_answer_are_aborted_and_counted(bundle_repository, tmp_path):
    proc = ServerProcess(bundle_repository, tmp_path / "slow.log", args=["--model", "embeddings"],
                         env={"BERTH_WRITE_TIMEOUT_S": "2", "BERTH_MAX_QUEUED_RESPONSE_BYTES": str(24 * 1024 * 1024)})
    try:
        proc.wait_ready()
        answer = httpx.post(proc.url + "/v1/embed", content=token_vectors_request(8).split(b"\r\n\r\n", 1)[1],
                            headers={"content-type": "application/json"}, timeout=120)
        full = len(answer.content)
        assert answer.status_code == 200 and full > 4 * 1024 * 1024  # a multi-MiB answer: over any socket buffer
        sockets = stalled_readers(proc.port, 6, 8)
        time.sleep(2)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (closed_count(proc.url, "write_timeout")
                                               + closed_count(proc.url, "write_queue_full")) < 6:
            time.sleep(0.5)
        timed_out, queue_full = closed_count(proc.url, "write_timeout"), closed_count(proc.url, "write_queue_full")
        assert timed_out + queue_full == 6, (timed_out, queue_full)
        assert queue_full >= 1  # 6 x ~8 MiB stalled at once is over the 24 MiB cap
        assert all(drained_until_closed(sock) < full for sock in sockets)  # cut off, never the whole answer
        assert httpx.get(proc.url + "/healthz", timeout=10).status_code == 200
        again = httpx.post(proc.url + "/v1/embed", json={"inputs": "still serving"}, timeout=60)
        assert again.status_code == 200
    finally:
        proc.stop()


def test_tokenize_answers_count_against_the_answer_size_limit(bundle_repository, tmp_path):
    texts = [" ".join(f"harbour{i % 97}" for i in range(10_000))[:100_000]] * 2  # 2 x 100,000 characters
    proc = ServerProcess(bundle_repository, tmp_path / "tokenize.log", args=["--model", "embeddings"],
                         env={"BERTH_MAX_RESPONSE_BYTES": str(1024 * 1024)})
    try:
        proc.wait_ready()
        refused = httpx.post(proc.url + "/tokenize", json={"inputs": texts}, timeout=120)
        assert refused.status_code == 413 and "max_response_bytes" in refused.text, refused.text[:300]
        small = httpx.post(proc.url + "/tokenize", json={"inputs": "the harbour"}, timeout=60)
        assert small.status_code == 200 and [t["text"] for t in small.json()[0][1:-1]] == ["the", "harbour"]
    finally:
        proc.stop()
    proc = ServerProcess(bundle_repository, tmp_path / "tokenize-default.log", args=["--model", "embeddings"])
    try:
        proc.wait_ready()
        whole = httpx.post(proc.url + "/tokenize", json={"inputs": texts}, timeout=120)
        assert whole.status_code == 200 and len(whole.content) > 2 * 1024 * 1024  # what the 1 MiB limit refused
    finally:
        proc.stop()


def test_the_openapi_document_lists_the_statuses_the_routes_return(server_no_auth):
    document = httpx.get(server_no_auth.url + "/openapi.json", timeout=30).json()
    paths = document["paths"]
    for route in ("/embed", "/predict", "/rerank", "/tokenize"):
        assert {"400", "422", "424"} <= set(paths[route]["post"]["responses"]), route
    assert "404" in paths["/models/{name}"]["post"]["responses"]
    metrics = httpx.get(server_no_auth.url + "/metrics", timeout=30)
    assert metrics.headers["content-type"] in paths["/metrics"]["get"]["responses"]["200"]["content"]
