"""How many cores this process may really use: the CPU affinity mask, capped by a cgroup CPU quota.

`os.cpu_count()` reports the host's cores even in a container limited to one (`docker run --cpus 1`,
a Kubernetes CPU limit); sizing thread pools by it oversubscribes the quota and the kernel throttles
the whole process. Import `usable_cpus` wherever a thread count is chosen (the service, training, `berth
predict`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """min(cores in this process's affinity mask, ceil(cgroup quota / period)), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cgroup_root)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def cgroup_cpu_limit(cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota in cores (e.g. 1.5), or None when no quota is set or none can be read.

    cgroup v2: `cpu.max` holds "<quota> <period>" or "max <period>". cgroup v1: `cpu/cpu.cfs_quota_us`
    (-1 = none) and `cpu/cpu.cfs_period_us`."""
    v2 = cgroup_root / "cpu.max"
    try:
        if v2.is_file():
            quota, _, period = v2.read_text().strip().partition(" ")
            if quota == "max":
                return None
            return int(quota) / int(period or 100_000)
        for folder in (cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"):
            quota_file, period_file = folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"
            if quota_file.is_file() and period_file.is_file():
                quota_us = int(quota_file.read_text().strip())
                if quota_us <= 0:
                    return None
                return quota_us / int(period_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return None
