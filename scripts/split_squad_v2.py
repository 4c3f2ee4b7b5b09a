"""Split the SQuAD v2.0 dev set by article into a training part and an evaluation part, and optionally
add unanswerable training questions made from SQuAD v1.1 questions (training/finetuning/squad_v2_split.py says how).
`berth build-defaults --data-dir ../shared/data` makes the same split for its `squad20` recipe.

    python scripts/split_squad_v2.py ../shared/data/squad/v2.0/dev-v2.0.derived.json runs/data --train-articles 18 \
        --unanswerable-from ../shared/data/squad/v1.1/train-v1.1-subset-44articles.json --unanswerable 1000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.finetuning.squad_v2_split import split_squad_v2  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("source", type=Path, help="SQuAD v2.0 JSON (official article order)")
    parser.add_argument("out", type=Path, help="folder for squad-v2-train.json and squad-v2-eval.json")
    parser.add_argument("--train-articles", type=int, default=18, help="first N articles go to training")
    parser.add_argument("--unanswerable-from", type=Path, help="SQuAD v1.1 JSON whose questions become extra "
                        "unanswerable training questions over other articles' paragraphs")
    parser.add_argument("--unanswerable", type=int, default=0, help="how many such questions to add")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    summary = split_squad_v2(args.source, args.out, args.train_articles, args.unanswerable_from,
                             args.unanswerable, args.seed)
    for name, part in summary.items():
        borrowed = f", {part['borrowed']} of them borrowed from {args.unanswerable_from}" if part["borrowed"] else ""
        print(f"{args.out / name}: {len(part['articles'])} articles, {part['questions']} questions "
              f"({part['unanswerable']} unanswerable{borrowed}): " + ", ".join(part["articles"]))


if __name__ == "__main__":
    main()
