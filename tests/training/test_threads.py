"""Thread count from the CPU affinity and the cgroup quota (file formats as the kernel's cgroup docs give them)."""

from __future__ import annotations

import os

from tasks.cpu import cgroup_cpu_limit as cgroup_cpu_quota
from tasks.cpu import usable_cpus as usable_cores
from training.threads import default_threads, idle_cores


def affinity() -> int:
    return len(os.sched_getaffinity(0))


def test_cgroup_v2_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs
    assert cgroup_cpu_quota(tmp_path) == 1.5
    assert usable_cores(tmp_path) == min(affinity(), 2)  # rounded up
    (tmp_path / "cpu.max").write_text("max 100000\n")  # no limit
    assert cgroup_cpu_quota(tmp_path) is None
    assert usable_cores(tmp_path) == affinity()
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a CPU still gets one thread
    assert usable_cores(tmp_path) == 1


def test_cgroup_v1_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.0 and usable_cores(tmp_path) == 1


def test_no_cgroup_files_and_unreadable_ones(tmp_path):
    assert cgroup_cpu_quota(tmp_path) is None and usable_cores(tmp_path) == affinity()
    (tmp_path / "cpu.max").write_text("garbage")
    assert cgroup_cpu_quota(tmp_path) is None


def test_busy_cores_are_left_alone(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.1, 0.1))
    assert idle_cores(8) == 8  # a quiet machine: every core
    monkeypatch.setattr(os, "getloadavg", lambda: (3.4, 2.0, 1.0))
    assert idle_cores(8) == 5
    monkeypatch.setattr(os, "getloadavg", lambda: (25.0, 24.0, 20.0))
    assert idle_cores(2) == 1  # oversubscribed: one thread, never zero


def test_torchrun_ranks_share_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_threads(tmp_path) == max(1, affinity() // 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert default_threads(tmp_path) == affinity()
