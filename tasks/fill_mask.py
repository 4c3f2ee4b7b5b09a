"""Fill-mask: the masked-LM head's logits at each [MASK] -> the top-k tokens, as transformers'
fill-mask pipeline answers. Torch-free.

Per [MASK]: softmax over the vocabulary, the k most probable tokens with their probability, the
token's text (`decode([id])`) and the whole sequence with that token in place. With one [MASK] the
sequence is decoded without special tokens; with several, the pipeline keeps the special tokens
(so the other [MASK]s stay visible), and so does this.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from tasks import readers
from tasks.common import InputFailed, InputTooLong, Refusal, TooLarge, margin, softmax
from tasks.definition import Endpoint, ListOf, Prepared, RowLayout, ServingLimits, StructOf, TaskDefinition, columns
from tasks.runtime.inference import Keep
from tasks.runtime.tokenizer import MASK, PAD, EncodedInput


def mask_positions(tokenizer: Tokenizer, encoded: EncodedInput) -> list[int]:
    mask_id = tokenizer.token_to_id(MASK)
    return [i for i, token in enumerate(encoded.input_ids) if token == mask_id]


def decode_fill_mask(tokenizer: Tokenizer, encoded: EncodedInput, positions: list[int], logits: np.ndarray,
                     top_k: int = 5) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
    """`logits` is (T, V) for this input. One mask: a list of top_k candidates; several: one list per mask."""
    ids, probs = top_candidates(np.asarray(logits)[positions], top_k)
    return describe_candidates(tokenizer, encoded, positions, ids, probs)


def top_candidates(mask_logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, V) logits at the [MASK]s -> the top k token ids (M, k) and their softmax probabilities (M, k)."""
    probs = softmax(np.asarray(mask_logits, dtype=np.float32))  # (M, V)
    top_k = min(top_k, probs.shape[-1])
    ids = np.stack([top_indices(row, top_k) for row in probs]) if len(probs) else np.zeros((0, top_k), np.int64)
    return ids, np.take_along_axis(probs, ids, axis=-1)


