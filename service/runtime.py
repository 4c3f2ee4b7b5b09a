"""The service's life: discover the bundles, load and warm them up in the background, serve, drain.

    STARTING --all models loaded and warmed up--> READY --SIGTERM / shutdown--> DRAINING
        \\--a model failed to load--> FAILED (liveness reports it; `berth serve` exits with an error)

/healthz answers 200 from the first moment (the process is alive) unless FAILED: liveness only, never the
models' health (a restart would not heal a failing model; the canary does). /readyz answers 200 only in READY,
and only while every model of `ready_models` (default: every model served) is ready; it lists each model with
`ready` and the `reason` when it is not. A model is not ready after max_consecutive_failures forward passes in
a row counted against it (service/batcher.py says which count); a canary pass every canary_interval_s brings it
back by itself. A model that is not ready answers its own requests 503 + Retry-After, whether /readyz waits for
it or not: with `ready_models` naming the others, one failing model no longer takes the pod out of rotation.

The drain (see `berth serve`): SIGTERM -> DRAINING, /readyz 503, requests still admitted for
drain_delay_s (load balancers need that long to notice) -> `stop_admitting()`: new requests 503,
queued and in-flight ones finish -> `stop()` within what is left of shutdown_timeout_s.

Threads: the forward passes of all models share `usable_cpus()` compute units, one per ONNX Runtime
thread, so the pools never run more threads than the cores allow: a lone pass takes `intra_op_threads`
(all cores by default), and under load a CPU model runs `parallel_passes` passes at once on
`cores // parallel_passes` threads each (batcher.py says why); large tokenizations run on one
tokenizer thread, with the GIL released (`encode_batch`). Discovery (manifests and file hashes) runs before
the server accepts connections, so a bad repository stops the start with the bundle and the reason; sessions
and warm-up run after, off the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import Any

from service.compute_slots import ComputeSlots
from service.errors import ErrorType, ServiceError
from service.metrics import Metrics
from service.models import RepositoryError, ServedModel, canary_item, discover, load_model, resolve_model
from service.settings import ServiceSettings
from service.workers import WorkerBoard
from tasks.runtime.bundle import Bundle
from tasks.runtime.cpu import usable_cpus
from tasks.runtime.onnx_session import CPU, MemoryPolicy, memory_policy, set_memory_policy, trim_heap
from tasks.runtime.tokenizer import GilFreeTokenizer

log = logging.getLogger("berth.service")


class Phase(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


BULK_CHARS = 50_000  # characters of a request past which it tokenizes on the bulk thread (a quarter of the default
#                     max_chars_per_request; ~25 ms of tokenizing here)
GC_YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython's default: 700)


def tune_garbage_collector() -> None:
    """Once the models are loaded. What exists then (the app, the sessions' wrappers, the tokenizers) lives as long
    as the process: frozen, the cyclic collector no longer walks it, and a full collection under load costs ~1 ms
    instead of ~26 ms of event loop. Requests leave few cycles, so young collections can be rarer. Measured under
    hey, 32 clients, 20 s (docs/SERVICE_RESULTS.md): collector time 680 ms -> 59 ms."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class Runtime:
    def __init__(self, settings: ServiceSettings, metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.bundles: dict[str, Bundle] = {}
        self.models: dict[str, ServedModel] = {}
        self.tokenizers: dict[str, GilFreeTokenizer] = {}  # by tokenizer.json's sha256: one per distinct file
        self.phase = Phase.STARTING
        self.failure: str | None = None
        self.admitting = True
        self.stop_deadline: float | None = None  # monotonic time by which in-flight work must be done
        self._loader: asyncio.Task | None = None
        # with --workers N, each server process runs its passes on its share of the cores
        self.cpus = max(1, usable_cpus() // settings.worker_count(usable_cpus()))
        self.board: WorkerBoard | None = None  # --workers N: the workers' loaded and unready flags, this one's index
        self.worker_index = 0
        self._publishing = threading.Lock()  # one model state at a time to the board, read and written together
        self.intra_op_threads = min(settings.intra_op_threads or self.cpus, self.cpus)
        self.compute_slots = ComputeSlots(self.cpus)
        set_memory_policy(MemoryPolicy.serving(settings.ort_prepack_weights) if settings.ort_shared_memory
                          else MemoryPolicy())
        self.tokenizer_pool = ThreadPoolExecutor(max_workers=settings.tokenizer_threads,
                                                 thread_name_prefix="berth-tokenizer")
        # the largest requests (up to max_chars_per_request) tokenize and decode on a thread of their own, so a few
        # of them queue each other, not every other request over tokenize_in_thread_chars
        self.bulk_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="berth-tokenizer-bulk")
        # estimated JSON bytes of the answers of the requests in progress (max_inflight_response_bytes)
        self.response_bytes_in_flight = 0

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY and all(self.model_ready(name) for name in self.required_models) \
            and (self.board is None or self.board.all_loaded())

    @property
    def required_models(self) -> list[str]:
        """The models /readyz waits for: `ready_models`, or every model served."""
        return list(self.settings.ready_models or self.bundles)

    def model_ready(self, name: str) -> bool:
        """Loaded and not failing here, and (--workers N) not failing in another server process either."""
        return self.model_status(name)["ready"]

    def model_status(self, name: str) -> dict[str, Any]:
        """/readyz's entry for one model: ready, whether /readyz waits for it, and why not when it is not (fixed
        phrases only: /readyz answers unauthenticated callers). With --workers N, a model failing in another
        server process is not ready here either, whichever process answers (service/workers.py)."""
        model = self.models.get(name)
        if model is None or not model.ready:
            reason: str | None = "failed to load" if self.phase is Phase.FAILED else "loading"
        else:
            reason = model.batcher.unready_reason if model.batcher is not None else None
        if reason is None and self.board is not None:
            reason = self.board.unready_elsewhere(self.worker_index, name)
        return {"ready": reason is None, "required": name in self.required_models, "reason": reason}

    def _publish_health(self, name: str, batcher: Any) -> None:
        """--workers N: this process's health of model `name` to the board, for the other processes' /readyz."""
        assert self.board is not None
        with self._publishing:
            self.board.publish(self.worker_index, name, batcher.unready_reason)

    def discover(self) -> None:
        """Find and verify the bundles (manifests and hashes), and check that `ready_models` names served ones;
        raises RepositoryError naming the problem."""
        bundles = {bundle.path.name: bundle for bundle in discover(self.settings)}
        unknown = [name for name in self.settings.ready_models or () if name not in bundles]
        if unknown:
            raise RepositoryError(f"ready_models names {unknown}, which this server does not serve; it serves "
                                  f"{sorted(bundles)}")
        self.bundles = bundles

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
                                                self.intra_op_threads, self.compute_slots, self.tokenizers)
                if self.phase is not Phase.STARTING:  # shut down (or failed) while this one loaded
                    return
                assert model.batcher is not None
                self._arm_health_checks(model)
                if memory_policy().shared_arena and model.provider == CPU:  # the heap pages loading left free
                    await asyncio.to_thread(trim_heap)
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
        if self.board is not None:
            self.board.mark_loaded(self.worker_index)
        log.info("all %d model(s) ready in %.1f s", len(self.models), time.perf_counter() - started)

    def _arm_health_checks(self, model: ServedModel) -> None:
        """The batcher's watchdog, canary input and interval (service/batcher.py)."""
        batcher = model.batcher
        assert batcher is not None
        batcher.policy.pass_timeout_s = self.settings.pass_timeout_s
        batcher.policy.canary_interval_s = self.settings.canary_interval_s
        batcher.canary = canary_item(model)
        if self.board is not None:
            batcher.health_changed = functools.partial(self._publish_health, model.name, batcher)

    async def wait_until_loaded(self) -> None:
        if self._loader is not None:
            await asyncio.shield(self._loader)

    def pool_for(self, chars: int) -> ThreadPoolExecutor | None:
        """Where a request of `chars` characters is tokenized and decoded: inline (None) when small, the tokenizer
        threads when large, its own thread when larger than BULK_CHARS."""
        if chars > BULK_CHARS:
            return self.bulk_pool
        return self.tokenizer_pool if chars > self.settings.tokenize_in_thread_chars else None

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
        self.bulk_pool.shutdown(wait=False, cancel_futures=True)
        for name in self.models:
            self.metrics.model_ready.labels(name).set(0)
