"""Sequence classification (single texts and pairs): encoding, the label set, logits -> answers.

Used by training to build features and by the service on every request, so decoding is vectorized
over the batch. Three problem types, named as in Hugging Face configs:
- `single_label_classification`: softmax over the labels, one label per input;
- `multi_label_classification`: an independent sigmoid per label;
- `regression`: one output (num_labels == 1), returned as a score.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from tasks.definition import InputFailed, Prepared, TaskDefinition, margin
from tasks.tokenizer import EncodedInput, encode_many, truncation

SINGLE_LABEL = "single_label_classification"
MULTI_LABEL = "multi_label_classification"
REGRESSION = "regression"
PROBLEM_TYPES = (SINGLE_LABEL, MULTI_LABEL, REGRESSION)


class InputTooLong(ValueError):
    """An input has more tokens than the model takes and truncation was not allowed (HTTP 413)."""

    def __init__(self, num_tokens: int, max_length: int):
        self.num_tokens = num_tokens
        self.max_length = max_length
        super().__init__(
            f"input is {num_tokens} tokens long (special tokens included); the model takes at most {max_length}"
        )


def encode_classification(
    tokenizer: Tokenizer,
    text: str,
    text_pair: str | None = None,
    max_length: int = 128,
    truncate: bool = True,
) -> EncodedInput:
    """`[CLS] text [SEP] (text_pair [SEP])`, at most `max_length` tokens.

    With `truncate` the longer of the two texts loses tokens first (`truncated` says whether any
    did); without it an input that does not fit raises `InputTooLong` with its token count.
    """
    try:
        return encode_classification_many(tokenizer, [text], None if text_pair is None else [text_pair],
                                          max_length, truncate)[0]
    except InputFailed as failed:
        raise failed.error from None


def encode_classification_many(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    text_pairs: Sequence[str | None] | None = None,
    max_length: int = 128,
    truncate: bool = True,
) -> list[EncodedInput]:
    """`encode_classification` of each (text, text pair) with one `encode_batch` call; without `truncate`,
    `InputFailed(index, InputTooLong)` names the first that does not fit."""
    if truncate:
        return encode_many(tokenizer, texts, text_pairs, max_length=max_length, truncation="longest_first")
    encoded = encode_many(tokenizer, texts, text_pairs, max_length=None)
    for index, item in enumerate(encoded):
        if len(item) > max_length:
            raise InputFailed(index, InputTooLong(len(item), max_length))
    return encoded


def _sort_key(label: str) -> tuple[int, float | str]:
    try:
        return (0, float(label))
    except ValueError:
        return (1, label)


class LabelSet:
    """Label names in id order: the order saved with the model (`id2label`) and used by its head."""

    def __init__(self, labels: Iterable[str]):
        self.labels: list[str] = [str(x) for x in labels]
        if not self.labels:
            raise ValueError("a label set needs at least one label")
        self._ids = {name: i for i, name in enumerate(self.labels)}
        if len(self._ids) != len(self.labels):
            raise ValueError(f"duplicate labels in {self.labels}")

    @classmethod
    def from_data(cls, labels: Iterable[str | int | None]) -> LabelSet:
        """The distinct labels found in training data, sorted: numerically when all are numbers
        ("2" before "10"), else as strings. None (unlabelled) is ignored."""
        found = {str(x) for x in labels if x is not None}
        return cls(sorted(found, key=_sort_key))

    @classmethod
    def from_id2label(cls, id2label: Mapping[int | str, str]) -> LabelSet:
        """From a Hugging Face config's `id2label` (its keys may be strings of ints)."""
        ordered = sorted(((int(k), v) for k, v in id2label.items()), key=lambda kv: kv[0])
        if [k for k, _ in ordered] != list(range(len(ordered))):
            raise ValueError(f"id2label ids are not 0..{len(ordered) - 1}: {sorted(id2label)}")
        return cls(v for _, v in ordered)

    def id(self, label: str | int) -> int:
        try:
            return self._ids[str(label)]
        except KeyError:
            raise KeyError(f"unknown label {label!r}; the labels are {self.labels}") from None

    def name(self, label_id: int) -> str:
        return self.labels[label_id]

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.labels))

    @property
    def label2id(self) -> dict[str, int]:
        return dict(self._ids)

    def __len__(self) -> int:
        return len(self.labels)

    def __iter__(self):
        return iter(self.labels)

    def __contains__(self, label: object) -> bool:
        return str(label) in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelSet) and self.labels == other.labels

    def __repr__(self) -> str:
        return f"LabelSet({self.labels})"


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = logits - logits.max(axis=axis, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=axis, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * logits))  # overflow-free form of 1 / (1 + exp(-x))


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

