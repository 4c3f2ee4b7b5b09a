"""Per-task glue between a request and the task layer: inputs -> model items, item outputs -> results.

Each handler turns one input into one or more model items (`prepare`: a classification text is one
item, truncated or refused when too long; a NER text or a QA context of any length becomes
overlapping windows, so nothing is silently ignored) and turns all the inputs' item outputs back
into results in one call (`finish`), vectorized over the request where the task layer allows.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.errors import ErrorType, ServiceError
from service.graphemes import extend_end
from service.models import ServedModel
from service.schemas import (
    ChoiceInput,
    ChoiceRequest,
    ClassifyRequest,
    EmbeddingsRequest,
    EmbedRequest,
    FillMaskRequest,
    NERRequest,
    PairRequest,
    QAInput,
    QARequest,
    SimilarityInput,
    SimilarityRequest,
    TextPair,
)
from tasks import classification, embedding, fill_mask, multiple_choice, ner, qa
from tasks.tokenizer import MASK, encode

Outputs = list[dict[str, np.ndarray]]  # one dict of output rows per model item


@dataclass(slots=True)
class Prepared:
    """One input's model items and what decoding it needs."""

    items: Sequence[Any]
    state: Any = None
    truncated: bool = False


class TaskHandler:
    task: str
    route: str | None = None  # when not the task's route (two more routes serve embedding models)

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


# -- the paper's other uses of the encoder: embeddings, fill-mask, multiple choice ---------------------

MAX_TARGETS = 256  # texts compared with one source (/v1/similarity)
MAX_CHOICES = 64  # choices of one multiple-choice input (/v1/choice)
MAX_TOKEN_OUTPUT_INPUTS = 16  # /v1/embed with "output": "tokens" (up to ~4 MB of JSON per input)


def _encode_or_413(model: ServedModel, text: str, text_pair: str | None, truncate: bool, where: str):
    try:
        return classification.encode_classification(model.tokenizer, text, text_pair,
                                                    max_length=model.spec.max_seq_length, truncate=truncate)
    except classification.InputTooLong as error:
        raise ServiceError(ErrorType.TOO_LARGE, f"{where}: {error}; send \"truncate\": true to cut it to fit") from None


def _sentence_vectors(model: ServedModel, outputs: Outputs, normalize: bool | None) -> np.ndarray:
    vectors = np.stack([out["sentence_embedding"] for out in outputs]).astype(np.float32)  # (N, H)
    if model.spec.extra.get("normalize", True) if normalize is None else normalize:
        vectors = embedding.l2_normalize(vectors)
    return vectors


class _OneText(TaskHandler):
    def texts(self, raw: str) -> list[tuple[str, str]]:
        return [("text", raw)]


class EmbedHandler(_OneText):
    task = "embedding"

    def prepare(self, model: ServedModel, raw: str, body: EmbedRequest, index: int) -> Prepared:
        if getattr(body, "output", "sentence") == "tokens":
            if index >= MAX_TOKEN_OUTPUT_INPUTS:
                raise ServiceError(ErrorType.TOO_LARGE, f"inputs: \"output\": \"tokens\" takes at most "
                                   f"{MAX_TOKEN_OUTPUT_INPUTS} inputs per request")
            try:
                embedding.check_layers(body.layers, int(model.bundle.encoder_config.get("num_hidden_layers", 0)))
            except ValueError as error:
                raise ServiceError(ErrorType.VALIDATION, f"layers: {error}") from None
        elif getattr(body, "layers", [-1]) != [-1]:
            raise ServiceError(ErrorType.VALIDATION, "layers: only with \"output\": \"tokens\" (sentence vectors "
                               "pool the last layer)")
        encoded = _encode_or_413(model, raw, None, body.truncate, f"inputs[{index}]")
        return Prepared([encoded], encoded, encoded.truncated)

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        if getattr(body, "output", "sentence") == "tokens":
            return [{"tokens": embedding.token_vectors(
                        p.state, [model.tokenizer.id_to_token(i) for i in p.state.input_ids],
                        out[0]["hidden_states"], body.layers), "truncated": p.truncated}
                    for p, out in zip(prepared, outputs)]
        vectors = _sentence_vectors(model, [out[0] for out in outputs], body.normalize)
        return [{"embedding": vector.tolist(), "truncated": p.truncated} for vector, p in zip(vectors, prepared)]


