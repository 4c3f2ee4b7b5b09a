"""`berth plot`: training curves (loss, accuracies, learning rate, tokens/s, eval) from a metrics.jsonl."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "plot",
        help="plot a training run's metrics.jsonl to a PNG",
        description="Draw one panel per metric of a training run's metrics.jsonl (written by pretrain and "
        "finetune into their output folder) and save it as a PNG.",
    )
    parser.add_argument("metrics", type=Path,
                        help="a metrics.jsonl, or a folder holding one (searched recursively); or a `berth sweep` "
                             "folder (its sweep.json): the dev metric per cell and the winner's curves")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="PNG to write (default: metrics.png beside the metrics.jsonl)")
    parser.add_argument("--keys", default=None,
                        help="comma-separated metrics to plot, e.g. loss,mlm_accuracy (default: all)")
    parser.set_defaults(func=run)
    return parser


def find_metrics_file(path: Path) -> Path:
    if path.is_file():
        return path
    if (path / "metrics.jsonl").is_file():  # the run's own log, before any below it
        return path / "metrics.jsonl"
    found = sorted(path.rglob("metrics.jsonl")) if path.is_dir() else []
    if not found:
        raise SystemExit(f"berth plot: no metrics.jsonl at {path}")
    return found[0]


def run(args: argparse.Namespace) -> int:
    from berth.sweep.plot import find_sweep, plot_sweep
    from training.loop.plot import plot_metrics

    sweep = find_sweep(args.metrics)
    if sweep is not None:  # a `berth sweep` folder: dev metric per cell, the winner's curves
        try:
            print(plot_sweep(sweep, args.output or sweep.with_name("sweep.png")))
        except ValueError as err:
            raise SystemExit(f"berth plot: {err}") from err
        return 0

    metrics = find_metrics_file(args.metrics)
    output = args.output or metrics.with_name("metrics.png")
    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    try:
        written = plot_metrics(metrics, output, keys=keys)
    except ValueError as err:
        raise SystemExit(f"berth plot: {err}") from err
    print(written)
    return 0
