"""Hooks into the one training loop: what best-checkpoint keeping, early stopping and trackers plug into.

The loop (training/loop/trainer.py) knows nothing about tasks or metrics. It calls each callback with what it
has (a metrics line, the results of an evaluation), asks whether to stop, and keeps each callback's
`state_dict()` in its resumable training state, handing it back through `restore` when a run resumes.
So a run killed mid-way resumes with its best-so-far and its patience counter, as if never stopped.
Every hook runs on rank 0 only (where evaluation runs); the loop shares `should_stop` with the others.
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from training.loop.training_state import load_training_state, save_training_state

_STEP_FOLDER = re.compile(r"^step-(\d+)$")


class TrainerCallback:
    """No-op hooks; a callback overrides the ones it needs. `name` keys its state in the training state."""

    name = "callback"

    def restore(self, state: dict[str, Any] | None, step: int) -> None:
        """Before the first step: `state` is what `state_dict()` returned when the training state the run resumes
        from (at `step`) was saved; None when the run starts from scratch."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def on_log(self, record: dict[str, Any]) -> None:
        """A training line of metrics.jsonl (step, loss, learning_rate, tokens_per_s ...)."""

    def on_evaluate(self, step: int, metrics: dict[str, float], model: nn.Module) -> None:
        """The results of an evaluation of `model` (in eval mode) at optimizer step `step`."""

    def on_state_saved(self, step: int) -> None:
        """A resumable training state holding this callback's `state_dict()` was written at `step`."""

    def should_stop(self) -> bool:
        return False

    def on_run_end(self, out: Path, step: int, metrics: dict[str, float]) -> None:
        """The run's model is saved in `out`, its weights from optimizer step `step`, scored `metrics` on dev: the
        last hook. The job that saves the model calls it (the loop ends before the model is saved)."""

    def close(self) -> None:
        """The run stopped before its model was saved (an error, an interrupt): let go of what is held open."""


@contextlib.contextmanager
def closed_on_failure(callbacks: Sequence[TrainerCallback]) -> Iterator[None]:
    """Run the block; when it raises, every callback's `close` runs before the error goes on."""
    try:
        yield
    except BaseException:
        for callback in callbacks:
            callback.close()
        raise


def greater_is_better(metric: str) -> bool:
    """The direction of a metric by its name: losses, errors and perplexities go down, the rest up."""
    return not any(word in metric.lower() for word in ("loss", "error", "perplexity"))


def improves(value: float, best: float | None, greater: bool, min_delta: float = 0.0) -> bool:
    """Whether `value` beats `best` by more than `min_delta` (any number beats None; NaN beats nothing)."""
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best + min_delta if greater else value < best - min_delta


def metric_value(metrics: dict[str, float], metric: str) -> float:
    if metric not in metrics:
        raise KeyError(f"the evaluation gave no {metric!r}; it gave {', '.join(sorted(metrics))}")
    return float(metrics[metric])


class BestCheckpoint(TrainerCallback):
    """Keeps the weights of the best evaluation so far (by `metric`) and the results of every evaluation.

    The weights go to `folder`/step-N/ (model state only, read back with weights_only=True). Older ones are
    deleted once a training state that no longer needs them is saved; a resumed run deletes the ones
    written after the state it resumes from (it will write them again, the same, on its way).
    """

    name = "best_checkpoint"

    def __init__(self, folder: Path, metric: str, greater: bool | None = None) -> None:
        self.folder, self.metric = Path(folder), metric
        self.greater = greater_is_better(metric) if greater is None else greater
        self.step: int | None = None
        self.value: float | None = None
        self.evaluations: list[dict[str, Any]] = []

    def _path(self, step: int) -> Path:
        return self.folder / f"step-{step:08d}"

    def _saved_steps(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.folder.iterdir() if (m := _STEP_FOLDER.match(p.name)))

    def restore(self, state: dict[str, Any] | None, step: int) -> None:
        if state is None:
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        self.step, self.value, self.evaluations = state["step"], state["value"], list(state["evaluations"])
        for saved in self._saved_steps():
            if saved > step and saved != self.step:
                shutil.rmtree(self._path(saved), ignore_errors=True)
        if self.step is not None and not self._path(self.step).is_dir():
            raise FileNotFoundError(f"the best weights of step {self.step} are gone from {self.folder}; resume "
                                    "from the latest training state, or start over")

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "value": self.value, "evaluations": list(self.evaluations)}

    def on_evaluate(self, step: int, metrics: dict[str, float], model: nn.Module) -> None:
        value = metric_value(metrics, self.metric)
        self.evaluations.append({"step": step, **metrics})
        if improves(value, self.value, self.greater):
            save_training_state(self._path(step), {"model": model.state_dict(), "step": step})
            self.step, self.value = step, value

    def on_state_saved(self, step: int) -> None:
        for saved in self._saved_steps():
            if saved != self.step:
                shutil.rmtree(self._path(saved), ignore_errors=True)

    def best_weights(self) -> dict[str, Any]:
        """The model state of the best evaluation."""
        if self.step is None:
            raise ValueError("no evaluation yet")
        return load_training_state(self._path(self.step))["model"]

    def record(self) -> dict[str, Any]:
        """step, metric, value and direction of the best evaluation, and every evaluation."""
        return {"metric": self.metric, "greater_is_better": self.greater, "step": self.step, "value": self.value,
                "evaluations": list(self.evaluations)}


class EarlyStopping(TrainerCallback):
    """Stop after `patience` evaluations in a row that do not beat the best by more than `min_delta`."""

    name = "early_stopping"

    def __init__(self, metric: str, patience: int, greater: bool | None = None, min_delta: float = 0.0) -> None:
        if patience < 1:
            raise ValueError("patience must be at least 1")
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.greater = greater_is_better(metric) if greater is None else greater
        self.best: float | None = None
        self.evaluations_without_improvement = 0
        self.stopped_at: int | None = None

    def restore(self, state: dict[str, Any] | None, step: int) -> None:
        if state is not None:
            self.best = state["best"]
            self.evaluations_without_improvement = state["evaluations_without_improvement"]
            self.stopped_at = state["stopped_at"]

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "evaluations_without_improvement": self.evaluations_without_improvement,
                "stopped_at": self.stopped_at}

    def on_evaluate(self, step: int, metrics: dict[str, float], model: nn.Module) -> None:
        value = metric_value(metrics, self.metric)
        if improves(value, self.best, self.greater, self.min_delta):
            self.best, self.evaluations_without_improvement = value, 0
        else:
            self.evaluations_without_improvement += 1
        if self.should_stop() and self.stopped_at is None:
            self.stopped_at = step

    def should_stop(self) -> bool:
        return self.evaluations_without_improvement >= self.patience
