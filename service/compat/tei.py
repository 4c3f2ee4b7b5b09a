"""text-embeddings-inference's routes, for the clients written against a TEI server (its HTTP API; not gRPC).

A TEI server serves one model; here each route serves one chosen model: `tei_embed_model` (/embed,
/embed_all), `tei_predict_model` (/predict: a classification or pair model), `tei_rerank_model` (/rerank).
With none set, a route takes the one served model of its task, when there is exactly one; otherwise it
answers 424 (TEI's "the model cannot do this" status) saying which setting to set. /tokenize, /decode and
/info use the first of those three models that resolves.

The inference routes translate their body into berth's request and run it through `infer` (the limits,
batching, metrics and API key of /v1). TEI's defaults are kept: `normalize` true, `truncate` false (an
over-long input is a 413 naming it; true cuts it at its end), `add_special_tokens` and `skip_special_tokens`
true. Inputs may be token ids as TEI takes them (service/token_ids.py). `prompt_name` is refused (berth's
bundles carry no prompts), and so is `truncation_direction: left` with `truncate`. /tokenize's `start` and
`stop` are UTF-8 byte offsets, as TEI's (berth's own routes use str indices). Errors have TEI's shape
(service/compat/errors.py), also those the request guard answers before the route.

Why one file of ~500 lines: it is one router, TEI's whole HTTP surface in TEI's order (the order the OpenAPI document
lists its routes in); its error shape is already its own module.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, field_validator

from service import token_ids
from service.compat.errors import as_tei
from service.compat.shared import (
    Direction,
    Strict,
    refuse_left_truncation,
    refuse_prompt_name,
    scored_labels,
    scored_request,
    takes_pairs,
    tasks_doing,
    validated,
)
from service.errors import ErrorType, ServiceError, response_for
from service.handlers import RankingHandler, TaskHandler, handler_for
from service.inference import Reservation, check_response, infer
from service.models import ServedModel
from service.runtime import Runtime
from service.schemas import TEI_ERROR_RESPONSES
from service.token_ids import TokenIds, as_inputs
from tasks.common import InputFailed, sigmoid
from tasks.definition import Prepared
from tasks.registry import DEFINITIONS
from tasks.rerank import best_logits
from tasks.runtime.tokenizer import CLS, SEP


class TEIRoute(APIRoute):
    """A route whose every error, body validation included, is answered in TEI's shape."""

    def get_route_handler(self) -> Callable:
        handle = super().get_route_handler()

        async def tei_handler(request: Request) -> Response:
            try:
                return await handle(request)
            except Exception as error:  # noqa: BLE001 - every error is answered, in TEI's shape
                return as_tei(response_for(error, request))

        return tei_handler


tei = APIRouter(tags=["text-embeddings-inference"], route_class=TEIRoute, responses=TEI_ERROR_RESPONSES)

# -- which model each route serves ------------------------------------------------------------------------------

# setting -> (the tasks it may name, by what their models do in Hugging Face's words; the routes it serves)
SETTINGS = {
    "tei_embed_model": (tasks_doing("feature-extraction"), "/embed and /embed_all"),
    "tei_predict_model": (tasks_doing("text-classification"), "/predict"),
    "tei_rerank_model": (tasks_doing("text-ranking"), "/rerank"),
}


def _not_this(message: str) -> ServiceError:
    return ServiceError(ErrorType.VALIDATION, message, status=424)


def tei_model(runtime: Runtime, setting: str) -> str:
    """The model named by `setting`, else the one served model of its tasks; 424 naming the setting."""
    tasks, routes = SETTINGS[setting]
    variable = "BERTH_" + setting.upper()
    kinds = " or ".join(tasks)
    name = getattr(runtime.settings, setting)
    if name is not None:
        bundle = runtime.bundles.get(name)
        if bundle is None:
            raise _not_this(f"{setting} ({variable}) is {name!r}, which is not served here; served models: "
                            f"{', '.join(sorted(runtime.bundles))}")
        if bundle.task not in tasks:
            raise _not_this(f"{setting} ({variable}) is {name!r}, a {bundle.task} model; {routes} need a {kinds} "
                            "model")
        return name
    candidates = sorted(n for n, b in runtime.bundles.items() if b.task in tasks)
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise _not_this(f"{routes}: no {kinds} model is served here")
    raise _not_this(f"{routes}: {len(candidates)} {kinds} models are served ({', '.join(candidates)}); set "
                    f"{setting} ({variable}) to the one {routes} should use")


