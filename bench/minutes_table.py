"""What a minute of training buys each default: dev metric against examples seen (and the minutes they take at
a reference build's measured speed), from build records, with the slope per minute in units of the dev set's
standard error (bench/dev_set_errors.py), so that metrics on different scales compare.

Each build record is one point per model: the examples it saw in its budget and its dev figure. The slope is a
least-squares line through a model's points (examples seen -> dev metric), with its own standard error (points
that span a fraction of a minute give a slope too uncertain to act on); a minute is the reference record's
examples/s times 60. A model that trained on every example for its epochs within its budget (its `why` says
"every example") cannot buy more with more minutes: its slope is not fitted.

    B=bench/results/defaults_build; .venv/bin/python -m bench.minutes_table $B/build_record-avx2-held.json \\
        $B/build_record-budget-first.json $B/build_record-idle.json $B/build_record-rerun.json \\
        $B/build_record-reuse.json --reference $B/build_record-reuse.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.dev_set_errors import standard_error


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", type=Path, nargs="+", help="build records (build_record.json)")
    parser.add_argument("--reference", type=Path, required=True, help="the build whose speed turns examples into "
                        "minutes and whose dev figures size the standard errors")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON (derived from the build "
                        "records, so bench/results keeps only those)")
    args = parser.parse_args(argv)

    reference = {m["name"]: m for m in json.loads(args.reference.read_text(encoding="utf-8"))["models"]}
    points: dict[str, list[dict]] = {}
    for path in args.records:
        record = json.loads(path.read_text(encoding="utf-8"))
        for model in record["models"]:
            if "sizing" not in model:
                continue
            sizing = model["sizing"]
            points.setdefault(model["name"], []).append({
                "record": path.name, "started_at": record["started_at"], "budget_minutes": sizing["budget_minutes"],
                "examples_seen": sizing["examples_seen"], "examples_per_s": sizing["examples_per_s"],
                "precision": sizing["precision"], "threads": sizing["threads"], "dev": model["dev"],
                "dev_examples": model["dev_examples"], "value": model["quality"]["value"],
                "every_example": sizing["why"].startswith("every example")})
    rows = []
    for name, model in reference.items():
        metric, sizing = model["quality"]["metric"], model["sizing"]
        error, _ = standard_error(metric, model["quality"]["value"], model["dev_metrics"], model["dev_examples"])
        per_minute = sizing["examples_per_s"] * 60
        same_dev = [p for p in points.get(name, []) if p["dev"] == model["dev"]]
        seen = np.array([p["examples_seen"] for p in same_dev], dtype=float)
        values = np.array([p["value"] for p in same_dev], dtype=float)
        saturated = sizing["why"].startswith("every example")
        slope = slope_error = None
        if len(same_dev) >= 4 and np.ptp(seen) > 0 and not saturated:
            fit, covariance = np.polyfit(seen, values, 1, cov=True)
            slope, slope_error = float(fit[0]), float(np.sqrt(covariance[0, 0]))
        rows.append({"model": name, "metric": metric, "standard_error": error, "reference_examples_per_minute":
                     per_minute, "reference_budget_minutes": sizing["budget_minutes"], "saturated": saturated,
                     "slope_per_minute": slope * per_minute if slope is not None else None,
                     "slope_per_minute_se": slope_error * per_minute if slope is not None else None,
                     "span_minutes": float(np.ptp(seen)) / per_minute if len(same_dev) else 0.0,
                     "slope_per_minute_in_standard_errors": slope * per_minute / error if slope is not None else None,
                     "points": sorted(same_dev, key=lambda p: p["examples_seen"])})
    result = {"reference": str(args.reference), "records": [str(p) for p in args.records], "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = ["| model | budget (min) | examples a minute | dev points: examples seen → metric | points span (min) "
             "| dev s.e. | slope a minute (± its s.e.) | in dev s.e. a minute |", "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        shown = ", ".join(f"{p['examples_seen']:,} → {p['value']:.4g}" for p in row["points"])
        if row["saturated"]:
            slope = gain = "— (every example within the budget)"
        elif row["slope_per_minute"] is None:
            slope = gain = "— (too few points)"
        else:
            slope = f"{row['slope_per_minute']:+.3g} (± {row['slope_per_minute_se']:.2g})"
            gain = f"{row['slope_per_minute_in_standard_errors']:+.2f}"
        lines.append(f"| {row['model']} | {row['reference_budget_minutes']:g} | "
                     f"{row['reference_examples_per_minute']:,.0f} | {shown} | {row['span_minutes']:.2f} | "
                     f"{row['standard_error']:.3g} | {slope} | "
                     f"{gain} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
