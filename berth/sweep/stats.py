"""Selection and statistics over a sweep's trial records: plain data in, plain data out.

A trial record is a dict with at least `id`, `cell` (its index in the grid), `seed`, `status` ("ok",
"failed" or "not_run") and, when ok, `dev_metrics`. Selection is on the dev metric `metric`, higher is
better unless `greater` is False (a loss). The winner is the best ok trial; equal values are a tie,
reported, and broken by trial order (the earlier trial, so the answer does not depend on which finished
first).

Per cell: over its ok restarts the mean, the sample standard deviation (n - 1; none for one restart),
min, max, and the best restart; the failed restarts are counted there, never dropped.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def metric_value(trial: dict, metric: str) -> float | None:
    """The trial's dev `metric`, or None when it did not run, failed, or has no finite value."""
    if trial.get("status") != "ok":
        return None
    value = (trial.get("dev_metrics") or {}).get(metric)
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def select_winner(trials: Sequence[dict], metric: str, greater: bool = True) -> dict | None:
    """{"id", "cell", "seed", "value", "ties": [ids of other trials with the same value]}; None if no ok trial."""
    scored = [(value, index, trial) for index, trial in enumerate(trials)
              if (value := metric_value(trial, metric)) is not None]
    if not scored:
        return None
    best = (max if greater else min)(value for value, _, _ in scored)
    tied = [trial for value, _, trial in scored if value == best]
    winner = tied[0]
    return {"id": winner["id"], "cell": winner["cell"], "seed": winner["seed"], "metric": metric, "value": best,
            "settings": winner.get("settings", {}), "dev_metrics": winner.get("dev_metrics", {}),
            "ties": [trial["id"] for trial in tied[1:]]}


def cell_statistics(trials: Sequence[dict], cells: Sequence[dict], metric: str, greater: bool = True) -> list[dict]:
    """One entry per grid cell, in grid order."""
    out = []
    for index, settings in enumerate(cells):
        own = [trial for trial in trials if trial["cell"] == index]
        values = [(v, trial) for trial in own if (v := metric_value(trial, metric)) is not None]
        entry: dict[str, Any] = {
            "cell": index, "settings": dict(settings), "metric": metric, "restarts": len(own), "ok": len(values),
            "failed": sum(trial.get("status") == "failed" for trial in own),
            "not_run": sum(trial.get("status") == "not_run" for trial in own),
            "values": [v for v, _ in values], "mean": None, "std": None, "min": None, "max": None, "best": None,
        }
        if values:
            numbers = [v for v, _ in values]
            pick = max if greater else min  # both keep the first of equals
            best_value, best_trial = pick(values, key=lambda pair: pair[0])
            entry.update(mean=statistics.fmean(numbers), std=statistics.stdev(numbers) if len(numbers) > 1 else None,
                         min=min(numbers), max=max(numbers),
                         best={"id": best_trial["id"], "seed": best_trial["seed"], "value": best_value})
        out.append(entry)
    return out


def best_cell_by_mean(cells: Sequence[dict], greater: bool = True) -> dict | None:
    """The cell with the highest mean over its restarts (the robust choice; the winner is the best single
    restart, as the paper keeps): {"cell", "mean", "std", "ok"}."""
    scored = [cell for cell in cells if cell["mean"] is not None]
    if not scored:
        return None
    best = (max if greater else min)(scored, key=lambda cell: cell["mean"])
    return {"cell": best["cell"], "settings": best["settings"], "mean": best["mean"], "std": best["std"],
            "ok": best["ok"]}