def any_tei_model(runtime: Runtime) -> ServedModel:
    """The model of /tokenize, /decode and /info: the first of the embed, predict and rerank models that resolves."""
    problems = []
    for setting in SETTINGS:
        try:
            name = tei_model(runtime, setting)
        except ServiceError as error:
            problems.append(error.message)
            continue
        return runtime.resolve(name, runtime.bundles[name].task)
    raise _not_this("no model for this route: " + "; ".join(problems))


# -- embeddings -------------------------------------------------------------------------------------------------

Input = str | TokenIds | list[str | TokenIds]


class EmbedAllBody(Strict):
    inputs: Input = Field(description="a text, token ids, or a list of either")
    truncate: bool | None = Field(
        False, strict=True, description="cut an input longer than the model takes at its end; false: refuse it (413)")
    truncation_direction: Direction = "right"
    prompt_name: str | None = Field(None, description="not supported: 422 when given")

    @field_validator("inputs")
    @classmethod
    def _one_id_list_is_one_input(cls, value: Any) -> Any:
        return as_inputs(value)


class EmbedBody(EmbedAllBody):
    normalize: bool = Field(True, strict=True, description="L2-normalize the pooled vectors")


class EmbedIdsHandler(TaskHandler):
    """/embed and /embed_all: berth's embeddings of texts or token ids (the embed request, its inputs texts or
    token id lists); /embed_all keeps every token's vector of the last layer, the special tokens' too, as
    TEI's."""

    def __init__(self, task: str, route: str, all_tokens: bool = False):
        own = handler_for(task, "inputs", route)
        super().__init__(own.definition, own.endpoint, route)
        self.all_tokens = all_tokens
        self.request_model = type(f"{own.request_model.__name__}Ids", (own.request_model,), {
            "__module__": __name__, "__annotations__": {"inputs": list[str | TokenIds]}})

    def texts(self, raw: str | list[int]) -> list[tuple[str, str]]:
        return [] if token_ids.is_ids(raw) else super().texts(raw)

    def check_body(self, body: Any, settings: Any) -> None:
        token_ids.check_id_lengths(body.inputs, settings)

    def check_input(self, model: ServedModel, raw: str | list[int], body: Any, index: int) -> None:
        if token_ids.is_ids(raw):
            token_ids.check_ids(model, raw, f"inputs[{index}]")
        super().check_input(model, raw, body, index)

    def prepare_checked(self, model: ServedModel, inputs: list[Any], body: Any) -> list[Prepared]:
        try:
            return token_ids.prepare_mixed(self.definition, model, inputs, body)
        except InputFailed as failed:
            raise self.refusal(failed.error, f"inputs[{failed.index}]") from None

    def finish(self, model, prepared, outputs, body) -> list[Any]:
        if self.all_tokens:
            return [out[0]["features"].tolist() for out in outputs]
        return super().finish(model, prepared, outputs, body)


@functools.cache
def embed_handler(task: str, route: str) -> EmbedIdsHandler:
    """The adapter of /embed (pooled vectors) or /embed_all (every token's vector) for a `task` model."""
    return EmbedIdsHandler(task, route, all_tokens=route == "/embed_all")


def embed_request(request: Request, route: str, body: EmbedAllBody,
                  **options: Any) -> tuple[EmbedIdsHandler, Any]:
    """The adapter of `route` for the embed model and berth's embed request of the body."""
    runtime: Runtime = request.app.state.runtime
    refuse_prompt_name(body.prompt_name)
    refuse_left_truncation(body.truncation_direction, body.truncate)
    inputs = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    name = tei_model(runtime, "tei_embed_model")
    handler = embed_handler(runtime.bundles[name].task, route)
    return handler, validated(handler.request_model, {"model": name, "inputs": inputs,
                                                      "truncate": bool(body.truncate), **options})


@tei.post("/embed", response_model=list[list[float]], summary="TEI: sentence embeddings")
async def tei_embed(body: EmbedBody, request: Request) -> Response:
    """`[[float]]`: one pooled vector per input (unit length unless `"normalize": false`)."""
    handler, berth = embed_request(request, "/embed", body, normalize=body.normalize)
    return await infer(request, handler, berth,
                       payload_shape=lambda _, results: [r["embedding"] for r in results])


@tei.post("/embed_all", response_model=list[list[list[float]]], summary="TEI: every token's vector, unpooled")
async def tei_embed_all(body: EmbedAllBody, request: Request) -> Response:
    """`[[[float]]]`: per input, the last layer's vector of each of its tokens, [CLS] and [SEP] included
    (at most 16 inputs a request, as /v1/embed's token output)."""
    handler, berth = embed_request(request, "/embed_all", body, output="tokens", layers=[-1])
    return await infer(request, handler, berth, payload_shape=lambda _, results: results)