# Used by the parity gate when neither ../shared/data nor the shipped samples are there (an installed wheel).
BUILTIN_SENTENCES = [
    "The film is a charming and often affecting journey.",
    "Unflinchingly bleak and desperate.",
    "It's slow -- very, very slow.",
    "A sometimes tedious film, but the acting, costumes, music and cinematography are all astounding.",
    "Emma is a novel by Jane Austen, first published in December 1815.",
    "The European Commission said on Thursday it disagreed with German advice to consumers to shun British lamb.",
    "Peter Blackburn met officials of the World Health Organization in Geneva on Monday.",
    "Who wrote the theory of relativity, and when was it published?",
]


class ClassifyOptions(BaseModel):
    top_k: int | None = Field(None, ge=1, le=1000, description="return the k best labels, ranked, per input")
    truncate: bool = Field(True, description="cut inputs longer than the model's max_seq_length (the result says "
                                             "\"truncated\": true); false: such an input is refused with 413")


def read_sentences(path: Path | None, size: int) -> list[str]:
    """The first `size` texts of an SST-2 TSV or a text table; the built-in sentences without a file."""
    from tasks import readers

    if path is None:
        return BUILTIN_SENTENCES[:size]
    examples = readers.read_sst2(path) if path.suffix == ".tsv" else readers.read_table(path)
    return [e.text for e in examples[:size]]


class ClassificationTask(TaskDefinition):
    """One text -> a label and its probability (or a regression score); accuracy / F1 / Pearson."""

    name = "classification"
    head_class = "BertForSequenceClassification"
    output_names = ("logits",)
    route = "/v1/classify"
    options = ClassifyOptions
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
                                             truncate=options.truncate)
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

    def served_input(self, example: Any) -> Any:
        return example.text

    def score(self, spec, examples, results) -> tuple[dict[str, float], dict]:
        from tasks import cls_metrics

        if spec.problem_type == REGRESSION:
            return cls_metrics.regression_metrics([r["score"] for r in results], [float(e.label) for e in examples]), {}
        positive = "1" if sorted(spec.labels) == ["0", "1"] else None
        return cls_metrics.classification_metrics([r["label"] for r in results], [str(e.label) for e in examples],
                                                  positive=positive), {}

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
        return read_sentences(path, size)


class PairTask(ClassificationTask):
    """Two texts -> a label (paraphrase, entailment) or a similarity score."""

    name = "pair"
    route = "/v1/pair"
    input_fields = ("text", "text_pair")
    parity_files = ("mrpc/dev.tsv", "stsb/dev.jsonl")

    def _texts(self, raw: Any) -> tuple[str, str | None]:
        return raw.text, raw.text_pair

    def served_input(self, example: Any) -> Any:
        return example  # readers.TextExample has text and text_pair, as the route's input

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        from tasks import readers

        if path is None:
            return [readers.TextExample(a, b) for a, b in zip(BUILTIN_SENTENCES[0::2], BUILTIN_SENTENCES[1::2])][:size]
        rows = readers.read_mrpc(path) if path.suffix == ".tsv" else readers.read_table(path, regression=True)
        return [readers.TextExample(e.text, e.text_pair) for e in rows[:size]]


DEFINITIONS = (ClassificationTask(), PairTask())
