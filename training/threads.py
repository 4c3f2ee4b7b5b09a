"""How many CPU threads a training run should use: every core this process may run on.

torch picks its intra-op thread count from the machine's cores, which over-counts inside a container
whose CPU quota is smaller than the host, or a process pinned to a few cores. This counts what the
process can really use: its CPU affinity, capped by a cgroup CPU quota when one is set (v2
`cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), less the cores other processes keep
busy (the load average), split between the local ranks of a torchrun launch. A run alone on the
machine uses every core.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time the cgroup may use per period (e.g. 1.5), or None when unlimited / unknown."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        v1 = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
        if v1[0].is_file() and v1[1].is_file():
            quota, period = int(v1[0].read_text()), int(v1[1].read_text())
            return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None
    return None


def usable_cores(root: Path = CGROUP_ROOT) -> int:
    """Cores in this process's affinity mask, capped by the cgroup quota (rounded up), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def idle_cores(cores: int) -> int:
    """Cores not already busy: `cores` minus the 1-minute load average (rounded), at least 1.

    Why: intra-op threads synchronise at every operator, so on an oversubscribed machine a thread that
    is descheduled stalls the others. Measured side by side on this 2-core machine at a load average of
    ~25 (bench/results/finetune_speed.json): 2 threads ran a fine-tuning step 3-4x slower than 1.
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return cores
    return max(1, min(cores, cores - round(load)))


def default_threads(root: Path = CGROUP_ROOT) -> int:
    """Threads per process: the usable cores that are idle, shared by the processes torchrun started here."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, idle_cores(usable_cores(root)) // max(1, local_ranks))
