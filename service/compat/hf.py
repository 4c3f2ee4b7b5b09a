"""The Hugging Face Inference API at `POST /models/{name}`: what `huggingface_hub.InferenceClient` sends to a
model URL (`InferenceClient(model="http://host:8000/models/<name>")`, or `base_url=`) and parses back.

The task is the model's own; an embedding model serves two, told apart by the input's shape (an object with
`source_sentence` is sentence-similarity, a text or a list of texts feature-extraction), or named in the path as
the Hugging Face router names it (`/models/{name}/pipeline/{task}`). Each request becomes the berth request of
that task and runs through `infer`, so every limit, the batching, metrics and the API key are those of /v1.

Per model task, the Hugging Face task it serves, the body it takes and the answer it gives:

- embedding models, feature-extraction: `{"inputs": text | [texts], "normalize"?, "truncate"?,
  "truncation_direction"?}` (at the root, as the client sends them, or under `parameters`); `[float]` for a text,
  `[[float]]` for a list.
- embedding models, sentence-similarity: `{"inputs": {"source_sentence", "sentences"}, "parameters"?:
  {"truncate"?}}`; `[float]`, a cosine per sentence.
- classification and pair models, text-classification: `{"inputs": text | {"text", "text_pair"} | [...],
  "parameters"?: {"top_k"?, "function_to_apply"?, "truncate"?}}`; `[[{label, score}]]`, a ranked list per input
  (every label unless top_k).
- ner models, token-classification: `{"inputs": text | [texts], "parameters"?: {"aggregation_strategy"?,
  "ignore_labels"?}}`; `[{entity_group, score, word, start, end}]` (a list per input for a list).
- qa models, question-answering: `{"inputs": {"question", "context"} | [...], "parameters"?: {"top_k"?,
  "max_answer_len"?, "handle_impossible_answer"?}}`; `{answer, score, start, end}` (a list with top_k > 1).
- fill-mask models, fill-mask: `{"inputs": text | [texts], "parameters"?: {"top_k"?}}`;
  `[{sequence, score, token, token_str}]`.

Nothing is cut silently: an input longer than the model takes is a 413 unless `truncate` is true (TEI's
parameter, which the client's feature_extraction sends; NER and QA read long texts in windows and never cut).
Offsets are Python str indices, as on /v1. Errors are berth's `{"error", "error_type"}`: the client reads
`error`. Parameters that would change what the bundle fixes (`doc_stride`, `max_seq_len`, `stride`...) are
refused unless equal to the bundle's; `targets` (fill-mask) and `prompt_name` are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import ConfigDict, Field

from service.compat.shared import (
    Direction,
    ScoreFunction,
    Strict,
    load_json,
    refuse_left_truncation,
    refuse_prompt_name,
    scored_labels,
    scored_request,
    takes_pairs,
    validated,
)
from service.errors import ErrorType, ServiceError
from service.handlers import TaskHandler, handler_for
from service.inference import infer
from service.runtime import Runtime
from service.schemas import HF_ERROR_RESPONSES
from tasks.ner import window_overlap
from tasks.registry import definition
from tasks.runtime.bundle import Bundle

ROUTE = "/models/{name}"
hf = APIRouter(tags=["Hugging Face Inference API"], responses=HF_ERROR_RESPONSES)



# -- the bodies, as huggingface_hub sends them ------------------------------------------------------------------


class Options(Strict):
    """The legacy `options` of the Inference API (`wait_for_model`, `use_cache`): accepted and ignored."""

    model_config = ConfigDict(extra="allow")


class EmbedParameters(Strict):
    normalize: bool | None = Field(None, strict=True)
    prompt_name: str | None = None
    truncate: bool | None = Field(None, strict=True)
    truncation_direction: Direction | None = None
    dimensions: int | None = Field(None, strict=True, ge=1)
    encoding_format: Literal["float"] | None = None


class FeatureExtraction(EmbedParameters):
    inputs: str | list[str]
    parameters: EmbedParameters | None = None
    options: Options | None = None

    def merged(self) -> EmbedParameters:
        """The parameters sent at the root (the client's way) over those under `parameters`."""
        under = self.parameters.model_dump(exclude_none=True) if self.parameters else {}
        return EmbedParameters(**{**under, **self.model_dump(include=set(EmbedParameters.model_fields),
                                                              exclude_none=True)})


class Sentences(Strict):
    source_sentence: str
    sentences: list[str]


class SimilarityParameters(Strict):
    prompt_name: str | None = None
    truncate: bool | None = Field(None, strict=True)
    truncation_direction: Direction | None = None


class SentenceSimilarity(Strict):
    inputs: Sentences
    parameters: SimilarityParameters | None = None
    options: Options | None = None


class ClassifyParameters(Strict):
    top_k: int | None = Field(None, strict=True, ge=1, le=1000)
    function_to_apply: ScoreFunction | None = None
    truncate: bool | None = Field(None, strict=True)


class TextPair(Strict):
    text: str
    text_pair: str


class TextClassification(Strict):
    inputs: str | TextPair | list[str | TextPair]
    parameters: ClassifyParameters | None = None
    options: Options | None = None


class TokenParameters(Strict):
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] | None = None
    ignore_labels: list[str] | None = None
    stride: int | None = None


