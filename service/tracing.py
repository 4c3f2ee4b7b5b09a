"""OpenTelemetry tracing, opt-in by the standard OTEL_* variables, and free when off.

On when OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`; `none`: off), or, with it unset, when
OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (then `otlp`); OTEL_SDK_DISABLED=true
turns it off. `otlp` speaks OTLP over HTTP (protobuf) unless OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL says `grpc`.
Everything else is the SDK's own reading of the standard variables: the endpoint and headers, OTEL_SERVICE_NAME
(default here: berth), OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER[_ARG], OTEL_BSP_* (spans leave in batches,
off the request path). Needs the `otel` extra (`pip install 'berth[otel]'`).

A request's trace (a W3C `traceparent` from the client continues the client's trace; a malformed one is ignored,
starting a new trace):

    POST /v1/classify      the request, from its arrival to its last byte (server span)
      tokenize             its inputs becoming model items
      queue                from its items' arrival at the batcher until the last of them was taken into a batch
      inference            each forward pass its items rode in (a pass may carry other requests' items too; the
                           passes of one take run one after another, so a later pass starts after the queue span)
      decode               its items' outputs becoming results

The stage spans are written when the request has its results, from the times the request path measures anyway
(service/inference.py `Timings`, the batcher's `ItemResult`): the batcher and the passes carry no tracing code.
When tracing is off, `ACTIVE` is False and the request path does nothing more than read it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

ACTIVE = False  # read on the request path: tracing costs nothing more when off
_tracer: Any = None
_provider: Any = None
_propagator: Any = None
_configured = False
# perf_counter() seconds -> Unix epoch nanoseconds (the request path times with perf_counter)
_EPOCH_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


class TracingError(RuntimeError):
    """The OTEL_* variables ask for tracing that cannot be set up (the extra missing, an unknown exporter)."""


def epoch_ns(perf_seconds: float) -> int:
    return int(perf_seconds * 1e9) + _EPOCH_OFFSET_NS


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The span exporters the OTEL_* variables ask for ([]: tracing off)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not named:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    names = [name.strip() for name in named.split(",") if name.strip()]
    return [] if names == ["none"] else [name for name in names if name != "none"]


def setup_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """Turn tracing on as the OTEL_* variables say (once per process); the exporters' names ([]: off).
    TracingError naming the problem when it cannot."""
    global _configured
    environ = os.environ if environ is None else environ
    names = exporter_names(environ)
    if _configured or not names:
        return names
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise TracingError("tracing is asked for by OTEL_* variables, but OpenTelemetry is not installed: "
                           "pip install 'berth[otel]'") from None
    exporters = [_exporter(name, environ) for name in names]
    named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    from tasks.runtime.version import berth_version

    attributes = {"service.version": berth_version(), **({} if named else {"service.name": "berth"})}
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    use(provider)
    _configured = True
    return names


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingError(f"OTEL_TRACES_EXPORTER: {name!r} is not an exporter berth has (otlp, console, none)")
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            raise TracingError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r}; berth speaks http/protobuf or grpc")
    except ImportError:
        package = "opentelemetry-exporter-otlp-proto-grpc" if protocol == "grpc" else "'berth[otel]'"
        raise TracingError(f"the OTLP {protocol} exporter is not installed: pip install {package}") from None
    return OTLPSpanExporter()


def use(provider: Any) -> None:
    """Trace with this TracerProvider from now on (what setup_from_env does; tests pass one with an in-memory
    exporter). Does not touch OpenTelemetry's global provider."""
    global ACTIVE, _tracer, _provider, _propagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from tasks.runtime.version import berth_version

    _provider, _propagator = provider, TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("berth.service", berth_version())
    ACTIVE = True


def stop() -> None:
    """Tracing off (the provider is flushed and shut down)."""
    global ACTIVE, _tracer, _provider, _configured
    ACTIVE, _configured = False, False
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def flush() -> None:
    if _provider is not None:
        _provider.force_flush()


# -- spans ---------------------------------------------------------------------------------------------------


def start_request(scope: Mapping[str, Any], started: float, request_id: str) -> tuple[Any, Any]:
    """The request's server span, child of the client's `traceparent` when it is valid, made current; (span,
    token to detach)."""
    from opentelemetry import context, trace

    carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())
               if name in (b"traceparent", b"tracestate")}
    parent = _propagator.extract(carrier) if carrier else None
    span = _tracer.start_span(scope["method"], context=parent, kind=trace.SpanKind.SERVER,
                              start_time=epoch_ns(started),
                              attributes={"http.request.method": scope["method"], "url.path": scope["path"],
                                          "berth.request_id": request_id})
    return span, context.attach(trace.set_span_in_context(span, parent))


def end_request(span: Any, token: Any, ended: float, route: str | None, status: int,
                fields: Mapping[str, Any]) -> None:
    """End the request's span: its route, status and the access log's fields as attributes."""
    from opentelemetry import context, trace

    try:
        if route:
            span.update_name(f"{span.name} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        for key, value in fields.items():
            if value is not None:
                span.set_attribute(f"berth.{key}", value)
        if status >= 500:
            span.set_status(trace.Status(trace.StatusCode.ERROR))
        span.end(end_time=epoch_ns(ended))
    finally:
        context.detach(token)


def record_stages(timings: Any, results: Sequence[Any]) -> None:
    """The stage spans of the current request from its timings (service/inference.py `Timings`) and its items'
    `ItemResult`s: tokenize, queue (its items are handed to the batcher as tokenizing ends, and the longest wait
    was `queue_s`), inference (each distinct pass), decode."""
    _interval("tokenize", timings.tokenize_at, timings.tokenize_at + timings.tokenize_s,
              {"berth.items": timings.items, "berth.tokens": timings.tokens})
    if results:
        submitted = timings.tokenize_at + timings.tokenize_s  # then only the budget checks, microseconds
        _interval("queue", submitted, submitted + timings.queue_s)
        passes: dict[int, list[Any]] = {}
        for r in results:
            passes.setdefault(r.run_id, [r, 0])[1] += 1
        for run_id, (r, count) in sorted(passes.items()):
            _interval("inference", r.finished_at - r.inference_seconds, r.finished_at,
                      {"berth.pass.id": run_id, "berth.pass.items_of_request": count,
                       "berth.pass.pad_seconds": r.pad_seconds})
    _interval("decode", timings.decode_at, timings.decode_at + timings.decode_s)


def _interval(name: str, start: float, end: float, attributes: Mapping[str, Any] | None = None) -> None:
    span = _tracer.start_span(name, start_time=epoch_ns(start), attributes=attributes)
    span.end(end_time=epoch_ns(max(start, end)))
