"""Passage ranking on SQuAD v1.1 dev: BM25, the `embeddings` bi-encoder and the `rerank` cross-encoder side by side.

Every dev question ranks every paragraph of its article (its own paragraph is the relevant one; 48 articles,
43 paragraphs each on average). Three rankers on the same questions:
- BM25 (rank-bm25's Okapi BM25, lowercased word tokens) over the article's paragraphs;
- the bi-encoder: the `embeddings` bundle (all-MiniLM-L6-v2 as it is), cosine of question and paragraph vectors;
- the cross-encoder: each `rerank` bundle given (fp32, int8...) reorders the bi-encoder's top `--candidates`
  (the rest keep the bi-encoder's order), through the task layer's served steps (windows, best window).
MRR@10 (with its standard error) and top-1 of each, each ranker's MRR@10 minus the bi-encoder's (with the paired
standard error: same questions), and the bi-encoder's recall at the candidate depth (the cross-encoder's ceiling).
The questions are the first `--questions` of tasks.rerank.read_article_questions (round-robin over articles
and paragraphs: every article has its share). Usage, from the repository root:

    .venv/bin/python -m bench.rerank_quality --rerank models/rerank /tmp/rerank-fp32 --questions 1000

On the rerank recipe's own dev set (its questions carry the candidates they rank: the bi-encoder's top 5):

    .venv/bin/python -m bench.rerank_quality --rerank models/rerank --dev data/samples/rerank/dev.json \
        --questions 0 --candidates 5 --out bench/results/rerank_quality_dev.json
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import machine_facts
from tasks.first_stage import embedding_rankings, load_bundle_runner
from tasks.rerank import (
    RerankExample,
    RerankInput,
    RerankOptions,
    mrr_standard_error,
    ranking_metrics,
    read_article_questions,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
DEV = REPO.parent / "shared" / "data" / "squad" / "v1.1" / "dev-v1.1.json"
WORD = re.compile(r"\w+")


def bm25_rankings(examples: list[RerankExample]) -> list[list[int]]:
    from rank_bm25 import BM25Okapi

    indexes: dict[int, Any] = {}
    rankings = []
    for example in examples:
        key = id(example.documents)  # one index per article (its examples share the list)
        if key not in indexes:
            indexes[key] = BM25Okapi([WORD.findall(d.lower()) for d in example.documents])
        scores = indexes[key].get_scores(WORD.findall(example.query.lower()))
        rankings.append(np.argsort(-scores, kind="stable").tolist())
    return rankings


def bi_encoder_rankings(folder: Path, examples: list[RerankExample], threads: int) -> tuple[list[list[int]], dict]:
    rankings, facts = embedding_rankings(folder, examples, threads)
    return rankings, {**facts, "max_seq_length": load_bundle_runner(folder, 1)[0].max_seq_length}


def cross_encoder_rankings(folder: Path, examples: list[RerankExample], first_stage: list[list[int]], depth: int,
                           threads: int, chunk: int = 50) -> tuple[list[list[int]], dict]:
    from tasks.registry import definition

    spec, run, tokenizer, precision = load_bundle_runner(folder, threads)
    task = definition("rerank")
    rankings, windows = [], 0
    for at in range(0, len(examples), chunk):
        part = list(zip(examples[at : at + chunk], first_stage[at : at + chunk]))
        inputs = [RerankInput(query=e.query, documents=[e.documents[i] for i in ranked[:depth]]) for e, ranked in part]
        prepared, outputs = task.run_prepared(tokenizer, spec, inputs, run, RerankOptions())
        windows += sum(len(p.items) for p in prepared)
        results = task.decode(tokenizer, spec, prepared, outputs, RerankOptions())
        for (_, ranked), result in zip(part, results):
            top = [ranked[entry["index"]] for entry in result]
            rankings.append(top + ranked[depth:])
        print(f"  {folder.name} ({precision}): {len(rankings)}/{len(examples)} questions", flush=True)
    return rankings, {"precision": precision, "max_seq_length": spec.max_seq_length, "windows": windows,
                      "dev_metrics_at_build": spec.dev_metrics}


def recall_at(rankings: list[list[int]], examples: list[RerankExample], depth: int) -> float:
    return sum(any(i in e.relevant for i in r[:depth]) for r, e in zip(rankings, examples)) / len(examples)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dev", type=Path, default=DEV, help="SQuAD v1.1 dev JSON")
    parser.add_argument("--questions", type=int, default=1000, help="first n questions (round-robin over articles); "
                        "0: all 10,570")
    parser.add_argument("--embeddings", type=Path, default=Path("/tmp/rerank-quality/embeddings"),
                        help="the embeddings bundle (exported from the base model here when missing)")
    parser.add_argument("--rerank", type=Path, nargs="+", required=True, help="rerank bundle folder(s)")
    parser.add_argument("--candidates", type=int, default=20, help="bi-encoder candidates the cross-encoder reorders")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: all cores)")
    parser.add_argument("--out", type=Path, default=RESULTS / "rerank_quality.json")
    args = parser.parse_args(argv)

    examples = read_article_questions(args.dev)
    examples = examples[: args.questions] if args.questions else examples
    if not (args.embeddings / "bundle.json").is_file():
        from berth.build_defaults import build_embeddings_bundle

        build_embeddings_bundle(args.embeddings.parent, threads=args.threads or None)
    rows: dict[str, dict[str, Any]] = {}

    def record(name: str, rankings: list[list[int]], started: float, **facts: Any) -> None:
        seconds = time.time() - started
        relevant = [e.relevant for e in examples]
        rows[name] = {**ranking_metrics(rankings, relevant), "mrr_at_10_se": mrr_standard_error(rankings, relevant),
                      "seconds": round(seconds, 1), "questions_per_s": round(len(examples) / seconds, 2), **facts}
        if name != "bi-encoder" and "bi-encoder" in rows:  # the paired difference: same questions, same gold
            rows[name]["minus_bi_encoder"] = rows[name]["mrr_at_10"] - rows["bi-encoder"]["mrr_at_10"]
            rows[name]["minus_bi_encoder_se"] = mrr_standard_error(rankings, relevant, first_stage)
        print(f"{name}: MRR@10 {rows[name]['mrr_at_10']:.4f}, top-1 {rows[name]['top1']:.4f} ({seconds:.0f} s)",
              flush=True)

    started = time.time()
    first_stage, facts = bi_encoder_rankings(args.embeddings, examples, args.threads)
    record("bi-encoder", first_stage, started, recall_at_candidates=recall_at(first_stage, examples, args.candidates),
           **facts)
    started = time.time()
    record("bm25", bm25_rankings(examples), started)
    for folder in args.rerank:
        started = time.time()
        rankings, facts = cross_encoder_rankings(folder, examples, first_stage, args.candidates, args.threads)
        record(f"cross-encoder {folder.name} ({facts['precision']})", rankings, started, **facts)

    result = {
        "data": str(args.dev), "questions": len(examples),
        "candidates_per_question": round(float(np.mean([len(e.documents) for e in examples])), 1),
        "cross_encoder_depth": args.candidates, "rankers": rows, "rerank_bundles": [str(f) for f in args.rerank],
        "embeddings_bundle": str(args.embeddings), "machine": machine_facts(args.threads or None),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{result['questions']} questions, {result['candidates_per_question']} candidate paragraphs per question "
             f"on average",
             "", "| ranker | MRR@10 (± s.e.) | minus the bi-encoder's (± paired s.e.) | top-1 | questions/s |",
             "|---|---|---|---|---|"]
    for name, row in result["rankers"].items():
        gain = (f"{row['minus_bi_encoder']:+.3f} (± {row['minus_bi_encoder_se']:.3f})" if "minus_bi_encoder" in row
                else "")
        lines.append(f"| {name} | {row['mrr_at_10']:.3f} (± {row['mrr_at_10_se']:.3f}) | {gain} | {row['top1']:.3f} "
                     f"| {row['questions_per_s']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
