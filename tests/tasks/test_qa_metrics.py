"""SQuAD metrics against hand-computed cases of the official evaluate-v1.1.py / evaluate-v2.0.py rules."""

from __future__ import annotations

import pytest

from tasks.qa import QAExample, read_squad
from tasks.qa_metrics import (
    evaluate_squad,
    exact_match,
    find_best_threshold,
    normalize_answer,
    score_answer,
    token_f1,
)


def _example(qid: str, *golds: str) -> QAExample:
    context = " ".join(golds) or "nothing here"
    answers = [(g, context.index(g)) for g in golds]
    return QAExample(qid, "t", "q?", context, answers, is_impossible=not golds)


def test_normalize_answer_lowercases_strips_punctuation_articles_and_spaces():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("an apple, a pear; the end.") == "apple pear end"
    assert normalize_answer("Theory of the Atom") == "theory of atom"  # only whole-word articles
    assert normalize_answer("A-ha") == "aha"  # punctuation goes before articles are looked for
    assert normalize_answer("\tUN\u00a0 Charter\n") == "un charter"
    assert normalize_answer("the") == "" and normalize_answer(".") == ""
    assert normalize_answer("Café «Zoë»") == "café «zoë»"  # only ASCII punctuation is removed


def test_exact_match_and_token_f1():
    assert exact_match("the Broncos.", "Broncos") == 1
    assert exact_match("Denver Broncos", "Broncos") == 0
    # pred {denver, broncos}, gold {broncos}: precision 1/2, recall 1 -> F1 2/3
    assert token_f1("Denver Broncos", "the Broncos") == pytest.approx(2 / 3)
    # pred {1, 2, 3, 3}, gold {3, 3, 4}: two 3s shared -> P 2/4, R 2/3 -> F1 4/7
    assert token_f1("1 2 3 3", "3 3 4") == pytest.approx(4 / 7)
    assert token_f1("cat", "dog") == 0.0


def test_v2_and_v1_differ_only_on_empty_normalized_answers():
    assert token_f1("", "") == 1.0 and token_f1("", "", version="1.1") == 0.0
    assert token_f1("the", ".") == 1.0  # both normalize to nothing
    assert token_f1("", "Broncos") == 0.0 and token_f1("Broncos", "") == 0.0
    # v2.0 drops gold answers that normalize to "", leaving "" as the only right answer
    assert score_answer("", ["."]) == (1, 1.0)
    assert score_answer("", ["."], version="1.1") == (1, 0.0)
    assert score_answer("Broncos", []) == (0, 0.0)
    assert score_answer("", []) == (1, 1.0)
    with pytest.raises(ValueError, match="at least one gold"):
        score_answer("x", [], version="1.1")
    with pytest.raises(ValueError, match="unknown SQuAD version"):
        token_f1("a", "b", version="3")


def test_score_is_the_max_over_gold_answers():
    golds = ["Denver Broncos", "the Broncos", "Broncos team"]
    exact, f1 = score_answer("Broncos", golds)
    assert exact == 1 and f1 == 1.0
    exact, f1 = score_answer("Denver Broncos team", ["Denver", "Broncos team"])
    # vs "Denver": P 1/3 R 1 -> 1/2; vs "Broncos team": P 2/3 R 1 -> 4/5
    assert exact == 0 and f1 == pytest.approx(0.8)


def test_evaluate_squad_v2_with_has_and_no_answer_splits():
    examples = [
        _example("a", "Denver Broncos", "Broncos"),
        _example("b", "Paris"),
        _example("c"),  # unanswerable
        _example("d"),  # unanswerable
    ]
    predictions = {"a": "the Broncos", "b": "in Paris France", "c": "", "d": "Rome"}
    result = evaluate_squad(examples, predictions)
    # exact: a 1, b 0, c 1, d 0. F1 of b: {in, paris, france} vs {paris}: P 1/3, R 1 -> 1/2
    assert result["exact"] == pytest.approx(50.0)
    assert result["f1"] == pytest.approx(100 * (1 + 0.5 + 1 + 0) / 4)
    assert result["total"] == 4
    has_answer = [result[f"HasAns_{k}"] for k in ("exact", "f1", "total")]
    no_answer = [result[f"NoAns_{k}"] for k in ("exact", "f1", "total")]
    assert has_answer == pytest.approx([50.0, 75.0, 2]) and no_answer == pytest.approx([50.0, 50.0, 2])
    assert "best_exact" not in result and "missing" not in result


