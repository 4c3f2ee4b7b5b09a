"""What the server processes of one `berth serve --workers N` share: which of them have loaded their models, and
which of their models are failing.

Each worker loads its own models and judges their health on its own passes (service/batcher.py's "Health");
/readyz, whichever worker answers it, says ready only once every worker has loaded, and says a model is not ready
while it is not ready in any worker (with that worker's reason), so a load balancer sends no traffic to a port
where some connections would meet a worker still loading or a model failing there, and the answer does not depend
on which worker took the probe's connection. Each worker still answers its own requests by its own model's state.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from typing import Any

REASON_BYTES = 256  # of a model's unready reason (service/batcher.py's fixed phrases, ~150 characters)


class WorkerBoard:
    """In shared memory: one flag per worker, 1 once its models are loaded and warmed up; and per worker and model,
    a flag set while the model is not ready there, with the reason (UTF-8, NUL-padded)."""

    def __init__(self, workers: int, models: Sequence[str] = (), context: Any = None):
        context = context or multiprocessing.get_context("spawn")
        self.workers = workers
        self._models = {name: i for i, name in enumerate(models)}
        self._loaded = context.Array("b", workers, lock=False)
        slots = workers * len(self._models)
        self._unready = context.Array("b", slots, lock=False)
        self._reasons = context.Array("c", slots * REASON_BYTES, lock=False)

    def mark_loaded(self, index: int, loaded: bool = True) -> None:
        self._loaded[index] = 1 if loaded else 0

    def all_loaded(self) -> bool:
        return all(self._loaded)

    def publish(self, index: int, model: str, reason: str | None) -> None:
        """Worker `index`'s model is ready (reason None) or not ready for `reason`. The caller serializes the
        calls of one worker; the reason is written before the flag is set, so a reader never sees an unready
        model without its reason."""
        if model not in self._models:
            return
        slot = index * len(self._models) + self._models[model]
        if reason is None:
            self._unready[slot] = 0
            return
        data = reason.encode()[:REASON_BYTES].ljust(REASON_BYTES, b"\0")
        self._reasons[slot * REASON_BYTES:(slot + 1) * REASON_BYTES] = data
        self._unready[slot] = 1

    def unready_elsewhere(self, index: int, model: str) -> str | None:
        """Why `model` is not ready in a worker other than `index` (the first such one); None when it is ready in
        all of them."""
        if model not in self._models:
            return None
        for other in range(self.workers):
            slot = other * len(self._models) + self._models[model]
            if other != index and self._unready[slot]:
                raw = self._reasons[slot * REASON_BYTES:(slot + 1) * REASON_BYTES].rstrip(b"\0")
                return f"in server process {other}: {raw.decode(errors='ignore')}"
        return None

    def __len__(self) -> int:
        return len(self._loaded)
