"""The Python work of one request on the event loop, counted: function calls per request, which no noisy neighbour
changes.

Requests/s and CPU time per request on a shared 2-vCPU machine move 10-25% from one window to the next, more than a
change to the request path of a few percent. This counts instead: the real app (`create_app`) on one bundle, in
process, its lifespan run and the model ready, answers `--requests` sequential requests of a real dev input
(bench/serving_ceiling.py's) through its ASGI interface (no socket: uvicorn's own part is the same for every tree),
and cProfile on the event loop's thread counts the calls (the forward pass runs in a worker thread, uncounted).
Then, without the profiler, `--clients` requests in flight, it times the loop thread's CPU per request: the
Python work of a request under load without HTTP or a socket (noisier than the count: a time, on shared cores).
Each `--berth` code tree runs in a process of its own with that tree on its path, so before and after a change
count side by side.

    python -m bench.request_calls /path/to/topics --input classify-short --berth before=/tmp/berth-before after=. \\
        --out bench/results/request_calls.json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOP = 15  # the most-called functions kept per tree
LIBRARIES = ("fastapi", "starlette", "uvicorn", "pydantic", "prometheus_client", "tokenizers")  # their calls count


def count(repository: Path, route: str, body: dict[str, Any], requests: int, warmup: int = 50, clients: int = 32
          ) -> dict[str, Any]:
    """Calls on this thread per request of `body` to `route`, the app serving `repository` (in this process), one
    request at a time; then, without the profiler, this thread's CPU time per request with `clients` requests in
    flight (at least `requests` and ten per client): the Python work of a request under load, with no socket."""
    import uvloop

    from service.app import create_app
    from service.settings import ServiceSettings

    raw = json.dumps(body).encode()

    async def run() -> dict[str, Any]:
        app = create_app(ServiceSettings(models=str(repository), playground=False))
        inbox: asyncio.Queue = asyncio.Queue()
        outbox: asyncio.Queue = asyncio.Queue()
        await inbox.put({"type": "lifespan.startup"})
        life = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                         inbox.get, outbox.put))
        started = await outbox.get()
        if started["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app did not start: {started}")
        while not app.state.runtime.ready:
            await asyncio.sleep(0.05)
        statuses: dict[int, int] = {}
        for _ in range(warmup):
            await one(app, route, raw, statuses)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(requests):
            await one(app, route, raw, statuses)
        profile.disable()
        loaded: dict[int, int] = {}
        total, sent = max(requests, 10 * clients), 0

        async def client() -> None:
            nonlocal sent
            while sent < total:
                sent += 1
                await one(app, route, raw, loaded)

        begin = time.thread_time()
        await asyncio.gather(*(client() for _ in range(clients)))
        loop_cpu = time.thread_time() - begin
        await inbox.put({"type": "lifespan.shutdown"})
        await life
        stats = pstats.Stats(profile)
        top = sorted(stats.stats.items(), key=lambda kv: -kv[1][1])[:TOP]  # type: ignore[attr-defined]
        return {"requests": requests, "statuses": {str(k): v for k, v in statuses.items()},
                "clients": clients, "loaded_statuses": {str(k): v for k, v in loaded.items()},
                "loop_cpu_ms_per_request": 1000 * loop_cpu / total,
                "calls_per_request": stats.total_calls / requests,  # type: ignore[attr-defined]
                "most_called": [{"function": f"{Path(f).name}:{line}({name})", "calls_per_request": n / requests}
                                for (f, line, name), (_, n, *_) in top]}

    return uvloop.run(run())


async def one(app: Any, route: str, raw: bytes, statuses: dict[int, int]) -> None:
    """One POST through the app's ASGI interface, as uvicorn would call it."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": route, "raw_path": route.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "state": {}}
    answered = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await answered.wait()  # the client stays until its answer is sent
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] = statuses.get(message["status"], 0) + 1
        elif not message.get("more_body", False):
            answered.set()

    await app(scope, receive, send)


def in_tree(tree: Path, repository: Path, route: str, body: dict[str, Any], requests: int, clients: int = 32
            ) -> dict[str, Any]:
    """`count` in a process that imports berth from `tree`."""
    code = ("import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from request_calls import count; "
            "print(json.dumps(count(Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5]), "
            "clients=int(sys.argv[6]))))")
    command = [sys.executable, "-c", code, str(Path(__file__).parent), str(repository), route, json.dumps(body),
               str(requests), str(clients)]
    done = subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree.resolve())},
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"counting in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(result: dict[str, Any]) -> str:
    lines = ["| bundle | input | berth | Python calls per request on the event loop | answers | event loop CPU ms "
             "per request, requests in flight |",
             "|---|---|---|---|---|---|"]
    for label, counted in result["trees"].items():
        cpu = (f"{counted['loop_cpu_ms_per_request']:.3f} ({counted['clients']})"
               if "loop_cpu_ms_per_request" in counted else "")
        lines.append(f"| {result['bundle']} | {result['input']} | {label} | {counted['calls_per_request']:.0f} | "
                     f"{', '.join(f'{n} x {status}' for status, n in counted['statuses'].items())} | {cpu} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from bench.local_processes import REPO
    from bench.machine import machine_facts
    from bench.records import write_record
    from bench.serving_ceiling import request_bodies
    from tasks.bundle_checks import load_bundle
    from tasks.registry import definition
    from tasks.runtime.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--input", default="classify-short", help="a workload of bench/serving_ceiling.py")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=32, help="requests in flight for the CPU time per request")
    parser.add_argument("--berth", nargs="+", default=[f"this={REPO}"], metavar="LABEL=CODE")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "request_calls.json")
    args = parser.parse_args(argv)
    bundle = load_bundle(args.bundle)
    body = request_bodies(load_tokenizer(bundle.tokenizer_path))[args.input]
    route = definition(bundle.task).route
    result: dict[str, Any] = {"machine": machine_facts(None, LIBRARIES), "bundle": args.bundle.name,
                              "input": args.input, "route": route, "requests": args.requests, "trees": {}}
    with tempfile.TemporaryDirectory(prefix="berth-calls-") as work:
        repository = Path(work)
        (repository / args.bundle.name).symlink_to(args.bundle.resolve())
        for label, tree in (t.split("=", 1) for t in args.berth):
            result["trees"][label] = in_tree(Path(tree), repository, route, body, args.requests, args.clients)
    write_record(args.out, result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
