"""Split the SQuAD v2.0 dev set by article into a training part and an evaluation part, and optionally
add unanswerable training questions made from SQuAD v1.1 questions.

There is no SQuAD v2.0 train set on this machine (see ../shared/data/SOURCES.md), so docs/RESULTS.md
trains on the first articles of the official dev order and evaluates on the rest. Splitting by
article keeps every context (and its questions) on one side only.

`--unanswerable-from v1.json --unanswerable N` adds N questions of a SQuAD v1.1 file, each paired with a
paragraph of a *different* article of the training part, as unanswerable (`is_impossible`, no answer):
issue 11's recipe for more "no answer" signal than the ~2,900 real unanswerable questions of the 18
training articles. The v1.1 train subset and the v2.0 dev articles share no title, so a borrowed
question is never about the paragraph it is paired with. Seeded; the evaluation part is never touched.

    python scripts/split_squad_v2.py ../shared/data/squad/v2.0/dev-v2.0.derived.json runs/data --train-articles 18 \
        --unanswerable-from ../shared/data/squad/v1.1/train-v1.1-subset-44articles.json --unanswerable 3000
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def borrowed_unanswerable(train_articles: list[dict], source: dict, count: int, seed: int) -> int:
    """Append `count` questions of `source` (SQuAD v1.1) to random paragraphs of `train_articles` as
    unanswerable questions, in place. Returns how many were added."""
    own_titles = {article["title"] for article in train_articles}
    questions = [(article["title"], qa["question"], qa["id"])
                 for article in source["data"] if article["title"] not in own_titles
                 for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    rng = random.Random(seed)
    chosen = rng.sample(questions, min(count, len(questions)))
    paragraphs = [p for article in train_articles for p in article["paragraphs"]]
    for _title, question, qid in chosen:
        rng.choice(paragraphs)["qas"].append(
            {"question": question, "id": f"borrowed-{qid}", "answers": [], "is_impossible": True})
    return len(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="SQuAD v2.0 JSON (official article order)")
    parser.add_argument("out", type=Path, help="folder for squad-v2-train.json and squad-v2-eval.json")
    parser.add_argument("--train-articles", type=int, default=18, help="first N articles go to training")
    parser.add_argument("--unanswerable-from", type=Path, help="SQuAD v1.1 JSON whose questions become extra "
                        "unanswerable training questions over other articles' paragraphs")
    parser.add_argument("--unanswerable", type=int, default=0, help="how many such questions to add")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    payload = json.loads(args.source.read_text(encoding="utf-8"))
    articles = payload["data"]
    parts = {"train": articles[: args.train_articles], "eval": articles[args.train_articles :]}
    if args.unanswerable_from and args.unanswerable > 0:
        source = json.loads(args.unanswerable_from.read_text(encoding="utf-8"))
        added = borrowed_unanswerable(parts["train"], source, args.unanswerable, args.seed)
        print(f"added {added} unanswerable training questions borrowed from {args.unanswerable_from}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, chosen in parts.items():
        path = args.out / f"squad-v2-{name}.json"
        path.write_text(json.dumps({"version": payload.get("version", "v2.0"), "data": chosen}), encoding="utf-8")
        questions = [q for a in chosen for p in a["paragraphs"] for q in p["qas"]]
        impossible = sum(bool(q.get("is_impossible")) for q in questions)
        print(f"{path}: {len(chosen)} articles, {len(questions)} questions ({impossible} unanswerable): "
              + ", ".join(a["title"] for a in chosen))


if __name__ == "__main__":
    main()
