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
from service.graphemes import extend_end
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

    def check_body(self, body: Any, settings: Any) -> None:
        """Request options a setting caps (422 naming it); nothing by default."""

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
        results = []
        for item, out in zip(prepared, outputs):
            text = item.state.text
            entities = ner.decode_entities(text, item.state, [o["logits"] for o in out], model.spec.labels,
                                           aggregation=body.aggregation)
            for entity in entities:
                end = extend_end(text, entity["end"])
                if end != entity["end"]:
                    entity["end"], entity["text"] = end, text[entity["start"]:end]
            results.append(entities)
        return results


def ner_overlap(model: ServedModel) -> int:
    """Tokens shared by consecutive NER windows: the bundle's doc_stride, capped at half a window."""
    window = model.spec.max_seq_length - 2
    return max(0, min(model.spec.doc_stride, window // 2))


class QAHandler(TaskHandler):
    task = "qa"

    def texts(self, raw: QAInput) -> list[tuple[str, str]]:
        return [("question", raw.question), ("context", raw.context)]

    def check_body(self, body: QARequest, settings: Any) -> None:
        if body.max_answer_length > settings.max_answer_length_cap:
            raise ServiceError(ErrorType.VALIDATION, f"max_answer_length: {body.max_answer_length} tokens; the limit "
                               f"is {settings.max_answer_length_cap} (max_answer_length_cap)")

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
            context = item.state[0].context
            shaped = []
            for a in answers:
                end = extend_end(context, a.end) if not a.is_impossible else a.end
                shaped.append({"answer": context[a.start:end] if end != a.end else a.answer, "start": a.start,
                               "end": end, "score": a.score, "is_impossible": a.is_impossible})
            results.append(shaped if body.top_k > 1 else shaped[0])
        return results


HANDLERS: dict[str, TaskHandler] = {h.task: h for h in (ClassifyHandler(), PairHandler(), NERHandler(), QAHandler())}
