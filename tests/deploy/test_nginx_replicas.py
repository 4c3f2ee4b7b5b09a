"""Two real `berth serve` replicas on loopback behind Debian's nginx running the repository's
nginx.conf (only the upstream addresses and the listen port rewritten): requests are spread over
both, a replica stopped (SIGTERM, graceful) or killed (SIGKILL) mid-load loses no request, since
nginx retries it on the other replica, and the survivor keeps serving with the right answers. A busy
replica's 429 goes to the client (not retried, the replica not taken out); a loading replica's 503 is
retried on the other one."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.deploy.conftest import (
    NGINX_CONFIG,
    REPO,
    SERVE_ENV,
    Replica,
    free_port,
    require_tool,
    stop_process,
    wait_for,
)

TEXTS = [f"Review {i}: the {w} was {a}, and I would {v} it." for i, (w, a, v) in enumerate(
    (w, a, v) for w in ("film", "plot", "cast", "ending") for a in ("superb", "awful", "long", "quiet", "odd")
    for v in ("watch", "skip", "recommend"))]  # 60 distinct sentences
CLIENTS = 6


def nginx_config_for(upstreams: list[int], port: int, tmp: Path) -> Path:
    """The repository's nginx.conf with the compose service address replaced by the loopback replicas
    (same server parameters) and the listen port by `port`. As non-root, temp files go to `tmp`."""
    text = NGINX_CONFIG.read_text()
    server = re.search(r"^(\s*)server\s+berth:8000(.*);$", text, flags=re.M)
    assert server, "nginx.conf must have the upstream line `server berth:8000 ...;`"
    indent, params = server.groups()
    replicas = "\n".join(f"{indent}server 127.0.0.1:{p}{params};" for p in upstreams)
    text = text[: server.start()] + replicas + text[server.end():]
    text, listens = re.subn(r"^(\s*)listen\s+8080;$", rf"\1listen 127.0.0.1:{port};", text, flags=re.M)
    assert listens == 1, "nginx.conf must listen on 8080"
    if os.geteuid() != 0:  # Debian's default temp folders are root's
        text = text.replace("http {", f"http {{\n    client_body_temp_path {tmp}/body;\n"
                                      f"    proxy_temp_path {tmp}/proxy;", 1)
    path = tmp / "nginx.conf"
    path.write_text(text)
    return path


class TunableReplica(Replica):
    """A Replica whose next start adds `extra_env` (BERTH_* settings) to the deploy tests' own."""

    extra_env: dict[str, str] = {}

    def start(self) -> Replica:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        env.update(SERVE_ENV, **self.extra_env, PYTHONUNBUFFERED="1")
        command = [sys.executable, "-m", "berth.cli", "serve", "--models", str(self.repository),
                   "--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self


@pytest.fixture(scope="module")
def cluster(deploy_repository, tmp_path_factory):
    nginx = require_tool("nginx")
    tmp = tmp_path_factory.mktemp("nginx")
    replicas = [TunableReplica(deploy_repository, tmp, name) for name in ("a", "b")]
    for replica in replicas:
        replica.start()
    port = free_port()
    config = nginx_config_for([r.port for r in replicas], port, tmp)
    log = tmp / "nginx.log"
    process = None
    try:
        for replica in replicas:
            replica.wait_ready()
        command = [nginx, "-c", str(config), "-e", str(tmp / "error.log"),
                   "-g", f"daemon off; pid {tmp / 'nginx.pid'};"]
        test = subprocess.run([*command[:-2], "-t"], capture_output=True, text=True)
        assert test.returncode == 0, test.stderr
        with open(log, "wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/nginx-health", process, log, timeout=30)
        yield Cluster(url, replicas, log)
    finally:
        if process is not None:
            stop_process(process)
        for replica in replicas:
            replica.stop()


class Cluster:
    def __init__(self, url: str, replicas: list[Replica], access_log: Path):
        self.url, self.replicas, self.access_log = url, replicas, access_log

    def retried(self, first: Replica, then: Replica, statuses: str = "") -> int:
        """Requests nginx sent to `first`, then (after an error or a 503) to `then`: its access log
        lists both upstreams for them (and, if given, `statuses`: their upstream statuses, e.g. "503, 200")."""
        pair = f"upstream=127.0.0.1:{first.port}, 127.0.0.1:{then.port} upstream_status={statuses}"
        return sum(pair in line for line in self.log_lines())

    def log_lines(self) -> list[str]:
        return self.access_log.read_text(errors="replace").splitlines()

    def ensure_running(self) -> None:
        """Bring a stopped replica back on its own port, then wait until nginx sends it traffic again
        (a replica that failed is left out for fail_timeout)."""
        restarted = [r.start() for r in self.replicas if not r.alive]
        for replica in restarted:
            replica.wait_ready()
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while True:
                before = [r.served() for r in self.replicas]
                for text in TEXTS[:8]:
                    assert client.post("/v1/classify", json={"inputs": text}).status_code == 200
                if all(r.served() > b for r, b in zip(self.replicas, before)) or time.monotonic() > deadline:
                    break
                time.sleep(1)


@pytest.fixture(scope="module")
def expected(cluster) -> dict[str, dict]:
    """The answer for every text, straight from one replica (no nginx in between)."""
    body = httpx.post(cluster.replicas[1].url + "/v1/classify", json={"inputs": TEXTS}, timeout=60).json()
    return dict(zip(TEXTS, body["results"]))


def classify_through_nginx(url: str, texts: list[str], on_progress=None) -> list[tuple[str, int, dict]]:
    """Each text its own request, CLIENTS at a time; `on_progress(done)` after every answer."""
    answered = itertools.count(1)
    lock = threading.Lock()

    def one(client: httpx.Client, text: str) -> tuple[str, int, dict]:
        response = client.post("/v1/classify", json={"inputs": text})
        if on_progress:
            with lock:
                on_progress(next(answered))
        return text, response.status_code, response.json()

    with httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_connections=CLIENTS)) as client, \
            ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(lambda t: one(client, t), texts))


