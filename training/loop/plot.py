"""Training curves from a metrics.jsonl (written by training.loop.trainer) into one PNG, one panel per metric.

Training lines are plotted against the step; evaluation lines ("split": "eval") are drawn as markers,
in the panel of the training metric with the same name when there is one, else in a panel of their own.
A fine-tuning run's folder also has finetune_run.json: the step of the checkpoint it saved (the best dev
evaluation) is marked in every panel.
Uses matplotlib's Agg canvas directly (no pyplot state), so it works headless and in threads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# Bookkeeping columns, not curves worth a panel.
NOT_PLOTTED = {"step", "epoch", "elapsed_s", "examples_per_s", "split", "eval_seconds"}
# Panels in this order first; any other metric follows, alphabetically.
PREFERRED_ORDER = ["loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "accuracy", "learning_rate",
                   "tokens_per_s", "grad_norm"]


# A training line of metrics.jsonl is the mean over the optimizer steps since the last line, of the batches trained
# on (dropout on, weights moving): not a score on held-out data.
TRAIN_LABEL = "train batches (mean since the last log line)"


def panel_title(key: str, has_train: bool, has_dev: bool) -> str:
    """What a panel shows: an accuracy from the training batches is said to be one (it reads higher than dev)."""
    if not has_train:
        return f"dev: {key}"
    if key.endswith("accuracy"):
        return f"{key} on the training batches" + (" and dev" if has_dev else " (not dev accuracy)")
    return key


def read_metrics(jsonl_path: str | Path) -> tuple[list[dict], list[dict]]:
    """(training records, evaluation records) of a metrics.jsonl; lines that are not JSON objects are skipped."""
    train: list[dict] = []
    evaluation: list[dict] = []
    for line in Path(jsonl_path).read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # e.g. the last line of a log being written right now
        if isinstance(record, dict) and "step" in record:
            (evaluation if record.get("split") == "eval" else train).append(record)
    return train, evaluation


def saved_step(jsonl_path: str | Path) -> int | None:
    """The step of the checkpoint a fine-tuning run saved (finetune_run.json beside the log), if it says."""
    record = Path(jsonl_path).with_name("finetune_run.json")
    try:
        best = json.loads(record.read_text(encoding="utf-8")).get("best") or {}
    except (OSError, json.JSONDecodeError):
        return None
    return best.get("step") if best.get("evaluations") else None


def _numeric_keys(records: list[dict]) -> list[str]:
    keys: dict[str, None] = {}
    for record in records:
        for key, value in record.items():
            if key not in NOT_PLOTTED and isinstance(value, int | float) and not isinstance(value, bool):
                keys[key] = None
    return list(keys)


def _ordered(keys: list[str]) -> list[str]:
    first = [k for k in PREFERRED_ORDER if k in keys]
    return first + sorted(k for k in keys if k not in first)


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
    return [p[0] for p in points], [float(p[1]) for p in points]


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_metrics(jsonl_path: str | Path, png_path: str | Path, keys: list[str] | None = None) -> Path:
    """Write a PNG of the metrics in `jsonl_path` (all plottable ones, or `keys`) and return its path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train, evaluation = read_metrics(jsonl_path)
    train_keys, eval_keys = _numeric_keys(train), _numeric_keys(evaluation)
    panels = _ordered(train_keys) + [k for k in _ordered(eval_keys) if k not in train_keys]
    if keys is not None:
        unknown = [k for k in keys if k not in panels]
        if unknown:
            raise ValueError(f"no metric {unknown} in {jsonl_path}; it has {panels}")
        panels = list(keys)
    if not panels:
        raise ValueError(f"nothing to plot in {jsonl_path}")

    best_step = saved_step(jsonl_path)
    columns = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(6.0 * columns, 3.0 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    for index, key in enumerate(panels):
        axes = figure.add_subplot(rows, columns, index + 1)
        steps, values = _series(train, key)
        if steps:
            smooth = len(values) > 50 and key != "learning_rate"
            axes.plot(steps, values, lw=1, alpha=0.35 if smooth else 1.0, color="C0", label=TRAIN_LABEL)
            if smooth:
                axes.plot(steps, _moving_average(values, max(5, len(values) // 50)), lw=1.5, color="C0",
                          label="train (moving average)")
        eval_steps, eval_values = _series(evaluation, key)
        if eval_steps:
            axes.plot(eval_steps, eval_values, "o-", ms=4, color="C1", label="dev (eval)")
        if best_step is not None:
            axes.axvline(best_step, color="C2", lw=1, ls="--", label=f"saved: best dev, step {best_step}")
        axes.set_title(panel_title(key, bool(steps), bool(eval_steps)))
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if key == "learning_rate":
            axes.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        if steps and eval_steps or len(axes.lines) > 1:
            axes.legend(fontsize="small")
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=100)
    return png_path
