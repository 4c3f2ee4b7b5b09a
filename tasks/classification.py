"""Sequence classification (single texts and pairs): logits -> answers, and the two task definitions (their
encoder and label set are tasks/common.py's).

Used by the service on every request, so decoding is vectorized
over the batch. Three problem types, named as in Hugging Face configs:
- `single_label_classification`: softmax over the labels, one label per input;
- `multi_label_classification`: an independent sigmoid per label;
- `regression`: one output (num_labels == 1), returned as a score.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from tasks import readers
from tasks.common import LabelSet, encode_classification_many, margin, sigmoid, softmax
from tasks.definition import (
    TRUNCATION,
    Endpoint,
    InputField,
    ListOf,
    Prepared,
    RowLayout,
    StructOf,
    TaskDefinition,
    columns,
    truncation_fields,
)
from tasks.runtime.tokenizer import truncation

SINGLE_LABEL = "single_label_classification"
MULTI_LABEL = "multi_label_classification"
REGRESSION = "regression"
PROBLEM_TYPES = (SINGLE_LABEL, MULTI_LABEL, REGRESSION)


def resolve_problem_type(problem_type: str | None, num_outputs: int) -> str:
    """None means regression for one output, else single-label classification (as Hugging Face)."""
    if problem_type is None:
        return REGRESSION if num_outputs == 1 else SINGLE_LABEL
    if problem_type not in PROBLEM_TYPES:
        raise ValueError(f"unknown problem_type {problem_type!r}; use one of {PROBLEM_TYPES}")
    return problem_type


def decode_classification(
    logits: np.ndarray,
    labels: Sequence[str] | LabelSet,
    top_k: int | None = None,
    problem_type: str | None = None,
) -> list[dict | list[dict]]:
    """Turn logits (B, C) into one answer per row, in row order.

    - regression: `{"score": float}` (the raw output; `labels` is ignored);
    - single-label: softmax; `{"label", "score"}` for the best label, or with `top_k` the `top_k`
      best as a list, highest score first;
    - multi-label: independent sigmoid scores; by default all labels ranked by score (the caller
      applies its threshold), with `top_k` only the first `top_k`.
    """
    logits = np.asarray(logits, dtype=np.float32)
    if logits.ndim == 1:
        logits = logits[None, :]
    if logits.ndim != 2:
        raise ValueError(f"logits must be (batch, num_labels), got shape {logits.shape}")
    kind = resolve_problem_type(problem_type, logits.shape[1])
    if kind == REGRESSION:
        if logits.shape[1] != 1:
            raise ValueError(f"regression needs one output per row, got {logits.shape[1]}")
        return [{"score": float(x)} for x in logits[:, 0]]
    names = list(labels)
    if len(names) != logits.shape[1]:
        raise ValueError(f"{logits.shape[1]} logits per row but {len(names)} labels")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    scores = softmax(logits) if kind == SINGLE_LABEL else sigmoid(logits)
    if kind == SINGLE_LABEL and top_k is None:
        best = scores.argmax(axis=1)
        return [{"label": names[j], "score": float(scores[i, j])} for i, j in enumerate(best)]
    keep = len(names) if top_k is None else min(top_k, len(names))
    ranked = np.argsort(-scores, axis=1, kind="stable")[:, :keep]
    return [[{"label": names[j], "score": float(scores[i, j])} for j in row] for i, row in enumerate(ranked)]


# -- the task definitions ------------------------------------------------------------------------------

class ClassifyOptions(BaseModel):
    top_k: int | None = Field(None, strict=True, ge=1, le=1000,
                              description="return the k best labels, ranked, per input")
    truncate: bool = Field(
        True, strict=True, description="cut inputs longer than the model's max_seq_length (the result says "
                                       "\"truncated\": true); false: such an input is refused with 413")


class ClassificationTask(TaskDefinition):
    """One text -> a label and its probability (or a regression score); accuracy / F1 / Pearson."""

    name = "classification"
    head_class = "BertForSequenceClassification"
    training_adapter = "ClassificationAdapter"
    pools = True
    output_names = ("logits",)
    endpoints = (Endpoint(
        "/v1/classify", "classify", "Single-text classification (or regression)",
        "One result per input, in input order: `{label, score, truncated}`; with `top_k` the ranked list.",
        request="ClassifyRequest", response="ClassifyResponse",
        examples=({"inputs": "A charming and often affecting journey."},
                  {"inputs": ["Unflinchingly bleak and desperate.", "A gorgeous, witty, seductive movie."],
                   "top_k": 2}),
    ),)
    options = ClassifyOptions
    pipeline_tasks = ("text-classification",)
    metric_examples = 1000
    parity_files = ("sst2/dev.tsv", "topics/dev.jsonl")

    def needs_labels(self, problem_type: str | None) -> bool:
        return problem_type != REGRESSION

    def _texts(self, raw: Any) -> tuple[str, str | None]:
        return raw, None

    def prepare_many(self, tokenizer: Tokenizer, spec: Any, inputs: Sequence[Any], options: Any) -> list[Prepared]:
        if self.input_fields:  # pairs
            texts = [self._texts(raw) for raw in inputs]
            firsts, seconds = [a for a, _ in texts], [b for _, b in texts]
        else:
            firsts, seconds = inputs, None
        encoded = encode_classification_many(tokenizer, firsts, seconds, max_length=spec.max_seq_length,
                                             truncate=options.truncate, spans=False)
        return [Prepared([item], truncated=item.truncated) for item in encoded]

    def response_bytes(self, spec, prepared, options) -> int:
        return 96 * max(1, min(options.top_k or 1, len(spec.labels) or 1)) + 64

    def decode(self, tokenizer, spec, prepared, outputs, options) -> list[Any]:
        logits = np.stack([out[0]["logits"] for out in outputs])  # (N, C)
        results = decode_classification(logits, spec.labels, options.top_k, spec.problem_type)
        for result, p in zip(results, prepared):
            for entry in result if isinstance(result, list) else [result]:
                entry.update(truncation(p.items[0]))
        return results

    def row_layout(self, spec, options) -> RowLayout:
        """One label (or a regression score): `label`, `score` and the truncation; ranked labels (`top_k`, or
        multi-label): `labels`, the truncation (every entry's: the input's) beside them."""
        kind = resolve_problem_type(spec.problem_type, max(1, len(spec.labels)))
        if kind == REGRESSION or (kind == SINGLE_LABEL and options.top_k is None):
            return RowLayout(columns(("label", "string"), ("score", "float64")) + TRUNCATION,
                             lambda r: {"label": r.get("label"), "score": r["score"], **truncation_fields(r)})
        label = StructOf(columns(("label", "string"), ("score", "float64")) + TRUNCATION)
        return RowLayout(columns(("labels", ListOf(label))) + TRUNCATION,
                         lambda r: {"labels": r, **truncation_fields(r[0] if r else {})})

    def served_input(self, example: Any) -> Any:
        return example.text

    def score(self, spec, examples, results) -> tuple[dict[str, float], dict]:
        from tasks import cls_metrics

        if spec.problem_type == REGRESSION:
            return cls_metrics.regression_metrics([r["score"] for r in results], [float(e.label) for e in examples]), {}
        positive = "1" if sorted(spec.labels) == ["0", "1"] else None
        return cls_metrics.classification_metrics([r["label"] for r in results], [str(e.label) for e in examples],
                                                  positive=positive), {}

    def report(self, spec, examples, results) -> dict[str, Any]:
        from tasks import cls_metrics

        if spec.problem_type == REGRESSION:
            return {}
        return cls_metrics.label_report([r["label"] for r in results], [str(e.label) for e in examples], spec.labels)

    def parity_answer(self, tokenizer, spec, prepared, outputs) -> Hashable:
        logits = outputs[0]["logits"]  # (C,)
        kind = resolve_problem_type(spec.problem_type, logits.shape[-1])
        if kind == REGRESSION:
            return float(logits[0])
        if kind == MULTI_LABEL:
            return tuple(bool(x) for x in logits > 0)
        return int(np.argmax(logits))

    def confidence(self, spec, prepared, outputs) -> float:
        logits = outputs[0]["logits"]
        kind = resolve_problem_type(spec.problem_type, logits.shape[-1])
        if kind == REGRESSION:
            return 1.0
        if kind == MULTI_LABEL:  # per label: distance of the sigmoid from 0.5, doubled
            return float(np.min(np.abs(sigmoid(logits) - 0.5)) * 2)
        return float(margin(logits))

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        return readers.read_sentences(path, size)


class PairTask(ClassificationTask):
    """Two texts -> a label (paraphrase, entailment) or a similarity score."""

    name = "pair"
    endpoints = (Endpoint(
        "/v1/pair", "pair", "Sentence-pair classification or regression",
        "`{label, score, truncated}` per pair (regression models: `{score, truncated}`).",
        request="PairRequest", response="ClassifyResponse",
        inputs_description="a {text, text_pair} object or a list of them",
        input_object="TextPair", fields=(InputField("text"), InputField("text_pair")),
        examples=({"inputs": {"text": "The cat sat on the mat.",
                              "text_pair": "A cat was sitting on a mat."}},),
    ),)
    input_fields = ("text", "text_pair")
    parity_files = ("mrpc/dev.tsv", "stsb/dev.jsonl")

    def _texts(self, raw: Any) -> tuple[str, str | None]:
        return raw.text, raw.text_pair

    def served_input(self, example: Any) -> Any:
        return example  # readers.TextExample has text and text_pair, as the route's input

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        return readers.read_sentence_pairs(path, size)


DEFINITIONS = (ClassificationTask(), PairTask())
