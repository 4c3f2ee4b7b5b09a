"""Fill-mask: the masked-LM head's logits at each [MASK] -> the top-k tokens, as transformers'
fill-mask pipeline answers. Torch-free.

Per [MASK]: softmax over the vocabulary, the k most probable tokens with their probability, the
token's text (`decode([id])`) and the whole sequence with that token in place. With one [MASK] the
sequence is decoded without special tokens; with several, the pipeline keeps the special tokens
(so the other [MASK]s stay visible), and so does this.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tasks.classification import softmax
from tasks.tokenizer import MASK, PAD, EncodedInput


def mask_positions(tokenizer: Tokenizer, encoded: EncodedInput) -> list[int]:
    mask_id = tokenizer.token_to_id(MASK)
    return [i for i, token in enumerate(encoded.input_ids) if token == mask_id]


def decode_fill_mask(tokenizer: Tokenizer, encoded: EncodedInput, positions: list[int], logits: np.ndarray,
                     top_k: int = 5) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
    """`logits` is (T, V) for this input. One mask: a list of top_k candidates; several: one list per mask."""
    probs = softmax(np.asarray(logits, dtype=np.float32)[positions])  # (M, V)
    top_k = min(top_k, probs.shape[-1])
    best = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]  # (M, k)
    pad_id = tokenizer.token_to_id(PAD)
    single = len(positions) == 1
    rows = []
    for position, candidates, row_probs in zip(positions, best, probs):
        row = []
        for token in candidates.tolist():
            ids = list(encoded.input_ids)
            ids[position] = token
            ids = [i for i in ids if i != pad_id]
            row.append({"score": float(row_probs[token]), "token": int(token),
                        "token_str": tokenizer.decode([token], skip_special_tokens=False),
                        "sequence": tokenizer.decode(ids, skip_special_tokens=single)})
        rows.append(row)
    return rows[0] if single else rows
