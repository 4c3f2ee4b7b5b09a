"""Why QA answers run on: answer lengths of a QA bundle against the gold, on a SQuAD-format dev set.

    python scripts/qa_span_report.py models/squad data/samples/squad/dev.json \
        [--max-answer-length 30 15 10] [--out bench/results/qa_spans.json]

For each `max_answer_length` (tokens; 30 is the paper's and the route's default) it asks the bundle
in-process (berth.load: the route's own decoding, not a copy) and prints the official SQuAD v1.1 EM / F1,
the answer length in words (mean, median, 90th percentile) of the predictions and of the gold (the shortest
gold answer of each question), and how the misses fall: a prediction that holds a gold answer and runs on
past it, one that is a part of a gold answer, one that overlaps neither.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.qa import read_squad  # noqa: E402  (the repository root is only on the path now)
from tasks.qa_metrics import normalize_answer, score_answer  # noqa: E402


def _words(text: str) -> int:
    return len(normalize_answer(text).split())


def _quantiles(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {"mean": round(statistics.fmean(ordered), 2), "median": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]}


def miss_kind(prediction: str, golds: list[str]) -> str:
    """exact, runs_on (holds a gold answer and more), inside (part of a gold answer) or elsewhere."""
    predicted = f" {normalize_answer(prediction)} "
    normalized = [f" {normalize_answer(gold)} " for gold in golds]
    if predicted in normalized:
        return "exact"
    if any(gold.strip() and gold in predicted for gold in normalized):
        return "runs_on"
    if predicted.strip() and any(predicted in gold for gold in normalized):
        return "inside"
    return "elsewhere"


def report(bundle: str, dev_file: str, lengths: list[int]) -> dict:
    import berth

    examples = [e for e in read_squad(dev_file) if e.answers]
    model = berth.load(bundle)
    inputs = [{"question": e.question, "context": e.context} for e in examples]
    golds = [[text for text, _ in e.answers] for e in examples]
    gold_words = [min(_words(g) for g in gold) for gold in golds]
    rows = []
    for length in lengths:
        answers = [a["answer"] for a in model(inputs, max_answer_length=length)]
        scores = [score_answer(answer, gold, version="1.1") for answer, gold in zip(answers, golds)]
        kinds = [miss_kind(answer, gold) for answer, gold in zip(answers, golds)]
        rows.append({"max_answer_length": length, "questions": len(examples),
                     "exact": round(100 * statistics.fmean(s[0] for s in scores), 2),
                     "f1": round(100 * statistics.fmean(s[1] for s in scores), 2),
                     "predicted_words": _quantiles([_words(a) for a in answers]),
                     "gold_words": _quantiles(gold_words),
                     "misses": {kind: kinds.count(kind) for kind in ("runs_on", "inside", "elsewhere")}})
    return {"bundle": str(bundle), "dev": str(dev_file), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("dev_file")
    parser.add_argument("--max-answer-length", type=int, nargs="+", default=[30, 15, 10])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = report(args.bundle, args.dev_file, args.max_answer_length)
    print("| max_answer_length | EM | F1 | predicted words mean / median / p90 | gold words mean / median / p90 "
          "| runs on | inside | elsewhere |")
    print("|---|---|---|---|---|---|---|---|")
    for row in result["rows"]:
        p, g, m = row["predicted_words"], row["gold_words"], row["misses"]
        print(f"| {row['max_answer_length']} | {row['exact']:.1f} | {row['f1']:.1f} | {p['mean']} / {p['median']} / "
              f"{p['p90']} | {g['mean']} / {g['median']} / {g['p90']} | {m['runs_on']} | {m['inside']} | "
              f"{m['elsewhere']} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
