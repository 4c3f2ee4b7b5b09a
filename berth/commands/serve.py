"""`berth serve`: serve a model repository (a folder of bundles) over HTTP.

Flags override `BERTH_*` environment variables, which override the defaults (service/settings.py).
The API key is read from BERTH_API_KEY only, so it never shows in a process listing; an empty one is
refused. SIGTERM drains: /readyz turns 503 at once while requests are still served for --drain-delay
seconds (so load balancers notice), then new requests are refused (the listener closes), queued and
in-flight ones finish within --shutdown-timeout seconds (0: not waited for), and the process exits 0.
Ctrl-C (or a second SIGTERM) skips the drain delay. With --workers N (berth/commands/workers.py), N processes
serve on one port, each draining so on the signal the parent passes on.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any

from pydantic import ValidationError

from berth.config_files import ConfigError, add_config_flag, describe_errors, read_config
from berth.flags import add_settings_flags, given_settings
from service.settings import ENV_PREFIX, ServiceSettings

FLAG_NAMES = {  # the flags' short names; every other setting is --its-name
    "model_names": "--model", "max_inputs_per_request": "--max-inputs", "max_chars_per_input": "--max-chars",
    "request_timeout_s": "--request-timeout", "intra_op_threads": "--threads", "drain_delay_s": "--drain-delay",
    "shutdown_timeout_s": "--shutdown-timeout", "ready_models": "--ready-model",
}
GROUPS = {
    "what to serve, where": ["models", "model_names", "host", "port", "device", "warmup", "playground"],
    "dynamic batching (per model)": ["max_batch_size", "max_batch_tokens", "max_wait_ms", "cpu_pass_tokens",
                                     "max_pass_output_bytes", "batch_table", "pipeline", "length_buckets",
                                     "pad_multiple", "max_queue_items", "retry_after_s"],
    "request limits": ["max_inputs_per_request", "max_chars_per_input", "max_chars_per_request",
                       "max_tokens_per_request", "max_items_per_request", "max_answer_length_cap",
                       "max_concurrent_requests", "max_body_reads", "body_read_timeout_s", "max_body_bytes",
                       "request_timeout_s", "tokenize_in_thread_chars", "max_response_bytes",
                       "max_inflight_response_bytes", "max_masks_per_input"],
    "connections": ["header_timeout_s", "keep_alive_timeout_s", "max_connections"],
    "health and trust": ["max_consecutive_failures", "canary_interval_s", "pass_timeout_s", "ready_models",
                         "bundle_public_key"],
    "server processes": ["workers"],
    "ONNX Runtime and threads": ["intra_op_threads", "parallel_passes", "tokenizer_threads", "ort_spinning",
                                 "ort_spin_in_pass", "ort_shared_memory", "ort_prepack_weights"],
    "logs and shutdown": ["log_level", "log_json", "access_log", "drain_delay_s", "shutdown_timeout_s"],
}
OPTIONS = {  # --model NAME, repeated (as before), not a comma-separated list
    "model_names": {"action": "append", "metavar": "NAME", "help": "serve only this bundle (repeat for several)"},
    "ready_models": {"action": "append", "metavar": "NAME",
                     "help": "this model must be ready for /readyz to answer 200 (repeat for several; default: all)"},
}
NOT_FLAGS = ["api_key"]  # read from BERTH_API_KEY only, so it never shows in a process listing


def configure_logging(level: str, as_json: bool) -> None:
    """Root logging for berth and uvicorn (service/log_format.py: JSON lines under --log-json, request ids)."""
    from service.log_format import configure_logging as configure

    configure(level, as_json)


def settings_from_args(args: argparse.Namespace) -> ServiceSettings:
    """Defaults, then the --config file, then BERTH_* variables, then the flags given."""
    config = getattr(args, "config", None)
    from_file = read_config(config) if config else {}
    from_file = {k: v for k, v in from_file.items() if ENV_PREFIX + str(k).upper() not in os.environ}
    try:
        return ServiceSettings.from_env(**{**from_file, **given_settings(args, ServiceSettings)})
    except ValidationError as error:
        raise ConfigError(describe_errors(error, from_file, config)) from None


log = logging.getLogger("berth.service")


def run(args: argparse.Namespace) -> int:
    from service.log_format import error_line, startup_line
    from service.models import RepositoryError
    from service.runtime import Runtime
    from service.tracing import TracingError, setup_from_env
    from tasks.cpu import usable_cpus

    try:
        settings = settings_from_args(args)
    except ConfigError as error:
        print(f"berth serve: {' '.join(str(error).split())}", file=sys.stderr)  # one line, whatever it quotes
        return 2
    # encode_batch's Rust pool: as many threads as the tokenizer workers, not one per host core
    os.environ.setdefault("RAYON_NUM_THREADS", str(settings.tokenizer_threads))
    configure_logging(settings.log_level, settings.log_json)
    workers = settings.worker_count(usable_cpus())
    settings = settings.model_copy(update={"workers": workers})
    print(startup_line("berth serve settings", settings.describe(), settings.log_json), file=sys.stderr, flush=True)
    try:
        tracing = setup_from_env()  # the OTEL_* variables (service/tracing.py); [] when tracing is off
    except TracingError as error:
        print(error_line("berth serve", str(error), settings.log_json), file=sys.stderr)
        return 2
    if tracing:
        log.info("tracing on: spans exported by %s", ", ".join(tracing))
    runtime = Runtime(settings)
    try:
        runtime.discover()
    except RepositoryError as error:
        print(error_line("berth serve", str(error), settings.log_json), file=sys.stderr)
        return 2
    if workers == 1:
        return serve(settings, runtime)
    from berth.commands.workers import supervise

    return supervise(settings, workers, serve_worker, models=list(runtime.bundles))


def serve_worker(settings: ServiceSettings, sock: Any, board: Any, index: int) -> None:
    """One of `--workers N` server processes (berth/commands/workers.py): serves on the parent's socket."""
    from berth.commands.workers import detach_from_terminal_group
    from service.runtime import Runtime

    detach_from_terminal_group()
    os.environ.setdefault("RAYON_NUM_THREADS", str(settings.tokenizer_threads))
    configure_logging(settings.log_level, settings.log_json)
    runtime = Runtime(settings)
    runtime.board, runtime.worker_index = board, index
    runtime.discover()
    sys.exit(serve(settings, runtime, sockets=[sock]))


