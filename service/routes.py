"""The HTTP routes: /v1 inference and model listing (behind the optional API key), /v2/rerank (Cohere's v2 path),
probes, metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from service.handlers import HANDLERS, TaskHandler
from service.inference import infer
from service.metrics import CONTENT_TYPE
from service.runtime import Phase, Runtime
from service.schemas import ERROR_RESPONSES, RESPONSES
from tasks.registry import definition


async def get_runtime(request: Request) -> Runtime:  # async: FastAPI would run a plain def in a thread
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


# The API key is checked once, in the ASGI middleware (service/middleware.py), before the body is read.
# Every POST route is an inference endpoint `(body, request)`, one per task endpoint of the registry
# (tasks/definition.py `Endpoint`): service/fastpath.py calls it directly for JSON bodies, FastAPI for
# anything else (both run the same endpoint, so they answer alike).
v1 = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)
v2 = APIRouter(prefix="/v2", responses=ERROR_RESPONSES)  # Cohere's v2 client posts to /v2/rerank
ROUTERS = (v1, v2)


def inference_endpoint(handler: TaskHandler) -> Callable[..., Awaitable[Response]]:
    """The endpoint of one task endpoint: its request model validated, then the one request path."""

    async def endpoint(body: Any, request: Request) -> Response:
        return await infer(request, handler, body, payload_shape=handler.shape)

    endpoint.__name__ = endpoint.__qualname__ = handler.endpoint.name
    endpoint.__annotations__ = {"body": handler.request_model, "request": Request, "return": Response}
    return endpoint


def add_inference_routes() -> None:
    """Every task endpoint's route, at each of its paths."""
    for handler in HANDLERS.values():
        endpoint, declared = inference_endpoint(handler), handler.endpoint
        for path in (declared.path, *declared.also_at):
            router = next(r for r in ROUTERS if path.startswith(r.prefix + "/"))
            router.add_api_route(path.removeprefix(router.prefix), endpoint, methods=["POST"],
                                 response_model=RESPONSES[declared.response], summary=declared.summary,
                                 description=declared.description)


add_inference_routes()


@v1.get("/models", summary="The served models")
async def list_models(runtime: RuntimeDep) -> dict:
    described = []
    for name, bundle in sorted(runtime.bundles.items()):
        model = runtime.models.get(name)
        if model is not None:  # ready as /readyz says it (with --workers N: in every server process)
            described.append({**model.describe(), "ready": runtime.model_ready(name)})
        else:
            spec = bundle.spec()
            described.append({"name": name, "task": bundle.task, "labels": spec.labels,
                              "routes": [e.describe() for e in definition(bundle.task).endpoints],
                              "max_seq_length": spec.max_seq_length, "precision": bundle.precision,
                              "execution_provider": None, "ready": False, "examples": bundle.examples})
    return {"models": described, "phase": runtime.phase.value}


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


@probes.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
                             "description": "the Prometheus text exposition format"}})
async def metrics(runtime: RuntimeDep) -> Response:
    return Response(runtime.metrics.exposition(), media_type=CONTENT_TYPE)
