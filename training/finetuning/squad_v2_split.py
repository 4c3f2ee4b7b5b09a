"""A SQuAD v2.0 training set for this machine: the v2.0 dev set split by article, plus unanswerable
questions borrowed from SQuAD v1.1.

There is no public SQuAD v2.0 train set in the data folder (docs/data.md), so the first articles of the
official dev order train and the rest evaluate; splitting by article keeps every context (and its
questions) on one side only. Borrowed questions are v1.1 questions, each paired with a paragraph of a
*different* article of the training part, as unanswerable (`is_impossible`, no answer), for more
"no answer" signal. The v1.1 train subset and the v2.0 dev articles share no title,
so a borrowed question is never about the paragraph it is paired with. Seeded; the evaluation part
is never touched.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TRAIN_FILE, EVAL_FILE = "squad-v2-train.json", "squad-v2-eval.json"


def borrowed_unanswerable(train_articles: list[dict], source: dict, count: int, seed: int) -> int:
    """Append `count` questions of `source` (SQuAD v1.1) to random paragraphs of `train_articles` as
    unanswerable questions, in place. Returns how many were added."""
    own_titles = {article["title"] for article in train_articles}
    questions = [(qa["question"], qa["id"])
                 for article in source["data"] if article["title"] not in own_titles
                 for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    rng = random.Random(seed)
    chosen = rng.sample(questions, min(count, len(questions)))
    paragraphs = [p for article in train_articles for p in article["paragraphs"]]
    for question, qid in chosen:
        rng.choice(paragraphs)["qas"].append(
            {"question": question, "id": f"borrowed-{qid}", "answers": [], "is_impossible": True})
    return len(chosen)


def split_squad_v2(source: Path, out: Path, train_articles: int = 18, unanswerable_from: Path | None = None,
                   unanswerable: int = 0, seed: int = 42) -> dict[str, dict]:
    """Write out/squad-v2-train.json and out/squad-v2-eval.json; returns, per part, its article titles,
    question count and unanswerable count."""
    payload = json.loads(Path(source).read_text(encoding="utf-8"))
    articles = payload["data"]
    parts = {TRAIN_FILE: articles[:train_articles], EVAL_FILE: articles[train_articles:]}
    borrowed = 0
    if unanswerable_from and unanswerable > 0:
        v1 = json.loads(Path(unanswerable_from).read_text(encoding="utf-8"))
        borrowed = borrowed_unanswerable(parts[TRAIN_FILE], v1, unanswerable, seed)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, chosen in parts.items():
        (out / name).write_text(json.dumps({"version": payload.get("version", "v2.0"), "data": chosen}),
                                encoding="utf-8")
        questions = [q for a in chosen for p in a["paragraphs"] for q in p["qas"]]
        summary[name] = {"articles": [a["title"] for a in chosen], "questions": len(questions),
                         "unanswerable": sum(bool(q.get("is_impossible")) for q in questions),
                         "borrowed": borrowed if name == TRAIN_FILE else 0}
    return summary
