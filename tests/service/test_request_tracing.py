"""Requests you can follow: X-Request-ID on every response and log line, the access log (never the text), JSON log
lines, a validated log level, and OpenTelemetry traces (in-memory exporter in-process; OTLP over HTTP from a real
`berth serve` to a receiver this test runs).

Expectations come from outside the code under test: W3C trace-context ids written here, token counts from the
bundle's own tokenizer.json read with the `tokenizers` library, the receiver's protobuf decoded with
OpenTelemetry's own message classes.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from bench.local_processes import free_port
from tests.service.conftest import API_KEY, BASE_ENV, REPO, ServerProcess

SECRET = "zq-secret-7781 Marguerite"  # an input text that must never reach a log line
HEX32 = re.compile(r"[0-9a-f]{32}")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"  # W3C trace-context's own example
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def tokens_of(repository: Path, name: str, texts: list[str]) -> int:
    """Tokens of each text as one sequence ([CLS] ... [SEP]) by the bundle's tokenizer.json, read here directly."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(repository / name / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return sum(len(tokenizer.encode(text).ids) for text in texts)


# -- a real `berth serve --access-log --log-json` -----------------------------------------------------------------


@pytest.fixture(scope="module")
def logged(bundle_repository, tmp_path_factory):
    server = ServerProcess(bundle_repository, tmp_path_factory.mktemp("trace-logs") / "serve.log",
                           env={"BERTH_API_KEY": API_KEY}, args=["--model", "sentiment", "--access-log", "--log-json"])
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
            yield server, c
    finally:
        server.stop()


def log_lines(server: ServerProcess) -> list[dict]:
    """Every line the server wrote so far, each parsed as JSON (fails on a line that is not)."""
    time.sleep(0.2)  # the access line is written as the response ends
    return [json.loads(line) for line in server.log_path.read_text(encoding="utf-8").splitlines() if line.strip()]


def access_line(server: ServerProcess, request_id: str) -> dict:
    found = [line for line in log_lines(server) if line.get("logger") == "berth.access"
             and line.get("request_id") == request_id]
    assert len(found) == 1, found
    return found[0]


