"""SQuAD metrics, exactly as the official evaluate-v1.1.py and evaluate-v2.0.py scripts define them.

The two scripts share `normalize_answer` (lowercase, drop ASCII punctuation, drop the articles
a/an/the, collapse whitespace) and exact match, and differ in two places only:
- v2.0 drops gold answers that normalize to "" and scores an empty gold list as the single gold ""
  (no answer), so that "" is the right prediction exactly for unanswerable questions;
- v2.0 F1 is 1 when both the prediction and the gold are empty after normalization, 0 when only one
  is; v1.1 F1 is 0 whenever no token is shared.
(SQuAD v1.1 dev has three gold answers "." on which the two disagree.)

Scores are percentages, like the scripts. `na_scores` are the scripts' "na_probs": any per-question
number where higher means "more likely unanswerable", e.g. the null score diff from `tasks.qa`.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

Version = Literal["1.1", "2.0"]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


class ScoredExample(Protocol):
    """What evaluation needs of an example (`tasks.qa.QAExample` is one)."""

    id: str
    answers: Sequence[tuple[str, int]]


def normalize_answer(text: str) -> str:
    """Lowercase, remove punctuation, remove articles, fix whitespace (in the official order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> int:
    """1 when prediction and gold are equal after normalization, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, version: Version = "2.0") -> float:
    """Harmonic mean of token precision and recall between the normalized texts (bag of tokens)."""
    _check_version(version)
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if version == "2.0" and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def score_answer(prediction: str, gold_answers: Sequence[str], version: Version = "2.0") -> tuple[int, float]:
    """(exact match, F1) of one prediction: the max over the gold answers."""
    _check_version(version)
    golds = list(gold_answers)
    if version == "2.0":
        golds = [g for g in golds if normalize_answer(g)] or [""]
    elif not golds:
        raise ValueError("SQuAD v1.1 scoring needs at least one gold answer per question")
    exact = max(exact_match(prediction, g) for g in golds)
    f1 = max(token_f1(prediction, g, version) for g in golds)
    return exact, f1


def find_best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_scores: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """The no-answer threshold that maximizes a score, as evaluate-v2.0.py's `find_best_thresh`.

    Start from "every question predicted unanswerable" (right for each unanswerable one), then walk
    the questions by increasing na score, switching each to its prediction: an answerable question
    gains its score, an unanswerable one loses 1 if its prediction is not empty. Returns (best score
    in percent of len(scores), the na score where it was reached; 0.0 when "all unanswerable" is best).
    A question is predicted unanswerable when its na score > threshold.
    """
    current = sum(1 for has in has_answer.values() if not has)
    best, best_threshold = current, 0.0
    for qid in sorted(na_scores, key=na_scores.__getitem__):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_threshold = current, na_scores[qid]
    return 100.0 * best / len(scores), float(best_threshold)


def evaluate_squad(
    examples: Sequence[ScoredExample],
    predictions: Mapping[str, str],
    na_scores: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
    version: Version | None = None,
) -> dict[str, float]:
    """Exact match and F1 (percent) of `predictions` (question id -> answer text, "" = no answer).

    Returns exact, f1, total; HasAns_exact/f1/total and NoAns_exact/f1/total for the questions with
    and without gold answers (when there are any); with `na_scores`, also best_exact,
    best_exact_thresh, best_f1, best_f1_thresh from `find_best_threshold`; and `missing` when some
    questions have no prediction (they score 0, as in evaluate-v1.1.py).

    `version` picks the scoring rules: "2.0" when any example has no gold answer, else "1.1" (then
    `exact` is the v1.1 script's `exact_match`). With `na_scores`, a question whose na score is above
    `na_prob_thresh` counts as predicted unanswerable in exact/f1 (the v2.0 script's
    --na-prob-thresh, default 1.0). For the threshold search to mean what it says, predict the best
    non-null span for every question (decode with handle_impossible=False) and pass the null score
    diffs as `na_scores`.
    """
    if not examples:
        raise ValueError("no examples to evaluate")
    if version is None:
        version = "2.0" if any(not ex.answers for ex in examples) else "1.1"
    _check_version(version)
    has_answer = {ex.id: bool(ex.answers) for ex in examples}
    predicted = [ex.id for ex in examples if ex.id in predictions]
    if na_scores is not None:
        lacking = [qid for qid in predicted if qid not in na_scores]
        if lacking:
            raise ValueError(f"na_scores lacks {len(lacking)} predicted question ids, e.g. {lacking[0]!r}")

    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for ex in examples:
        if ex.id in predictions:
            exact_raw[ex.id], f1_raw[ex.id] = score_answer(
                predictions[ex.id], [t for t, _ in ex.answers], version
            )
        else:
            exact_raw[ex.id], f1_raw[ex.id] = 0, 0.0

    exact, f1 = exact_raw, f1_raw
    if na_scores is not None:
        exact = _apply_no_answer_threshold(exact_raw, predicted, na_scores, has_answer, na_prob_thresh)
        f1 = _apply_no_answer_threshold(f1_raw, predicted, na_scores, has_answer, na_prob_thresh)

    result = _summary(exact, f1, list(exact))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has == wanted]
        if qids:
            result.update({f"{prefix}_{k}": v for k, v in _summary(exact, f1, qids).items()})
    if na_scores is not None:
        preds = {qid: predictions[qid] for qid in predicted}
        searched = {qid: na_scores[qid] for qid in predicted}
        has_predicted = {qid: has_answer[qid] for qid in predicted}
        result["best_exact"], result["best_exact_thresh"] = find_best_threshold(
            preds, exact_raw, searched, has_predicted
        )
        result["best_f1"], result["best_f1_thresh"] = find_best_threshold(
            preds, f1_raw, searched, has_predicted
        )
    missing = len(examples) - len(predicted)
    if missing:
        result["missing"] = missing
    return result


def _apply_no_answer_threshold(
    raw: Mapping[str, float],
    predicted: Sequence[str],
    na_scores: Mapping[str, float],
    has_answer: Mapping[str, bool],
    threshold: float,
) -> dict[str, float]:
    scores = dict(raw)
    for qid in predicted:
        if na_scores[qid] > threshold:
            scores[qid] = float(not has_answer[qid])
    return scores


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str]) -> dict[str, float]:
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / total,
        "f1": 100.0 * sum(f1[q] for q in qids) / total,
        "total": total,
    }


def _check_version(version: str) -> None:
    if version not in ("1.1", "2.0"):
        raise ValueError(f"unknown SQuAD version {version!r}; use '1.1' or '2.0'")