def serve(settings: ServiceSettings, runtime: Any, sockets: list[Any] | None = None) -> int:
    """Serve `runtime`'s models until SIGTERM / SIGINT (drained as the module says); on `sockets` when given
    (a worker), else on settings.host:port."""
    import uvicorn

    from service.app import create_app
    from service.connections import connection_protocol
    from service.runtime import Phase

    log_config = {"version": 1, "disable_existing_loggers": False}  # configure_logging's handlers stay

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
        # httptools with a deadline for request heads and a cap on open connections (service/connections.py)
        http=connection_protocol(settings, runtime.metrics),
        timeout_keep_alive=settings.keep_alive_timeout_s,  # a float works
    )
    server = Server(config)
    server.run(sockets=sockets)
    if runtime.phase is Phase.FAILED:
        from service.log_format import error_line

        print(error_line("berth serve", f"loading the models failed: {runtime.failure}", settings.log_json),
              file=sys.stderr)
        return 1
    return 0 if server.started else 3


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve", help="serve a folder of bundles over HTTP (FastAPI + ONNX Runtime, dynamic batching)",
        description="Serve every bundle in --models (or those named with --model) on http://HOST:PORT: "
                    "POST /v1/classify, /v1/pair, /v1/ner, /v1/qa; GET /v1/models, /healthz, /readyz, /metrics, "
                    "/docs. Each flag has a BERTH_* environment variable (e.g. BERTH_MAX_BATCH_SIZE); set "
                    "BERTH_API_KEY to require `Authorization: Bearer <key>` on /v1.")
    add_settings_flags(p, ServiceSettings, groups=GROUPS, names=FLAG_NAMES, options=OPTIONS, exclude=NOT_FLAGS,
                       env_prefix=ENV_PREFIX)
    add_config_flag(p)  # precedence: defaults < --config < BERTH_* < flags
    p.set_defaults(func=run)
    return p
