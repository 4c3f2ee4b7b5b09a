"""How many cores this process may really use: the CPU affinity mask, capped by a cgroup CPU quota.

`os.cpu_count()` reports the host's cores even in a container limited to one (`docker run --cpus 1`,
a Kubernetes CPU limit); sizing thread pools by it oversubscribes the quota and the kernel throttles
the whole process. Import `usable_cpus` wherever a thread count is chosen, and share one `ComputeSlots` of
that many units among the forward passes of a process.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


class ComputeSlots:
    """The process's cores as units that forward passes hold while they run (a pass on n ONNX Runtime threads
    holds n), so the passes of all models together never run more ORT threads than there are cores: an extra
    thread would not add compute, it would make every pass wait for its descheduled straggler."""

    def __init__(self, units: int):
        self.units = max(1, units)
        self._free = self.units
        self._changed = threading.Condition()

    @property
    def busy(self) -> int:
        """Units held right now (a hint for the event loop: read without the lock)."""
        return self.units - self._free

    @contextmanager
    def hold(self, units: int, or_else: int | None = None) -> Iterator[int]:
        """Hold `units` (waiting until they are free) and yield how many are held; with `or_else`, hold `units`
        only if they are free right now, else wait for `or_else` (so a wide pass never waits behind narrow ones)."""
        units = min(max(1, units), self.units)
        with self._changed:
            if or_else is not None and self._free < units:
                units = min(max(1, or_else), self.units)
            self._changed.wait_for(lambda: self._free >= units)
            self._free -= units
        try:
            yield units
        finally:
            with self._changed:
                self._free += units
                self._changed.notify_all()
