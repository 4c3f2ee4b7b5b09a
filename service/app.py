"""The app factory: settings in, a FastAPI app out. Loads no torch (a serving image has none)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from service import tracing
from service.compat.errors import HF_PREFIX, TEI_PATHS, error_response_for, in_route_shape
from service.compat.hf import hf
from service.compat.tei import tei
from service.errors import install_error_handlers
from service.fastpath import FastPath
from service.middleware import RequestGuard
from service.playground import install_playground
from service.request_trace import RequestTrace
from service.routes import probes, v1, v2
from service.runtime import Runtime
from service.settings import ServiceSettings
from tasks.runtime.version import berth_version

DESCRIPTION = """BERT heads served on ONNX Runtime with dynamic batching.

Every /v1 inference route takes one input or a list (`inputs`) and answers `{"model", "results"}`, one
result per input in input order. Errors are always `{"error", "error_type"}` with the matching status.
Character offsets are Python str indices into the caller's own string. Timing headers: `x-total-time`,
`x-tokenization-time`, `x-queue-time`, `x-inference-time` (milliseconds), and `Server-Timing` with every
stage (parse, tokenize, queue, pad, inference, wake, decode, serialize).

The same models also answer in the wire formats of other servers: the Hugging Face Inference API at
`POST /models/{name}`, text-embeddings-inference's `/embed`, `/embed_all`, `/predict`, `/rerank`,
`/tokenize`, `/decode` and `/info`, OpenAI's `/v1/embeddings`, and Cohere's and Jina's `/v1/rerank` (Cohere's v2 client:
`/v2/rerank`)."""


def create_app(settings: ServiceSettings | None = None, runtime: Runtime | None = None) -> FastAPI:
    settings = settings or ServiceSettings.from_env()
    runtime = runtime or Runtime(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        yield
        await runtime.stop()

    app = BerthApp(title="berth", version=berth_version(), description=DESCRIPTION, lifespan=lifespan)
    app.state.runtime = runtime
    app.router.redirect_slashes = False  # "/v1/classify/" is a 404 in the one error shape, not a bodiless 307
    install_error_handlers(app, reshape=in_route_shape)
    app.include_router(v1)
    app.include_router(v2)
    app.include_router(probes)
    app.include_router(hf)  # the wire formats of other servers (service/compat)
    app.include_router(tei)
    if settings.playground:
        install_playground(app)
    tracing.setup_from_env()  # once per process; TracingError when the OTEL_* variables ask for the impossible
    fast = FastPath(app.fastapi_stack, v1, v2)  # inside the guard: the body is read and checked already
    guarded = RequestGuard(fast, metrics=runtime.metrics, max_body_bytes=settings.max_body_bytes,
                           api_key=settings.api_key.get_secret_value() if settings.api_key else None,
                           max_concurrent=settings.max_concurrent_requests, max_body_reads=settings.max_body_reads,
                           body_read_timeout_s=settings.body_read_timeout_s, retry_after_s=settings.retry_after_s,
                           protected_prefixes=(HF_PREFIX,), protected_paths=TEI_PATHS,
                           error_response_for=error_response_for)
    app.layers = RequestTrace(guarded, access_log=settings.access_log)  # request ids, access log, tracing
    return app


class BerthApp(FastAPI):
    """FastAPI with berth's request layers in front of FastAPI's own middleware stack, not inside it.

    An HTTP request goes through `layers` (the request trace, the guard, the inference routes' fast path) first; what
    the fast path does not answer goes on into FastAPI (its error middleware and telemetry check, exception
    handlers, routing). Inside FastAPI's stack, its and Starlette's layers (a telemetry check, each layer wrapping
    `send`) ran around every fast-path request for nothing: 3-5% of the Python calls a request makes on the event loop.
    Lifespan and websockets go to FastAPI directly."""

    layers: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.layers is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # as Starlette sets it: request.app, the route templates of refused requests
        await self.layers(scope, receive, send)

    async def fastapi_stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