# -- classification ---------------------------------------------------------------------------------------------


class Prediction(BaseModel):
    score: float
    label: str


class PredictBody(Strict):
    inputs: str | list[str] | list[list[str]] = Field(
        description="a text, a pair [text, text_pair], or a batch of either: [[text], [text, text_pair], ...]")
    raw_scores: bool = Field(False, strict=True, description="the logits instead of probabilities")
    truncate: bool | None = Field(False, strict=True)
    truncation_direction: Direction = "right"


def sequences(inputs: str | list[str] | list[list[str]]) -> tuple[list[list[str]], bool]:
    """(each input as [text] or [text, text_pair], one input?) as TEI reads `inputs`: a list of strings is ONE
    input (a text or a pair), a list of lists a batch."""
    if isinstance(inputs, str):
        return [[inputs]], True
    batch = bool(inputs) and isinstance(inputs[0], list)
    found: list[list[str]] = list(inputs) if batch else [list(inputs)]  # type: ignore[arg-type]
    for index, sequence in enumerate(found):
        if len(sequence) not in (1, 2):
            where = f"inputs[{index}]" if batch else "inputs"
            raise ServiceError(ErrorType.VALIDATION, f"{where}: {len(sequence)} strings; an input is a text [text] "
                               "or a pair [text, text_pair]")
    return found, not batch


@tei.post("/predict", response_model=list[Prediction] | list[list[Prediction]], summary="TEI: classification")
async def tei_predict(body: PredictBody, request: Request) -> Response:
    """Every label ranked, highest score first: `[{score, label}]` for one input, a list of those for a batch.
    Scores are the model's probabilities (softmax; sigmoid for multi-label; a regression model's raw output),
    or its logits with `raw_scores`."""
    runtime: Runtime = request.app.state.runtime
    name = tei_model(runtime, "tei_predict_model")
    task = runtime.bundles[name].task
    refuse_left_truncation(body.truncation_direction, body.truncate)
    found, single = sequences(body.inputs)
    for index, sequence in enumerate(found):
        if (len(sequence) == 2) != takes_pairs(task):
            where = "inputs" if single else f"inputs[{index}]"
            wanted = "a sentence-pair model: send [text, text_pair]" if takes_pairs(task) else \
                "a single-text classification model: send one text, not a pair"
            raise ServiceError(ErrorType.VALIDATION, f"{where}: model {name!r} is {wanted}")
    pairs = takes_pairs(task)
    inputs = [{"text": s[0], "text_pair": s[1]} for s in found] if pairs else [s[0] for s in found]
    berth = validated(scored_request(task), {"model": name, "inputs": inputs, "truncate": bool(body.truncate),
                                              "function": "none" if body.raw_scores else None})
    return await infer(request, scored_labels(task, "/predict"), berth,
                       payload_shape=lambda _, results: results[0] if single else results)


# -- reranking -------------------------------------------------------------------------------------------------


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = Field(None, description="with return_text: the text")


class RerankBody(Strict):
    query: str
    texts: list[str]
    raw_scores: bool = Field(False, strict=True, description="the relevance logits instead of their sigmoid")
    return_text: bool = Field(False, strict=True)
    truncate: bool | None = Field(
        False, strict=True, description="accepted; nothing needs cutting: a long text is read in overlapping windows "
                                        "and scored by its best one")
    truncation_direction: Direction = "right"


class TEIRerankHandler(RankingHandler):
    """/rerank: /v1/rerank's ranking (the same windows, the same order), as TEI's `[{index, score, text?}]`;
    its request is /v1/rerank's with `raw_scores`."""

    def __init__(self, task: str):
        own = handler_for(task, "ranking", "/rerank")
        super().__init__(own.definition, own.endpoint, "/rerank")
        self.request_model = type(own.request_model.__name__, (own.request_model,), {
            "__module__": __name__, "__annotations__": {"raw_scores": bool}, "raw_scores": Field(False, strict=True)})

    def finish(self, model, prepared, outputs, body: Any) -> list[Any]:
        [p], [out] = prepared, outputs
        logits = best_logits(p, out)
        scores = logits if body.raw_scores else sigmoid(logits)
        texts = p.state.documents if body.return_documents else None
        return [[{"index": i, "score": float(scores[i]), **({"text": texts[i]} if texts else {})}
                 for i in np.argsort(-logits, kind="stable").tolist()]]