def test_evaluate_squad_v1_rules_are_picked_when_every_question_has_answers():
    examples = [_example("a", "."), _example("b", "Paris")]
    v1 = evaluate_squad(examples, {"a": "", "b": "Paris"})
    assert (v1["exact"], v1["f1"]) == pytest.approx((100.0, 50.0))  # v1.1: F1("", ".") = 0
    v2 = evaluate_squad(examples, {"a": "", "b": "Paris"}, version="2.0")
    assert (v2["exact"], v2["f1"]) == pytest.approx((100.0, 100.0))


def test_missing_predictions_score_zero_and_are_reported():
    examples = [_example("a", "Paris"), _example("b", "Rome")]
    result = evaluate_squad(examples, {"a": "Paris"})
    assert result["exact"] == pytest.approx(50.0) and result["total"] == 2 and result["missing"] == 1
    with pytest.raises(ValueError, match="no examples"):
        evaluate_squad([], {})
    with pytest.raises(ValueError, match="na_scores lacks"):
        evaluate_squad(examples, {"a": "Paris"}, na_scores={})


def test_find_best_threshold_walks_questions_by_increasing_na_score():
    # Hand-computed: start with everything predicted null -> 2 of 5 right (the NoAns ones).
    has_answer = {"h1": True, "h2": True, "h3": True, "n1": False, "n2": False}
    predictions = {"h1": "x", "h2": "y", "h3": "z", "n1": "w", "n2": ""}
    scores = {"h1": 1.0, "h2": 1.0, "h3": 0.0, "n1": 0.0, "n2": 1.0}  # exact of each prediction
    na = {"h1": -3.0, "n1": -2.0, "h2": -1.0, "h3": 0.5, "n2": 2.0}
    # walk: h1 +1 -> 3 (best, -3); n1 -1 -> 2; h2 +1 -> 3 (not better); h3 +0; n2 empty pred +0
    best, threshold = find_best_threshold(predictions, scores, na, has_answer)
    assert best == pytest.approx(60.0) and threshold == -3.0
    # When no switch helps, "all unanswerable" wins with threshold 0.0.
    best, threshold = find_best_threshold({"n1": "w"}, {"n1": 0.0}, {"n1": 0.0}, {"n1": False})
    assert best == pytest.approx(100.0) and threshold == 0.0


def test_evaluate_squad_applies_na_threshold_and_searches_the_best():
    examples = [_example("h1", "Paris"), _example("h2", "Rome"), _example("n1"), _example("n2")]
    predictions = {"h1": "Paris", "h2": "Rome", "n1": "Oslo", "n2": "Bern"}  # best non-null spans
    na_scores = {"h1": -4.0, "h2": 1.5, "n1": 0.5, "n2": 3.0}
    result = evaluate_squad(examples, predictions, na_scores=na_scores)  # official na_prob_thresh=1.0
    # na > 1.0 -> predicted null: h2 (wrong), n2 (right); h1 right, n1 wrong -> 2/4
    assert result["exact"] == pytest.approx(50.0) and result["f1"] == pytest.approx(50.0)
    # walk from 2/4 (all null): h1 +1 = 3 @-4.0; n1 -1 = 2; h2 +1 = 3; n2 -1 = 2 -> best 75 @ -4.0
    assert result["best_exact"] == pytest.approx(75.0) and result["best_exact_thresh"] == -4.0
    assert result["best_f1"] == pytest.approx(75.0) and result["best_f1_thresh"] == -4.0
    strict = evaluate_squad(examples, predictions, na_scores=na_scores, na_prob_thresh=-5.0)
    assert strict["exact"] == pytest.approx(50.0) and strict["HasAns_exact"] == 0.0


def test_real_dev_sets_gold_scores_100_and_all_null_scores_the_no_answer_share(shared_data):
    v1 = read_squad(shared_data / "squad" / "v1.1" / "dev-v1.1.json")
    result = evaluate_squad(v1, {ex.id: ex.answers[0][0] for ex in v1})
    assert result["exact"] == 100.0 and result["f1"] == 100.0 and result["total"] == 10570
    v2 = read_squad(shared_data / "squad" / "v2.0" / "dev-v2.0.derived.json")
    result = evaluate_squad(v2, {ex.id: "" for ex in v2})
    assert result["total"] == 11873 and result["NoAns_total"] == 5945 and result["HasAns_total"] == 5928
    assert result["exact"] == pytest.approx(100 * 5945 / 11873)  # the known 50.07 "always abstain" baseline
    assert result["HasAns_f1"] == 0.0 and result["NoAns_exact"] == 100.0
