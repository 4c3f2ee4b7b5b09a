"""Two real `berth serve` replicas on loopback behind Debian's nginx running the repository's
nginx.conf (only the upstream addresses and the listen port rewritten): requests are spread over
both, a replica stopped (SIGTERM, graceful) or killed (SIGKILL) mid-load loses no request, since
nginx retries it on the other replica, and the survivor keeps serving with the right answers."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.deploy.conftest import NGINX_CONFIG, Replica, free_port, require_tool, stop_process, wait_for

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
        text = text.replace("http {", f"http {{\n    client_body_temp_path {tmp}/body;\n    proxy_temp_path {tmp}/proxy;", 1)
    path = tmp / "nginx.conf"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def cluster(deploy_repository, tmp_path_factory):
    nginx = require_tool("nginx")
    tmp = tmp_path_factory.mktemp("nginx")
    replicas = [Replica(deploy_repository, tmp, name) for name in ("a", "b")]
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

    def retried(self, first: Replica, then: Replica) -> int:
        """Requests nginx sent to `first`, then (after an error or a 503) to `then`: its access log
        lists both upstreams for them."""
        pair = f"upstream=127.0.0.1:{first.port}, 127.0.0.1:{then.port} "
        return sum(pair in line for line in self.access_log.read_text(errors="replace").splitlines())

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
