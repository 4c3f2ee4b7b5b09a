"""Inputs given as token ids instead of text (OpenAI's embeddings API and text-embeddings-inference take both).

An id list is one input: it is checked against the model's vocabulary (422 naming the first bad id), wrapped
in [CLS] ... [SEP] as the tokenizer wraps a text, and held to the same rules as a text: the same per-input
limit (an id counts as a character: every token is at least one), and the same truncation (cut to the
model's max_seq_length only when the request allows it, and then said; otherwise `InputTooLong`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Strict

from service.errors import ErrorType, ServiceError
from tasks.common import InputFailed, InputTooLong
from tasks.definition import Prepared, TaskDefinition
from tasks.runtime.tokenizer import CLS, SEP, EncodedInput

if TYPE_CHECKING:
    from service.models import ServedModel

TokenIds = list[Annotated[int, Strict()]]  # strict: true, 1.0 and "1" are not ids


def is_ids(raw: Any) -> bool:
    return isinstance(raw, list)


def as_inputs(value: Any) -> Any:
    """One flat id list is one input (not a list of inputs): `[101, 2023]` -> `[[101, 2023]]`."""
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return [value]
    return value


def check_ids(model: ServedModel, ids: Sequence[int], where: str) -> None:
    """422 for an empty list or an id outside the model's vocabulary, naming it."""
    if not ids:
        raise ServiceError(ErrorType.VALIDATION, f"{where}: the token id list is empty; send at least one id")
    size = model.tokenizer.get_vocab_size()
    for position, token in enumerate(ids):
        if not 0 <= token < size:
            raise ServiceError(ErrorType.VALIDATION, f"{where}[{position}]: token id {token} is not in the "
                               f"vocabulary of model {model.name!r} (ids 0..{size - 1})")


def check_id_lengths(inputs: Sequence[Any], settings: Any, name: str = "inputs") -> None:
    """The per-input and per-request character limits, an id counting as a character (413 naming the input). The
    request's texts count too (check_inputs bounds them alone), so a list mixing texts and ids has one budget."""
    total = sum(len(raw) for raw in inputs if isinstance(raw, str))
    for index, raw in enumerate(inputs):
        if not is_ids(raw):
            continue
        if len(raw) > settings.max_chars_per_input:
            raise ServiceError(ErrorType.TOO_LARGE, f"{name}[{index}]: {len(raw)} token ids; the limit is "
                               f"{settings.max_chars_per_input} (max_chars_per_input)")
        total += len(raw)
        if total > settings.max_chars_per_request:
            raise ServiceError(ErrorType.TOO_LARGE, f"{name}: more than {settings.max_chars_per_request} characters "
                               "and token ids in one request (max_chars_per_request); split it into several requests")


def encode_ids(model: ServedModel, ids: Sequence[int], truncate: bool) -> EncodedInput:
    """`[CLS] ids [SEP]`, cut to the model's max_seq_length when `truncate` (else `InputTooLong`)."""
    tokenizer, max_length = model.tokenizer, model.spec.max_seq_length
    if len(ids) + 2 > max_length and not truncate:
        raise InputTooLong(len(ids) + 2, max_length)
    kept = list(ids[: max_length - 2])
    dropped = len(ids) - len(kept)
    n = len(kept)
    return EncodedInput([tokenizer.token_to_id(CLS), *kept, tokenizer.token_to_id(SEP)], [0] * (n + 2),
                        [(0, 0)] * (n + 2), [None, *([0] * n), None], [None] * (n + 2), dropped > 0, dropped)


def prepare_mixed(definition: TaskDefinition, model: ServedModel, inputs: Sequence[Any], body: Any) -> list[Prepared]:
    """Every input's one item: texts through the task (one `encode_batch`), id lists by `encode_ids`. Raises
    `InputFailed` naming the first input, in request order, that cannot be prepared."""
    prepared: list[Prepared | None] = [None] * len(inputs)
    failed: InputFailed | None = None
    for index, raw in enumerate(inputs):
        if is_ids(raw):
            try:
                item = encode_ids(model, raw, body.truncate)
            except InputTooLong as error:
                failed = InputFailed(index, error)
                break
            prepared[index] = Prepared([item], item, item.truncated)
    texts = [(index, raw) for index, raw in enumerate(inputs) if not is_ids(raw)
             and (failed is None or index < failed.index)]
    if texts:
        try:
            done = definition.prepare_many(model.tokenizer, model.spec, [raw for _, raw in texts], body)
        except InputFailed as text_failed:
            raise InputFailed(texts[text_failed.index][0], text_failed.error) from None
        for (index, _), p in zip(texts, done):
            prepared[index] = p
    if failed is not None:
        raise failed
    return prepared  # type: ignore[return-value]
