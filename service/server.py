"""The server's lifecycle: start a model repository's runtime, serve it with uvicorn until SIGTERM / SIGINT, drain.

SIGTERM drains: /readyz turns 503 at once while requests are still served for `drain_delay_s` seconds (so load
balancers notice), then new requests are refused (the listener closes), queued and in-flight ones finish within
`shutdown_timeout_s` seconds (0: not waited for), and the process exits 0. Ctrl-C (or a second SIGTERM) skips the
drain delay. With `workers` > 1 (service/supervisor.py), N processes serve on one port, each draining so on the
signal the parent passes on.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any

from service.log_format import configure_logging, error_line, startup_line
from service.settings import ServiceSettings

log = logging.getLogger("berth.service")


def main(settings: ServiceSettings) -> int:
    """Serve the repository `settings` names until stopped; the process exit code (2: it could not start)."""
    from service.models import RepositoryError
    from service.runtime import Runtime
    from service.tracing import TracingError, setup_from_env
    from tasks.runtime.cpu import usable_cpus

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
    from service.supervisor import supervise

    return supervise(settings, workers, serve_worker, models=list(runtime.bundles))


def serve_worker(settings: ServiceSettings, sock: Any, board: Any, index: int) -> None:
    """One of `--workers N` server processes (service/supervisor.py): serves on the parent's socket."""
    from service.runtime import Runtime
    from service.supervisor import detach_from_terminal_group

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
        print(error_line("berth serve", f"loading the models failed: {runtime.failure}", settings.log_json),
              file=sys.stderr)
        return 1
    return 0 if server.started else 3
