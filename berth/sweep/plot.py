"""A sweep record (sweep.json) as a PNG: the dev metric of every cell (each restart a dot, mean ± std as an
error bar, the winner starred) and, where the winner's metrics.jsonl was kept, its training loss and dev
evaluations against the step. Matplotlib's Agg canvas, no pyplot state (headless, thread-safe)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def find_sweep(path: Path) -> Path | None:
    """The sweep.json at `path` (the file, or a sweep folder holding one); None when it is not a sweep."""
    path = Path(path)
    if path.is_file() and path.name == "sweep.json":
        return path
    if path.is_dir() and (path / "sweep.json").is_file():
        return path / "sweep.json"
    return None


def _label(settings: dict[str, Any]) -> str:
    short = {"learning_rate": "lr", "batch_size": "bs", "epochs": "ep"}
    return "\n".join(f"{short.get(k, k)}={v:g}" if isinstance(v, float) else f"{short.get(k, k)}={v}"
                     for k, v in settings.items()) or "(base)"


def _winner_metrics(sweep_json: Path, record: dict) -> Path | None:
    winner = record.get("winner")
    if not winner:
        return None
    for folder in (sweep_json.parent / "best", sweep_json.parent / "trials" / winner["id"]):
        for candidate in (folder / "metrics.jsonl", folder / "train_state" / "metrics.jsonl"):
            if candidate.is_file():
                return candidate
    return None


def plot_sweep(sweep_json: str | Path, png_path: str | Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from training.loop.plot import read_metrics

    sweep_json = Path(sweep_json)
    record = json.loads(sweep_json.read_text(encoding="utf-8"))
    cells, metric, winner = record["cells"], record["metric"], record.get("winner")
    if not cells or metric is None:
        raise ValueError(f"{sweep_json}: no finished trial to plot")
    curves = _winner_metrics(sweep_json, record)
    figure = Figure(figsize=(max(6.0, 1.1 * len(cells) + 2), 3.6 * (2 if curves else 1)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(2 if curves else 1, 1, 1)
    for cell in cells:
        x = cell["cell"]
        axes.scatter([x] * len(cell["values"]), cell["values"], s=18, color="C0", alpha=0.6, zorder=3)
        if cell["mean"] is not None:
            axes.errorbar([x], [cell["mean"]], yerr=[cell["std"] or 0.0], fmt="_", color="C1", capsize=6,
                          markersize=14, zorder=2)
        if cell["failed"]:
            axes.annotate(f"{cell['failed']} failed", (x, axes.get_ylim()[0]), fontsize=7, color="C3", ha="center")
    if winner:
        axes.scatter([winner["cell"]], [winner["value"]], marker="*", s=160, color="C3", zorder=4,
                     label=f"winner {winner['id']}")
        axes.legend(loc="best", fontsize=8)
    axes.set_xticks([cell["cell"] for cell in cells], [_label(cell["settings"]) for cell in cells], fontsize=7)
    restarts = len(record.get("seeds", []))
    axes.set_ylabel(f"dev {metric}")
    axes.set_title(f"{record.get('task')}: dev {metric} per cell ({restarts} restarts; bar: mean ± std)", fontsize=9)
    axes.grid(alpha=0.3)
    if curves:
        train, evaluation = read_metrics(curves)
        loss_axes = figure.add_subplot(2, 1, 2)
        points = [(r["step"], r["loss"]) for r in train if isinstance(r.get("loss"), int | float)]
        if points:
            loss_axes.plot([p[0] for p in points], [p[1] for p in points], "o-" if len(points) < 20 else "-", lw=1,
                           markersize=3, color="C0", label="train loss")
        loss_axes.set_xlabel("step")
        loss_axes.set_ylabel("loss")
        evals = [(r["step"], r[metric]) for r in evaluation if isinstance(r.get(metric), int | float)]
        if evals:
            dev_axes = loss_axes.twinx()
            dev_axes.plot([p[0] for p in evals], [p[1] for p in evals], "o-", color="C3", label=f"dev {metric}")
            dev_axes.set_ylabel(f"dev {metric}")
        loss_axes.set_title(f"winner {winner['id']}: training curves", fontsize=9)
        loss_axes.grid(alpha=0.3)
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=110)
    return png_path
