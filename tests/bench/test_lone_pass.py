"""The lone-pass benchmark on a real bundle: the three spinning settings as the service builds them, each timed, and
the one that spins between passes seen keeping a core busy after a pass while the default leaves it idle."""

from __future__ import annotations

from bench.lone_pass import SETTINGS, measure, table
from tasks.runtime.onnx_session import memory_policy


def test_each_spinning_setting_is_timed_and_only_spinning_between_passes_burns_cpu_after_one(bundle_repository):
    policy = memory_policy()
    rows = measure(bundle_repository / "sentiment", ["classify-short"], [1.0, 20.0], after_ms=30.0, rounds=1,
                   passes=2, threads=2)
    assert memory_policy() == policy  # the service's policy was the bench's sessions' alone, not the process's
    assert [row["setting"] for row in rows] == list(SETTINGS)
    for row in rows:
        assert row["input"] == "classify-short" and row["tokens"] > 2
        assert set(row["pass_ms_after_idle"]) == {"1.0", "20.0"} and min(row["pass_ms_after_idle"].values()) > 0
        assert row["tokenize_us_back_to_back"] > 0 and row["tokenize_us_right_after_a_pass"] > 0
    busy = {row["setting"]: row["cores_busy_after_a_pass"] for row in rows}
    default, spinning = busy["spin in pass, stop after (default)"], busy["spin between passes (--ort-spinning)"]
    # ONNX Runtime's own spin keeps a thread on a core for tens of milliseconds after a pass; the default stops it
    assert spinning > 0.3 > default, busy
    printed = table({"args": {"idle_ms": [1.0, 20.0], "after_ms": 30.0}, "rows": rows})
    assert printed.count("\n| sentiment | classify-short") == 3
