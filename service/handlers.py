"""Per-task glue between a request and the task layer: inputs -> model items, item outputs -> results.

Each handler turns one input into one or more model items (`prepare`: a classification text is one
item, truncated or refused when too long; a NER text or a QA context of any length becomes
overlapping windows, so nothing is silently ignored) and turns all the inputs' item outputs back
into results in one call (`finish`), vectorized over the request where the task layer allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.errors import ErrorType, ServiceError
from service.models import ServedModel
from service.schemas import ClassifyRequest, NERRequest, PairRequest, QAInput, QARequest, TextPair
from tasks import classification, ner, qa

Outputs = list[dict[str, np.ndarray]]  # one dict of output rows per model item


@dataclass(slots=True)
class Prepared:
    """One input's model items and what decoding it needs."""

    items: Sequence[Any]
    state: Any = None
    truncated: bool = False


class TaskHandler:
    task: str

    def texts(self, raw: Any) -> list[tuple[str, str]]:
        """(field name, text) of one input, for the limit checks."""
        raise NotImplementedError

    def prepare(self, model: ServedModel, raw: Any, body: Any, index: int) -> Prepared:
        raise NotImplementedError

    def finish(self, model: ServedModel, prepared: list[Prepared], outputs: list[Outputs], body: Any) -> list[Any]:
        raise NotImplementedError


class ClassifyHandler(TaskHandler):
    task = "classification"

    def texts(self, raw: str) -> list[tuple[str, str]]:
        return [("text", raw)]

    def _pair(self, raw: Any) -> tuple[str, str | None]:
        return raw, None

    def prepare(self, model: ServedModel, raw: Any, body: ClassifyRequest | PairRequest, index: int) -> Prepared:
        text, text_pair = self._pair(raw)
        try:
            encoded = classification.encode_classification(
                model.tokenizer, text, text_pair, max_length=model.spec.max_seq_length, truncate=body.truncate)
        except classification.InputTooLong as error:
            raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}]: {error}; send \"truncate\": true to cut it "
                               "to fit") from None
        return Prepared([encoded], truncated=encoded.truncated)

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        logits = np.stack([out[0]["logits"] for out in outputs])  # (N, C)
        results = classification.decode_classification(logits, model.spec.labels, body.top_k, model.spec.problem_type)
        for result, item in zip(results, prepared):
            for entry in result if isinstance(result, list) else [result]:
                entry["truncated"] = item.truncated
        return results


class PairHandler(ClassifyHandler):
    task = "pair"

    def texts(self, raw: TextPair) -> list[tuple[str, str]]:
        return [("text", raw.text), ("text_pair", raw.text_pair)]

    def _pair(self, raw: TextPair) -> tuple[str, str | None]:
        return raw.text, raw.text_pair


class NERHandler(TaskHandler):
    task = "ner"

    def texts(self, raw: str) -> list[tuple[str, str]]:
        return [("text", raw)]

    def prepare(self, model: ServedModel, raw: str, body: NERRequest, index: int) -> Prepared:
        windows = ner.ner_windows(model.tokenizer, raw, model.spec.max_seq_length, ner_overlap(model))
        return Prepared(windows.items, windows)

    def finish(self, model, prepared, outputs, body: NERRequest) -> list[Any]:
        return [ner.decode_entities(item.state.text, item.state, [o["logits"] for o in out], model.spec.labels,
                                    aggregation=body.aggregation)
                for item, out in zip(prepared, outputs)]


def ner_overlap(model: ServedModel) -> int:
    """Tokens shared by consecutive NER windows: the bundle's doc_stride, capped at half a window."""
    window = model.spec.max_seq_length - 2
    return max(0, min(model.spec.doc_stride, window // 2))


class QAHandler(TaskHandler):
    task = "qa"

    def texts(self, raw: QAInput) -> list[tuple[str, str]]:
        return [("question", raw.question), ("context", raw.context)]

    def prepare(self, model: ServedModel, raw: QAInput, body: QARequest, index: int) -> Prepared:
        spec = model.spec
        windows = qa.make_windows(model.tokenizer, raw.question, raw.context, spec.max_seq_length, spec.doc_stride,
                                  spec.max_query_length)
        return Prepared(windows, windows)

    def finish(self, model, prepared, outputs, body: QARequest) -> list[Any]:
        spec = model.spec
        handle_impossible = spec.version_2_with_negative if body.handle_impossible is None else body.handle_impossible
        results = []
        for item, out in zip(prepared, outputs):
            answers = qa.decode_answers(
                item.state, [o["start_logits"] for o in out], [o["end_logits"] for o in out],
                n_best_size=max(20, body.top_k), max_answer_length=body.max_answer_length, top_k=body.top_k,
                handle_impossible=handle_impossible, null_score_diff_threshold=spec.null_score_diff_threshold)
            shaped = [{"answer": a.answer, "start": a.start, "end": a.end, "score": a.score,
                       "is_impossible": a.is_impossible} for a in answers]
            results.append(shaped if body.top_k > 1 else shaped[0])
        return results


HANDLERS: dict[str, TaskHandler] = {h.task: h for h in (ClassifyHandler(), PairHandler(), NERHandler(), QAHandler())}
