"""Sequence classification (single texts and pairs): encoding, the label set, logits -> answers.

Used by training to build features and by the service on every request, so decoding is vectorized
over the batch. Three problem types, named as in Hugging Face configs:
- `single_label_classification`: softmax over the labels, one label per input;
- `multi_label_classification`: an independent sigmoid per label;
- `regression`: one output (num_labels == 1), returned as a score.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from tokenizers import Tokenizer

from tasks.tokenizer import EncodedInput, encode

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
    if truncate:
        return encode(tokenizer, text, text_pair, max_length=max_length, truncation="longest_first")
    encoded = encode(tokenizer, text, text_pair, max_length=None)
    if len(encoded) > max_length:
        raise InputTooLong(len(encoded), max_length)
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
