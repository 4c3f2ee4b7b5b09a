"""The rerank guard: a reranker ships only if it ranks its dev questions better than the embeddings model whose
candidates it reorders (MRR@10 on the same candidates). Otherwise the latency it adds buys nothing, so the build
tries the recipe's fallbacks in turn and, when none beats the embeddings model, ships no reranker."""

from __future__ import annotations

import math
from pathlib import Path

GUARD_METRIC = "mrr_at_10"


def embeddings_dev_figures(dev_file: Path, bundle: Path, threads: int | None) -> dict:
    """The embeddings model's MRR@10 (with its standard error) ranking the candidates of every question of
    `dev_file`, through its ONNX bundle (`bundle`) as /v1/embed serves it."""
    from tasks.first_stage import embedding_rankings
    from tasks.rerank import mrr_standard_error, ranking_metrics, read_article_questions

    examples = read_article_questions(dev_file)
    rankings, _ = embedding_rankings(bundle, examples, threads)
    relevant = [e.relevant for e in examples]
    metrics = ranking_metrics(rankings, relevant)
    return {GUARD_METRIC: round(metrics[GUARD_METRIC], 4), "standard_error": round(mrr_standard_error(rankings,
            relevant), 4), "queries": len(examples), "bundle": str(bundle)}


def verdict(reranker_metrics: dict[str, float], embeddings: dict) -> dict:
    """Whether the reranker's dev MRR@10 is above the embeddings model's on the same questions, with both."""
    value = reranker_metrics.get(GUARD_METRIC, float("nan"))
    passed = not math.isnan(value) and value > embeddings[GUARD_METRIC]
    return {"metric": GUARD_METRIC, "reranker": round(value, 4), "embeddings": embeddings[GUARD_METRIC],
            "embeddings_standard_error": embeddings["standard_error"], "queries": embeddings["queries"],
            "embeddings_bundle": embeddings["bundle"],
            "passed": passed}


def verdict_line(check: dict) -> str:
    word = "beats" if check["passed"] else "does NOT beat"
    return (f"reranker dev MRR@10 {check['reranker']:.4f} {word} the embeddings model's {check['embeddings']:.4f} "
            f"(± {check['embeddings_standard_error']:.4f}) on the same {check['queries']} questions")
