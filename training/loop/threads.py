"""How many CPU threads a training run should use: every core this process may run on that others leave idle.

torch picks its intra-op thread count from the machine's cores, which over-counts inside a container
whose CPU quota is smaller than the host, or a process pinned to a few cores. This counts what the
process can really use: its CPU affinity, capped by a cgroup CPU quota when one is set (v2
`cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), less the cores other processes keep
busy right now, split between the local ranks of a torchrun launch. A run alone on the machine uses
every core.

"Busy right now" is a short sample of the kernel's CPU counters (/proc/stat) on the cores this process
may use, less this process's own CPU time in the same interval. The 1-minute load average is not used:
it remembers the work that ran just before (pip, the previous model of the same build) and counts the
measuring process's own threads, so a build on an idle 2-core machine read it as busy and trained every
model on one core.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from tasks.runtime.cpu import CGROUP_ROOT, usable_cpus

PROC_STAT = Path("/proc/stat")
SAMPLE_SECONDS = 0.5
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuSample:
    """Busy CPU seconds of the machine's cores (those in `cores`), this process's CPU seconds, and when."""

    machine_busy: float
    own: float
    at: float


def read_busy_seconds(cores: set[int], stat: Path = PROC_STAT) -> float:
    """Seconds the listed cores spent on anything but idle and iowait since boot, from /proc/stat's per-CPU
    lines (`cpuN user nice system idle iowait irq softirq steal ...`, in clock ticks)."""
    busy = 0
    for line in stat.read_text().splitlines():
        name, _, fields = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        ticks = [int(v) for v in fields.split()]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        busy += sum(ticks[:8]) - idle  # guest time is already inside user time
    return busy / CLOCK_TICKS


def sample(cores: set[int], stat: Path = PROC_STAT) -> CpuSample:
    times = os.times()
    return CpuSample(read_busy_seconds(cores, stat), times.user + times.system, time.monotonic())


def outside_busy_cores(before: CpuSample, after: CpuSample) -> float:
    """Cores kept busy between the two samples by processes other than this one (never below 0)."""
    elapsed = after.at - before.at
    if elapsed <= 0:
        return 0.0
    others = (after.machine_busy - before.machine_busy) - (after.own - before.own)
    return max(0.0, others / elapsed)


def measure_outside_busy_cores(seconds: float = SAMPLE_SECONDS, stat: Path = PROC_STAT) -> float | None:
    """Sample the cores this process may use for `seconds`; None where /proc/stat cannot be read."""
    try:
        cores = os.sched_getaffinity(0)
        first = sample(cores, stat)
        time.sleep(seconds)
        return outside_busy_cores(first, sample(cores, stat))
    except (AttributeError, OSError, ValueError, IndexError):
        return None


def idle_cores(cores: int, outside_busy: float | None) -> int:
    """Cores not kept busy by other processes: `cores` minus their busy cores (rounded), at least 1.

    Why leave busy cores alone: intra-op threads synchronise at every operator, so on an oversubscribed
    machine a thread that is descheduled stalls the others. Measured side by side on this 2-core machine
    under a heavy outside load (bench/results/finetune_speed.json): 2 threads ran a fine-tuning step 3-4x
    slower than 1.
    """
    if outside_busy is None:
        return cores
    return max(1, min(cores, cores - round(outside_busy)))


def default_threads(root: Path = CGROUP_ROOT, outside_busy: float | None = None) -> int:
    """Threads per process: the usable cores that others leave idle, shared by the processes torchrun started
    here. `outside_busy` is measured when not given."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    cores = usable_cpus(root)
    if outside_busy is None:
        outside_busy = measure_outside_busy_cores()
    return max(1, idle_cores(cores, outside_busy) // max(1, local_ranks))
