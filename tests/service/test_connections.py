"""Connection hygiene against a real `berth serve` (service/connections.py and the request guard): request heads
have a deadline (a slow-loris is closed, its file descriptors come back), idle keep-alive connections are closed,
connections beyond the cap get 503, trickling bodies take no /v1 slot and are bounded on their own (429 beyond
max_body_reads), and the in-flight limit answers 429 + Retry-After."""

from __future__ import annotations

import concurrent.futures
import json
import os
import selectors
import socket
import time

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.connections import MAX_HEAD_BYTES, GuardedHttpToolsProtocol, connection_protocol
from service.settings import ServiceSettings
from tests.service.conftest import ServerProcess, single_process
from tests.service.test_service_overload import metric_value

HEADER_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 1.0
BODY_READ_TIMEOUT_S = 4.0
MAX_CONNECTIONS = 300
MAX_CONCURRENT = 2
MAX_BODY_READS = 4
SLACK_S = 1.0  # the event loop's timer granularity, a busy two-core machine, the select loop below
ENV = {
    "BERTH_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
    "BERTH_KEEP_ALIVE_TIMEOUT_S": str(KEEP_ALIVE_S),
    "BERTH_BODY_READ_TIMEOUT_S": str(BODY_READ_TIMEOUT_S),
    "BERTH_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "BERTH_MAX_CONCURRENT_REQUESTS": str(MAX_CONCURRENT),
    "BERTH_MAX_BODY_READS": str(MAX_BODY_READS),
    "BERTH_MAX_BATCH_SIZE": "1",  # one item per forward pass: a request of 64 inputs takes a while
}
PARTIAL_HEAD = b"POST /v1/classify HTTP/1.1\r\nHost: x\r\n"  # and then nothing more
BODY_HEAD = (b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n")


@pytest.fixture(scope="module")
def guarded(bundle_repository, tmp_path_factory):
    proc = ServerProcess(bundle_repository, tmp_path_factory.mktemp("connections") / "server.log",
                         args=["--model", "sentiment"], env=ENV)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def address(server: ServerProcess) -> tuple[str, int]:
    return "127.0.0.1", server.port


def open_fds(server: ServerProcess) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in server.pids())


def settled_fds(server: ServerProcess, at_most: int | None = None, timeout: float = 10) -> int:
    """The server's descriptor count once it stops changing (and, if given, is at most `at_most`)."""
    deadline = time.monotonic() + timeout
    last = open_fds(server)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = open_fds(server)
        if now == last and (at_most is None or now <= at_most):
            return now
        last = now
    return last


def wait_closed(sockets: list[socket.socket], timeout: float, every=None) -> dict[socket.socket, float]:
    """When (monotonic) the server closed each socket: EOF or reset. `every()` runs about every 0.25 s."""
    selector = selectors.DefaultSelector()
    for s in sockets:
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
    closed: dict[socket.socket, float] = {}
    deadline = time.monotonic() + timeout
    next_tick = time.monotonic()
    while len(closed) < len(sockets) and time.monotonic() < deadline:
        if every is not None and time.monotonic() >= next_tick:
            every()
            next_tick = time.monotonic() + 0.25
        for key, _ in selector.select(timeout=0.05):
            try:
                data = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                closed[key.fileobj] = time.monotonic()
                selector.unregister(key.fileobj)
    selector.close()
    return closed


