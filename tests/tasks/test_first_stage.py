"""The first stage a reranker reorders: the embeddings bundle ranks each question's candidates as
sentence-transformers ranks them with the same checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tasks.first_stage import embedding_rankings
from tasks.rerank import read_article_questions

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"


@pytest.mark.slow
def test_embedding_rankings_match_sentence_transformers_on_the_same_checkpoint(tmp_path, base_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from berth.build_defaults import build_embeddings_bundle

    bundle = build_embeddings_bundle(tmp_path, threads=2)
    examples = read_article_questions(SAMPLES / "rerank" / "dev.json")[:24]
    rankings, facts = embedding_rankings(bundle, examples, threads=2)
    model = sentence_transformers.SentenceTransformer(str(base_path), device="cpu")
    for example, ranking in zip(examples, rankings):
        vectors = model.encode([example.query, *example.documents], normalize_embeddings=True)
        scores = vectors[1:] @ vectors[0]
        assert ranking == np.argsort(-scores, kind="stable").tolist(), example.id
    assert facts["documents_embedded"] == len({d for e in examples for d in e.documents})