rerank_handler = functools.cache(TEIRerankHandler)


@tei.post("/rerank", response_model=list[Rank], summary="TEI: rerank texts")
async def tei_rerank(body: RerankBody, request: Request) -> Response:
    """Every text, most relevant first: `[{index, score}]` (`text` too with `return_text`); the scores are the
    sigmoid of the cross-encoder's logit, or the logit with `raw_scores`."""
    runtime: Runtime = request.app.state.runtime
    name = tei_model(runtime, "tei_rerank_model")
    handler = rerank_handler(runtime.bundles[name].task)
    berth = validated(handler.request_model, {
        "model": name, "query": body.query, "documents": body.texts, "return_documents": body.return_text,
        "raw_scores": body.raw_scores})
    return await infer(request, handler, berth, payload_shape=lambda _, results: results[0])


# -- the tokenizer ----------------------------------------------------------------------------------------------


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="UTF-8 byte offset into the input (TEI's); null for a special token")
    stop: int | None


class TokenizeBody(Strict):
    inputs: str | list[str]
    add_special_tokens: bool = Field(True, strict=True)
    prompt_name: str | None = Field(None, description="not supported: 422 when given")


# /tokenize's limit checks: each input a text, as the adapter of a task whose inputs are texts checks them.
TEXTS = handler_for(next(name for name, task in DEFINITIONS.items()
                         if task.endpoints and not task.input_fields), "inputs", "/tokenize")


def byte_offsets(text: str) -> Sequence[int]:
    """The UTF-8 byte offset of every str index of `text` (and of its end)."""
    if text.isascii():
        return range(len(text) + 1)
    return np.concatenate(([0], np.cumsum([len(ch.encode("utf-8", "surrogatepass")) for ch in text]))).tolist()


# JSON bytes of one /tokenize token besides its text: {"id":..,"text":"","special":false,"start":..,"stop":..},
TOKEN_JSON_BYTES = 72


def tokens_json_bytes(texts: list[str], encodings: Sequence[Any]) -> int:
    """An estimate of /tokenize's answer: a fixed cost per token and each token's text (a text's characters)."""
    tokens = sum(len(encoding.ids) + 2 for encoding in encodings)
    return tokens * TOKEN_JSON_BYTES + sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)


def tokens_of(tokenizer: Any, texts: list[str], add_special_tokens: bool,
              encodings: Sequence[Any] | None = None) -> list[list[dict[str, Any]]]:
    """Each text's tokens as the model is given them ([CLS] text [SEP], the specials without offsets)."""
    cls, sep = ({"id": tokenizer.token_to_id(t), "text": t, "special": True, "start": None, "stop": None}
                for t in (CLS, SEP))
    answers = []
    if encodings is None:
        encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    for text, encoding in zip(texts, encodings):
        at = byte_offsets(text)
        tokens = [{"id": i, "text": text[start:end], "special": False, "start": at[start], "stop": at[end]}
                  for i, (start, end) in zip(encoding.ids, encoding.offsets)]
        answers.append([cls, *tokens, sep] if add_special_tokens else tokens)
    return answers


async def off_the_loop(runtime: Runtime, chars: int, fn: Callable[[], Any]) -> Any:
    """`fn()` in the tokenizer thread when the request is large (as `infer` tokenizes), else inline."""
    pool = runtime.pool_for(chars)
    return await asyncio.get_running_loop().run_in_executor(pool, fn) if pool is not None else fn()


def answer(request: Request, payload: Any) -> Response:
    check_response(request, payload)
    return Response(orjson.dumps(payload), media_type="application/json")


@tei.post("/tokenize", response_model=list[list[SimpleToken]], summary="TEI: the tokens the model is given")
async def tei_tokenize(body: TokenizeBody, request: Request) -> Response:
    """Per input, `[{id, text, special, start, stop}]`; with `add_special_tokens` (default) [CLS] first and [SEP]
    last, as the model reads the text. Nothing is cut."""
    runtime: Runtime = request.app.state.runtime
    model = any_tei_model(runtime)
    request.state.berth_model = model.name
    refuse_prompt_name(body.prompt_name)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    TEXTS.check_inputs(texts, runtime.settings)
    chars = sum(map(len, texts))
    encodings = await off_the_loop(runtime, chars,
                                   lambda: model.tokenizer.encode_batch(texts, add_special_tokens=False))
    # The answer counts against max_response_bytes and, while it is built, max_inflight_response_bytes (413 / 429),
    # and is built, checked against its schema and serialized off the event loop when the request is large.
    reserved = Reservation(runtime)
    try:
        reserved.take(tokens_json_bytes(texts, encodings))

        def serialized() -> bytes:
            payload = tokens_of(model.tokenizer, texts, body.add_special_tokens, encodings)
            check_response(request, payload)
            return orjson.dumps(payload)

        return Response(await off_the_loop(runtime, chars, serialized), media_type="application/json")
    finally:
        reserved.release()


