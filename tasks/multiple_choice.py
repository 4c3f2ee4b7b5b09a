"""Multiple choice (the paper's SWAG head): readers, encoding, ranking and accuracy. Torch-free.

Each choice is its own sequence `[CLS] context [SEP] choice [SEP]`; the head gives it one score
and a softmax over an input's choices gives their probabilities. Training batches the choices of an
example together (B, C, T); serving and evaluation score every choice as its own sequence (B, 1),
which is the same computation.

Readers:
- SWAG's CSV (`sent1`, `sent2`, `ending0`..`ending3`, `label`): the context is `sent1`, choice i is
  `sent2 + " " + ending_i`, as in the BERT paper and Hugging Face's run_swag;
- JSON lines: `{"context": "...", "choices": ["...", ...], "label": 0}` (`id` optional).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from tasks import readers
from tasks.common import (
    InputFailed,
    Refusal,
    TooLarge,
    encode_classification,
    encode_classification_many,
    softmax,
)
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
)
from tasks.runtime.tokenizer import EncodedInput, truncation

SWAG_ENDINGS = ("ending0", "ending1", "ending2", "ending3")


@dataclass
class ChoiceExample:
    id: str
    context: str
    choices: list[str]
    label: int | None = None


def read_swag(path: str | Path) -> list[ChoiceExample]:
    """SWAG's CSV (train/val have `label`; test has none)."""
    examples = []
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in ("sent1", "sent2", *SWAG_ENDINGS) if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a SWAG CSV, columns {missing} are missing")
        for number, row in enumerate(reader):
            label = row.get("label")
            examples.append(ChoiceExample(
                id=row.get("fold-ind") or str(number), context=row["sent1"],
                choices=[f"{row['sent2']} {row[e]}".strip() for e in SWAG_ENDINGS],
                label=int(label) if label not in (None, "") else None))
    return examples


def read_choice_jsonl(path: str | Path) -> list[ChoiceExample]:
    examples = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: invalid JSON: {e.msg} (character {e.colno})") from None
            if not (isinstance(row, dict) and isinstance(row.get("context"), str)
                    and isinstance(row.get("choices"), list)):
                raise ValueError(f"{path}:{number}: expected {{\"context\": str, \"choices\": [str, ...], \"label\"}}")
            label = row.get("label")
            if label is not None and not 0 <= int(label) < len(row["choices"]):
                raise ValueError(f"{path}:{number}: label {label} is not an index into its "
                                 f"{len(row['choices'])} choices")
            examples.append(ChoiceExample(str(row.get("id", number)), row["context"], [str(c) for c in row["choices"]],
                                          None if label is None else int(label)))
    return examples


def read_choices(path: str | Path) -> list[ChoiceExample]:
    """SWAG CSV (.csv) or JSON lines (anything else)."""
    return read_swag(path) if Path(path).suffix.lower() == ".csv" else read_choice_jsonl(path)


def encode_choices(tokenizer: Tokenizer, context: str, choices: Sequence[str], max_length: int) -> list[EncodedInput]:
    """One `[CLS] context [SEP] choice [SEP]` per choice, the longer text truncated first to max_length."""
    return encode_classification_many(tokenizer, [context] * len(choices), choices, max_length=max_length)


def rank_choices(scores: np.ndarray, choices: Sequence[str]) -> list[dict[str, Any]]:
    """Choices with their softmax probabilities, most probable first (ties keep request order)."""
    probs = softmax(np.asarray(scores, dtype=np.float32))
    order = np.argsort(-probs, kind="stable")
    return [{"index": int(i), "choice": choices[i], "score": float(probs[i])} for i in order]


def accuracy(predicted: Sequence[int], gold: Sequence[int]) -> float:
    if len(predicted) != len(gold) or not gold:
        raise ValueError(f"{len(predicted)} predictions for {len(gold)} gold labels")
    return sum(int(p == g) for p, g in zip(predicted, gold)) / len(gold)


MIN_CHOICES = 2  # choices of one input
MAX_CHOICES = 64  # choices of one served input
NEEDS_CHOICES = f"a multiple-choice input needs at least {MIN_CHOICES}"


def too_few_choices(raw: Any) -> bool:
    """The rule no model of the task can answer without: fewer than MIN_CHOICES choices (the route and berth
    predict each count them in their own words before NEEDS_CHOICES)."""
    return len(raw.choices) < MIN_CHOICES


class ChoiceOptions(BaseModel):
    truncate: bool = Field(
        True, strict=True, description="cut texts (or text pairs, the longer first) longer than the model's "
                                       "max_seq_length, and say \"truncated\": true; false: refuse them with 413")


