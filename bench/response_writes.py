"""What sending a response in one write instead of two saves: the do-nothing ASGI app (bench/serving_ceiling.py)
under `berth serve`'s connection protocol from two code trees, one with service/coalesced_writes.py and one
without, the same `hey` load on each in turn, round after round; requests/s and the server's CPU a request.

The app does nothing, so what differs is the HTTP path alone (the same in both trees but for the writes).

    python -m bench.response_writes --trees before=<checkout without it> after=. --rounds 4 --seconds 5 \
        --out bench/results/response_writes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.load_tools import hey
from bench.local_processes import REPO, free_port, running
from bench.machine import machine_facts


def null_server(tree: Path, work: Path, label: str):
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "bench.serving_ceiling:null_app", "--host", "127.0.0.1", "--port",
               str(port), "--http", "service.connections:GuardedHttpToolsProtocol", "--loop", "uvloop",
               "--no-access-log", "--log-level", "warning", "--lifespan", "off"]
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    return port, running(command, port, work / f"{label}.log", ready_path="/", cwd=tree, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs=2, required=True, metavar="LABEL=CODE")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "response_writes.json")
    args = parser.parse_args(argv)
    trees = {label: Path(code).resolve() for label, code in (t.split("=", 1) for t in args.trees)}
    work = Path(tempfile.mkdtemp(prefix="berth-writes-"))
    result: dict[str, Any] = {"machine": machine_facts(2, ("uvicorn", "uvloop", "httptools")),
                              "clients": args.clients, "seconds": args.seconds, "rounds": {k: [] for k in trees}}
    with ExitStack() as stack:
        servers = {}
        for label, tree in trees.items():
            port, context = null_server(tree, work, label)
            servers[label] = (port, stack.enter_context(context))
        for port, proc in servers.values():  # warm-up, not kept
            hey(port, "/", {"inputs": "x"}, args.clients, 1.0, proc.pid, work)
        for round_ in range(args.rounds):
            for label in list(servers) if round_ % 2 == 0 else list(servers)[::-1]:
                port, proc = servers[label]
                level = hey(port, "/", {"inputs": "x"}, args.clients, args.seconds, proc.pid, work)
                result["rounds"][label].append({k: level[k] for k in ("requests_per_s", "p50_ms", "p99_ms",
                                                                      "server_cpu_ms_per_request")})
    print(f"| code | requests/s (median of {args.rounds}) | server CPU µs a request | p50 ms | p99 ms |\n"
          "|---|---:|---:|---:|---:|")
    for label, rounds in result["rounds"].items():
        median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        result.setdefault("medians", {})[label] = median
        print(f"| {label} | {median['requests_per_s']:.0f} | {1000 * median['server_cpu_ms_per_request']:.0f} | "
              f"{median['p50_ms']:.2f} | {median['p99_ms']:.2f} |")
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
