"""The ceiling benchmark's two pieces of its own: the do-nothing server (under real uvicorn on 127.0.0.1) and the
ceiling's arithmetic (figures worked out by hand)."""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.serving_ceiling import ceiling, engine_rate, markdown, markdown_row, median_round, null_server


def test_the_do_nothing_server_answers_posts_with_a_fixed_json() -> None:
    with tempfile.TemporaryDirectory() as work:
        port, context = null_server(Path(work))
        with context:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/classify", method="POST",
                                             data=json.dumps({"inputs": "a fine film"}).encode(),
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200 and json.loads(response.read()) == {"ok": True}
            with pytest.raises(urllib.error.HTTPError) as missing:  # berth's load tool reads /metrics: none here
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
            assert missing.value.code == 404


def test_the_ceiling_shares_the_cores_between_engine_and_http() -> None:
    engine = {"best_requests_per_s": 500.0, "batch1_p50_ms": 4.0}
    # 2 ms + 1/27,500 s of the machine a request: 1 / 0.0020364 s = 491.07 requests/s
    assert ceiling(engine, {"requests_per_s": 27_500.0}, 32)["requests_per_s"] == pytest.approx(491.07, abs=0.01)
    # one client: the engine's batch-1 time, then the HTTP round trip: 4.0 + 0.25 ms
    assert ceiling(engine, {"p50_ms": 0.25}, 1) == pytest.approx({"requests_per_s": 1000 / 4.25, "p50_ms": 4.25})


def test_rounds_keep_each_trees_median_window_and_list_every_window() -> None:
    windows = [{"requests_per_s": rate, "event_loop_cpu_ms_per_request": loop, "p50_ms": 100.0, "p99_ms": 150.0}
               for rate, loop in ((240.0, 1.0), (250.0, 0.9), (230.0, 1.1), (260.0, 0.8))]
    assert median_round(windows[:3]) is windows[0]  # 230, 240, 250: the middle one
    assert median_round(windows) is windows[0]  # 230, 240, 250, 260: the lower middle one
    row = {"model": "classify", "precision": "int8", "input": "classify-short", "tokens": 24, "clients": 32,
           "engine": {"best_requests_per_s": 300.0, "best_batch": 16, "batch1_p50_ms": 7.0},
           "null": {"requests_per_s": 9000.0, "p50_ms": 2.5}, "ceiling": {"requests_per_s": 290.0},
           "berth": {"after": median_round(windows)}, "berth_rounds": {"after": windows}}
    result = {"machine": {"cpu_model": "x", "logical_cores": 2, "cpu_flags": ["avx2"]}, "started_load_average": [0.5],
              "rows": [row]}
    printed = markdown(result)
    assert "| after | 240 | 0.83 |" in printed  # the median window in the main table: 240 / 290 of the ceiling
    assert printed.endswith("| classify | classify-short | 32 | after | 240, 250, 230, 260 | 1.00, 0.90, 1.10, 0.80 |")


def test_engine_measured_again_each_round_sets_the_ceiling_by_its_median() -> None:
    engine = {"best_requests_per_s": 320.0, "best_batch": 8, "batch1_p50_ms": 7.0}
    null = {"requests_per_s": 8000.0, "p50_ms": 2.5}
    row = {"model": "classify", "precision": "int8", "input": "classify-short", "tokens": 24, "clients": 32,
           "engine": engine, "null": null, "engine_rounds": [290.0, 310.0, 280.0, 300.0, 305.0]}
    assert engine_rate(row) == 300.0  # the median of five windows, not the scan's 320
    row["ceiling"] = ceiling(engine, null, 32, engine_rate(row))
    assert row["ceiling"]["requests_per_s"] == pytest.approx(1 / (1 / 300 + 1 / 8000), abs=0.01)  # 289.16
    row["berth"] = {"after": {"requests_per_s": 260.0, "p50_ms": 120.0, "p99_ms": 200.0}}
    printed = markdown_row(row, ["after"])
    # the engine column: the median (the scan's best) (batch) / batch-1 ms; 260 / 289.16 = 0.90 of the ceiling,
    # 260 / 300 = 0.87 of the engine
    assert "| 300 (scan 320) (8) / 7.00 | 8000 / 2.50 | 289 | after | 260 | 0.90 | 0.87 |" in printed
    assert engine_rate({"engine": engine}) == 320.0  # one window per tree: the scan's best, as before


def test_the_paced_do_nothing_server_leaves_berths_own_event_loop_cost() -> None:
    row = {"model": "classify", "precision": "int8", "input": "classify-short", "tokens": 24, "clients": 32,
           "engine": {"best_requests_per_s": 300.0, "best_batch": 16, "batch1_p50_ms": 7.0},
           "null": {"requests_per_s": 9000.0, "p50_ms": 2.5}, "ceiling": {"requests_per_s": 290.0},
           "berth": {"after": {"requests_per_s": 224.0, "p50_ms": 140.0, "p99_ms": 230.0,
                               "event_loop_cpu_ms_per_request": 1.15}},
           "null_paced": {"requests_per_s": 223.6, "event_loop_cpu_ms_per_request": 0.13}}
    result = {"machine": {"cpu_model": "x", "logical_cores": 2, "cpu_flags": ["avx2"]}, "started_load_average": [0.5],
              "rows": [row]}
    # 1.15 - 0.13 = 1.02 ms of event loop a request is berth's own
    assert markdown(result).endswith("| classify | classify-short | 32 | 224 | 0.130 | after | 1.150 | 1.020 |")
