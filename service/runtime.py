"""The service's life: discover the bundles, load and warm them up in the background, serve, drain.

    STARTING --all models loaded and warmed up--> READY --SIGTERM / shutdown--> DRAINING
        \\--a model failed to load--> FAILED (liveness reports it; `berth serve` exits with an error)

/healthz answers 200 from the first moment (the process is alive) unless FAILED; /readyz answers 200
only in READY. Discovery (manifests and file hashes) runs before the server accepts connections, so
a bad repository stops the start with the bundle and the reason; sessions and warm-up run after,
off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import StrEnum

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


class Runtime:
    def __init__(self, settings: ServiceSettings, metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.bundles: dict[str, Bundle] = {}
        self.models: dict[str, ServedModel] = {}
        self.phase = Phase.STARTING
        self.failure: str | None = None
        self._loader: asyncio.Task | None = None

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

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
        self._loader = asyncio.get_running_loop().create_task(self._load_all(), name="berth-model-loader")

    async def _load_all(self) -> None:
        started = time.perf_counter()
        try:
            for name, bundle in self.bundles.items():
                model = await asyncio.to_thread(load_model, bundle, self.settings, self.metrics)
                if self.phase is not Phase.STARTING:  # shut down (or failed) while this one loaded
                    return
                assert model.batcher is not None
                model.batcher.start()
                model.ready = True
                self.models[name] = model
                self.metrics.model_ready.labels(name).set(1)
                log.info("model %s ready: %s %s on %s, %d warm-up shapes, %.1f s", name, model.task,
                         bundle.precision, model.provider, len(model.warmup_shapes), model.load_seconds)
        except Exception as error:  # a session that cannot be created, a warm-up that fails
            log.exception("loading the models failed")
            self.failure = f"{type(error).__name__}: {error}"
            self.phase = Phase.FAILED
            return
        self.phase = Phase.READY
        log.info("all %d model(s) ready in %.1f s", len(self.models), time.perf_counter() - started)

    async def wait_until_loaded(self) -> None:
        if self._loader is not None:
            await asyncio.shield(self._loader)

    def resolve(self, name: str | None, task: str) -> ServedModel:
        if self.phase is Phase.DRAINING:
            raise ServiceError(ErrorType.OVERLOADED, "the server is shutting down", status=503,
                               retry_after=self.settings.retry_after_s)
        return resolve_model(self.bundles, self.models, name, task)

    def begin_shutdown(self) -> None:
        """Stop admitting work (new requests get 503, /readyz turns 503); queued work continues.
        Called from the SIGTERM handler, so it only flips flags."""
        if self.phase is not Phase.FAILED:
            self.phase = Phase.DRAINING
        for model in list(self.models.values()):
            if model.batcher is not None:
                model.batcher.begin_draining()

    async def stop(self) -> None:
        """Finish what is queued (within shutdown_timeout_s), then stop every batcher."""
        self.begin_shutdown()
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
        timeout = self.settings.shutdown_timeout_s
        await asyncio.gather(*(m.batcher.close(timeout) for m in self.models.values() if m.batcher is not None))
        for name in self.models:
            self.metrics.model_ready.labels(name).set(0)
