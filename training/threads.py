"""How many CPU threads a training run should use: every core this process may run on.

torch picks its intra-op thread count from the machine's cores, which over-counts inside a container
whose CPU quota is smaller than the host, or a process pinned to a few cores. This counts what the
process can really use: its CPU affinity, capped by a cgroup CPU quota when one is set (v2
`cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), less the cores other processes keep
busy (the load average), split between the local ranks of a torchrun launch. A run alone on the
machine uses every core.
"""

from __future__ import annotations

import os
from pathlib import Path

from tasks.cpu import CGROUP_ROOT, usable_cpus


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
    return max(1, idle_cores(usable_cpus(root)) // max(1, local_ranks))