class TokenClassification(Strict):
    inputs: str | list[str]
    parameters: TokenParameters | None = None
    options: Options | None = None


class QAParameters(Strict):
    top_k: int | None = Field(None, strict=True, ge=1, le=20)
    handle_impossible_answer: bool | None = Field(None, strict=True)
    max_answer_len: int | None = Field(None, strict=True, ge=1, le=512)
    align_to_words: bool | None = Field(None, strict=True)
    doc_stride: int | None = None
    max_question_len: int | None = None
    max_seq_len: int | None = None


class Question(Strict):
    question: str
    context: str


class QuestionAnswering(Strict):
    inputs: Question | list[Question]
    parameters: QAParameters | None = None
    options: Options | None = None


class FillParameters(Strict):
    top_k: int | None = Field(None, strict=True, ge=1, le=100)
    targets: list[str] | None = None


class FillMask(Strict):
    inputs: str | list[str]
    parameters: FillParameters | None = None
    options: Options | None = None


# -- one translation per task: (handler, berth request, payload shape) ------------------------------------------

Shape = Callable[[str, list[Any]], Any]
Translation = tuple[TaskHandler, Any, Shape]



def own(bundle: Bundle, kind: str = "inputs") -> TaskHandler:
    """The adapter of the bundle's task's endpoint of `kind`, served here."""
    return handler_for(bundle.task, kind, ROUTE)


def _unless_bundle(value: int | None, fixed: int, where: str) -> None:
    if value is not None and value != fixed:
        raise ServiceError(ErrorType.VALIDATION, f"{where}: {value}; this model's bundle fixes it at {fixed}")


def feature_extraction(name: str, bundle: Bundle, value: Any) -> Translation:
    body = validated(FeatureExtraction, value)
    p = body.merged()
    refuse_prompt_name(p.prompt_name)
    refuse_left_truncation(p.truncation_direction, p.truncate)
    _unless_bundle(p.dimensions, int(bundle.encoder_config.get("hidden_size", 0)), "dimensions")
    features = own(bundle)
    berth = validated(features.request_model, {"model": name, "inputs": body.inputs, "normalize": p.normalize,
                                               "truncate": bool(p.truncate)})
    if isinstance(body.inputs, str):
        return features, berth, lambda _, results: results[0]["embedding"]
    return features, berth, lambda _, results: [r["embedding"] for r in results]


def sentence_similarity(name: str, bundle: Bundle, value: Any) -> Translation:
    body = validated(SentenceSimilarity, value)
    p = body.parameters or SimilarityParameters()
    refuse_prompt_name(p.prompt_name, "parameters.prompt_name")
    refuse_left_truncation(p.truncation_direction, p.truncate, "parameters.truncation_direction")
    similarity = own(bundle, "similarity")
    berth = validated(similarity.request_model, {"model": name, "truncate": bool(p.truncate), "inputs": {
        "source": body.inputs.source_sentence, "targets": body.inputs.sentences}})
    return similarity, berth, lambda _, results: results[0]["scores"]


