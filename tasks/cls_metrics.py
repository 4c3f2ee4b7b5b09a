"""Classification and regression metrics, as GLUE reports them (numpy only).

accuracy (SST-2, RTE), binary F1 of the positive class (MRPC, QQP), Matthews correlation (CoLA),
Pearson and Spearman correlation (STS-B). Labels may be any hashable values (names or ids).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def _check(predictions: Sequence, references: Sequence) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not len(references):
        raise ValueError("no examples to score")


def accuracy(predictions: Sequence[Hashable], references: Sequence[Hashable]) -> float:
    _check(predictions, references)
    return sum(p == r for p, r in zip(predictions, references)) / len(references)


def binary_f1(
    predictions: Sequence[Hashable], references: Sequence[Hashable], positive: Hashable = "1"
) -> float:
    """F1 of the `positive` class (0.0 when it is never predicted nor present, as scikit-learn)."""
    _check(predictions, references)
    tp = sum(p == positive and r == positive for p, r in zip(predictions, references))
    fp = sum(p == positive and r != positive for p, r in zip(predictions, references))
    fn = sum(p != positive and r == positive for p, r in zip(predictions, references))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews_corrcoef(predictions: Sequence[Hashable], references: Sequence[Hashable]) -> float:
    """Matthews correlation, multi-class form (Gorodkin 2004), as scikit-learn; 0.0 when undefined."""
    _check(predictions, references)
    classes = {c: i for i, c in enumerate(sorted(set(references) | set(predictions), key=repr))}
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    for p, r in zip(predictions, references):
        confusion[classes[r], classes[p]] += 1
    t_sum, p_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    n_correct, n = np.trace(confusion), confusion.sum()
    cov_ytyp = n_correct * n - t_sum @ p_sum
    cov_ypyp = n * n - p_sum @ p_sum
    cov_ytyt = n * n - t_sum @ t_sum
    denominator = np.sqrt(cov_ytyt * cov_ypyp)
    return float(cov_ytyp / denominator) if denominator else 0.0


def pearson(predictions: Sequence[float], references: Sequence[float]) -> float:
    _check(predictions, references)
    x = np.asarray(predictions, dtype=np.float64)
    y = np.asarray(references, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator else 0.0


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (scipy.stats.rankdata 'average')."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    is_new = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    group = np.cumsum(is_new) - 1
    starts = np.flatnonzero(is_new)
    ends = np.r_[starts[1:], len(values)]
    average = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = average[group]
    return ranks


def spearman(predictions: Sequence[float], references: Sequence[float]) -> float:
    """Pearson correlation of the average ranks."""
    _check(predictions, references)
    x = _average_ranks(np.asarray(predictions, dtype=np.float64))
    y = _average_ranks(np.asarray(references, dtype=np.float64))
    return pearson(x, y)


def classification_metrics(
    predictions: Sequence[Hashable], references: Sequence[Hashable], positive: Hashable | None = None
) -> dict[str, float]:
    """accuracy and Matthews correlation, plus `f1` of `positive` when one is given (binary tasks)."""
    metrics = {
        "accuracy": accuracy(predictions, references),
        "matthews_corrcoef": matthews_corrcoef(predictions, references),
    }
    if positive is not None:
        metrics["f1"] = binary_f1(predictions, references, positive)
    return metrics


def regression_metrics(predictions: Sequence[float], references: Sequence[float]) -> dict[str, float]:
    """STS-B's figures: Pearson, Spearman and their mean (GLUE's combined score)."""
    p, s = pearson(predictions, references), spearman(predictions, references)
    return {"pearson": p, "spearman": s, "combined_score": (p + s) / 2}


def label_report(
    predictions: Sequence[Hashable], references: Sequence[Hashable], labels: Sequence[Hashable] = ()
) -> dict:
    """Per-label precision, recall, F1 and support; their macro and support-weighted averages; and the confusion
    matrix (rows: the reference label, columns: the predicted one), as scikit-learn's classification_report and
    confusion_matrix compute them (a label never predicted has precision 0). `labels`: the order of the rows; a
    label found in the data but not listed is added after them."""
    _check(predictions, references)
    order = list(labels) + sorted(set(references) - set(labels), key=repr) + sorted(
        set(predictions) - set(references) - set(labels), key=repr)
    index = {label: i for i, label in enumerate(order)}
    confusion = np.zeros((len(order), len(order)), dtype=np.int64)
    for p, r in zip(predictions, references):
        confusion[index[r], index[p]] += 1
    per_label = {}
    for i, label in enumerate(order):
        tp, predicted, support = confusion[i, i], confusion[:, i].sum(), confusion[i].sum()
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_label[str(label)] = {"precision": float(precision), "recall": float(recall), "f1": float(f1),
                                 "support": int(support)}
    seen = set(predictions) | set(references)  # the averages run over labels in the data, as scikit-learn's
    present = [per_label[str(label)] for label in order if label in seen]
    total = sum(f["support"] for f in present)
    averages = {
        name: {key: float(np.mean([f[key] for f in present])) if name == "macro"
               else float(sum(f[key] * f["support"] for f in present) / total)
               for key in ("precision", "recall", "f1")} | {"support": total}
        for name in ("macro", "weighted")
    }
    return {"per_label": per_label, "averages": averages,
            "confusion_matrix": {"labels": [str(label) for label in order], "rows": confusion.tolist()}}
