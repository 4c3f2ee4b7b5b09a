"""Pad encoded sequences into the int64 arrays a BERT model (PyTorch or ONNX) takes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tasks.runtime.tokenizer import EncodedInput

MODEL_INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def pad_batch(
    items: Sequence[EncodedInput], pad_to: int | None = None, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """Right-pad to the longest item (or to `pad_to`, which must be at least that long).

    Returns `input_ids`, `attention_mask` and `token_type_ids`, each int64 of shape (B, T).
    """
    longest = max((len(x) for x in items), default=0)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest item ({longest} tokens)")
    batch = len(items)
    input_ids = np.full((batch, width), pad_id, dtype=np.int64)
    attention_mask = np.zeros((batch, width), dtype=np.int64)
    token_type_ids = np.zeros((batch, width), dtype=np.int64)
    for row, item in enumerate(items):
        n = len(item)
        input_ids[row, :n] = item.input_ids
        attention_mask[row, :n] = 1
        token_type_ids[row, :n] = item.token_type_ids
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
