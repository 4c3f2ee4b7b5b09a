"""What the server processes of one `berth serve --workers N` share: which of them have loaded their models.

Each worker loads its own models; /readyz, whichever worker answers it, says ready only once every worker has,
so a load balancer sends no traffic to a port where some connections would meet a worker still loading.
"""

from __future__ import annotations

import multiprocessing
from typing import Any


class WorkerBoard:
    """One flag per worker in shared memory: 1 once its models are loaded and warmed up."""

    def __init__(self, workers: int, context: Any = None):
        context = context or multiprocessing.get_context("spawn")
        self._loaded = context.Array("b", workers, lock=False)

    def mark_loaded(self, index: int, loaded: bool = True) -> None:
        self._loaded[index] = 1 if loaded else 0

    def all_loaded(self) -> bool:
        return all(self._loaded)

    def __len__(self) -> int:
        return len(self._loaded)
