"""Local processes for the benchmarks (and the tests, which import them from here): a free loopback port, a
server process waited for and stopped, a process's CPU time, and a real Ray cluster on 127.0.0.1.

`RayCluster` is `ray start --head` and more nodes joining it, each `ray start --block` in a session of its own,
stopped by the ids of the processes it started (the nodes and their descendants), never by `ray stop`, which
would stop every Ray process on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def wait_for(url: str, process: subprocess.Popen, log: Path, timeout: float = 120, ok=(200,)) -> None:
    """Poll `url` until it answers one of `ok`; fails with the process log if it exits or times out."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}:\n{tail(log)}")
        try:
            if httpx.get(url, timeout=2).status_code in ok:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout} s:\n{tail(log)}")


def stop_process(process: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds; waits for the process either way."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


class RayCluster:
    """A Ray cluster of `nodes` local nodes of `cpus_per_node` CPUs each; `address` is the head's."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1):
        self.folder = Path(tempfile.mkdtemp(prefix="berth-ray-", dir="/tmp"))  # Ray's socket paths must be short
        self.address = f"127.0.0.1:{free_port()}"
        common = ["--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus_per_node}", "--disable-usage-stats"]
        self.processes: list[subprocess.Popen] = []
        self._start("head", "--head", f"--port={self.address.rsplit(':', 1)[1]}", "--include-dashboard=false",
                    f"--temp-dir={self.folder / 'ray'}", *common)
        self.wait_for_nodes(1)
        for n in range(1, nodes):
            self._start(f"node{n}", f"--address={self.address}", *common)
        self.wait_for_nodes(nodes)

    def _start(self, name: str, *args: str) -> None:
        with open(self.folder / f"{name}.log", "wb") as log:
            self.processes.append(subprocess.Popen([str(RAY), "start", *args], stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True))

    def wait_for_nodes(self, count: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"ray start exited with {process.returncode}: {self.logs()}")
            status = subprocess.run([str(RAY), "status", f"--address={self.address}"], capture_output=True, text=True)
            if status.returncode == 0 and status.stdout.count(" node_") >= count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"{count} Ray node(s) not up after {timeout} s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(log.read_text(errors="replace")[-2000:] for log in self.folder.glob("*.log"))

    def stop(self) -> None:
        pids = [p for process in self.processes for p in (process.pid, *descendants(process.pid))]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(p.poll() is None for p in self.processes):
                time.sleep(0.2)
        shutil.rmtree(self.folder, ignore_errors=True)


def ready(port: int, path: str = "/readyz") -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def running(command: list[str], port: int, log: Path, timeout: float = 600, ready_path: str = "/readyz",
            cwd: Path = REPO, env: dict[str, str] | None = None):
    """A server subprocess, yielded once GET `ready_path` answers 200; stopped with SIGTERM after."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + timeout
            while not ready(port, ready_path):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[:4]} did not become ready; see {log}")
                time.sleep(0.5)
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """utime + stime of a process and its threads, or of one of its threads (the main thread: `thread=pid`),
    from /proc."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_repository(repository: Path, threads: int, work: Path, serve_args: list[str]):
    port = free_port()
    command = [sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--port", str(port),
               "--threads", str(threads), "--log-level", "warning", *serve_args]
    return port, running(command, port, work / f"serve-{repository.name}.log")