def assert_all_answered(results: list[tuple[str, int, dict]], expected: dict[str, dict]) -> None:
    failed = [(text, status, body) for text, status, body in results if status != 200]
    assert not failed, f"{len(failed)} of {len(results)} requests failed, e.g. {failed[:3]}"
    for text, _, body in results:  # each answer is the one for its own text
        got, want = body["results"][0], expected[text]
        assert got["label"] == want["label"], text
        assert got["score"] == pytest.approx(want["score"], abs=1e-4), text


def test_requests_are_spread_over_both_replicas(cluster, expected):
    cluster.ensure_running()
    before = [r.served() for r in cluster.replicas]
    results = classify_through_nginx(cluster.url, TEXTS)
    assert_all_answered(results, expected)
    shares = [r.served() - b for r, b in zip(cluster.replicas, before)]
    assert sum(shares) == len(TEXTS)
    assert min(shares) >= 0.25 * len(TEXTS), f"round robin over two replicas gave {shares}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm-drain", "sigkill"])
def test_a_replica_stopped_mid_load_loses_no_request(cluster, expected, sig):
    cluster.ensure_running()
    victim, survivor = cluster.replicas
    texts = TEXTS * 3
    served_before, retried_before = victim.served(), cluster.retried(victim, survivor)
    served_until_stopped = []

    def stop_victim_at_a_third(done: int) -> None:
        if done == len(texts) // 3:
            served_until_stopped.append(victim.served())
            victim.process.send_signal(sig)

    results = classify_through_nginx(cluster.url, texts, on_progress=stop_victim_at_a_third)
    assert served_until_stopped and served_until_stopped[0] > served_before, "the victim took no part in the load"
    victim.process.wait(30)
    assert not victim.alive
    assert_all_answered(results, expected)
    # Some requests did meet the stopped replica (refused, reset, or 503 while draining) and were
    # answered all the same, by the survivor.
    assert cluster.retried(victim, survivor) > retried_before

    # The survivor alone keeps serving.
    before = survivor.served()
    results = classify_through_nginx(cluster.url, TEXTS[:20])
    assert_all_answered(results, expected)
    assert survivor.served() - before == 20