class OpenAIEmbeddingsHandler(EmbedHandler):
    """/v1/embeddings: the same embeddings; `openai_payload` gives the response OpenAI's shape."""

    route = "/v1/embeddings"

    def prepare(self, model: ServedModel, raw: str, body: EmbeddingsRequest, index: int) -> Prepared:
        size = int(model.bundle.encoder_config.get("hidden_size", 0))
        if body.dimensions is not None and body.dimensions != size:
            raise ServiceError(ErrorType.VALIDATION, f"dimensions: {body.dimensions}; model {model.name!r} gives "
                               f"{size}-dimensional embeddings (shortening is not supported)")
        return super().prepare(model, raw, body, index)

    def finish(self, model, prepared, outputs, body: EmbeddingsRequest) -> list[Any]:
        vectors = _sentence_vectors(model, [out[0] for out in outputs], True)
        results = []
        for index, (vector, p) in enumerate(zip(vectors, prepared)):
            value = (base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                     if body.encoding_format == "base64" else vector.tolist())
            results.append({"object": "embedding", "index": index, "embedding": value, "tokens": len(p.state)})
        return results


def openai_payload(model_name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(result.pop("tokens") for result in results)
    return {"object": "list", "data": results, "model": model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


class SimilarityHandler(TaskHandler):
    task = "embedding"
    route = "/v1/similarity"

    def texts(self, raw: SimilarityInput) -> list[tuple[str, str]]:
        return [("source", raw.source)] + [(f"targets[{i}]", t) for i, t in enumerate(raw.targets)]

    def prepare(self, model: ServedModel, raw: SimilarityInput, body: SimilarityRequest, index: int) -> Prepared:
        if not raw.targets:
            raise ServiceError(ErrorType.VALIDATION, f"inputs[{index}].targets: the list is empty; send at least one")
        if len(raw.targets) > MAX_TARGETS:
            raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}].targets: {len(raw.targets)} texts; the limit "
                               f"is {MAX_TARGETS}")
        items = [_encode_or_413(model, text, None, body.truncate, f"inputs[{index}].{field}")
                 for field, text in self.texts(raw)]
        return Prepared(items)

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        results = []
        for out in outputs:
            vectors = _sentence_vectors(model, out, True)
            results.append(embedding.cosine(vectors[0], vectors[1:]).tolist())
        return results


class FillMaskHandler(_OneText):
    task = "fill-mask"

    def prepare(self, model: ServedModel, raw: str, body: FillMaskRequest, index: int) -> Prepared:
        encoded = encode(model.tokenizer, raw, max_length=None)
        positions = fill_mask.mask_positions(model.tokenizer, encoded)
        if not positions:
            raise ServiceError(ErrorType.VALIDATION, f"inputs[{index}]: no {MASK} token; put {MASK} where a token "
                               "should be predicted")
        if len(encoded) > model.spec.max_seq_length:
            raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}]: {len(encoded)} tokens (special tokens "
                               f"included); the model takes at most {model.spec.max_seq_length}")
        return Prepared([encoded], (encoded, positions))

    def finish(self, model, prepared, outputs, body: FillMaskRequest) -> list[Any]:
        return [fill_mask.decode_fill_mask(model.tokenizer, p.state[0], p.state[1], out[0]["logits"], body.top_k)
                for p, out in zip(prepared, outputs)]


class ChoiceHandler(TaskHandler):
    task = "multiple-choice"

    def texts(self, raw: ChoiceInput) -> list[tuple[str, str]]:
        return [("context", raw.context)] + [(f"choices[{i}]", c) for i, c in enumerate(raw.choices)]

    def prepare(self, model: ServedModel, raw: ChoiceInput, body: ChoiceRequest, index: int) -> Prepared:
        if len(raw.choices) < 2:
            raise ServiceError(ErrorType.VALIDATION, f"inputs[{index}].choices: {len(raw.choices)} given; a "
                               "multiple-choice input needs at least 2")
        if len(raw.choices) > MAX_CHOICES:
            raise ServiceError(ErrorType.TOO_LARGE, f"inputs[{index}].choices: {len(raw.choices)} given; the limit "
                               f"is {MAX_CHOICES}")
        items = [_encode_or_413(model, raw.context, choice, body.truncate, f"inputs[{index}].choices[{i}]")
                 for i, choice in enumerate(raw.choices)]
        return Prepared(items, raw, any(item.truncated for item in items))

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        results = []
        for p, out in zip(prepared, outputs):
            scores = np.array([o["logits"][0] for o in out], dtype=np.float32)
            ranked = multiple_choice.rank_choices(scores, p.state.choices)
            for entry in ranked:
                entry["truncated"] = p.items[entry["index"]].truncated
            results.append(ranked)
        return results


HANDLERS.update({"embedding": EmbedHandler(), "fill-mask": FillMaskHandler(), "multiple-choice": ChoiceHandler()})
OPENAI_EMBEDDINGS = OpenAIEmbeddingsHandler()
SIMILARITY = SimilarityHandler()
