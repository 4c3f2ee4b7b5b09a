"""`berth evaluate`'s report as text for a terminal: the metrics, a table per label or entity type, the confusion
matrix. The JSON report (training/finetuning/evaluate.py) holds the same figures."""

from __future__ import annotations

from typing import Any

FIGURES = ("precision", "recall", "f1")
CORNER = "gold \\ predicted"


def render_report(report: dict[str, Any]) -> str:
    lines = [f"{report['model']} on {report['data']}: {report['examples']} examples ({report['task']})", ""]
    width = max((len(k) for k in report["metrics"]), default=0)
    lines += [f"  {name:<{width}}  {_number(value)}" for name, value in report["metrics"].items()]
    if "per_label" in report:
        rows = {**report["per_label"], **{f"{k} avg": v for k, v in report["averages"].items()}}
        lines += ["", *_figure_table("label", rows, len(report["per_label"]))]
        lines += ["", *_confusion(report["confusion_matrix"])]
    if "per_type" in report:
        lines += ["", *_figure_table("entity type", report["per_type"], len(report["per_type"]))]
    return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _figure_table(title: str, rows: dict[str, dict[str, Any]], rule_after: int) -> list[str]:
    width = max(len(title), *(len(name) for name in rows))
    header = f"  {title:<{width}}" + "".join(f"{name:>11}" for name in (*FIGURES, "support"))
    lines = [header, "  " + "-" * (len(header) - 2)]
    for n, (name, figures) in enumerate(rows.items()):
        if n == rule_after:
            lines.append("  " + "-" * (len(header) - 2))
        lines.append(f"  {name:<{width}}" + "".join(f"{figures[k]:>11.4f}" for k in FIGURES)
                     + f"{figures['support']:>11}")
    return lines


def _confusion(matrix: dict[str, Any]) -> list[str]:
    labels, rows = matrix["labels"], matrix["rows"]
    width = max(len(CORNER), *(len(label) for label in labels))
    cell = max(6, *(len(label) + 1 for label in labels))
    lines = ["  confusion matrix (rows: gold label, columns: predicted label)",
             f"  {CORNER:<{width}}" + "".join(f"{label:>{cell}}" for label in labels)]
    lines += [f"  {label:<{width}}" + "".join(f"{count:>{cell}}" for count in row) for label, row in zip(labels, rows)]
    return lines
