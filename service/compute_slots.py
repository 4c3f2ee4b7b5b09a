"""The process's cores as compute units that forward passes hold (`ComputeSlots`), counted by
`tasks.runtime.cpu.usable_cpus`: share one `ComputeSlots` of that many units among the forward passes of a process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ComputeSlots:
    """The process's cores as units that forward passes hold while they run (a pass on n ONNX Runtime threads
    holds n), so the passes of all models together never run more ORT threads than there are cores: an extra
    thread would not add compute, it would make every pass wait for its descheduled straggler."""

    def __init__(self, units: int):
        self.units = max(1, units)
        self._free = self.units
        self._changed = threading.Condition()

    @property
    def busy(self) -> int:
        """Units held right now (a hint for the event loop: read without the lock)."""
        return self.units - self._free

    @contextmanager
    def hold(self, units: int, or_else: int | None = None) -> Iterator[int]:
        """Hold `units` (waiting until they are free) and yield how many are held; with `or_else`, hold `units`
        only if they are free right now, else wait for `or_else` (so a wide pass never waits behind narrow ones)."""
        units = min(max(1, units), self.units)
        with self._changed:
            if or_else is not None and self._free < units:
                units = min(max(1, or_else), self.units)
            self._changed.wait_for(lambda: self._free >= units)
            self._free -= units
        try:
            yield units
        finally:
            with self._changed:
                self._free += units
                self._changed.notify_all()
