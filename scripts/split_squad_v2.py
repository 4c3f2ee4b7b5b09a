"""Split the SQuAD v2.0 dev set by article into a training part and an evaluation part.

There is no SQuAD v2.0 train set on this machine (see ../shared/data/SOURCES.md), so docs/RESULTS.md
trains on the first articles of the official dev order and evaluates on the rest. Splitting by
article keeps every context (and its questions) on one side only.

    python scripts/split_squad_v2.py ../shared/data/squad/v2.0/dev-v2.0.derived.json runs/data --train-articles 18
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="SQuAD v2.0 JSON (official article order)")
    parser.add_argument("out", type=Path, help="folder for squad-v2-train.json and squad-v2-eval.json")
    parser.add_argument("--train-articles", type=int, default=18, help="first N articles go to training")
    args = parser.parse_args()

    payload = json.loads(args.source.read_text(encoding="utf-8"))
    articles = payload["data"]
    parts = {"train": articles[: args.train_articles], "eval": articles[args.train_articles :]}
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
