import json
from pathlib import Path

import pytest

from bench import minutes_table

REFERENCE = Path(__file__).resolve().parents[2] / "bench/results/defaults_build/build_record-reuse.json"


def _point(examples: int, value: float, dev: str = "topics/dev.jsonl") -> dict:
    return {"model": "topics", "variant": "main", "steps": examples // 16, "examples_seen": examples,
            "examples_per_s": 40.0, "precision": "fp32", "threads": 2, "dev": dev, "dev_examples": 750,
            "dev_metrics": {"accuracy": value}, "value": value}


def test_fixed_step_points_on_a_line_give_its_slope_a_minute_at_the_reference_speed(tmp_path):
    # 0.02 accuracy per 1,000 examples; the reference build trained topics at 60.28 examples/s.
    points = tmp_path / "points.json"
    points.write_text(json.dumps({"points": [_point(1000, 0.60), _point(2000, 0.62), _point(3000, 0.64),
                                             _point(2500, 0.10, dev="another/dev.jsonl")]}))
    empty = tmp_path / "build_record.json"
    empty.write_text(json.dumps({"models": []}))
    result = minutes_table.main([str(empty), "--reference", str(REFERENCE), "--points", str(points),
                                 "--out", str(tmp_path / "table.json")])
    (topics,) = [row for row in result["rows"] if row["model"] == "topics"]
    assert [p["examples_seen"] for p in topics["points"]] == [1000, 2000, 3000]  # the other dev set's left out
    assert topics["slope_per_minute"] == pytest.approx(0.02 / 1000 * 60.28 * 60, rel=1e-3)
    assert topics["span_minutes"] == pytest.approx(2000 / (60.28 * 60), rel=1e-3)
    assert [row["model"] for row in result["rows"]] == ["topics"]  # no points, no row
