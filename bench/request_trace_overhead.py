"""What the request-id / access-log / tracing layer (service/request_trace.py) costs one request, in microseconds.

Calls the layer directly around a do-nothing ASGI app (no sockets, no event-loop switches: only the layer's own
work), side by side in one run, the same requests in each configuration:

    bare          the app alone (the baseline)
    ids           the layer as shipped by default: a request id read or made, returned in X-Request-ID
    access-log    + one access line per request (to a log file)
    tracing       + a server span per request (OpenTelemetry SDK, batch processor, spans dropped by the exporter)

    python -m bench.request_trace_overhead [--requests 50000] [--out bench/results/request_trace_overhead.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from pathlib import Path

from bench.machine import machine_facts


async def _app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _receive() -> dict:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message) -> None:
    return None


def _scope(with_id: bool) -> dict:
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    if with_id:
        headers.append((b"x-request-id", b"client-id-0123456789"))
    return {"type": "http", "method": "POST", "path": "/v1/classify", "headers": headers, "state": {}}


async def _time(app, requests: int, with_id: bool) -> float:
    """Microseconds per request (best of 5 rounds)."""
    best = float("inf")
    for _ in range(5):
        begin = time.perf_counter()
        for _ in range(requests):
            await app(_scope(with_id), _receive, _send)
        best = min(best, (time.perf_counter() - begin) / requests * 1e6)
    return best


def main() -> None:
    from service import tracing
    from service.log_format import configure_logging
    from service.request_trace import RequestTrace

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    log_file = Path(tempfile.mkdtemp()) / "access.log"
    configure_logging("info", as_json=True)
    logging.getLogger().handlers[0].setStream(open(log_file, "w"))  # noqa: SIM115 - kept open for the run

    rows = {}
    for with_id in (False, True):
        rows[f"bare (client id: {with_id})"] = asyncio.run(_time(_app, args.requests, with_id))
        rows[f"ids (client id: {with_id})"] = asyncio.run(_time(RequestTrace(_app), args.requests, with_id))
        rows[f"access-log (client id: {with_id})"] = asyncio.run(
            _time(RequestTrace(_app, access_log=True), args.requests, with_id))
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    tracing.use(provider)
    rows["tracing (client id: True)"] = asyncio.run(_time(RequestTrace(_app), args.requests, True))
    tracing.stop()
    base = rows["bare (client id: True)"]
    print(f"{'configuration':<36} {'us/request':>10} {'added us':>9}")
    for name, us in rows.items():
        print(f"{name:<36} {us:10.2f} {us - base:9.2f}")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_facts(), "requests": args.requests,
                                        "us_per_request": rows}, indent=1))


if __name__ == "__main__":
    main()
