"""The health rule of service/model_health.py, synchronously: what a pass's outcomes do to the model's readiness."""

from __future__ import annotations

import pytest

from service.batch_errors import ItemFailed, NonFiniteOutput, PassTimedOut
from service.model_health import ModelHealth, Transition

OK = {"logits": 0}


def never_called() -> tuple[bool, str]:
    raise AssertionError("no canary pass is needed for this outcome")


def canary(passed: bool):
    calls = []

    def confirm() -> tuple[bool, str]:
        calls.append(1)
        return passed, "" if passed else "it raised RuntimeError"

    return confirm, calls


def test_a_working_pass_and_failing_inputs_beside_computed_ones_never_count():
    health = ModelHealth(max_consecutive_failures=2)
    assert health.record([OK, OK], never_called).counted is None
    assert health.record([OK, ItemFailed("x"), NonFiniteOutput("y")], never_called).counted is None
    assert health.healthy and health.consecutive_failures == 0


def test_a_timeout_counts_at_once_and_the_second_in_a_row_makes_the_model_unready():
    health = ModelHealth(max_consecutive_failures=2)
    first = health.record([PassTimedOut("late")], never_called)
    assert (first.counted, first.failures, first.transition) == ("timeout", 1, Transition.NONE)
    second = health.record([PassTimedOut("late"), PassTimedOut("late")], never_called)
    assert (second.counted, second.failures, second.transition) == ("timeout", 2, Transition.UNREADY)
    assert not health.healthy
    assert health.unready_reason(has_canary=False, canary_interval_s=5) == (
        "2 failures in a row (a forward pass ran past pass_timeout_s); ready again once a forward pass succeeds")
    assert health.record([OK], never_called).transition is Transition.READY
    assert health.healthy and health.unready_reason(True, 5) is None


@pytest.mark.parametrize("outcomes,kind", [([NonFiniteOutput("nan")], "nonfinite"),
                                           ([NonFiniteOutput("nan"), ItemFailed("boom")], "error")])
def test_every_item_failing_counts_only_when_the_canary_fails_too(outcomes, kind):
    health = ModelHealth(max_consecutive_failures=3)
    confirm, calls = canary(passed=True)
    change = health.record(outcomes, confirm)
    assert change.excused and change.counted is None and calls == [1]  # the inputs were at fault
    confirm, calls = canary(passed=False)
    change = health.record(outcomes, confirm)
    assert change.counted == kind and change.failures == 1 and not change.excused and calls == [1]


def test_the_unready_reason_names_the_last_canary():
    health = ModelHealth(max_consecutive_failures=1)
    health.record([ItemFailed("x")], canary(passed=False)[0])
    health.canary_result(False, "NaN or infinite outputs")
    assert health.unready_reason(has_canary=True, canary_interval_s=0.5) == (
        "1 failures in a row (a forward pass raised an error); a canary pass retries every 0.5 s (last canary: "
        "failed: NaN or infinite outputs)")
    assert health.passed().transition is Transition.READY