def describe_candidates(tokenizer: Tokenizer, encoded: EncodedInput, positions: list[int], ids: np.ndarray,
                        probs: np.ndarray) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
    """The pipeline's answer from each [MASK]'s top ids and probabilities: score, token, its text, and the
    sequence with it in place (without special tokens for one mask; with them, so the others show, for several)."""
    pad_id = tokenizer.token_to_id(PAD)
    single = len(positions) == 1
    base = [i for i in encoded.input_ids]
    rows = []
    for position, candidates, row_probs in zip(positions, ids.tolist(), probs.tolist()):
        row = []
        for token, prob in zip(candidates, row_probs):
            filled = base.copy()
            filled[position] = token
            filled = [i for i in filled if i != pad_id]
            row.append({"score": float(prob), "token": int(token),
                        "token_str": tokenizer.decode([token], skip_special_tokens=False),
                        "sequence": tokenizer.decode(filled, skip_special_tokens=single)})
        rows.append(row)
    return rows[0] if single else rows


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest scores, highest first, ties by lower index: what a stable argsort of -scores
    gives, without sorting the whole vocabulary (a full sort was ~2 ms per [MASK] on the event loop)."""
    kth = np.partition(scores, scores.size - k)[scores.size - k]
    candidates = np.flatnonzero(scores >= kth)  # the top k and any ties with the k-th
    return candidates[np.lexsort((candidates, -scores[candidates]))][:k]


class FillMaskOptions(BaseModel):
    top_k: int = Field(5, strict=True, ge=1, le=100, description="candidate tokens per [MASK]")


class NoMask(Refusal):
    """An input without a [MASK] token."""


class FillMaskTask(TaskDefinition):
    """Text with [MASK]s -> the top-k tokens for each, as transformers' fill-mask pipeline."""

    name = "fill-mask"
    head_class = "BertForMaskedLM"
    output_names = ("logits",)
    per_token = True
    endpoints = (Endpoint(
        "/v1/fill-mask", "fill_mask", "Top-k tokens for each [MASK]",
        "`[{score, token, token_str, sequence}]` per input (a list per [MASK] when there are several), as\n"
        "transformers' fill-mask pipeline. 422 when an input has no [MASK].",
        request="FillMaskRequest", response="FillMaskResponse",
        inputs_description="a text or a list of texts, each with at least one [MASK]",
        examples=({"inputs": "Paris is the [MASK] of France.", "top_k": 3},),
    ),)
    options = FillMaskOptions
    pipeline_tasks = ("fill-mask",)
    parity_examples = 128
    agreement = "same top-1 token at the [MASK] position"
    parity_files = ("sst2/dev.tsv", "topics/dev.jsonl")

    def prepare_many(self, tokenizer, spec, inputs: Sequence[str], options) -> list[Prepared]:
        """InputFailed with NoMask for a text without [MASK], with InputTooLong above max_seq_length (a masked
        text is never cut), for the first input that has either."""
        from tasks.runtime.tokenizer import encode_many

        prepared = []
        for index, encoded in enumerate(encode_many(tokenizer, inputs, max_length=None)):
            positions = mask_positions(tokenizer, encoded)
            if not positions:
                raise InputFailed(index, NoMask(f"no {MASK} token; put {MASK} where a token should be predicted"))
            if len(encoded) > spec.max_seq_length:
                raise InputFailed(index, InputTooLong(len(encoded), spec.max_seq_length))
            # (the sequence's UTF-8 bytes, decoded once: what each candidate's "sequence" costs in the answer)
            sequence_bytes = len(tokenizer.decode(encoded.input_ids, skip_special_tokens=False).encode("utf-8"))
            prepared.append(Prepared([encoded], (encoded, positions, sequence_bytes)))
        return prepared

    def check_prepared(self, spec, prepared, options, limits: ServingLimits) -> None:
        for index, p in enumerate(prepared):
            masks = len(p.state[1])
            if masks > limits.max_masks_per_input:
                raise TooLarge(f"{masks} [MASK] tokens; the limit is {limits.max_masks_per_input} per input "
                               "(max_masks_per_input)", index=index)

    def keep(self, tokenizer, spec, options) -> Keep:
        """Only each [MASK]'s top k, reduced where the pass ran: never 30,522 logits per token."""
        mask_id, top_k = tokenizer.token_to_id(MASK), options.top_k

        def reduce(item: EncodedInput, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            positions = [i for i, token in enumerate(item.input_ids) if token == mask_id]
            ids, probs = top_candidates(rows["logits"][positions], top_k)
            return {"top_ids": ids, "top_probs": probs}

        return Keep(("logits",), reduce)

    def response_bytes(self, spec, prepared, options) -> int:
        _, positions, sequence_bytes = prepared.state
        # per candidate: the sequence with the token in place (a token's text is at most ~20 bytes more than the
        # [MASK] it replaces), its token_str, score and keys
        return len(positions) * options.top_k * (sequence_bytes + 128) + 64

    def decode(self, tokenizer, spec, prepared, outputs, options) -> list[Any]:
        return [describe_candidates(tokenizer, p.state[0], p.state[1], out[0]["top_ids"], out[0]["top_probs"])
                for p, out in zip(prepared, outputs)]

    def row_layout(self, spec, options) -> RowLayout:
        """`candidates`: a list per [MASK] always (a column has one type; the route answers a text of one [MASK]
        with the bare list)."""
        candidate = StructOf(columns(("score", "float64"), ("token", "int64"), ("token_str", "string"),
                                     ("sequence", "string")))
        return RowLayout(columns(("candidates", ListOf(ListOf(candidate)))),
                         lambda r: {"candidates": r if r and isinstance(r[0], list) else [r]})

    def kept_rows(self, prepared: Prepared, name: str, rows: np.ndarray) -> np.ndarray:
        return rows[prepared.state[1]]  # (M, V): only the [MASK] rows (the vocabulary is large)

    def parity_answer(self, tokenizer, spec, prepared, outputs) -> Hashable:
        return tuple(int(i) for i in np.argmax(outputs[0]["logits"], axis=-1))

    def confidence(self, spec, prepared, outputs) -> float:  # the least clear [MASK] position
        return float(margin(outputs[0]["logits"]).min())

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        """Dev sentences with a middle word-piece masked (never [CLS] or the last [SEP])."""
        return [MaskedText(text) for text in readers.read_sentences(path, size)]

    def prepare_parity(self, tokenizer, spec, raw: MaskedText) -> Prepared:
        from tasks.runtime.tokenizer import encode

        encoded = encode(tokenizer, raw.text, max_length=spec.max_seq_length)
        position = max(1, (len(encoded) - 1) // 2)
        encoded.input_ids = list(encoded.input_ids)
        encoded.input_ids[position] = tokenizer.token_to_id(MASK)
        return Prepared([encoded], (encoded, [position]))


@dataclass(frozen=True, slots=True)
class MaskedText:
    """A parity input: a text whose middle token the gate masks after encoding."""

    text: str


DEFINITIONS = (FillMaskTask(),)
