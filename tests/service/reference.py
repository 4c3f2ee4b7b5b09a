"""What the service should answer: the PyTorch model of the same fine-tuned folder, its logits decoded
by the shared task layer with the bundle's settings."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import torch

from export.onnx_export import load_finetuned
from tasks import classification, ner, qa
from tasks.tokenizer import load_tokenizer
from training.predict import predict


@cache
def _load(folder: Path):
    torch.set_num_threads(2)
    model, spec, _ = load_finetuned(folder)
    return model, spec, load_tokenizer(folder)


def classify(folder: Path, texts: list[str], pairs: list[str] | None = None, top_k: int | None = None) -> list:
    model, spec, tokenizer = _load(folder)
    pairs = pairs or [None] * len(texts)
    items = [classification.encode_classification(tokenizer, t, p, spec.max_seq_length) for t, p in zip(texts, pairs)]
    logits = predict(model, items, ["logits"], per_token=False)["logits"]
    return classification.decode_classification(np.stack(logits), spec.labels, top_k, spec.problem_type)


def entities(folder: Path, text: str, aggregation: str = "simple") -> list[dict]:
    model, spec, tokenizer = _load(folder)
    stride = min(spec.doc_stride, (spec.max_seq_length - 2) // 2)
    windows = ner.ner_windows(tokenizer, text, spec.max_seq_length, stride)
    logits = predict(model, list(windows), ["logits"], per_token=True)["logits"]
    return ner.decode_entities(text, windows, logits, spec.labels, aggregation)


def answers(folder: Path, question: str, context: str, top_k: int = 1) -> list[qa.Answer]:
    model, spec, tokenizer = _load(folder)
    windows = qa.make_windows(tokenizer, question, context, spec.max_seq_length, spec.doc_stride, spec.max_query_length)
    out = predict(model, windows, ["start_logits", "end_logits"], per_token=True)
    return qa.decode_answers(windows, out["start_logits"], out["end_logits"], n_best_size=20, top_k=top_k,
                             handle_impossible=spec.version_2_with_negative)
