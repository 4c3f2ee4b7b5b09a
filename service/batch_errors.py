"""The batcher's own errors: why an item was refused or not computed. The service maps them to HTTP statuses in
service/errors.py; service/batcher.py re-exports them."""

from __future__ import annotations


class BatcherError(Exception):
    """Why an item was refused or not computed. `retry_after` (seconds): when trying again may succeed."""

    retry_after: int | None = None

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class NotAccepting(BatcherError):
    """Draining or stopped: the model takes no new work (or dropped queued work at shutdown)."""


class QueueFull(BatcherError):
    """The queue has no room for the request's items right now."""


class ItemTooLarge(BatcherError):
    """An item, or the request's item count, can never fit the batch budget or the queue."""


class Expired(BatcherError):
    """The item's deadline passed while it was queued; it was not computed."""


class ItemFailed(BatcherError):
    """The forward pass failed for this item alone (retried by halves down to it)."""


class PassTimedOut(ItemFailed):
    """The item's forward pass ran past pass_timeout_s and the watchdog stopped it."""


class NonFiniteOutput(ItemFailed):
    """The model's outputs for this item hold NaN or infinity."""