def text_classification(name: str, bundle: Bundle, value: Any) -> Translation:
    body = validated(TextClassification, value)
    p = body.parameters or ClassifyParameters()
    inputs = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    pairs = takes_pairs(bundle.task)
    for index, raw in enumerate(inputs):
        if isinstance(raw, TextPair) != pairs:
            where = f"inputs[{index}]" if isinstance(body.inputs, list) else "inputs"
            wanted = ("is a sentence-pair model; send {\"text\", \"text_pair\"}" if pairs
                      else "classifies single texts; send a string, not a {\"text\", \"text_pair\"} pair")
            raise ServiceError(ErrorType.VALIDATION, f"{where}: model {name!r} {wanted}")
    berth = validated(scored_request(bundle.task), {
        "model": name, "inputs": [raw.model_dump() if pairs else raw for raw in inputs], "top_k": p.top_k,
        "truncate": bool(p.truncate), "function": p.function_to_apply})
    return scored_labels(bundle.task, ROUTE), berth, lambda _, results: results


def token_classification(name: str, bundle: Bundle, value: Any) -> Translation:
    body = validated(TokenClassification, value)
    p = body.parameters or TokenParameters()
    spec = bundle.spec()
    _unless_bundle(p.stride, window_overlap(spec.max_seq_length, spec.doc_stride), "parameters.stride")
    aggregation = p.aggregation_strategy or "simple"
    entities_of = own(bundle)
    berth = validated(entities_of.request_model,
                      {"model": name, "inputs": body.inputs, "aggregation": aggregation})
    ignored = set(p.ignore_labels or ())
    key = "entity" if aggregation == "none" else "entity_group"

    def entities(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{key: e["entity"], "score": e["score"], "word": e["text"], "start": e["start"], "end": e["end"]}
                for e in found if e["entity"] not in ignored]

    if isinstance(body.inputs, str):
        return entities_of, berth, lambda _, results: entities(results[0])
    return entities_of, berth, lambda _, results: [entities(found) for found in results]


def question_answering(name: str, bundle: Bundle, value: Any) -> Translation:
    body = validated(QuestionAnswering, value)
    p = body.parameters or QAParameters()
    spec = bundle.spec()
    _unless_bundle(p.doc_stride, spec.doc_stride, "parameters.doc_stride")
    _unless_bundle(p.max_question_len, spec.max_query_length, "parameters.max_question_len")
    _unless_bundle(p.max_seq_len, spec.max_seq_length, "parameters.max_seq_len")
    if p.align_to_words is False:
        raise ServiceError(ErrorType.VALIDATION, "parameters.align_to_words: false is not supported; answers are "
                           "token spans mapped to the characters of the context")
    options = {"top_k": p.top_k, "max_answer_length": p.max_answer_len, "handle_impossible": p.handle_impossible_answer}
    inputs = [q.model_dump() for q in body.inputs] if isinstance(body.inputs, list) else body.inputs.model_dump()
    answers = own(bundle)
    berth = validated(answers.request_model, {"model": name, "inputs": inputs,
                                              **{k: v for k, v in options.items() if v is not None}})

    def answer(result: dict[str, Any]) -> dict[str, Any]:
        return {"answer": result["answer"], "score": result["score"], "start": result["start"], "end": result["end"]}

    def shaped(result: Any) -> Any:
        return [answer(a) for a in result] if isinstance(result, list) else answer(result)

    if isinstance(body.inputs, list):
        return answers, berth, lambda _, results: [shaped(r) for r in results]
    return answers, berth, lambda _, results: shaped(results[0])


def fill_mask(name: str, bundle: Bundle, value: Any) -> Translation:
    body = validated(FillMask, value)
    p = body.parameters or FillParameters()
    if p.targets is not None:
        raise ServiceError(ErrorType.VALIDATION, "parameters.targets: not supported; the answer is the top_k tokens "
                           "of the whole vocabulary")
    fills = own(bundle)
    berth = validated(fills.request_model, {"model": name, "inputs": body.inputs,
                                            **({"top_k": p.top_k} if p.top_k is not None else {})})
    if isinstance(body.inputs, str):
        return fills, berth, lambda _, results: results[0]
    return fills, berth, lambda _, results: results


