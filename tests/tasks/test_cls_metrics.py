"""Classification / regression metrics: hand-computed cases, scikit-learn and scipy as references."""

from __future__ import annotations

import random

import pytest

from tasks.cls_metrics import (
    accuracy,
    binary_f1,
    classification_metrics,
    label_report,
    matthews_corrcoef,
    pearson,
    regression_metrics,
    spearman,
)


def test_hand_computed_binary_case():
    gold = ["1", "1", "1", "0", "0", "0"]
    pred = ["1", "1", "0", "1", "0", "0"]  # tp 2, fn 1, fp 1, tn 2
    assert accuracy(pred, gold) == pytest.approx(4 / 6)
    assert binary_f1(pred, gold, positive="1") == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert binary_f1(pred, gold, positive="0") == pytest.approx(2 / 3)
    assert matthews_corrcoef(pred, gold) == pytest.approx((2 * 2 - 1 * 1) / 9)
    assert binary_f1(["0", "0"], ["0", "0"], positive="1") == 0.0
    metrics = classification_metrics(pred, gold, positive="1")
    assert set(metrics) == {"accuracy", "matthews_corrcoef", "f1"}


def test_degenerate_cases():
    assert matthews_corrcoef(["a", "a"], ["a", "a"]) == 0.0  # undefined -> 0, as scikit-learn
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0
    with pytest.raises(ValueError):
        accuracy([], [])
    with pytest.raises(ValueError):
        accuracy(["a"], ["a", "b"])


def test_spearman_with_ties_by_hand():
    # ranks of x: [1.5, 1.5, 3, 4], y: [1, 2, 3, 4]
    x, y = [1.0, 1.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0]
    assert spearman(x, y) == pytest.approx(pearson([1.5, 1.5, 3, 4], [1, 2, 3, 4]))
    assert spearman([1, 2, 3], [1, 4, 9]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)


def test_against_scikit_learn_and_scipy():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(20):
        gold = [rng.choice("abc") for _ in range(50)]
        pred = [g if rng.random() < 0.6 else rng.choice("abc") for g in gold]
        assert matthews_corrcoef(pred, gold) == pytest.approx(sklearn_metrics.matthews_corrcoef(gold, pred))
        assert binary_f1(pred, gold, "a") == pytest.approx(
            sklearn_metrics.f1_score([g == "a" for g in gold], [p == "a" for p in pred])
        )
        x = [round(rng.uniform(0, 5), 1) for _ in range(40)]  # rounding makes ties
        y = [v + rng.gauss(0, 1) for v in x]
        assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


def test_label_report_against_scikit_learn():
    """Per-label figures, both averages and the confusion matrix, with a label never predicted ('d') and one
    predicted but never gold ('e'), as classification_report and confusion_matrix give them."""
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(1)
    for _ in range(10):
        gold = [rng.choice("abcd") for _ in range(60)]
        pred = [g if rng.random() < 0.5 and g != "d" else rng.choice("abce") for g in gold]
        report = label_report(pred, gold, labels=["c", "b", "a"])
        expected = sklearn_metrics.classification_report(gold, pred, output_dict=True, zero_division=0)
        assert list(report["per_label"]) == ["c", "b", "a", "d", "e"]  # the given order, then the rest
        for label, figures in report["per_label"].items():
            assert figures["support"] == expected[label]["support"]
            assert (figures["precision"], figures["recall"], figures["f1"]) == pytest.approx(
                (expected[label]["precision"], expected[label]["recall"], expected[label]["f1-score"]))
        for name in ("macro", "weighted"):
            ours, theirs = report["averages"][name], expected[f"{name} avg"]
            assert (ours["precision"], ours["recall"], ours["f1"]) == pytest.approx(
                (theirs["precision"], theirs["recall"], theirs["f1-score"]))
        labels = report["confusion_matrix"]["labels"]
        assert report["confusion_matrix"]["rows"] == sklearn_metrics.confusion_matrix(gold, pred,
                                                                                      labels=labels).tolist()


def test_regression_metrics_on_real_stsb(shared_data):
    from tasks.readers import read_glue

    gold = [e.label for e in read_glue(shared_data / "stsb" / "dev.tsv", "stsb")]
    rng = random.Random(0)
    noisy = [g + rng.gauss(0, 1.0) for g in gold]
    metrics = regression_metrics(noisy, gold)
    assert 0.5 < metrics["pearson"] < 0.95 and 0.5 < metrics["spearman"] < 0.95
    assert metrics["combined_score"] == pytest.approx((metrics["pearson"] + metrics["spearman"]) / 2)
    assert regression_metrics(gold, gold)["spearman"] == pytest.approx(1.0)