class DecodeBody(Strict):
    ids: TokenIds | list[TokenIds] = Field(description="token ids, or a list of id lists")
    skip_special_tokens: bool = Field(True, strict=True)

    @field_validator("ids")
    @classmethod
    def _one_id_list_is_one_input(cls, value: Any) -> Any:
        return as_inputs(value)


@tei.post("/decode", response_model=list[str], summary="TEI: token ids back to text")
async def tei_decode(body: DecodeBody, request: Request) -> Response:
    """One text per id list (a list of one for a flat list of ids). 422 names an id outside the vocabulary."""
    runtime: Runtime = request.app.state.runtime
    settings = runtime.settings
    model = any_tei_model(runtime)
    request.state.berth_model = model.name
    lists: list[list[int]] = body.ids  # type: ignore[assignment]
    if not lists:
        raise ServiceError(ErrorType.VALIDATION, "ids: the list is empty; send at least one id list")
    if len(lists) > settings.max_inputs_per_request:
        raise ServiceError(ErrorType.TOO_LARGE, f"ids: {len(lists)} id lists in one request; the limit is "
                           f"{settings.max_inputs_per_request} (max_inputs_per_request)")
    total = sum(map(len, lists))
    if total > settings.max_tokens_per_request:
        raise ServiceError(ErrorType.TOO_LARGE, f"ids: {total} ids in one request; the limit is "
                           f"{settings.max_tokens_per_request} (max_tokens_per_request)")
    size = model.tokenizer.get_vocab_size()
    for index, ids in enumerate(lists):
        for position, token in enumerate(ids):
            if not 0 <= token < size:
                raise ServiceError(ErrorType.VALIDATION, f"ids[{index}][{position}]: token id {token} is not in "
                                   f"the vocabulary of model {model.name!r} (ids 0..{size - 1})")
    texts = await off_the_loop(runtime, total, lambda: model.tokenizer.decode_batch(
        lists, skip_special_tokens=body.skip_special_tokens))
    return answer(request, list(texts))


# -- what is served ---------------------------------------------------------------------------------------------


class Info(BaseModel):
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, Any] = Field(description='{"embedding": {"pooling"}}, {"classifier": {"id2label", '
                                                   '"label2id"}} or {"reranker": {...}}')
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None
    docker_label: str | None


DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}


def model_type(model: ServedModel) -> dict[str, Any]:
    spec = model.spec
    if model.task in tasks_doing("feature-extraction"):
        return {"embedding": {"pooling": str(spec.extra.get("pooling") or spec.pooling or "mean")}}
    labels = list(spec.labels) or ["LABEL_0"]
    described = {"id2label": {str(i): label for i, label in enumerate(labels)},
                 "label2id": {label: i for i, label in enumerate(labels)}}
    reranks = model.task in tasks_doing("text-ranking")
    return {"reranker" if reranks or len(labels) == 1 else "classifier": described}


@tei.get("/info", response_model=Info, summary="TEI: the model and the server's limits")
async def tei_info(request: Request) -> Response:
    """The model of /tokenize and /decode (the embed model, else the predict model, else the rerank model) and
    the limits that hold for every route: `max_input_length` is the model's max_seq_length, `max_client_batch_size`
    the inputs of one request, `max_batch_requests` / `max_batch_tokens` those of one forward pass."""
    runtime: Runtime = request.app.state.runtime
    settings = runtime.settings
    model = any_tei_model(runtime)
    request.state.berth_model = model.name
    return answer(request, {
        "model_id": model.name, "model_sha": model.bundle.manifest_sha256 or None,
        "model_dtype": DTYPES.get(model.bundle.precision, model.bundle.precision), "model_type": model_type(model),
        "max_concurrent_requests": settings.max_concurrent_requests, "max_input_length": model.spec.max_seq_length,
        "max_batch_tokens": settings.max_batch_tokens, "max_batch_requests": settings.max_batch_size,
        "max_client_batch_size": settings.max_inputs_per_request, "auto_truncate": False,
        "tokenization_workers": settings.tokenizer_threads, "version": request.app.version, "sha": None,
        "docker_label": None})
