"""Thread count from the CPU affinity and the cgroup quota (file formats as the kernel's cgroup docs give them)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from tasks.runtime.cpu import cgroup_cpu_limit as cgroup_cpu_quota
from tasks.runtime.cpu import usable_cpus as usable_cores
from training.loop import threads
from training.loop.threads import default_threads, idle_cores


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


def test_busy_cores_are_left_alone():
    assert idle_cores(8, 0.2) == 8  # a quiet machine: every core
    assert idle_cores(8, 3.4) == 5
    assert idle_cores(2, 25.0) == 1  # oversubscribed: one thread, never zero
    assert idle_cores(4, None) == 4  # nothing to read: every core


def test_torchrun_ranks_share_the_cores(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_threads(tmp_path, outside_busy=0.0) == max(1, affinity() // 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert default_threads(tmp_path, outside_busy=0.0) == affinity()


# Two per-CPU lines as the kernel's proc(5) page lays them out: user nice system idle iowait irq softirq steal
# guest guest_nice, in clock ticks. cpu1 is left out of the affinity set below, so its ticks must not count.
STAT_BEFORE = """cpu  900 0 300 5000 100 0 0 0 0 0
cpu0 400 0 100 2000 50 0 0 0 0 0
cpu1 500 0 200 3000 50 0 0 0 0 0
intr 12345
"""
STAT_AFTER = """cpu  1400 0 400 5400 100 0 0 0 0 0
cpu0 700 0 150 2050 90 10 5 5 0 0
cpu1 700 0 250 3350 10 0 0 0 0 0
intr 12399
"""


def test_busy_seconds_read_only_the_allowed_cores(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT_BEFORE)
    before = threads.read_busy_seconds({0}, stat)
    stat.write_text(STAT_AFTER)
    after = threads.read_busy_seconds({0}, stat)
    # cpu0 busy ticks: (400+100) before, (700+150+10+5+5) after: 370 ticks; iowait is idle time.
    assert after - before == pytest.approx(370 / threads.CLOCK_TICKS)


def test_own_cpu_time_is_not_outside_load():
    before = threads.CpuSample(machine_busy=100.0, own=10.0, at=0.0)
    after = threads.CpuSample(machine_busy=103.0, own=11.5, at=2.0)  # 3 busy core-seconds, 1.5 of them ours
    assert threads.outside_busy_cores(before, after) == pytest.approx(0.75)
    ours_only = threads.CpuSample(machine_busy=102.0, own=12.0, at=1.0)
    assert threads.outside_busy_cores(before, ours_only) == 0.0


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def test_a_build_s_own_work_keeps_every_core_and_an_outside_load_does_not():
    """Real load on the real counters: this process's own busy threads (a build training its previous model)
    do not count; two outside processes spinning do."""
    cores = len(os.sched_getaffinity(0))
    quiet = threads.measure_outside_busy_cores(0.5)
    if quiet is None:
        pytest.skip("no /proc/stat to sample")
    if quiet > 0.5:
        pytest.skip(f"the machine is already busy ({quiet:.2f} cores in use by others): nothing to tell apart")
    stop = threading.Event()
    spinners = [threading.Thread(target=_spin, args=(stop,), daemon=True) for _ in range(2)]
    for spinner in spinners:
        spinner.start()
    try:
        own = threads.measure_outside_busy_cores(1.0)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    assert own is not None and own < 0.5, own
    outside = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.3)
        busy = threads.measure_outside_busy_cores(1.0)
    finally:
        for process in outside:
            process.kill()
            process.wait()
    assert busy is not None and busy > min(cores, 2) - 0.7, busy
    assert threads.idle_cores(cores, busy) < cores or cores == 1
