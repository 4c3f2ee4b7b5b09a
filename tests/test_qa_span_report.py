"""scripts/qa_span_report.py sorts a QA miss the way a reader would."""

import pytest

from scripts.qa_span_report import miss_kind


@pytest.mark.parametrize(("prediction", "golds", "kind"), [
    ("the Black Sea", ["Black Sea"], "exact"),  # SQuAD normalisation drops articles
    ("1889 and completed in 1890", ["1889"], "runs_on"),
    ("Swiss Alps and flows to the North Sea", ["Swiss Alps", "the Alps"], "runs_on"),
    ("Curie", ["Marie Curie"], "inside"),
    ("Paris", ["Lyon"], "elsewhere"),
    ("19", ["1889"], "elsewhere"),  # a part of a word is not a part of the answer
])
def test_a_prediction_is_exact_runs_on_inside_or_elsewhere(prediction, golds, kind):
    assert miss_kind(prediction, golds) == kind
