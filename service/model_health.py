"""Whether a model is ready, from the outcomes of its forward passes: a small synchronous state machine.

The rule (what counts against a model):

    a pass's outcome                                   counts against the model?
    every item computed                                no; the count of failures in a row goes back to 0
    some items failed, others were computed            no: those inputs are at fault, the model works
    the watchdog stopped it (ran past pass_timeout_s)  yes, at once
    every item failed (one item or many)               a canary pass confirms it: it counts only if the canary
                                                       fails too; a canary that passes means the inputs are at
                                                       fault (no canary input: it counts)

max_consecutive_failures counted passes in a row make the model not ready; a pass or a canary pass that succeeds
makes it ready again. `record` takes a pass's outcomes and returns what changed; the batcher (service/batcher.py)
runs the passes and the canaries, and turns each change into log lines, metrics and readiness.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from service.batch_errors import NonFiniteOutput, PassTimedOut

FAILURE_TEXT = {"timeout": "a forward pass ran past pass_timeout_s", "error": "a forward pass raised an error",
                "nonfinite": "a forward pass produced NaN or infinite outputs"}  # the kinds of berth_model_failures


class Transition(Enum):
    NONE = "none"
    READY = "ready"  # was not ready, is now
    UNREADY = "unready"  # this failure was the max_consecutive_failures-th in a row


@dataclass(frozen=True)
class Change:
    """What one recorded pass did to the model's health."""

    transition: Transition = Transition.NONE
    counted: str | None = None  # the kind of failure counted against the model (FAILURE_TEXT's keys), if one was
    failures: int = 0  # failures in a row after it
    excused: bool = False  # every item failed but a canary passed: the inputs are at fault


class ModelHealth:
    """One model's failures in a row and why; safe to call from the batcher's worker threads."""

    def __init__(self, max_consecutive_failures: int) -> None:
        self.max_consecutive_failures = max_consecutive_failures
        self.consecutive_failures = 0
        self.last_failure = "error"
        self.last_canary = ""  # "passed" or "failed: why", for the unready reason
        self._lock = threading.Lock()

    @property
    def healthy(self) -> bool:
        return self.consecutive_failures < self.max_consecutive_failures

    def unready_reason(self, has_canary: bool, canary_interval_s: float) -> str | None:
        """Why the model is not ready (fixed phrases, no error text: /readyz is unauthenticated); None when it is."""
        if self.healthy:
            return None
        reason = f"{self.consecutive_failures} failures in a row ({FAILURE_TEXT[self.last_failure]})"
        if not has_canary:
            return reason + "; ready again once a forward pass succeeds"
        reason += f"; a canary pass retries every {canary_interval_s:g} s"
        return reason + (f" (last canary: {self.last_canary})" if self.last_canary else "")

    def record(self, outcomes: Sequence[Any], confirm: Callable[[], tuple[bool, str]]) -> Change:
        """A planned pass's outcomes (results, or the exception of each failed item). `confirm()` runs a canary pass
        and says (passed, why not); it is called only when every item failed for a reason other than a timeout."""
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if not failed or len(failed) < len(outcomes):
            return self.passed()
        if any(isinstance(o, PassTimedOut) for o in failed):
            return self.failed("timeout")
        if confirm()[0]:
            return Change(self.passed().transition, excused=True)
        return self.failed("nonfinite" if all(isinstance(o, NonFiniteOutput) for o in failed) else "error")

    def passed(self) -> Change:
        """A pass (or a canary pass) succeeded: the count goes back to 0."""
        with self._lock:
            was_ready = self.healthy
            self.consecutive_failures = 0
        return Change(Transition.NONE if was_ready else Transition.READY)

    def failed(self, kind: str) -> Change:
        with self._lock:
            self.consecutive_failures += 1
            self.last_failure = kind
            count = self.consecutive_failures
        transition = Transition.UNREADY if count == self.max_consecutive_failures else Transition.NONE
        return Change(transition, kind, count)

    def canary_result(self, passed: bool, why: str) -> None:
        self.last_canary = "passed" if passed else f"failed: {why}"
