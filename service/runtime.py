"""The service's life: discover the bundles, load and warm them up in the background, serve, drain.

    STARTING --all models loaded and warmed up--> READY --SIGTERM / shutdown--> DRAINING
        \\--a model failed to load--> FAILED (liveness reports it; `berth serve` exits with an error)

/healthz answers 200 from the first moment (the process is alive) unless FAILED; /readyz answers 200
only in READY, and only while no model has failed max_consecutive_failures forward passes in a row.

The drain (see `berth serve`): SIGTERM -> DRAINING, /readyz 503, requests still admitted for
drain_delay_s (load balancers need that long to notice) -> `stop_admitting()`: new requests 503,
queued and in-flight ones finish -> `stop()` within what is left of shutdown_timeout_s.

Threads: the forward passes of all models share `usable_cpus()` compute units, one per ONNX Runtime
thread, so the pools never run more threads than the cores allow: a lone pass takes `intra_op_threads`
(all cores by default), and under load a CPU model runs `parallel_passes` passes at once on
`cores // parallel_passes` threads each (batcher.py says why); large tokenizations run on one
tokenizer thread, with the GIL released (`encode_batch`). Discovery (manifests and file hashes) runs before the server accepts connections, so
a bad repository stops the start with the bundle and the reason; sessions and warm-up run after,
off the event loop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum

from service.cpu import ComputeSlots, usable_cpus
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics
from service.models import ServedModel, discover, load_model, resolve_model
from service.settings import ServiceSettings
from tasks.bundle import Bundle

log = logging.getLogger("berth.service")


class Phase(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython's default: 700)


def tune_garbage_collector() -> None:
    """Once the models are loaded. What exists then (the app, the sessions' wrappers, the tokenizers) lives as long
    as the process: frozen, the cyclic collector no longer walks it, and a full collection under load costs ~1 ms
    instead of ~26 ms of event loop. Requests leave few cycles, so young collections can be rarer. Measured under
    hey, 32 clients, 20 s (docs/SERVICE.md): collector time 680 ms -> 59 ms."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class Runtime:
    def __init__(self, settings: ServiceSettings, metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.bundles: dict[str, Bundle] = {}
        self.models: dict[str, ServedModel] = {}
        self.phase = Phase.STARTING
        self.failure: str | None = None
        self.admitting = True
        self.stop_deadline: float | None = None  # monotonic time by which in-flight work must be done
        self._loader: asyncio.Task | None = None
        self.cpus = usable_cpus()
        self.intra_op_threads = min(settings.intra_op_threads or self.cpus, self.cpus)
        self.compute_slots = ComputeSlots(self.cpus)
        self.tokenizer_pool = ThreadPoolExecutor(max_workers=settings.tokenizer_threads,
                                                 thread_name_prefix="berth-tokenizer")

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY and all(self.model_ready(name) for name in self.bundles)

    def model_ready(self, name: str) -> bool:
        model = self.models.get(name)
        return model is not None and model.ready and (model.batcher is None or model.batcher.healthy)

    def discover(self) -> None:
        """Find and verify the bundles (manifests and hashes); raises RepositoryError naming the problem."""
        self.bundles = {bundle.path.name: bundle for bundle in discover(self.settings)}

    async def start(self) -> None:
        """Verify the repository now (unless done already), then load the models in the background."""
        if not self.bundles:
            self.discover()
        for name in self.bundles:
            self.metrics.model_ready.labels(name).set(0)
        log.info("serving %d model(s) from %s: %s", len(self.bundles), self.settings.models, ", ".join(self.bundles))
        log.info("threads: %d usable core(s); a lone forward pass on %d ONNX Runtime thread(s); %d tokenizer "
                 "thread(s)", self.cpus, self.intra_op_threads, self.settings.tokenizer_threads)
        self._loader = asyncio.get_running_loop().create_task(self._load_all(), name="berth-model-loader")

    async def _load_all(self) -> None:
        started = time.perf_counter()
        try:
            for name, bundle in self.bundles.items():
                model = await asyncio.to_thread(load_model, bundle, self.settings, self.metrics,
                                                self.intra_op_threads, self.compute_slots)
                if self.phase is not Phase.STARTING:  # shut down (or failed) while this one loaded
                    return
                assert model.batcher is not None
                model.batcher.start()
                model.ready = True
                self.models[name] = model
                self.metrics.model_ready.labels(name).set(1)
                log.info("model %s ready: %s %s on %s, up to %d pass(es) at once, %d warm-up shapes, %.1f s", name,
                         model.task, bundle.precision, model.provider, model.batcher.parallel,
                         len(model.warmup_shapes), model.load_seconds)
        except Exception as error:  # a session that cannot be created, a warm-up that fails
            log.exception("loading the models failed")
            self.failure = f"{type(error).__name__}: {error}"
            self.phase = Phase.FAILED
            return
        tune_garbage_collector()
        self.phase = Phase.READY
        log.info("all %d model(s) ready in %.1f s", len(self.models), time.perf_counter() - started)

    async def wait_until_loaded(self) -> None:
        if self._loader is not None:
            await asyncio.shield(self._loader)

    def resolve(self, name: str | None, task: str) -> ServedModel:
        if not self.admitting:
            raise ServiceError(ErrorType.OVERLOADED, "the server is shutting down", status=503,
                               retry_after=self.settings.retry_after_s)
        return resolve_model(self.bundles, self.models, name, task, retry_after=self.settings.retry_after_s)

    def begin_drain(self) -> None:
        """SIGTERM: /readyz turns 503 at once; requests are still admitted until `stop_admitting`.
        Called from the signal handler, so it only flips a flag."""
        if self.phase is not Phase.FAILED:
            self.phase = Phase.DRAINING

    def stop_admitting(self) -> None:
        """New requests get 503; what is queued or in flight continues."""
        self.begin_drain()
        if self.admitting:
            self.stop_deadline = time.monotonic() + self.settings.shutdown_timeout_s
        self.admitting = False
        for model in list(self.models.values()):
            if model.batcher is not None:
                model.batcher.begin_draining()

    def begin_shutdown(self) -> None:
        """Both at once: stop admitting now (no drain delay)."""
        self.stop_admitting()

    async def stop(self, timeout: float | None = None) -> None:
        """Finish what is queued within `timeout` (default shutdown_timeout_s; 0: do not wait), then stop
        every batcher."""
        self.stop_admitting()
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
        if timeout is None:  # what is left of shutdown_timeout_s since admission stopped
            assert self.stop_deadline is not None
            timeout = self.stop_deadline - time.monotonic()
        timeout = max(0.0, timeout)
        await asyncio.gather(*(m.batcher.close(timeout) for m in self.models.values() if m.batcher is not None))
        self.tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        for name in self.models:
            self.metrics.model_ready.labels(name).set(0)
