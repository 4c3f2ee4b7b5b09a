"""Dev evaluation while fine-tuning: which metric picks the best checkpoint, on which dev examples, with which
callbacks. The evaluation is the task definition's own (prepare -> run -> decode -> metric, as served).

The metric's name is checked before training starts, against what the task's evaluation really gives: the
untrained model is scored on a few dev examples (a second or so), so a typo fails at once, not after an hour.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from tasks.registry import definition
from tasks.runtime.spec import TaskSpec
from training.bert.torch_runner import torch_item_runner
from training.finetuning.settings import FinetuneSettings
from training.loop.callbacks import BestCheckpoint, EarlyStopping, TrainerCallback, greater_is_better

PROBE_EXAMPLES = 8
BEST_DIR = "best"  # under the training-state folder: the best evaluation's weights


class UnknownMetric(ValueError):
    """--metric-for-best names a metric the task's evaluation does not give."""


def dev_evaluator(adapter: Any, examples: Sequence[Any], spec: TaskSpec) -> Callable[[nn.Module], dict[str, float]]:
    """model -> the task's dev metrics on `examples` (what the trainer calls every eval_every_steps)."""
    def evaluate(model: nn.Module) -> dict[str, float]:
        metrics, _ = adapter.evaluate(torch_item_runner(model, progress="dev evaluation"), examples, spec)
        return metrics

    return evaluate


def choose_metric(settings: FinetuneSettings, adapter: Any, model: nn.Module, dev: Sequence[Any],
                  spec: TaskSpec) -> tuple[str, bool]:
    """(metric, greater is better): --metric-for-best, or the task's own; UnknownMetric if the task has no such."""
    probe = dev_evaluator(adapter, dev[:PROBE_EXAMPLES], spec)(model)
    metric = settings.metric_for_best or definition(spec.task).headline_metric(probe)[0]
    if metric not in probe:
        raise UnknownMetric(f"unknown --metric-for-best {metric!r}: the {spec.task} evaluation gives "
                            f"{', '.join(sorted(probe))}")
    return metric, greater_is_better(metric)


def eval_sample(examples: Sequence[Any], size: int | None, seed: int) -> list[Any]:
    """At most `size` dev examples, a seeded sample in file order (all of them when they are fewer)."""
    if size is None or size >= len(examples):
        return list(examples)
    return [examples[i] for i in sorted(random.Random(seed).sample(range(len(examples)), size))]


def evaluation_callbacks(settings: FinetuneSettings, state_dir: Path, metric: str,
                         greater: bool) -> tuple[BestCheckpoint, list[TrainerCallback]]:
    """The best-checkpoint keeper and, with a patience, early stopping, on the same metric."""
    best = BestCheckpoint(Path(state_dir) / BEST_DIR, metric, greater)
    callbacks: list[TrainerCallback] = [best]
    if settings.early_stopping_patience:
        callbacks.append(EarlyStopping(metric, settings.early_stopping_patience, greater))
    return best, callbacks
