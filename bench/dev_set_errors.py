"""How precisely each default's dev set measures its model: the standard error of its dev metric, from the dev
set's size and the metric a build recorded (a formula per metric, below), for a build record's models.

- accuracy (topics): the binomial sqrt(p (1 - p) / n), n dev texts;
- SQuAD F1 (squad, 0-100): a per-question F1 lies in [0, 100], so its variance is at most m (100 - m) (the
  Bhatia-Davis bound) and the standard error at most sqrt(m (100 - m) / n), n questions;
- MRR@10 (rerank): a reciprocal rank lies in [0, 1]: at most sqrt(m (1 - m) / n), n questions (bench/rerank_dev.py
  measures it from the per-question ranks);
- Pearson r (similarity): the delta method on Fisher's z, (1 - r^2) / sqrt(n - 3), n pairs;
- conlleval F1 (entities): F1 = 2 correct / (gold + predicted), taken as a proportion of (gold + predicted) / 2
  entities, sqrt(F (1 - F) / ((gold + predicted) / 2)); an approximation (sentences are the sampled unit and
  entities in one sentence are not independent, so the true error is somewhat larger).

    .venv/bin/python -m bench.dev_set_errors bench/results/defaults_build/build_record-reuse.json \\
        --rerank-dev-questions 414
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def standard_error(metric: str, value: float, metrics: dict[str, float], n: int) -> tuple[float, str]:
    """(the standard error, how it was had) of a dev `metric` of `value` on `n` dev examples."""
    if metric == "accuracy":
        return math.sqrt(value * (1 - value) / n), "binomial"
    if metric == "f1" and value > 1:  # SQuAD's 0-100 scale
        return math.sqrt(value * (100 - value) / n), "upper bound (Bhatia-Davis)"
    if metric == "mrr_at_10":
        return math.sqrt(value * (1 - value) / n), "upper bound (Bhatia-Davis)"
    if metric == "pearson":
        return (1 - value**2) / math.sqrt(n - 3), "Fisher z, delta method"
    if metric == "f1":
        entities = (metrics["n_gold"] + metrics["n_predicted"]) / 2
        return math.sqrt(value * (1 - value) / entities), f"approximate, over {entities:,.0f} entities"
    raise ValueError(f"no standard error formula for {metric}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("record", type=Path, help="a build record (berth build-defaults' build_record.json)")
    parser.add_argument("--rerank-dev-questions", type=int, help="the rerank dev set's size now, to show its "
                        "standard error at the recorded MRR@10 next to the recorded dev set's")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON (derived from the build "
                        "records, so bench/results keeps only those)")
    args = parser.parse_args(argv)

    record = json.loads(args.record.read_text(encoding="utf-8"))
    rows = []
    for model in record["models"]:
        metric = model["quality"]["metric"]
        value = model["dev_metrics"][metric]
        sizes = [("recorded", model["dev_examples"])]
        if model["name"] == "rerank" and args.rerank_dev_questions:
            sizes.append(("rerank/dev.json", args.rerank_dev_questions))
        for which, n in sizes:
            error, how = standard_error(metric, value, model["dev_metrics"], n)
            rows.append({"model": model["name"], "dev": model["dev"] if which == "recorded" else which, "n": n,
                         "metric": metric, "value": value, "standard_error": error, "how": how})
    result = {"record": str(args.record), "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = ["| model | dev set | size | metric | recorded | standard error | how |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['model']} | `{row['dev']}` | {row['n']:,} | {row['metric']} | {row['value']:.4g} | "
                     f"{row['standard_error']:.3g} | {row['how']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
