"""The first stage a reranker reorders: an `embeddings` bundle (a bi-encoder) ranking each question's candidate
paragraphs by the cosine of their vectors. Torch-free: the bundle runs on ONNX Runtime through the task layer's
served steps, so its ranking is the one `/v1/embed` would give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tasks.embedding import EmbeddingTask, EmbedOptions
from tasks.rerank import RerankExample


def load_bundle_runner(folder: Path, threads: int | None) -> tuple[Any, Any, Any, str]:
    """A bundle's spec, its ONNX Runtime session as the task layer's runner, its tokenizer, its precision."""
    from tasks.bundle_checks import load_bundle
    from tasks.runtime.onnx_session import create_session, onnx_item_runner
    from tasks.runtime.tokenizer import load_tokenizer

    bundle = load_bundle(folder)
    session, _ = create_session(bundle.model_path, bundle.precision, threads or 0, prefer_gpu=False)
    return bundle.spec(), onnx_item_runner(session), load_tokenizer(bundle.tokenizer_path), bundle.precision


def embed_texts(folder: Path, texts: list[str], threads: int | None = None) -> tuple[np.ndarray, int]:
    """(N, H) float32 unit vectors of `texts` from the embeddings bundle in `folder`, and how many it cut to its
    max_seq_length (the served truncation, reported)."""
    spec, run, tokenizer, _ = load_bundle_runner(folder, threads)
    embedded = EmbeddingTask().predict(tokenizer, spec, texts, run, EmbedOptions())
    return np.array([r["embedding"] for r in embedded], dtype=np.float32), sum(r["truncated"] for r in embedded)


def embedding_rankings(folder: Path, examples: list[RerankExample],
                       threads: int | None = None) -> tuple[list[list[int]], dict]:
    """Each example's candidate indices, most similar to its query first (ties in candidate order)."""
    documents = list(dict.fromkeys(d for e in examples for d in e.documents))
    vectors, truncated = embed_texts(folder, documents + [e.query for e in examples], threads)
    by_text = dict(zip(documents, vectors[: len(documents)]))
    rankings = []
    for example, query in zip(examples, vectors[len(documents):]):
        scores = np.stack([by_text[d] for d in example.documents]) @ query
        rankings.append(np.argsort(-scores, kind="stable").tolist())
    return rankings, {"documents_embedded": len(documents), "texts_truncated": truncated}
