"""Ask a running berth server the hand-written demo items and score its answers (`make demo-check`).

The items (data/demo/demo_items.json) were written by hand for this check and are never trained
on: short factual QA contexts with gold answers, NER sentences with gold person / location /
organisation spans (character offsets), and sentence triples where the first pair is similar and
the second unrelated. Targets: >= 85% exact QA answers (official SQuAD normalisation), >= 85% of
the gold entities found with the exact span and type, every similar pair scored above its
unrelated one. Exit status 1 when a target is missed.

    python scripts/demo_check.py --url http://127.0.0.1:8000 [--out demo_check.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.qa_metrics import exact_match  # noqa: E402  (the repository root is only on the path now)

ITEMS = REPO / "data" / "demo" / "demo_items.json"
TARGETS = {"qa_exact": 0.85, "ner_found": 0.85, "pairs_ordered": 1.0}


def _post(url: str, route: str, body: dict) -> dict:
    request = urllib.request.Request(url.rstrip("/") + route, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def check(url: str, items: dict) -> dict:
    """Score the server at `url` on `items`; every answer is kept in the result for the report."""
    qa = _post(url, "/v1/qa", {"inputs": [{"question": q["question"], "context": q["context"]} for q in items["qa"]]})
    qa_rows = []
    for item, answer in zip(items["qa"], qa["results"]):
        right = max(exact_match(answer["answer"], gold) for gold in item["answers"])
        qa_rows.append({"question": item["question"], "answer": answer["answer"], "gold": item["answers"],
                        "exact": bool(right)})

    ner = _post(url, "/v1/ner", {"inputs": [s["text"] for s in items["ner"]], "aggregation": "simple"})
    ner_rows = []
    for sentence, found in zip(items["ner"], ner["results"]):
        predicted = {(e["start"], e["end"], e["entity"]) for e in found}
        for gold in sentence["entities"]:
            ner_rows.append({"text": gold["text"], "label": gold["label"],
                             "found": (gold["start"], gold["end"], gold["label"]) in predicted})
        ner_rows[-1]["predicted_in_sentence"] = [f"{e['text']} ({e['entity']})" for e in found]

    pairs = [{"text": p["text"], "text_pair": other} for p in items["pairs"] for other in (p["similar"], p["unrelated"])]
    scores = [r["score"] for r in _post(url, "/v1/pair", {"inputs": pairs})["results"]]
    pair_rows = [{"text": p["text"], "similar": scores[2 * i], "unrelated": scores[2 * i + 1],
                  "ordered": scores[2 * i] > scores[2 * i + 1]} for i, p in enumerate(items["pairs"])]

    figures = {
        "qa_exact": sum(r["exact"] for r in qa_rows) / len(qa_rows),
        "ner_found": sum(r["found"] for r in ner_rows) / len(ner_rows),
        "pairs_ordered": sum(r["ordered"] for r in pair_rows) / len(pair_rows),
    }
    return {"url": url, "figures": figures, "targets": TARGETS,
            "met": {k: figures[k] >= TARGETS[k] for k in TARGETS},
            "qa": qa_rows, "ner": ner_rows, "pairs": pair_rows}


def print_report(result: dict) -> None:
    for row in result["qa"]:
        print(f"QA  {'ok  ' if row['exact'] else 'MISS'} {row['question']} -> {row['answer']!r} (gold {row['gold'][0]!r})")
    for row in result["ner"]:
        print(f"NER {'ok  ' if row['found'] else 'MISS'} {row['text']} ({row['label']})"
              + (f"   [sentence: {', '.join(row['predicted_in_sentence'])}]" if "predicted_in_sentence" in row else ""))
    for row in result["pairs"]:
        print(f"PAIR {'ok  ' if row['ordered'] else 'MISS'} {row['text']!r}: similar {row['similar']:.2f} "
              f"> unrelated {row['unrelated']:.2f}")
    for key, value in result["figures"].items():
        print(f"{key}: {value:.1%} (target {TARGETS[key]:.0%}) {'met' if result['met'][key] else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--items", type=Path, default=ITEMS)
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = parser.parse_args()
    result = check(args.url, json.loads(args.items.read_text(encoding="utf-8")))
    print_report(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0 if all(result["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