def read_response(s: socket.socket, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length: status, headers (lower-case names), body."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def test_the_protocol_is_uvicorns_httptools_with_the_hooks():
    """`berth serve` would run httptools without us (uvicorn[standard]); ours is that class, and uvicorn loads it."""
    assert uvicorn.Config(app=None, http="auto").http == "auto"
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    assert AutoHTTPProtocol is HttpToolsProtocol
    cls = connection_protocol(ServiceSettings(header_timeout_s=3, max_connections=7))
    assert issubclass(cls, GuardedHttpToolsProtocol) and issubclass(cls, HttpToolsProtocol)
    assert (cls.header_timeout_s, cls.max_connections) == (3, 7)
    config = uvicorn.Config(app=lambda scope, receive, send: None, http=cls)
    config.load()
    assert config.http_protocol_class is cls


def test_a_slow_loris_is_closed_within_the_header_timeout_and_its_descriptors_come_back(guarded):
    baseline = settled_fds(guarded)
    timed_out_before = metric_value(guarded.url, "berth_connections_closed_total", reason="header_timeout")
    connected: dict[socket.socket, float] = {}
    silent, trickling = [], []
    loris = []
    began = time.monotonic()
    for _ in range(200):  # a partial request head, then silence
        s = socket.create_connection(address(guarded))
        connected[s] = time.monotonic()
        s.sendall(PARTIAL_HEAD)
        loris.append(s)
    for group in (silent, trickling):  # nothing at all; a head one byte every 0.25 s
        for _ in range(5):
            s = socket.create_connection(address(guarded))
            connected[s] = time.monotonic()
            group.append(s)
    opened_in = time.monotonic() - began
    time.sleep(0.3)
    peak = open_fds(guarded)
    open_gauge = metric_value(guarded.url, "berth_open_connections")
    # meanwhile, a normal request is answered at once
    asked = time.monotonic()
    normal = httpx.post(guarded.url + "/v1/classify", json={"inputs": "A charming journey."}, timeout=10)
    answered_in = time.monotonic() - asked
    assert normal.status_code == 200 and answered_in < 1.0, (normal.status_code, answered_in)

    sent = {s: 0 for s in trickling}

    def trickle() -> None:
        for s in trickling:
            try:
                s.send(PARTIAL_HEAD[sent[s]:sent[s] + 1])
                sent[s] += 1
            except OSError:
                pass  # closed already

    closed = wait_closed(list(connected), timeout=HEADER_TIMEOUT_S + 10, every=trickle)
    after = settled_fds(guarded, at_most=baseline + 2)
    for s in connected:
        s.close()
    assert len(closed) == len(connected), f"{len(connected) - len(closed)} connections still open"
    lifetimes = sorted(closed[s] - connected[s] for s in connected)
    print(f"\n{len(connected)} connections opened in {opened_in:.2f} s; server fds: {baseline} before, {peak} "
          f"with them open, {after} after; closed {lifetimes[0]:.2f}-{lifetimes[-1]:.2f} s after connecting "
          f"(header_timeout_s={HEADER_TIMEOUT_S}); last one closed {max(closed.values()) - began:.2f} s after the "
          f"first connect; a normal request meanwhile: {answered_in * 1000:.0f} ms")
    assert peak >= baseline + 200, (baseline, peak)
    assert HEADER_TIMEOUT_S - 0.2 <= lifetimes[0] and lifetimes[-1] <= HEADER_TIMEOUT_S + SLACK_S, lifetimes
    assert min(sent.values()) >= 4, sent  # the trickling heads did keep sending, and were cut all the same
    assert after <= baseline + 2, (baseline, after)
    assert httpx.get(guarded.url + "/readyz").status_code == 200
    # the operator sees it: the open connections (with the two metrics scrapes' own) and why they were closed
    assert open_gauge >= 210
    timed_out = metric_value(guarded.url, "berth_connections_closed_total", reason="header_timeout")
    assert 210 <= timed_out - timed_out_before <= 212  # the test's own (closed) connections never idle into it
    assert metric_value(guarded.url, "berth_open_connections") <= 3


def test_a_head_larger_than_the_limit_gets_431(guarded):
    with socket.create_connection(address(guarded)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        try:
            for _ in range(MAX_HEAD_BYTES // 4096 + 4):
                s.sendall(b"a" * 4096)
                time.sleep(0.002)
        except OSError:
            pass  # closed while we were still sending
        status, _, body = read_response(s)
        assert status == 431 and json.loads(body)["error_type"] == "too_large"


def test_idle_keep_alive_connections_are_closed(guarded):
    idle, stray = socket.create_connection(address(guarded)), socket.create_connection(address(guarded))
    for s in (idle, stray):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[0] == 200
    answered = time.monotonic()

    def stray_bytes() -> None:  # CRLFs between requests: no request begins, yet the connection is not idle
        try:
            stray.send(b"\r\n")
        except OSError:
            pass

    closed = wait_closed([idle, stray], timeout=HEADER_TIMEOUT_S + 10, every=stray_bytes)
    idle.close()
    stray.close()
    assert idle in closed and KEEP_ALIVE_S - 0.2 <= closed[idle] - answered <= KEEP_ALIVE_S + SLACK_S, closed
    assert stray in closed and closed[stray] - answered <= HEADER_TIMEOUT_S + SLACK_S, closed


@single_process("max_body_reads (request bodies being read at once)")
def test_trickling_bodies_take_no_request_slot_and_are_bounded_on_their_own(guarded):
    before = metric_value(guarded.url, "berth_requests_total", route="/v1/classify", status="429")
    trickles = []
    for _ in range(MAX_CONCURRENT + 1):  # more bodies arriving than there are request slots
        s = socket.create_connection(address(guarded))
        s.sendall(BODY_HEAD + b'{"inputs": ')
        trickles.append(s)
    began = time.monotonic()
    time.sleep(0.3)
    ok = httpx.post(guarded.url + "/v1/classify", json={"inputs": "A charming journey."}, timeout=10)
    assert ok.status_code == 200, ok.text  # the slots are taken once a body has arrived

    last = socket.create_connection(address(guarded))  # now MAX_BODY_READS bodies are arriving
    last.sendall(BODY_HEAD + b'{"inputs": ')
    trickles.append(last)
    time.sleep(0.3)
    # A body that arrives whole is never refused for slow ones: they cannot deny service to normal clients.
    whole = httpx.post(guarded.url + "/v1/classify", json={"inputs": "A charming journey."}, timeout=10)
    assert whole.status_code == 200, whole.text
    one_more = socket.create_connection(address(guarded))  # a slow body beyond MAX_BODY_READS is refused
    one_more.sendall(BODY_HEAD + b'{"inputs": ')
    status, headers, body = read_response(one_more, timeout=5)
    one_more.close()
    assert status == 429, body
    assert json.loads(body)["error_type"] == "overloaded" and b"max_body_reads" in body
    assert int(headers["retry-after"]) >= 1
    assert metric_value(guarded.url, "berth_requests_total", route="/v1/classify", status="429") == before + 1

    # The trickling bodies get 408 after body_read_timeout_s: their heads were complete, so the head deadline
    # (shorter) did not cut them. Answered before their bodies arrived, they are then closed within it.
    for s in trickles:
        status, headers, body = read_response(s, timeout=BODY_READ_TIMEOUT_S + 5)
        assert status == 408 and json.loads(body)["error_type"] == "timeout"
    answered = time.monotonic()
    assert answered - began >= BODY_READ_TIMEOUT_S - 0.5
    closed = wait_closed(trickles, timeout=HEADER_TIMEOUT_S + 5)
    for s in trickles:
        s.close()
    assert len(closed) == len(trickles) and max(closed.values()) - answered <= HEADER_TIMEOUT_S + SLACK_S
    assert httpx.post(guarded.url + "/v1/classify", json={"inputs": "fine"}, timeout=10).status_code == 200


@single_process("max_concurrent_requests (requests in flight)")
def test_the_in_flight_limit_answers_429_with_retry_after(guarded):
    text = " ".join(["the harbour was quiet and the film was long"] * 12)  # ~120 tokens: bucket 128
    slow = {"inputs": [f"{text} ({i})" for i in range(64)]}  # 64 forward passes of one item each
    admitted = metric_value(guarded.url, "berth_request_inputs_total")
    with concurrent.futures.ThreadPoolExecutor(MAX_CONCURRENT) as pool:
        running = [pool.submit(httpx.post, guarded.url + "/v1/classify", json=slow, timeout=120)
                   for _ in range(MAX_CONCURRENT)]
        deadline = time.monotonic() + 60
        while metric_value(guarded.url, "berth_request_inputs_total") < admitted + 64 * MAX_CONCURRENT:
            assert time.monotonic() < deadline and not any(f.done() for f in running), guarded.log()
            time.sleep(0.01)
        refused = httpx.post(guarded.url + "/v1/classify", json={"inputs": "one more"}, timeout=10)
        assert not all(f.done() for f in running), "the slow requests finished too soon to hold their slots"
        assert httpx.get(guarded.url + "/readyz").status_code == 200  # probes are not limited
        results = [f.result() for f in running]
    assert refused.status_code == 429, refused.text
    assert refused.json()["error_type"] == "overloaded" and "max_concurrent_requests" in refused.json()["error"]
    assert int(refused.headers["retry-after"]) >= 1
    assert [r.status_code for r in results] == [200] * MAX_CONCURRENT


def test_connections_beyond_max_connections_get_503_and_are_closed(guarded):
    settled_fds(guarded)
    over_before = metric_value(guarded.url, "berth_connections_closed_total", reason="over_limit")
    # each server process keeps max_connections open: whichever way the kernel spread these, 10 are beyond
    cap = MAX_CONNECTIONS * guarded.workers
    sockets = [socket.create_connection(address(guarded)) for _ in range(cap + 10)]
    try:
        for s in sockets:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = []
        for s in sockets:
            try:
                answers.append(read_response(s, timeout=5))
            except OSError as error:
                answers.append((0, {}, repr(error).encode()))
    finally:
        for s in sockets:
            s.close()
    statuses = [status for status, _, _ in answers]
    assert statuses.count(200) <= cap and statuses.count(503) >= 10, statuses
    assert set(statuses) == {200, 503}, statuses
    for status, headers, body in answers:
        if status == 503:
            assert json.loads(body)["error_type"] == "overloaded" and "max_connections" in json.loads(body)["error"]
            assert int(headers["retry-after"]) >= 1 and headers["connection"] == "close"
    assert httpx.get(guarded.url + "/readyz", timeout=10).status_code == 200
    over = metric_value(guarded.url, "berth_connections_closed_total", reason="over_limit") - over_before
    assert over == statuses.count(503), (over, statuses.count(503))
