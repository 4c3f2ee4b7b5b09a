"""The `--workers N` supervisor: N server processes answering on one port (`berth serve --workers N`).

The parent binds the listening socket once and starts N workers (multiprocessing's spawn: each a fresh
interpreter, no ONNX Runtime thread or lock inherited from a fork), each serving on its own copy of that
socket with its own models, batchers and event loop: the kernel hands each new connection to a worker whose
loop is free to accept it, so a busy worker takes fewer. One pre-bound socket rather than a socket per worker
with SO_REUSEPORT: connections queued on a socket are reset when it closes, and SO_REUSEPORT spreads them by a
hash of the address, not by which worker is free; a shared socket also makes --port 0 mean one port for all.

Signals: SIGTERM and SIGINT are passed on to every worker, which drains as a lone server does (the workers run
in their own process group, so a terminal's Ctrl-C reaches them once, through the parent). A worker that exits
by itself (its models failed to load, a crash, the OOM killer) stops the others with SIGTERM, and `berth
serve` exits with that worker's code: the orchestrator restarts the whole server, as it would a single
process.

Metrics: the parent creates a folder for prometheus-client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set
for the workers), marks each exited worker dead there, and removes the folder at the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Sequence
from multiprocessing import connection, get_context
from typing import Any

from service.metrics import MULTIPROCESS_DIR_ENV
from service.settings import ServiceSettings
from service.workers import WorkerBoard

log = logging.getLogger("berth.service")
BACKLOG = 2048  # uvicorn's default


def bind(host: str, port: int) -> socket.socket:
    """The listening socket every worker serves on (SO_REUSEADDR, as uvicorn binds its own)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


def detach_from_terminal_group() -> None:
    """In a worker: its own process group (a terminal's Ctrl-C reaches the parent only, which passes it on),
    and SIGTERM when the parent dies (killed with SIGKILL, it cannot pass anything on)."""
    os.setpgid(0, 0)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(settings: ServiceSettings, workers: int,
              target: Callable[[ServiceSettings, socket.socket, WorkerBoard, int], Any],
              models: Sequence[str] = ()) -> int:
    """Run `target(settings, socket, board, index)` in `workers` processes until all have exited; the exit
    code is the first non-zero one of a worker (a worker killed by signal S: 128 + S), else 0. `models`: the
    names of the bundles served, whose readiness the board shares."""
    from prometheus_client import multiprocess

    metrics_dir = tempfile.mkdtemp(prefix="berth-metrics-")
    os.environ[MULTIPROCESS_DIR_ENV] = metrics_dir
    context = get_context("spawn")
    board = WorkerBoard(workers, models, context)
    sock = bind(settings.host, settings.port)
    log.info("%d server processes on http://%s:%d", workers, settings.host, sock.getsockname()[1])
    processes = [context.Process(target=target, args=(settings, sock, board, index), name=f"berth-worker-{index}")
                 for index in range(workers)]
    stopping = False

    def pass_on(sig: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, sig)

    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        for process in processes:
            process.start()
        sock.close()  # the workers hold it now: once the last one stops listening, connections are refused
        alive = list(processes)
        while alive:
            connection.wait([process.sentinel for process in alive], timeout=1.0)
            for process in [p for p in alive if p.exitcode is not None]:
                alive.remove(process)
                assert process.pid is not None and process.exitcode is not None
                multiprocess.mark_process_dead(process.pid, metrics_dir)
                exit_code = process.exitcode if process.exitcode >= 0 else 128 - process.exitcode
                if code == 0:
                    code = exit_code
                if not stopping:
                    log.error("worker %s (pid %d) exited with code %d; stopping the others", process.name,
                              process.pid, exit_code)
                    pass_on(signal.SIGTERM, None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for process in processes:
            if process.exitcode is None and process.pid is not None:
                process.kill()
                process.join()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.environ.pop(MULTIPROCESS_DIR_ENV, None)
    return code
