"""The HTTP routes: /v1 inference and model listing (behind the optional API key), /v2/rerank (Cohere's v2 path),
probes, metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from service.handlers import (
    HANDLERS,
    OPENAI_EMBEDDINGS,
    SIMILARITY,
    openai_payload,
    rerank_payload,
    similarity_payload,
)
from service.inference import infer
from service.metrics import CONTENT_TYPE
from service.runtime import Phase, Runtime
from service.schemas import (
    ERROR_RESPONSES,
    OFFSETS_NOTE,
    ChoiceRequest,
    ChoiceResponse,
    ClassifyRequest,
    ClassifyResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    FillMaskRequest,
    FillMaskResponse,
    NERRequest,
    NERResponse,
    PairRequest,
    QARequest,
    QAResponse,
    RerankRequest,
    RerankResponse,
    SimilarityRequest,
    SimilarityResponse,
)


async def get_runtime(request: Request) -> Runtime:  # async: FastAPI would run a plain def in a thread
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


# The API key is checked once, in the ASGI middleware (service/middleware.py), before the body is read.
# Every POST route of v1 is an inference endpoint `(body, request)`: service/fastpath.py calls it directly for
# JSON bodies, FastAPI for anything else (both run the same endpoint, so they answer alike).
v1 = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)


@v1.post("/classify", response_model=ClassifyResponse, summary="Single-text classification (or regression)")
async def classify(body: ClassifyRequest, request: Request) -> Response:
    """One result per input, in input order: `{label, score, truncated}`; with `top_k` the ranked list."""
    return await infer(request, HANDLERS["classification"], body)


@v1.post("/pair", response_model=ClassifyResponse, summary="Sentence-pair classification or regression")
async def pair(body: PairRequest, request: Request) -> Response:
    """`{label, score, truncated}` per pair (regression models: `{score, truncated}`)."""
    return await infer(request, HANDLERS["pair"], body)


@v1.post("/ner", response_model=NERResponse, summary="Named entities with character offsets")
async def named_entities(body: NERRequest, request: Request) -> Response:
    return await infer(request, HANDLERS["ner"], body)


named_entities.__doc__ = "A list of `{entity, text, start, end, score}` per input. " + OFFSETS_NOTE


@v1.post("/qa", response_model=QAResponse, summary="Extractive question answering over contexts of any length")
async def question_answering(body: QARequest, request: Request) -> Response:
    return await infer(request, HANDLERS["qa"], body)


question_answering.__doc__ = ("`{answer, start, end, score, is_impossible}` per question (a ranked list with "
                              "top_k > 1), the best over all windows of the context. " + OFFSETS_NOTE)


@v1.post("/embed", response_model=EmbedResponse, summary="Sentence embeddings, or token vectors with offsets")
async def embed(body: EmbedRequest, request: Request) -> Response:
    return await infer(request, HANDLERS["embedding"], body)


embed.__doc__ = ("`{embedding, truncated}` per input (pooled as the model was trained; L2-normalized by default); "
                 "with `\"output\": \"tokens\"` `{tokens: [{token, start, end, embedding}], truncated}`, the "
                 "`layers` concatenated. " + OFFSETS_NOTE)


@v1.post("/embeddings", response_model=EmbeddingsResponse, summary="OpenAI-compatible embeddings")
async def openai_embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """OpenAI's shape: `{object: list, data: [{object: embedding, index, embedding, truncated, truncated_tokens}],
    model, usage}`; unit vectors; `encoding_format` float or base64 (little-endian float32). An input longer than
    the model takes is a 400 naming it (as OpenAI), unless `"truncate": true`. Errors keep berth's shape."""
    return await infer(request, OPENAI_EMBEDDINGS, body, payload_shape=openai_payload)


@v1.post("/similarity", response_model=SimilarityResponse, summary="Cosine similarity of a source with targets")
async def similarity(body: SimilarityRequest, request: Request) -> Response:
    """Per input, the cosine of `source` with each of `targets`, from the same embeddings as /v1/embed; beside the
    results, `truncated_tokens` per input (the source's, then each target's)."""
    return await infer(request, SIMILARITY, body, payload_shape=similarity_payload)


@v1.post("/fill-mask", response_model=FillMaskResponse, summary="Top-k tokens for each [MASK]")
async def fill_mask(body: FillMaskRequest, request: Request) -> Response:
    """`[{score, token, token_str, sequence}]` per input (a list per [MASK] when there are several), as
    transformers' fill-mask pipeline. 422 when an input has no [MASK]."""
    return await infer(request, HANDLERS["fill-mask"], body)


@v1.post("/choice", response_model=ChoiceResponse, summary="Multiple choice: rank the choices for a context")
async def choice(body: ChoiceRequest, request: Request) -> Response:
    """Per input, its choices `{index, choice, score, truncated}`, most probable first (softmax over them)."""
    return await infer(request, HANDLERS["multiple-choice"], body)


RERANK_SUMMARY = "Rerank documents for a query (Cohere v2 / Jina shape)"


@v1.post("/rerank", response_model=RerankResponse, summary=RERANK_SUMMARY)
async def rerank(body: RerankRequest, request: Request) -> Response:
    """Cohere's v2 `{id, results: [{index, relevance_score, document?}], meta}` with Jina's `model` and `usage`;
    each result also says whether its document was `truncated` (cut to max_tokens_per_doc). The documents most
    relevant first; `top_n` the first n (more than the documents: all of them). A long document is read in
    overlapping windows and scored by its best one. Also served at /v2/rerank, the path of Cohere's v2 client."""
    return await infer(request, HANDLERS["rerank"], body, payload_shape=rerank_payload)


@v1.get("/models", summary="The served models")
async def list_models(runtime: RuntimeDep) -> dict:
    described = []
    for name, bundle in sorted(runtime.bundles.items()):
        model = runtime.models.get(name)
        if model is not None:
            described.append(model.describe())
        else:
            spec = bundle.spec()
            described.append({"name": name, "task": bundle.task, "labels": spec.labels,
                              "max_seq_length": spec.max_seq_length, "precision": bundle.precision,
                              "execution_provider": None, "ready": False, "examples": bundle.examples})
    return {"models": described, "phase": runtime.phase.value}


# Cohere's v2 client posts to /v2/rerank: the same endpoint, behind the same API key, limits and fast path.
v2 = APIRouter(prefix="/v2", responses=ERROR_RESPONSES)
v2.add_api_route("/rerank", rerank, methods=["POST"], response_model=RerankResponse, summary=RERANK_SUMMARY)


probes = APIRouter()


@probes.get("/healthz", summary="Liveness: the process answers (503 only when loading the models failed)")
async def healthz(runtime: RuntimeDep) -> JSONResponse:
    """Liveness only: answered by the event loop itself, so a wedged loop shows as no answer. A model failing its
    passes is /readyz's business (a restart would not heal it; its canary passes do)."""
    if runtime.phase is Phase.FAILED:  # the reason is in the server log, not shown to unauthenticated callers
        return JSONResponse({"status": "failed"}, status_code=503)
    return JSONResponse({"status": "alive", "phase": runtime.phase.value})


@probes.get("/readyz", summary="Readiness: the ready_models (default: all) loaded, warmed up and not failing, and "
                                "not shutting down")
async def readyz(runtime: RuntimeDep) -> JSONResponse:
    """`{"status", "models": {name: {"ready", "required", "reason"}}}`: 200 when every `required` model (ready_models;
    default: every model) is ready; a model that is not required may be not ready (its own requests get 503)."""
    models = {name: runtime.model_status(name) for name in runtime.bundles}
    if runtime.ready:
        return JSONResponse({"status": "ready", "models": models})
    status = "not_ready" if runtime.phase is Phase.READY else runtime.phase.value
    return JSONResponse({"status": status, "models": models}, status_code=503,
                        headers={"Retry-After": str(runtime.settings.retry_after_s)})


@probes.get("/metrics", summary="Prometheus metrics")
async def metrics(runtime: RuntimeDep) -> Response:
    return Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE)
