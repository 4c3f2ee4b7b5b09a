"""What the task modules share: the input errors, label sets, the `[CLS] a [SEP] (b [SEP])` encoders and the
numerics over logits. It imports no task module, so any of them (and the service) can use it. Torch-free."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from tokenizers import Tokenizer

from tasks.runtime.tokenizer import EncodedInput, encode_many

OFFSETS_NOTE = ("Offsets are Python str indices (code points) into the caller's original string, end "
                "exclusive: text[start:end] is the span's text.")


# -- the input errors -------------------------------------------------------------------------------------


class Refusal(ValueError):
    """An input or an option the task refuses: not what the task takes. Its message is the reason; `field` and
    `index` say what it is about (an option or the inputs as a whole by `field` alone, input `index` itself with no
    field, a field of input `index` with both; neither: the message names it), so each caller names the place in
    its own terms and chooses how to answer each kind (the service: service/handlers.py, `service_error`)."""

    def __init__(self, reason: str, field: str | None = None, index: int | None = None):
        super().__init__(reason)
        self.field = field
        self.index = index


class TooLarge(Refusal):
    """More than the task or a limit takes (tokens, choices, masks)."""


class InputTooLong(TooLarge):
    """An input has more tokens than the model takes and truncation was not allowed."""

    def __init__(self, num_tokens: int, max_length: int):
        self.num_tokens = num_tokens
        self.max_length = max_length
        super().__init__(
            f"input is {num_tokens} tokens long (special tokens included); the model takes at most {max_length}"
        )


class InputFailed(ValueError):
    """Input `index` of a list cannot be prepared; `error` is the task's reason (InputTooLong, NoMask...)."""

    def __init__(self, index: int, error: ValueError):
        self.index = index
        self.error = error
        super().__init__(f"input {index}: {error}")


# -- encoding ---------------------------------------------------------------------------------------------


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
    spans: bool = True,
) -> list[EncodedInput]:
    """`encode_classification` of each (text, text pair) with one `encode_batch` call; without `truncate`,
    `InputFailed(index, InputTooLong)` names the first that does not fit. `spans=False`: without character
    offsets (`encode_many`), for a task that reads only the ids."""
    if truncate:
        return encode_many(tokenizer, texts, text_pairs, max_length=max_length, truncation="longest_first",
                           spans=spans)
    encoded = encode_many(tokenizer, texts, text_pairs, max_length=None, spans=spans)
    for index, item in enumerate(encoded):
        if len(item) > max_length:
            raise InputFailed(index, InputTooLong(len(item), max_length))
    return encoded


# -- labels -----------------------------------------------------------------------------------------------


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


# -- numerics over logits ---------------------------------------------------------------------------------


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    shifted = logits - logits.max(axis=axis, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=axis, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * logits))  # overflow-free form of 1 / (1 + exp(-x))


def margin(logits: np.ndarray) -> np.ndarray:
    """Top-1 minus runner-up softmax probability over the last axis: (..., C) -> (...)."""
    top = np.sort(softmax(np.asarray(logits, dtype=np.float64)), axis=-1)
    return top[..., -1] - top[..., -2]
