"""Derive a 4-way multiple-choice set from SQuAD v1.1, split by article (SWAG is not on this machine).

Each question becomes `{"id", "context", "choices", "label"}` (the JSON-lines form `berth finetune
--task multiple-choice` reads): the context is the question followed by its paragraph (question first,
so that truncating a long paragraph never cuts the question away), the choices are the gold answer and
the answers of three other questions of the same article (distinct from the gold answer and from each
other, case-insensitively, and not contained in it), in a seeded random order. Articles go whole to one
side: the last `--dev-articles` articles of the file are the dev set.

    python scripts/make_squad_choices.py ../shared/data/squad/v1.1/train-v1.1-subset-44articles.json runs/data
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

CHOICES = 4


def article_examples(article: dict, rng: random.Random) -> list[dict]:
    questions = [(paragraph["context"], qa) for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    pool = sorted({qa["answers"][0]["text"].strip() for _, qa in questions})
    examples = []
    for context, qa in questions:
        gold = qa["answers"][0]["text"].strip()
        folded = gold.lower()
        others = [a for a in pool if a.lower() != folded and a.lower() not in folded and folded not in a.lower()]
        rng.shuffle(others)
        distractors: list[str] = []
        for answer in others:
            if all(answer.lower() != d.lower() for d in distractors):
                distractors.append(answer)
            if len(distractors) == CHOICES - 1:
                break
        if len(distractors) < CHOICES - 1:
            continue
        label = rng.randrange(CHOICES)
        choices = distractors[:label] + [gold] + distractors[label:]
        examples.append({"id": qa["id"], "context": f"{qa['question'].strip()} {context.strip()}",
                         "choices": choices, "label": label})
    return examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="SQuAD v1.1 JSON")
    parser.add_argument("out", type=Path, help="folder for squad-choices-train.jsonl and squad-choices-dev.jsonl")
    parser.add_argument("--dev-articles", type=int, default=8, help="the last N articles form the dev set")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()

    articles = json.loads(args.source.read_text(encoding="utf-8"))["data"]
    rng = random.Random(args.seed)
    parts = {"train": articles[: -args.dev_articles], "dev": articles[-args.dev_articles :]}
    args.out.mkdir(parents=True, exist_ok=True)
    for name, chosen in parts.items():
        path = args.out / f"squad-choices-{name}.jsonl"
        examples = [e for article in chosen for e in article_examples(article, rng)]
        path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples), encoding="utf-8")
        print(f"{path}: {len(chosen)} articles, {len(examples)} questions: " + ", ".join(a["title"] for a in chosen))


if __name__ == "__main__":
    main()
