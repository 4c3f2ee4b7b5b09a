"""The load generator and what is read around it: `hey` runs a closed-loop level against a server on 127.0.0.1,
with the CPU of the generator, of the server and of its event loop, the hypervisor's steal share and, for berth,
its forward passes (from /metrics)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench.local_processes import cpu_seconds


def machine_cpu() -> list[int]:
    """The machine's CPU time by state (/proc/stat: user nice system idle iowait irq softirq steal ...)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def steal_share(before: list[int], after: list[int]) -> float:
    """The share of the machine's CPU time the hypervisor gave to other guests in between (a VM's noise:
    throughput measured at different moments is comparable only at a similar steal share)."""
    spent = [b - a for a, b in zip(before, after)]
    return spent[7] / max(sum(spent), 1) if len(spent) > 7 else 0.0


def hey(port: int, route: str, body: dict, clients: int, seconds: float, server_pid: int, work: Path,
        rate_per_client: float | None = None) -> dict[str, Any]:
    """One closed-loop level: `clients` connections for `seconds`; throughput, latency percentiles,
    status codes, and the CPU share of the generator and of the server (of all the machine's cores).
    `rate_per_client`: each connection sends at most that many requests a second (hey's -q)."""
    payload = work / "body.json"
    payload.write_text(json.dumps(body), encoding="utf-8")
    # -o csv: one row per response, so percentiles are ours (hey's summary omits p99 below 100 responses).
    command = ["hey", "-z", f"{seconds}s", "-c", str(clients), "-t", "30", "-m", "POST", "-T", "application/json",
               "-D", str(payload), "-o", "csv", f"http://127.0.0.1:{port}{route}"]
    if rate_per_client is not None:
        command[1:1] = ["-q", f"{rate_per_client:g}"]
    passes_before = metrics_passes(port)
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the server's main thread runs its event loop: HTTP, validation, tokenization, batching, decoding, JSON
    loop_before = cpu_seconds(server_pid, server_pid)
    machine_before = machine_cpu()
    server_before, begin = cpu_seconds(server_pid), time.perf_counter()
    output = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120, check=True).stdout
    # (requests/s counts the 200 responses over the generator's wall time, its warm-up included)
    wall = time.perf_counter() - begin
    server_cpu = cpu_seconds(server_pid) - server_before
    loop_cpu = cpu_seconds(server_pid, server_pid) - loop_before
    steal = steal_share(machine_before, machine_cpu())
    after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    generator_cpu = (after_children.ru_utime - before_children.ru_utime) + (after_children.ru_stime -
                                                                              before_children.ru_stime)
    cores = os.cpu_count() or 1
    row: dict[str, Any] = {"clients": clients, "seconds": seconds, "wall_s": round(wall, 2),
                           "generator_cpu_share": generator_cpu / (wall * cores),
                           "server_cpu_share": server_cpu / (wall * cores), "steal_share": steal}
    rows = [line.split(",") for line in output.splitlines()[1:] if line.count(",") >= 7]
    seconds_each = np.array([float(r[0]) for r in rows if r[6] == "200"])
    row["requests_per_s"] = len(seconds_each) / wall
    row["responses"] = len(rows)
    row["event_loop_cpu_ms_per_request"] = 1000 * loop_cpu / max(len(rows), 1)
    row["server_cpu_ms_per_request"] = 1000 * server_cpu / max(len(rows), 1)
    for percentile in (50, 95, 99):
        row[f"p{percentile}_ms"] = 1000 * float(np.percentile(seconds_each, percentile)) if len(seconds_each) else None
    row["status"] = {}
    for r in rows:
        row["status"][r[6]] = row["status"].get(r[6], 0) + 1
    passes_after = metrics_passes(port)
    if passes_before and passes_after and passes_after[1] > passes_before[1]:  # berth only: the peer has no metrics
        count = passes_after[1] - passes_before[1]
        row["passes_per_s"] = count / wall
        row["mean_items_per_pass"] = (passes_after[0] - passes_before[0]) / count
    return row


def metrics_passes(port: int) -> tuple[float, float] | None:
    """(items, forward passes) so far, from the server's berth_batch_size histogram (all models); None without it."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (OSError, ValueError):
        return None
    totals = {"berth_batch_size_sum": 0.0, "berth_batch_size_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals["berth_batch_size_sum"], totals["berth_batch_size_count"]


def hey_version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}", "hey"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "hey"
    except OSError:
        return "hey"
