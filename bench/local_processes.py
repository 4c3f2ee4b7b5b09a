"""Local processes for the benchmarks (and the tests, which import them from here): a free loopback port, a
server process waited for and stopped, and a real Ray cluster on 127.0.0.1.

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
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")


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
