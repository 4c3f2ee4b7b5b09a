"""HTTP front benchmark: berth's app behind uvicorn (as `berth serve` runs it) and granian, side by side.

granian is an HTTP server written in Rust that runs ASGI apps; the question is whether it serves berth's app
faster than uvicorn (with httptools and uvloop, as `berth serve` runs it). Both servers load the same model
repository and stay up together (the idle one sleeps); every level is measured on each in turn, the order
swapped every round, under `hey` (closed loop, 127.0.0.1 only, bounded in time), with the load benchmark's own
workloads and measurement (bench/service_load.py). granian need not be installed in berth's venv:
`--granian-path` puts a folder holding it first on the server's PYTHONPATH (e.g. `pip install --no-deps
--target /tmp/granian-pkgs granian`).

    .venv/bin/python -m bench.http_front --models /tmp/repo --granian-path /tmp/granian-pkgs \
        --workloads classify-short embed --concurrency 1 32 --seconds 8 --rounds 2

Writes bench/results/http_front-granian.json (machine facts, every level, medians per server) and prints
a table.
granian runs one worker with one runtime thread and uvloop (`berth serve` is one process with one event loop
too); uvicorn runs exactly as `berth serve` does (with its head deadline and connection cap).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.load_tools import hey, hey_version
from bench.local_processes import REPO, free_port, running, serve_repository
from bench.machine import machine_facts
from bench.service_load import RESULTS, _print_level, workloads
from tasks.registry import definition

LIBRARIES = ("onnxruntime", "fastapi", "uvicorn", "uvloop", "httptools", "granian")


def app_from_env():
    """The ASGI app `berth serve` builds, from `BERTH_*` variables (granian's `--factory` target)."""
    from service.app import create_app
    from service.runtime import Runtime
    from service.settings import ServiceSettings

    settings = ServiceSettings.from_env()
    os.environ.setdefault("RAYON_NUM_THREADS", str(settings.tokenizer_threads))
    runtime = Runtime(settings)
    runtime.discover()
    return create_app(settings, runtime)


def granian_server(repository: Path, threads: int, work: Path, granian_path: Path | None):
    """(port, a context manager running berth's app under granian: one worker, one runtime thread, uvloop)."""
    port = free_port()
    env = {
        **os.environ,
        "BERTH_MODELS": str(repository),
        "BERTH_INTRA_OP_THREADS": str(threads),
        "BERTH_LOG_LEVEL": "warning",
        "PYTHONPATH": os.pathsep.join(p for p in (str(granian_path or ""), str(REPO)) if p),
    }
    command = [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        "asgi",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--runtime-threads",
        "1",
        "--loop",
        "uvloop",
        "--http",
        "1",
        "--no-ws",
        "--log-level",
        "warning",
        "bench.http_front:app_from_env",
    ]
    return port, running(command, port, work / "granian.log", env=env)


def worker_pid(pid: int) -> int:
    """granian's one worker process (a child of the process started): the server's CPU and event loop."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"granian ({pid}) has {len(children)} child processes, expected its one worker")
    return int(children[0])


def granian_version(granian_path: Path | None) -> str:
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(granian_path or "")}
    out = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('granian'))"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return out.stdout.strip() or "not installed"


def summarize(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, clients): each server's median req/s, p50 and p99 over the rounds; granian ÷ uvicorn."""
    groups: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
    for level in levels:
        groups.setdefault((level["workload"], level["clients"]), {}).setdefault(level["server"], []).append(
            level
        )
    rows = []
    for (name, clients), servers in groups.items():
        row: dict[str, Any] = {"workload": name, "clients": clients}
        for server, runs in servers.items():
            for key in ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_share"):
                row[f"{server}_{key}"] = statistics.median(r[key] for r in runs if r.get(key) is not None)
            row[f"{server}_rounds"] = [round(r["requests_per_s"], 1) for r in runs]
        if "uvicorn_requests_per_s" in row and "granian_requests_per_s" in row:
            row["granian_over_uvicorn"] = row["granian_requests_per_s"] / row["uvicorn_requests_per_s"]
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | clients | uvicorn req/s (each round) | granian req/s (each round) | "
        "granian ÷ uvicorn | "
        "p50 ms uvicorn / granian | p99 ms uvicorn / granian | server CPU uvicorn / granian |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['clients']} | "
            f"{r['uvicorn_requests_per_s']:.1f} ({r['uvicorn_rounds']}) | "
            f"{r['granian_requests_per_s']:.1f} ({r['granian_rounds']}) | {r['granian_over_uvicorn']:.2f} | "
            f"{r['uvicorn_p50_ms']:.1f} / {r['granian_p50_ms']:.1f} | {r['uvicorn_p99_ms']:.1f} / "
            f"{r['granian_p99_ms']:.1f} | {100 * r['uvicorn_server_cpu_share']:.0f}% / "
            f"{100 * r['granian_server_cpu_share']:.0f}% |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.bundle import find_bundles
    from tasks.runtime.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="the model repository both servers serve")
    parser.add_argument("--granian-path", type=Path, help="a folder holding granian, put first on PYTHONPATH")
    parser.add_argument("--workloads", nargs="+", default=["classify-short", "embed"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2, help="each level this many times per server")
    parser.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench-http-front")
    parser.add_argument("--out", type=Path, default=RESULTS / "http_front-granian.json")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    bundle = load_bundle(next(iter(find_bundles(args.models))))
    chosen = {
        k: v for k, v in workloads(load_tokenizer(bundle.tokenizer_path)).items() if k in args.workloads
    }
    result: dict[str, Any] = {
        "machine": machine_facts(args.threads, LIBRARIES),
        "generator": hey_version(),
        "granian": granian_version(args.granian_path),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_average_start": list(os.getloadavg()),
        "levels": [],
    }
    with ExitStack() as stack:
        uvicorn_port, uvicorn = serve_repository(args.models, args.threads, args.work, [])
        granian_port, granian = granian_server(args.models, args.threads, args.work, args.granian_path)
        servers = {
            "uvicorn": (uvicorn_port, stack.enter_context(uvicorn).pid),
            "granian": (granian_port, worker_pid(stack.enter_context(granian).pid)),
        }
        for round_number in range(args.rounds):
            order = list(servers) if round_number % 2 == 0 else list(servers)[::-1]
            for name, load in chosen.items():
                route = load.get("route") or definition(load["task"]).route
                for clients in args.concurrency:
                    for server in order:
                        port, pid = servers[server]
                        row = hey(port, route, load["body"], clients, args.seconds, pid, args.work)
                        row |= {"server": server, "workload": name, "round": round_number}
                        result["levels"].append(row)
                        _print_level(server, f"round {round_number}", name, row)
    result["load_average_end"] = list(os.getloadavg())
    result["summary"] = summarize(result["levels"])
    table = markdown(result["summary"])
    result["table_markdown"] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("\n" + table + f"\n\ngranian {result['granian']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