class SlowRequests:
    """`count` slow requests to `replica` kept in progress (each sent again as it finishes): with
    max_concurrent_requests = `count`, the replica answers 429 to any other request meanwhile."""

    def __init__(self, replica: Replica, count: int):
        text = " ".join(["the harbour was quiet and the film was long"] * 5)  # ~60 tokens: bucket 64
        self.body = {"inputs": [f"{text} ({i})" for i in range(256)]}  # 256 passes of one item each
        self.url, self.stop = replica.url + "/v1/classify", threading.Event()
        self.threads = [threading.Thread(target=self._keep_sending) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _keep_sending(self) -> None:
        while not self.stop.is_set():
            httpx.post(self.url, json=self.body, timeout=120)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def test_a_busy_replicas_429_goes_to_the_client_and_the_replica_stays_in(cluster, expected):
    """429 is not in proxy_next_upstream: nginx neither retries it on the other replica nor counts it as a
    failure, so a saturated replica is not taken out (max_fails=3 would after three 503s)."""
    cluster.ensure_running()
    busy, other = cluster.replicas
    busy.process.kill()
    busy.process.wait(30)
    busy.extra_env = {"BERTH_MAX_CONCURRENT_REQUESTS": "2", "BERTH_MAX_BATCH_SIZE": "1"}
    slow = None
    try:
        busy.start().wait_ready()
        cluster.ensure_running()
        slow = SlowRequests(busy, 2)
        deadline = time.monotonic() + 20
        while httpx.post(busy.url + "/v1/classify", json={"inputs": "x"}, timeout=10).status_code != 429:
            assert time.monotonic() < deadline, "the slow requests did not saturate the replica"
            time.sleep(0.05)
        lines_before = len(cluster.log_lines())
        busy_429s = busy.served(status="429")
        with httpx.Client(base_url=cluster.url, timeout=30) as client:
            answers = [client.post("/v1/classify", json={"inputs": text}) for text in TEXTS[:12]]
        lines = cluster.log_lines()[lines_before:]
    finally:
        if slow is not None:
            slow.close()
        busy.extra_env = {}
    refused = [r for r in answers if r.status_code == 429]
    assert {r.status_code for r in answers} == {200, 429}, [r.status_code for r in answers]
    assert len(refused) >= 3, "fewer 429s than max_fails: the test would not show that they are not counted"
    for r in refused:
        assert r.json()["error_type"] == "overloaded" and "max_concurrent_requests" in r.json()["error"]
        assert int(r.headers["retry-after"]) >= 1
    assert busy.served(status="429") - busy_429s == len(refused)  # each one answered by the busy replica
    not_retried = f"upstream=127.0.0.1:{busy.port} upstream_status=429 "
    assert sum(not_retried in line for line in lines) == len(refused), lines  # one upstream each: not retried
    for text, answer in zip(TEXTS, answers):
        if answer.status_code == 200:
            assert answer.json()["results"][0]["label"] == expected[text]["label"]

    # Not taken out: with its slots free again, its share of the next requests reaches it at once (a replica
    # nginx had counted three failures against would get none for fail_timeout, 10 s).
    deadline = time.monotonic() + 5
    while httpx.post(busy.url + "/v1/classify", json={"inputs": "x"}, timeout=10).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = busy.served()
    with httpx.Client(base_url=cluster.url, timeout=30) as client:  # one at a time: its limit is still 2
        statuses = [client.post("/v1/classify", json={"inputs": text}).status_code for text in TEXTS[:8]]
    assert statuses == [200] * 8
    assert busy.served() - before >= 2, "nginx took the busy replica out after its 429s"


def test_a_loading_replicas_503_is_retried_on_the_other(cluster, expected):
    """A replica that restarts answers 503 + Retry-After while its models load (not ready, as when draining);
    http_503 is in proxy_next_upstream, so nginx sends those requests to the other replica."""
    cluster.ensure_running()
    loading, other = cluster.replicas
    loading.process.kill()
    loading.process.wait(30)
    # More warm-up shapes: the model takes seconds to load, long enough to send requests while it does.
    loading.extra_env = {"BERTH_LENGTH_BUCKETS": "8,16,24,32,40,48,56,64", "BERTH_MAX_BATCH_SIZE": "64"}
    try:
        loading.start()
        wait_for(loading.url + "/readyz", loading.process, loading.log, ok=(503,))  # listening, still loading
        direct = httpx.post(loading.url + "/v1/classify", json={"inputs": "x"}, timeout=10)
        assert direct.status_code == 503 and int(direct.headers["retry-after"]) >= 1, direct.text
        retried_before = cluster.retried(loading, other, "503, 200")
        results = classify_through_nginx(cluster.url, TEXTS[:24])
        still_loading = httpx.get(loading.url + "/readyz", timeout=10).status_code == 503
    finally:
        loading.extra_env = {}
    assert_all_answered(results, expected)
    assert cluster.retried(loading, other, "503, 200") > retried_before
    assert still_loading, "the replica finished loading before the requests were sent; nothing was shown"
    loading.wait_ready()
