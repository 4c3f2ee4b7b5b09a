"""Service test fixtures: real `berth serve` processes on free loopback ports, over the session's bundle
repository (real bundles exported from the real checkpoint; the fixture is in tests/conftest.py).

BERTH_TEST_WORKERS=N (`make test-workers`) runs every test server as N server processes on its port
(BERTH_WORKERS=N), unless a test sets BERTH_WORKERS or --workers itself. A test that measures a limit of one
server process is marked `single_process(...)` and skips then, saying which limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench.local_processes import free_port
from tests.conftest import session_folder

REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-key-0123456789"
# Small buckets and budgets keep warm-up and every test quick.
BASE_ENV = {
    "BERTH_LENGTH_BUCKETS": "16,32,64,128",
    "BERTH_MAX_BATCH_TOKENS": "1024",
    "BERTH_MAX_BATCH_SIZE": "16",
    "BERTH_INTRA_OP_THREADS": "2",
    "BERTH_DEVICE": "cpu",
    "BERTH_MAX_INPUTS_PER_REQUEST": "64",
}
TEST_WORKERS = int(os.environ.get("BERTH_TEST_WORKERS") or 0)  # 0: one server process, as `berth serve` on 2 cores


def single_process(limit: str) -> pytest.MarkDecorator:
    """Skip under BERTH_TEST_WORKERS > 1: the test measures `limit`, which each server process keeps for itself,
    so a load spread over N processes does not reach it in any one of them."""
    return pytest.mark.skipif(TEST_WORKERS > 1, reason=f"measures {limit}, which each server process keeps on "
                                                       f"its own: the test's load, spread over {TEST_WORKERS} "
                                                       "processes, does not reach it in any one of them")


def workers_flag(args: list[str]) -> str | None:
    """The value of the last --workers among `berth serve`'s arguments, or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == "--workers":
            value = args[i + 1]
        elif arg.startswith("--workers="):
            value = arg.split("=", 1)[1]
    return value


def workers_env(env: dict[str, str], args: list[str]) -> dict[str, str]:
    """BERTH_WORKERS=BERTH_TEST_WORKERS, unless the test chose a number of server processes itself."""
    chosen = "BERTH_WORKERS" in env or workers_flag(args) is not None
    return {} if chosen or not TEST_WORKERS else {"BERTH_WORKERS": str(TEST_WORKERS)}


def server_processes(env: dict[str, str], args: list[str]) -> int:
    """How many server processes `berth serve` runs with this environment and these arguments."""
    from service.settings import ServiceSettings
    from tasks.runtime.cpu import usable_cpus

    workers = workers_flag(args) or env.get("BERTH_WORKERS") or 0
    return ServiceSettings(workers=int(workers)).worker_count(usable_cpus())


class ServerProcess:
    """`berth serve` in a subprocess, ready when /readyz says so."""

    def __init__(self, repository: Path, log_path: Path, env: dict[str, str] | None = None, args: list[str] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}  # no stray settings
        env = env or {}
        full_env = {**inherited, **BASE_ENV, **workers_env(env, list(args)), **env, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "berth.cli", "serve", "--models", str(repository),
                   "--port", str(self.port), *args]
        self.workers = server_processes(full_env, list(args))
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(command, cwd=REPO, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"berth serve exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"berth serve not ready after {timeout} s:\n{self.log()}")

    def pids(self) -> list[int]:
        """`berth serve`'s process and, with --workers N, its worker processes (which hold the connections and
        the models)."""
        pid = self.process.pid
        return [pid, *(int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


@pytest.fixture(scope="session")
def server(bundle_repository, tmp_path_factory):
    """The main server: all four models, an API key."""
    proc = ServerProcess(bundle_repository, session_folder(tmp_path_factory, "logs") / "main.log",
                         env={"BERTH_API_KEY": API_KEY})
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c