def test_the_client_id_comes_back_and_is_on_the_access_line(logged, bundle_repository):
    server, client = logged
    texts = [SECRET, "A second, harmless review of the film."]
    response = client.post("/v1/classify", json={"inputs": texts}, headers={"X-Request-ID": "order-42/retry:1"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "order-42/retry:1"
    line = access_line(server, "order-42/retry:1")
    assert {k: line[k] for k in ("method", "route", "model", "status", "inputs", "items")} == {
        "method": "POST", "route": "/v1/classify", "model": "sentiment", "status": 200, "inputs": 2, "items": 2}
    assert line["tokens"] == tokens_of(bundle_repository, "sentiment", texts)
    for stage in ("tokenize_seconds", "queue_seconds", "inference_seconds"):
        assert 0 <= line[stage] <= line["seconds"], (stage, line)
    assert line["inference_seconds"] > 0
    assert "client_request_id" not in line


def test_no_input_text_in_any_log_line(logged):
    server, client = logged
    client.post("/v1/classify", json={"inputs": [SECRET]})
    client.post("/v1/classify", json={"inputs": [SECRET, ""]})  # refused: 422 naming inputs[1]
    client.post("/v1/classify?text=" + SECRET.split()[0], json={"inputs": SECRET})
    text = server.log_path.read_text(encoding="utf-8")
    assert "zq-secret" not in text and "Marguerite" not in text


def test_ids_are_made_and_returned_on_every_response(logged):
    server, client = logged
    made = [client.post("/v1/classify", json={"inputs": "fine"}).headers["x-request-id"] for _ in range(3)]
    assert all(HEX32.fullmatch(i) for i in made) and len(set(made)) == 3
    responses = {
        "404 route": client.get("/v1/nowhere"),
        "404 model": client.post("/v1/classify", json={"inputs": "x", "model": "absent"}),
        "422": client.post("/v1/classify", json={"inputs": []}),
        "400": client.post("/v1/classify", content=b"{not json", headers={"content-type": "application/json"}),
        "401": httpx.post(server.url + "/v1/classify", json={"inputs": "x"}),
        "413": client.post("/v1/classify", json={"inputs": ["x"] * 300}),
        "405": client.get("/v1/classify"),
        "probe": client.get("/healthz"),
        "metrics": client.get("/metrics"),
    }
    for what, response in responses.items():
        assert HEX32.fullmatch(response.headers.get("x-request-id", "")), (what, response.headers)
        line = access_line(server, response.headers["x-request-id"])
        assert line["status"] == response.status_code, what
    assert responses["401"].status_code == 401 and responses["413"].status_code == 413


@pytest.mark.parametrize("given", [
    b"x" * 129,  # longer than 128
    "café-ünïcode".encode(),  # not ASCII
    b"two words",  # a space
    b'quote"inside',
    b"back\\slash",
    b"",
], ids=["too-long", "non-ascii", "space", "quote", "backslash", "empty"])
def test_unsafe_ids_are_replaced_and_never_logged(logged, given):
    server, client = logged
    response = client.post("/v1/classify", json={"inputs": "fine"}, headers=[(b"x-request-id", given)])
    assert response.status_code == 200
    made = response.headers["x-request-id"]
    assert HEX32.fullmatch(made) and made.encode() != given
    line = access_line(server, made)
    if given:
        assert line["client_request_id"] == "refused"
        assert given not in server.log_path.read_bytes()
    else:  # an empty header is no id at all
        assert "client_request_id" not in line


def test_every_line_is_json_the_settings_first(logged):
    server, _ = logged
    lines = log_lines(server)  # each parsed: a line that is not JSON fails here
    first = lines[0]
    assert first["message"] == "berth serve settings" and first["settings"]["port"] == server.port
    assert first["settings"]["access_log"] is True and first["settings"]["api_key"] == "***"
    assert any(line["logger"] == "uvicorn.error" for line in lines)  # uvicorn's own lines too


@pytest.mark.parametrize(("args", "env"), [(["--log-level", "verbose"], {}), ([], {"BERTH_LOG_LEVEL": "loud"}),
                                          (["--log-level", "verbose", "--log-json"], {})],
                         ids=["flag", "env", "json"])
def test_an_unknown_log_level_is_one_line_and_exit_2(tmp_path, args, env):
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    done = subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--models", str(tmp_path), *args],
                          cwd=REPO, env={**environ, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("berth serve: ") and "not a log level" in line
    assert "debug, info, warning, error, critical" in line


def test_a_misconfigured_exporter_is_one_line_and_exit_2(bundle_repository):
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BERTH_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--models", str(bundle_repository),
                           "--port", str(free_port())], cwd=REPO, env={**environ, "OTEL_TRACES_EXPORTER": "zipkin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("berth serve: OTEL_TRACES_EXPORTER: 'zipkin' is not an exporter "
                                                    "berth has (otlp, console, none)")


# -- in-process: the in-memory span exporter, and every log line of a request carrying its id --------------------


@pytest.fixture(scope="module")
def traced(bundle_repository):
    """A real uvicorn on 127.0.0.1 in this process (so the in-memory exporter sees its spans), tracing on."""
    import uvicorn
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from service import tracing
    from service.app import create_app
    from service.settings import ServiceSettings

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    port = free_port()
    settings = ServiceSettings(models=bundle_repository, model_names=["sentiment"], port=port, access_log=True,
                               length_buckets=[int(n) for n in BASE_ENV["BERTH_LENGTH_BUCKETS"].split(",")],
                               max_batch_tokens=1024, intra_op_threads=1, device="cpu")
    app = create_app(settings)
    logged: list[logging.LogRecord] = []

    async def logs_in_a_request() -> dict:  # a route that logs on the event loop and from a worker thread
        import asyncio

        log = logging.getLogger("berth.test")
        log.warning("on the loop")
        await asyncio.to_thread(log.warning, "in a thread")
        return {}

    app.add_api_route("/test/logs", logs_in_a_request)

    async def fails() -> dict:  # an unexpected error: Starlette's outermost error middleware answers the 500
        raise RuntimeError("a bug")

    app.add_api_route("/test/fails", fails)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record)

    from service.request_ids import RequestIdFilter

    handler = Keep()
    handler.addFilter(RequestIdFilter())
    for name in ("berth.access", "berth.test"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    try:
        yield url, exporter, logged
    finally:
        server.should_exit = True
        thread.join(30)
        for name in ("berth.access", "berth.test"):
            logging.getLogger(name).removeHandler(handler)
        tracing.stop()


def spans_of(exporter, trace_id: int) -> dict[str, list]:
    by_name: dict[str, list] = {}
    for span in exporter.get_finished_spans():
        if span.context.trace_id == trace_id:
            by_name.setdefault(span.name, []).append(span)
    return by_name


def test_a_traced_request_has_its_stages_as_spans(traced):
    url, exporter, _ = traced
    exporter.clear()
    response = httpx.post(url + "/v1/classify", json={"inputs": ["One review.", "Another, somewhat longer review."]},
                          headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200
    time.sleep(0.1)
    spans = spans_of(exporter, int(TRACE_ID, 16))
    assert set(spans) == {"POST /v1/classify", "tokenize", "queue", "inference", "decode"}, set(spans)
    [request] = spans["POST /v1/classify"]
    assert request.parent is not None and request.parent.span_id == int(PARENT_ID, 16)  # the client's span
    assert request.parent.is_remote
    assert request.attributes["http.route"] == "/v1/classify"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["berth.request_id"] == response.headers["x-request-id"]
    assert request.attributes["berth.items"] == 2
    for name in ("tokenize", "queue", "inference", "decode"):
        for span in spans[name]:
            assert span.parent.span_id == request.context.span_id, name
            assert request.start_time <= span.start_time <= span.end_time <= request.end_time, name
    order = [spans[name][0] for name in ("tokenize", "queue", "inference", "decode")]
    assert all(a.end_time <= b.start_time + 1000 for a, b in zip(order, order[1:]))  # in this order (1 us slack)
    inference_ms = sum(s.end_time - s.start_time for s in spans["inference"]) / 1e6
    assert inference_ms == pytest.approx(float(response.headers["x-inference-time"]), abs=0.01)
    print("\n" + "\n".join(f"{s.name:<20} {(s.end_time - s.start_time) / 1e6:8.3f} ms"
                           for s in [request, *order, *spans["inference"][1:]]))


@pytest.mark.parametrize("traceparent", [
    "00-xyz-00f067aa0ba902b7-01",
    f"00-{'0' * 32}-{PARENT_ID}-01",  # an all-zero trace id is invalid
    f"00-{TRACE_ID}-{'0' * 16}-01",  # an all-zero parent id too
    f"00-{TRACE_ID}-{PARENT_ID}",  # no flags
    "x" * 5000,
], ids=["not-hex", "zero-trace", "zero-parent", "short", "huge"])
def test_a_malformed_traceparent_starts_a_new_trace(traced, traceparent):
    url, exporter, _ = traced
    exporter.clear()
    response = httpx.post(url + "/v1/classify", json={"inputs": "fine"}, headers={"traceparent": traceparent})
    assert response.status_code == 200
    time.sleep(0.1)
    [request] = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/classify"]
    assert request.parent is None
    assert request.context.trace_id not in (0, int(TRACE_ID, 16))
    assert {s.name for s in exporter.get_finished_spans() if s.context.trace_id == request.context.trace_id} == {
        "POST /v1/classify", "tokenize", "queue", "inference", "decode"}


def test_errors_are_traced_too(traced):
    url, exporter, _ = traced
    exporter.clear()
    assert httpx.post(url + "/v1/classify", json={"inputs": ""}).status_code == 422
    time.sleep(0.1)
    [request] = exporter.get_finished_spans()
    assert request.name == "POST /v1/classify" and request.attributes["http.response.status_code"] == 422


def test_an_unexpected_500_carries_the_id_and_its_traceback_line_too(traced):
    url, exporter, logged = traced
    logged.clear()
    handler = logging.Handler()
    seen: list[logging.LogRecord] = []
    handler.emit = seen.append
    from service.request_ids import RequestIdFilter

    handler.addFilter(RequestIdFilter())
    logging.getLogger("berth.service").addHandler(handler)
    try:
        response = httpx.get(url + "/test/fails", headers={"X-Request-ID": "will-fail"})
    finally:
        logging.getLogger("berth.service").removeHandler(handler)
    assert response.status_code == 500 and response.headers["x-request-id"] == "will-fail"
    assert response.json()["error_type"] == "internal"
    assert [r.request_id for r in seen if r.exc_info] == ["will-fail"]  # the logged traceback names the request
    time.sleep(0.1)
    [access] = [r for r in logged if r.getMessage() == "request"]
    assert access.request_id == "will-fail" and access.fields["status"] == 500


def _run_layer(app, headers: list[tuple[bytes, bytes]]) -> tuple[list[dict], BaseException | None]:
    """RequestTrace around `app` for one GET, in process: the messages it sent and what it raised."""
    import asyncio

    from service.request_trace import RequestTrace

    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": headers, "state": {}}
    try:
        asyncio.run(RequestTrace(app)(scope, receive, send))
    except Exception as error:  # noqa: BLE001 - what escaped is part of the check
        return sent, error
    return sent, None


def test_a_bug_in_the_layers_before_any_response_is_a_json_500_with_the_id_and_is_raised_on():
    async def broken(scope, receive, send):  # a layer inside the trace that fails before it answers
        raise RuntimeError("a bug in a layer")

    sent, raised = _run_layer(broken, [(b"x-request-id", b"layer-bug")])
    assert isinstance(raised, RuntimeError)  # raised on, so the server logs its traceback
    start, body = sent
    assert start["status"] == 500 and (b"x-request-id", b"layer-bug") in start["headers"]
    assert json.loads(body["body"]) == {"error": "internal error", "error_type": "internal"}


def test_a_failure_after_the_response_started_sends_nothing_more():
    async def fails_midway(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("after the head")

    sent, raised = _run_layer(fails_midway, [])
    assert isinstance(raised, RuntimeError) and [m["type"] for m in sent] == ["http.response.start"]


def test_every_log_line_of_a_request_carries_its_id(traced):
    url, _, logged = traced
    logged.clear()
    first = httpx.get(url + "/test/logs", headers={"X-Request-ID": "first-request"})
    second = httpx.get(url + "/test/logs")
    time.sleep(0.1)
    by_message = {(r.getMessage(), r.request_id) for r in logged}
    made = second.headers["x-request-id"]
    assert first.headers["x-request-id"] == "first-request"
    assert by_message == {("on the loop", "first-request"), ("in a thread", "first-request"),
                          ("request", "first-request"), ("on the loop", made), ("in a thread", made),
                          ("request", made)}
    outside = logging.LogRecord("x", logging.INFO, __file__, 0, "outside", None, None)
    from service.request_ids import RequestIdFilter

    RequestIdFilter().filter(outside)
    assert outside.request_id is None  # a line written outside any request has none


# -- OTLP over HTTP from a real `berth serve` to a receiver run here --------------------------------------------


class Receiver(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        Receiver.received.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_otlp_http_export_reaches_a_receiver(bundle_repository, tmp_path):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    Receiver.received.clear()
    server = ServerProcess(bundle_repository, tmp_path / "serve.log", args=["--model", "sentiment"], env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_port}",
        "OTEL_SERVICE_NAME": "berth-under-test", "OTEL_BSP_SCHEDULE_DELAY": "200"})
    try:
        server.wait_ready()
        response = httpx.post(server.url + "/v1/classify", json={"inputs": ["Traced.", "Twice."]},
                              headers={"traceparent": TRACEPARENT})
        assert response.status_code == 200
        deadline = time.monotonic() + 20
        names: dict[str, list] = {}
        while time.monotonic() < deadline and "decode" not in names:
            time.sleep(0.2)
            names.clear()
            for path, body in list(Receiver.received):
                assert path == "/v1/traces"
                message = ExportTraceServiceRequest.FromString(body)
                for resource_spans in message.resource_spans:
                    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    assert service["service.name"] == "berth-under-test"
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            if span.trace_id.hex() == TRACE_ID:
                                names.setdefault(span.name, []).append(span)
        assert {"POST /v1/classify", "tokenize", "queue", "inference", "decode"} <= set(names), set(names)
        [request] = names["POST /v1/classify"]
        assert request.parent_span_id.hex() == PARENT_ID
        assert all(span.parent_span_id == request.span_id for name in ("tokenize", "queue", "inference", "decode")
                   for span in names[name])
        assert "tracing on: spans exported by otlp" in server.log()
    finally:
        server.stop()
        receiver.shutdown()


def test_a_failed_start_under_log_json_is_json_too(bundle_repository, tmp_path):
    """A bundle whose file no longer matches its manifest's sha256: berth serve refuses it, and under --log-json
    every line it wrote, the refusal included, is a JSON object."""
    import os
    import shutil

    repository = tmp_path / "repository"
    shutil.copytree(bundle_repository / "sentiment", repository / "sentiment")
    tokenizer = repository / "sentiment" / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text(encoding="utf-8") + " ", encoding="utf-8")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BERTH_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-m", "berth.cli", "serve", "--models", str(repository), "--log-json",
                           "--port", str(free_port())], cwd=REPO, env={**environ, **BASE_ENV},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (1, 2), done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert lines[0]["message"] == "berth serve settings"
    assert lines[-1]["level"] == "ERROR" and lines[-1]["message"].startswith("berth serve: ")
    assert "sha256" in lines[-1]["message"] or "tokenizer.json" in lines[-1]["message"], lines[-1]


def test_tracing_off_loads_no_opentelemetry(tmp_path):
    """Without OTEL_* variables the app is built without OpenTelemetry's SDK (FastAPI itself may import the API)."""
    import os

    code = ("import sys; from service.app import create_app; from service.settings import ServiceSettings; "
            "from service import tracing; create_app(ServiceSettings(models=sys.argv[1])); "
            "print(tracing.ACTIVE, any(m.startswith('opentelemetry.sdk') for m in sys.modules))")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BERTH_", "OTEL_"))}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=environ, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["False", "False"]
