"""Does a similarity bundle read meaning or count shared words? A probe on the dev pairs it never trained on.

    python scripts/contrast_probe.py models/similarity data/samples/stsb/dev.jsonl [--out probe.json]
    python scripts/contrast_probe.py models/embeddings data/samples/stsb/dev.jsonl [--out probe.json]

For each dev pair scored as a paraphrase (gold >= 3.5 of 5), each rule of scripts/contrast_pairs.py that
applies makes a contrast of its first sentence (a negation, an antonym, swapped roles, a changed number),
and the probe counts how often the bundle scores the paraphrase (other words, same meaning) above the
contrast (same words, other meaning). The rules are the ones that made the training pairs, so this measures
whether the lesson carries over to unseen sentences, not whether it carries over to other kinds of contrast
(the hand-written held-out pairs of scripts/demo_check.py do that).

The bundle is a pair bundle (a cross-encoder: `/v1/pair`'s score) or an embedding bundle (a bi-encoder:
`/v1/similarity`'s cosine of the two sentences' embeddings); the record also holds the bundle's Pearson
correlation with the gold scores of every dev pair, so the two routes can be compared on the same pairs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.contrast_pairs import RULES  # noqa: E402  (the repository root is only on the path now)
from tasks.cls_metrics import pearson  # noqa: E402

PARAPHRASE = 3.5  # gold score from which a dev pair counts as a paraphrase


def probe_items(dev_rows: list[dict], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for row in dev_rows:
        if row["label"] < PARAPHRASE:
            continue
        for name, rule in RULES.items():
            contrast = rule(row["text"], rng)
            if contrast and contrast != row["text"]:
                items.append({"rule": name, "text": row["text"], "paraphrase": row["text_pair"], "contrast": contrast})
    return items


def pair_scores(model, pairs: list[tuple[str, str]]) -> list[float]:
    """One similarity score per (text, other): a pair bundle's score, or an embedding bundle's cosine."""
    if model.task == "embedding":
        body = {"inputs": [{"source": text, "targets": [other]} for text, other in pairs]}
        return [scores[0] for scores in model.request("/v1/similarity", body)["results"]]
    return [result["score"] for result in model([{"text": text, "text_pair": other} for text, other in pairs])]


def run_probe(bundle: str, dev_file: Path) -> dict:
    import berth

    rows = [json.loads(line) for line in dev_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    items = probe_items(rows)
    model = berth.load(bundle)
    dev_scores = pair_scores(model, [(row["text"], row["text_pair"]) for row in rows])
    scores = pair_scores(model, [(i["text"], other) for i in items for other in (i["paraphrase"], i["contrast"])])
    by_rule: dict[str, list[int]] = {}
    for n, item in enumerate(items):
        item.update(paraphrase_score=scores[2 * n], contrast_score=scores[2 * n + 1])
        by_rule.setdefault(item["rule"], []).append(int(scores[2 * n] > scores[2 * n + 1]))
    return {"bundle": bundle, "task": model.task, "dev": str(dev_file),
            "dev_pearson": pearson(dev_scores, [row["label"] for row in rows]),
            "ordered": sum(map(sum, by_rule.values())), "items": len(items),
            "by_rule": {rule: f"{sum(v)}/{len(v)}" for rule, v in by_rule.items()}, "pairs": items}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("dev_file", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run_probe(args.bundle, args.dev_file)
    print(f"{result['task']} bundle: dev Pearson {result['dev_pearson']:.4f}; paraphrase above contrast: "
          f"{result['ordered']}/{result['items']}  by rule: {result['by_rule']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