class MultipleChoiceTask(TaskDefinition):
    """A context and its choices -> the choices ranked (one [CLS] context [SEP] choice [SEP] item each); accuracy."""

    name = "multiple-choice"
    head_class = "BertForMultipleChoice"
    training_adapter = "MultipleChoiceAdapter"
    output_names = ("logits",)  # (B, 1): one score per choice item
    endpoints = (Endpoint(
        "/v1/choice", "choice", "Multiple choice: rank the choices for a context",
        "Per input, its choices `{index, choice, score, truncated}`, most probable first (softmax over "
        "them).",
        request="ChoiceRequest", response="ChoiceResponse",
        inputs_description="a {context, choices} object or a list of them",
        input_object="ChoiceInput",
        fields=(InputField("context"),
                InputField("choices", many=True,
                           description=f"{MIN_CHOICES} to {MAX_CHOICES} candidate continuations or answers")),
        examples=({"inputs": {"context": "She opened the umbrella because",
                              "choices": ["it started to rain.", "the soup was cold.", "the train left."]}},),
    ),)
    options = ChoiceOptions
    input_fields = ("context", "choices")
    parity_files = ("mrpc/dev.tsv", "stsb/dev.jsonl")
    agreement = "choice score within the regression tolerance"

    def check_input(self, bundle, raw, options, index) -> None:
        if too_few_choices(raw):
            raise Refusal(f"{len(raw.choices)} given; {NEEDS_CHOICES}", "choices", index)
        if len(raw.choices) > MAX_CHOICES:
            raise TooLarge(f"{len(raw.choices)} given; the limit is {MAX_CHOICES}", "choices", index)

    def input_refusal(self, raw) -> tuple[str, str] | None:
        return ("choices", f"{len(raw.choices)} choice(s); {NEEDS_CHOICES}") if too_few_choices(raw) else None

    def texts(self, raw: Any) -> list[tuple[str, str]]:
        return [("context", raw.context)] + [(f"choices[{i}]", c) for i, c in enumerate(raw.choices)]

    def prepare_many(self, tokenizer, spec, inputs, options) -> list[Prepared]:
        owners = [index for index, raw in enumerate(inputs) for _ in raw.choices]  # the input of each item
        try:
            items = encode_classification_many(tokenizer, [raw.context for raw in inputs for _ in raw.choices],
                                               [choice for raw in inputs for choice in raw.choices],
                                               max_length=spec.max_seq_length, truncate=options.truncate,
                                               spans=False)
        except InputFailed as failed:
            raise InputFailed(owners[failed.index], failed.error) from None
        prepared, at = [], 0
        for raw in inputs:
            mine = items[at : at + len(raw.choices)]
            at += len(raw.choices)
            prepared.append(Prepared(mine, raw, any(item.truncated for item in mine)))
        return prepared

    def response_bytes(self, spec, prepared, options) -> int:
        return sum(128 + len(choice) for choice in prepared.state.choices) + 64

    def decode(self, tokenizer, spec, prepared, outputs, options) -> list[Any]:
        results = []
        for p, out in zip(prepared, outputs):
            ranked = rank_choices(np.array([o["logits"][0] for o in out], dtype=np.float32), p.state.choices)
            for entry in ranked:
                entry.update(truncation(p.items[entry["index"]]))
            results.append(ranked)
        return results

    def row_layout(self, spec, options) -> RowLayout:
        """`choices`: the ranked choices; beside them whether any was cut, and the tokens cut from all of them."""
        choice = StructOf(columns(("index", "int64"), ("choice", "string"), ("score", "float64")) + TRUNCATION)
        return RowLayout(columns(("choices", ListOf(choice))) + TRUNCATION,
                         lambda r: {"choices": r, "truncated": any(c["truncated"] for c in r),
                                    "truncated_tokens": sum(c["truncated_tokens"] for c in r)})

    def score(self, spec, examples, results) -> tuple[dict[str, float], dict]:
        return {"accuracy": accuracy([r[0]["index"] for r in results], [ex.label for ex in examples])}, {}

    # The gate compares the score of each (context, choice) item, like a regression output.
    def prepare_parity(self, tokenizer, spec, raw) -> Prepared:
        return Prepared([encode_classification(tokenizer, raw.text, raw.text_pair, max_length=spec.max_seq_length)])

    def parity_answer(self, tokenizer, spec, prepared, outputs) -> Hashable:
        return float(outputs[0]["logits"][0])

    def parity_inputs(self, path: Path | None, size: int) -> list[Any]:
        return readers.read_sentence_pairs(path, size)


DEFINITIONS = (MultipleChoiceTask(),)