TRANSLATIONS: dict[str, Callable[[str, Bundle, Any], Translation]] = {
    "feature-extraction": feature_extraction,
    "sentence-similarity": sentence_similarity,
    "text-classification": text_classification,
    "token-classification": token_classification,
    "question-answering": question_answering,
    "fill-mask": fill_mask,
}


# -- the routes ------------------------------------------------------------------------------------------------


def served_task(name: str, bundle: Bundle, value: Any, asked: str | None) -> str:
    """The Hugging Face task of this request: the one asked for in the path, else the model's (an embedding
    model's by the input's shape); 422 when the model does not serve it."""
    tasks = [task for task in definition(bundle.task).pipeline_tasks if task in TRANSLATIONS]
    if not tasks:
        route = definition(bundle.task).route
        raise ServiceError(ErrorType.VALIDATION, f"model {name!r} is a {bundle.task} model, which the Hugging Face "
                           f"Inference API has no task for; use POST {route}")
    if asked is None:
        inputs = value.get("inputs") if isinstance(value, dict) else None
        shaped = shape_task(inputs)
        if shaped is not None and shaped not in tasks:
            raise ServiceError(ErrorType.VALIDATION, f"model {name!r} is a {bundle.task} model "
                               f"({' and '.join(tasks)}); these inputs are {shaped}'s")
        if shaped is None and "sentence-similarity" in tasks and isinstance(inputs, dict):
            shaped = "sentence-similarity"  # so that a malformed one is told what sentence-similarity takes
        return shaped or tasks[0]
    if asked not in tasks:
        raise ServiceError(ErrorType.VALIDATION, f"model {name!r} is a {bundle.task} model: it serves "
                           f"{' and '.join(tasks)}, not {asked}")
    return asked


def shape_task(inputs: Any) -> str | None:
    """The task whose inputs have this shape, when only one task's have it (an object's keys say it)."""
    first = inputs[0] if isinstance(inputs, list) and inputs else inputs
    if isinstance(first, dict):
        for key, task in (("source_sentence", "sentence-similarity"), ("question", "question-answering"),
                          ("text_pair", "text-classification")):
            if key in first:
                return task
    return None


async def run(request: Request, name: str, asked: str | None) -> Response:
    runtime: Runtime = request.app.state.runtime
    bundle = runtime.bundles.get(name)
    if bundle is None:
        raise ServiceError(ErrorType.NOT_FOUND, f"unknown model {name[:80]!r}; served models: "
                           f"{', '.join(sorted(runtime.bundles)) or 'none'}")
    value = load_json(await request.body())
    task = served_task(name, bundle, value, asked)
    handler, body, shape = TRANSLATIONS[task](name, bundle, value)
    return await infer(request, handler, body, payload_shape=shape)


DESCRIPTION = (__doc__ or "").split("\n\n", 1)[1]
BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["inputs"],
    "properties": {"inputs": {"description": "per the model's task (the list above)"},
                   "parameters": {"type": "object", "description": "the task's parameters"}}},
    "examples": {"text-classification": {"value": {"inputs": "A gorgeous, witty, seductive movie.",
                                                   "parameters": {"top_k": 2}}},
                 "sentence-similarity": {"value": {"inputs": {"source_sentence": "A man is playing a guitar.",
                                                              "sentences": ["Someone plays an instrument."]}}}}}}}}


@hf.post(ROUTE, summary="Hugging Face Inference API: the model's task", description=DESCRIPTION, openapi_extra=BODY)
async def hf_model(name: str, request: Request) -> Response:
    return await run(request, name, None)


@hf.post(ROUTE + "/pipeline/{task}", summary="Hugging Face Inference API: a task named in the path",
         description="As `POST /models/{name}`, the task named (`feature-extraction`, `sentence-similarity`, "
                     "`text-classification`, `token-classification`, `question-answering`, `fill-mask`).",
         openapi_extra=BODY)
async def hf_pipeline(name: str, task: str, request: Request) -> Response:
    return await run(request, name, task)
