"""Span ends extended over whole grapheme clusters, and the usable-core count under a cgroup quota.
Expectations are written by hand from the Unicode definitions (UAX #29) and the cgroup file formats."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from service.compute_slots import ComputeSlots
from tasks.runtime.cpu import cgroup_cpu_limit, usable_cpus
from tasks.runtime.graphemes import extend_end

WOMAN_TECHNOLOGIST = "\U0001F469\u200d\U0001F4BB"  # 👩‍💻: woman, ZWJ, laptop
THUMBS_UP_DARK = "\U0001F44D\U0001F3FF"  # 👍🏿
HEART = "\u2764\ufe0f"  # ❤️ (VS16)
FLAGS = "\U0001F1EB\U0001F1F7\U0001F1E9\U0001F1EA"  # 🇫🇷🇩🇪


@pytest.mark.parametrize(("text", "end", "gold"), [
    ("Pari\u0301s x", 4, 5),  # combining acute after i
    ("Paris\u0301 x", 5, 6),
    ("Paris\u0301\u0327 x", 5, 7),  # two combining marks
    ("I " + HEART + " it", 3, 4),  # the heart without its VS16
    ("a " + WOMAN_TECHNOLOGIST + " b", 3, 5),  # cut after the woman: the ZWJ and the laptop join
    ("a " + WOMAN_TECHNOLOGIST + " b", 4, 5),  # cut after the ZWJ
    ("ok " + THUMBS_UP_DARK, 4, 5),  # skin tone
    (FLAGS, 1, 2),  # inside the French flag
    (FLAGS, 2, 2),  # between two flags: already a boundary
    (FLAGS, 3, 4),  # inside the German flag
    ("plain text", 5, 5),
    ("end", 3, 3),
    ("", 0, 0),
])
def test_span_ends_never_split_a_grapheme_cluster(text, end, gold):
    assert extend_end(text, end) == gold


def _cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    return tmp_path


def test_cgroup_v2_quota_caps_the_cores(tmp_path):
    root = _cgroup(tmp_path, {"cpu.max": "150000 100000\n"})
    assert cgroup_cpu_limit(root) == 1.5
    assert usable_cpus(root) == min(len(__import__("os").sched_getaffinity(0)), 2)
    assert usable_cpus(_cgroup(tmp_path / "one", {"cpu.max": "50000 100000\n"})) == 1


def test_cgroup_v2_without_quota_and_v1_formats(tmp_path):
    import os

    cores = len(os.sched_getaffinity(0))
    assert cgroup_cpu_limit(_cgroup(tmp_path / "max", {"cpu.max": "max 100000\n"})) is None
    assert usable_cpus(tmp_path / "max") == cores
    v1 = _cgroup(tmp_path / "v1", {"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(v1) == 1.0 and usable_cpus(v1) == 1
    unlimited = _cgroup(tmp_path / "v1u", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_limit(unlimited) is None
    assert cgroup_cpu_limit(tmp_path / "absent") is None and usable_cpus(tmp_path / "absent") == cores


def test_compute_slots_never_hand_out_more_units_than_cores_and_a_wide_pass_falls_back_at_once():
    slots = ComputeSlots(2)
    with slots.hold(1) as held:
        assert held == 1 and slots.busy == 1
        with slots.hold(2, or_else=1) as fallback:  # both cores asked, one free: take one now, do not wait
            assert fallback == 1 and slots.busy == 2
        got = threading.Event()

        def wide() -> None:
            with slots.hold(2):
                got.set()

        waiter = threading.Thread(target=wide)
        waiter.start()
        assert not got.wait(0.2)  # two units without a fallback wait while one is held
    assert got.wait(5)  # ... and get them once it is released
    waiter.join()
    with slots.hold(2, or_else=1) as held:
        assert held == 2  # all free: the wide pass gets every core
    assert slots.busy == 0
