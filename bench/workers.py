"""`berth serve --workers N` on this machine, and where one event loop saturates on larger ones.

1. One short-input workload (one ~10-word sentence a request, closed loop, `hey`) against `--workers 1` and
   `--workers 2` in one run: requests/s and latency percentiles.
2. One run of `--workers 1` with ONNX Runtime on one thread (`--threads 1 --parallel-passes 1`) and the
   server's threads pinned: the main thread (the event loop: HTTP, validation, tokenizing short inputs,
   batching, decoding, JSON) alone on core 0, every other thread (the forward passes, tokenizer threads) on
   core 1. From it, the CPU a request costs on the loop (c_loop) and elsewhere (c_rest): a loop saturates at 1
   / c_loop requests/s, the rest at cores_for_passes / c_rest; the prediction min(1 / c_loop, 1 / c_rest) is
   checked against the requests/s measured in that run. On C cores one process is limited by its loop once (C
   - 1) / c_rest > 1 / c_loop, i.e. from C = 1 + c_rest / c_loop cores: the cores per worker of the rule.

    python -m bench.workers --models models --model sentiment --out bench/results/workers.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.load_tools import hey
from bench.local_processes import REPO, cpu_seconds, free_port, running
from bench.machine import machine_facts

SENTENCE = "The service answered quickly and the results were exactly what we hoped for."


def server(repository: Path, model: str, work: Path, args: list[str], tag: str):
    port = free_port()
    command = [sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--model", model,
               "--port", str(port), "--log-level", "warning", *args]
    return port, running(command, port, work / f"workers-{tag}.log")


def pin(pid: int, stop: threading.Event) -> None:
    """The main thread on core 0, every other thread on core 1, again every 0.2 s (threads started later
    inherit the affinity of the thread that started them)."""
    while not stop.is_set():
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.sched_setaffinity(int(task.name), {0} if int(task.name) == pid else {1})
            except (ProcessLookupError, OSError):
                pass
        stop.wait(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--model", required=True, help="a classification bundle of --models")
    parser.add_argument("--route", default="/v1/classify")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "workers.json")
    args = parser.parse_args(argv)
    work = args.out.parent / "workers-logs"
    work.mkdir(parents=True, exist_ok=True)
    body = {"inputs": SENTENCE, "model": args.model}
    result: dict[str, Any] = {"machine": machine_facts(os.cpu_count()), "repository": str(args.models),
                              "model": args.model, "route": args.route, "clients": args.clients, "rows": []}
    for workers in (1, 2):
        port, running_server = server(args.models, args.model, work, ["--workers", str(workers)],
                                      f"n{workers}")
        with running_server as proc:
            hey(port, args.route, body, args.clients, 2.0, proc.pid, work)  # connections and shapes warmed
            row = hey(port, args.route, body, args.clients, args.seconds, proc.pid, work)
        row = {k: v for k, v in row.items() if workers == 1 or "cpu" not in k}  # CPU: the parent process only
        result["rows"].append({"workers": workers, **row})
        print(f"--workers {workers}: {row['requests_per_s']:.0f} req/s, p50 {row['p50_ms']:.1f} ms, "
              f"p99 {row['p99_ms']:.1f} ms, status {row['status']}", flush=True)

    port, running_server = server(args.models, args.model, work, ["--workers", "1", "--threads", "1",
                                                                 "--parallel-passes", "1"], "pinned")
    with running_server as proc:
        stop = threading.Event()
        pinner = threading.Thread(target=pin, args=(proc.pid, stop), daemon=True)
        pinner.start()
        time.sleep(0.5)
        hey(port, args.route, body, args.clients, 2.0, proc.pid, work)
        total_before, loop_before = cpu_seconds(proc.pid), cpu_seconds(proc.pid, proc.pid)
        row = hey(port, args.route, body, args.clients, args.seconds, proc.pid, work)
        total, loop = cpu_seconds(proc.pid) - total_before, cpu_seconds(proc.pid, proc.pid) - loop_before
        stop.set()
        pinner.join()
    answered = max(row["responses"], 1)
    c_loop, c_rest = loop / answered, (total - loop) / answered
    model = {"loop_cpu_ms_per_request": 1000 * c_loop, "other_cpu_ms_per_request": 1000 * c_rest,
             "loop_saturates_at_rps": 1 / c_loop, "passes_core_saturates_at_rps": 1 / c_rest,
             "predicted_rps": min(1 / c_loop, 1 / c_rest), "measured_rps": row["requests_per_s"],
             "loop_core_busy_share": loop / row["wall_s"],
             "passes_core_busy_share": (total - loop) / row["wall_s"],
             "cores_per_loop": 1 + c_rest / c_loop}
    result["pinned"] = {**row, **model}
    print(f"pinned: loop {model['loop_cpu_ms_per_request']:.2f} ms/request (saturates at "
          f"{model['loop_saturates_at_rps']:.0f}/s), other threads "
          f"{model['other_cpu_ms_per_request']:.2f} ms/request "
          f"(saturate at {model['passes_core_saturates_at_rps']:.0f}/s); predicted "
          f"{model['predicted_rps']:.0f}/s, "
          f"measured {model['measured_rps']:.0f}/s; one loop keeps {model['cores_per_loop']:.1f} cores busy",
          flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
