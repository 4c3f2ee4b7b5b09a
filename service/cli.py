"""`berth serve`: serve a model repository (a folder of bundles) over HTTP.

Flags override `BERTH_*` environment variables, which override the defaults (service/settings.py).
The API key is read from BERTH_API_KEY only, so it never shows in a process listing; an empty one is
refused. SIGTERM drains: /readyz turns 503 at once while requests are still served for --drain-delay
seconds (so load balancers notice), then new requests are refused (the listener closes), queued and
in-flight ones finish within --shutdown-timeout seconds (0: not waited for), and the process exits 0.
Ctrl-C (or a second SIGTERM) skips the drain delay.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

SETTING_FLAGS = {  # flag -> (settings field, type, help)
    "--models": ("models", Path, "model repository: a folder of bundles (BERTH_MODELS; default: models)"),
    "--host": ("host", str, "interface to listen on (default 127.0.0.1)"),
    "--port": ("port", int, "port (default 8000)"),
    "--max-batch-size": ("max_batch_size", int, "most items in one forward pass (default 32)"),
    "--max-batch-tokens": ("max_batch_tokens", int, "most padded tokens in one forward pass (default 8192)"),
    "--max-wait-ms": ("max_wait_ms", float, "longest wait for a batch to fill (default 2)"),
    "--batch-table": ("batch_table", Path, "measured batch sizes by length (python -m bench.batch_table): a JSON "
                                           "file, or a folder of <model>.json (default: max-batch-size everywhere)"),
    "--max-queue-items": ("max_queue_items", int, "queued items per model before 429 (default 2048)"),
    "--max-inputs": ("max_inputs_per_request", int, "inputs per request (default 256)"),
    "--max-chars": ("max_chars_per_input", int, "characters per input (default 100000)"),
    "--max-body-bytes": ("max_body_bytes", int, "request body bytes (default 4 MiB)"),
    "--request-timeout": ("request_timeout_s", float, "seconds before a request gets 504 (default 30)"),
    "--threads": ("intra_op_threads", int, "ONNX Runtime intra-op threads per model (default 0: all cores)"),
    "--device": ("device", str, "auto | cpu | cuda (default auto)"),
    "--drain-delay": ("drain_delay_s", float, "seconds to keep serving with /readyz 503 after SIGTERM (default 0)"),
    "--shutdown-timeout": ("shutdown_timeout_s", float, "seconds, after the drain delay, to finish in-flight work "
                                                       "(default 20; 0: do not wait)"),
    "--log-level": ("log_level", str, "debug | info | warning | error (default info)"),
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": self.formatTime(record), "level": record.levelname,
                                 "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, as_json: bool) -> dict[str, Any]:
    """Root logging for berth and uvicorn; returns uvicorn's log_config (None keeps ours)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    return {"version": 1, "disable_existing_loggers": False}


def settings_from_args(args: argparse.Namespace):
    from service.settings import ServiceSettings

    overrides = {field: getattr(args, field) for field, _, _ in SETTING_FLAGS.values()}
    if args.model_names:
        overrides["model_names"] = args.model_names
    if args.no_warmup:
        overrides["warmup"] = False
    if args.log_json:
        overrides["log_json"] = True
    if args.ort_spinning:
        overrides["ort_spinning"] = True
    return ServiceSettings.from_env(**overrides)


log = logging.getLogger("berth.service")


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from service.app import create_app
    from service.models import RepositoryError
    from service.runtime import Phase, Runtime

    try:
        settings = settings_from_args(args)
    except ValidationError as error:
        print(f"berth serve: invalid settings:\n{error}", file=sys.stderr)
        return 2
    # encode_batch's Rust pool: as many threads as the tokenizer workers, not one per host core
    os.environ.setdefault("RAYON_NUM_THREADS", str(settings.tokenizer_threads))
    log_config = configure_logging(settings.log_level, settings.log_json)
    print("berth serve settings: " + json.dumps(settings.describe(), sort_keys=True), file=sys.stderr, flush=True)
    runtime = Runtime(settings)
    try:
        runtime.discover()
    except RepositoryError as error:
        print(f"berth serve: {error}", file=sys.stderr)
        return 2

    class Server(uvicorn.Server):
        drain_until: float | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM and self.drain_until is None and settings.drain_delay_s > 0:
                runtime.begin_drain()  # /readyz 503 now; keep serving until the delay has passed (on_tick)
                self.drain_until = time.monotonic() + settings.drain_delay_s
                log.info("SIGTERM: draining; serving %.1f s more with /readyz 503", settings.drain_delay_s)
            else:
                runtime.stop_admitting()  # stop admitting before uvicorn starts waiting on connections
                super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:  # a drained stop is a clean exit (0), not death by the re-raised signal
                self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

        async def on_tick(self, counter: int) -> bool:
            if runtime.phase is Phase.FAILED:
                self.should_exit = True
            if self.drain_until is not None and not self.should_exit and time.monotonic() >= self.drain_until:
                runtime.stop_admitting()
                self.should_exit = True
            return await super().on_tick(counter)

    config = uvicorn.Config(
        create_app(settings, runtime), host=settings.host, port=settings.port, log_config=log_config,
        log_level=settings.log_level.lower(), access_log=False, lifespan="on",
        timeout_graceful_shutdown=settings.shutdown_timeout_s,  # 0: in-flight requests are not waited for
    )
    server = Server(config)
    server.run()
    if runtime.phase is Phase.FAILED:
        print(f"berth serve: loading the models failed: {runtime.failure}", file=sys.stderr)
        return 1
    return 0 if server.started else 3


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="serve a folder of bundles over HTTP (FastAPI + ONNX Runtime, dynamic batching)",
        description="Serve every bundle in --models (or those named with --model) on http://HOST:PORT: "
                    "POST /v1/classify, /v1/pair, /v1/ner, /v1/qa; GET /v1/models, /healthz, /readyz, /metrics, "
                    "/docs. Each flag has a BERTH_* environment variable (e.g. BERTH_MAX_BATCH_SIZE); set "
                    "BERTH_API_KEY to require `Authorization: Bearer <key>` on /v1.")
    for flag, (field, kind, text) in SETTING_FLAGS.items():
        p.add_argument(flag, dest=field, type=kind, default=None, help=text)
    p.add_argument("--model", dest="model_names", action="append", metavar="NAME",
                   help="serve only this bundle (repeat for several; BERTH_MODEL_NAMES=a,b)")
    p.add_argument("--no-warmup", action="store_true", help="report ready without warming up the length buckets")
    p.add_argument("--log-json", action="store_true", help="one JSON object per log line (BERTH_LOG_JSON=1)")
    p.add_argument("--ort-spinning", action="store_true",
                   help="let idle ONNX Runtime threads busy-wait (BERTH_ORT_SPINNING=1; only for cores nothing else "
                        "needs)")
    p.set_defaults(func=run)
    return p
