"""What a minute of training buys each default: dev metric against examples seen (and the minutes they take at
a reference build's measured speed), with the slope per minute in units of the dev set's standard error
(bench/dev_set_errors.py), so that metrics on different scales compare.

The points are the models of build records (each trained what its budget bought) and the fixed-step runs of
bench/recipe_points.py, on each recipe's current dev set only. The slope is a least-squares line through a
model's points (examples seen -> dev metric), with the slope's own standard error from the points' scatter about
the line (from the dev set's standard error when there are only 3 points; points that span a fraction of a
minute give a slope too uncertain to act on); a minute is the reference record's examples/s times 60. Fixed-step
points can lie past a recipe's epochs (more passes over its data), so a model that finishes its epochs within
its budget is fitted too, and marked.

    B=bench/results/defaults_build; .venv/bin/python -m bench.minutes_table $B/build_record-avx2-held.json \\
        $B/build_record-budget-first.json $B/build_record-idle.json $B/build_record-rerun.json \\
        $B/build_record-reuse.json --reference $B/build_record-reuse.json \\
        --points bench/results/recipe_points.json bench/results/rerank_points.json \\
        --out bench/results/minutes_table.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.dev_set_errors import standard_error


def build_record_points(path: Path) -> list[dict]:
    record = json.loads(path.read_text(encoding="utf-8"))
    return [{"model": model["name"], "source": path.name, "examples_seen": model["sizing"]["examples_seen"],
             "examples_per_s": model["sizing"]["examples_per_s"], "precision": model["sizing"]["precision"],
             "threads": model["sizing"]["threads"], "dev": model["dev"], "dev_examples": model["dev_examples"],
             "dev_metrics": model["dev_metrics"], "value": model["quality"]["value"]}
            for model in record["models"] if "sizing" in model]


def recipe_run_points(path: Path) -> list[dict]:
    record = json.loads(path.read_text(encoding="utf-8"))
    return [{**{k: p[k] for k in ("model", "examples_seen", "examples_per_s", "precision", "threads", "dev",
                                  "dev_examples", "dev_metrics", "value", "steps")},
             "source": f"{path.name} ({p['steps']} steps)"} for p in record["points"] if p["variant"] == "main"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from berth.build_defaults import SAMPLE_RECIPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", type=Path, nargs="+", help="build records (build_record.json)")
    parser.add_argument("--reference", type=Path, required=True, help="the build whose speed turns examples into "
                        "minutes (and whose budgets the table shows)")
    parser.add_argument("--points", type=Path, nargs="*", default=[], help="bench/recipe_points.py records")
    parser.add_argument("--out", type=Path,
                        help="also write the rows as JSON (derived from the records: bench/results keeps those)")
    args = parser.parse_args(argv)

    reference = {m["name"]: m for m in json.loads(args.reference.read_text(encoding="utf-8"))["models"]}
    points = [p for path in args.records for p in build_record_points(path)]
    points += [p for path in args.points for p in recipe_run_points(path)]
    rows = []
    for recipe in SAMPLE_RECIPES:
        sizing, metric = reference[recipe.name]["sizing"], recipe.floor[0]
        per_minute = sizing["examples_per_s"] * 60
        # One point per number of examples seen, the mean of its runs: builds that trained the same examples
        # (a model that finished its epochs within the budget every time) repeat one measurement.
        by_examples: dict[int, list[dict]] = {}
        for p in points:
            if p["model"] == recipe.name and p["dev"] == recipe.dev:
                by_examples.setdefault(p["examples_seen"], []).append(p)
        same_dev = [{**runs[-1], "value": float(np.mean([p["value"] for p in runs])), "runs": len(runs)}
                    for _, runs in sorted(by_examples.items())]
        if not same_dev:
            continue
        at_budget = min(same_dev, key=lambda p: abs(p["examples_seen"] - sizing["examples_seen"]))
        error, _ = standard_error(metric, at_budget["value"], at_budget["dev_metrics"], at_budget["dev_examples"])
        seen = np.array([p["examples_seen"] for p in same_dev], dtype=float)
        values = np.array([p["value"] for p in same_dev], dtype=float)
        slope = slope_error = None
        if len(same_dev) >= 3 and len(set(seen)) >= 2:
            # From the points' scatter about the line when there are enough of them; with 3, each point's error
            # taken as its dev set's standard error (unpaired: conservative for points on one dev set).
            fit, covariance = (np.polyfit(seen, values, 1, cov=True) if len(same_dev) >= 4 else
                               np.polyfit(seen, values, 1, w=np.full(len(seen), 1 / error), cov="unscaled"))
            slope, slope_error = float(fit[0]), float(np.sqrt(covariance[0, 0]))
        rows.append({"model": recipe.name, "metric": metric, "dev": recipe.dev, "standard_error": error,
                     "reference_examples_per_minute": per_minute,
                     "reference_budget_minutes": sizing["budget_minutes"],
                     "every_example_within_budget": sizing["why"].startswith("every example"),
                     "slope_per_minute": slope * per_minute if slope is not None else None,
                     "slope_per_minute_se": slope_error * per_minute if slope is not None else None,
                     "span_minutes": float(np.ptp(seen)) / per_minute,
                     "slope_per_minute_in_standard_errors": slope * per_minute / error if slope is not None else None,
                     "points": [{**p, "minutes": p["examples_seen"] / per_minute} for p in same_dev]})
    result = {"reference": str(args.reference), "records": [str(p) for p in args.records],
              "points": [str(p) for p in args.points], "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = ["| model | budget (min) | examples a minute | dev points: minutes → metric | points span (min) "
             "| dev s.e. | slope a minute (± its s.e.) | in dev s.e. a minute |", "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        shown = ", ".join(f"{p['minutes']:.2f} → {p['value']:.4g}" for p in row["points"])
        budget = f"{row['reference_budget_minutes']:g}" + (" (epochs done within)" if
                                                           row["every_example_within_budget"] else "")
        if row["slope_per_minute"] is None:
            slope = gain = "— (too few points)"
        else:
            slope = f"{row['slope_per_minute']:+.3g} (± {row['slope_per_minute_se']:.2g})"
            gain = f"{row['slope_per_minute_in_standard_errors']:+.2f}"
        lines.append(f"| {row['model']} | {budget} | {row['reference_examples_per_minute']:,.0f} | {shown} | "
                     f"{row['span_minutes']:.2f} | {row['standard_error']:.3g} | {slope} | {gain} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
