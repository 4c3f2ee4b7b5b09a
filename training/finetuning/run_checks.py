"""Warnings `berth finetune` gives before training: a run too short for its data, dev labels training never saw.

Both runs would finish and report a number, so nothing stops them; the warnings say what is wrong and what to
change. They go to the log and into finetune_run.json ("warnings").
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("berth.finetune")

# Fewer optimizer steps than this leave a head under-trained on a small file: measured with the defaults on 300
# rows of 4 uneven labels (bench/pooling_finetune.py), 30 steps (3 epochs) reached a dev accuracy far below what
# 100 steps (10 epochs) reached.
MIN_STEPS = 100


def short_run(planned_steps: int, steps_per_epoch: int, settings: Any) -> str | None:
    """A warning when the plan has fewer than MIN_STEPS optimizer steps and more epochs would fix it."""
    if planned_steps >= MIN_STEPS or settings.max_steps is not None or settings.max_minutes is not None:
        return None
    epochs = math.ceil(MIN_STEPS / max(steps_per_epoch, 1))
    return (f"a short run: {planned_steps} optimizer steps in all ({steps_per_epoch} an epoch at batch size "
            f"{settings.batch_size} x {settings.grad_accum_steps} accumulation, {settings.epochs:g} epochs); on a "
            f"file this small raise --epochs (--epochs {epochs} gives about {epochs * steps_per_epoch} steps) or "
            f"lower --batch-size")


def _labels_of(example: Any) -> list[str]:
    """A classification example's label, an NER sentence's tags (other tasks: none)."""
    if getattr(example, "tags", None) is not None:
        return [tag for tag in example.tags if tag != "O"]
    label = getattr(example, "label", None)
    return [label] if isinstance(label, str) else []


def unseen_dev_labels(dev_examples: Sequence[Any], train_examples: Sequence[Any]) -> str | None:
    """A warning naming the dev labels (or NER tags) that no training example has, with their dev counts."""
    trained = {label for example in train_examples for label in _labels_of(example)}
    found = Counter(label for example in dev_examples for label in _labels_of(example) if label not in trained)
    if not found:
        return None
    shown = ", ".join(f"{label!r} ({count} in dev)" for label, count in found.most_common(10))
    return (f"dev labels never seen in training: {shown}; the model cannot learn them, so every such dev answer "
            "counts as an error (add training examples of them)")


def warn_before_training(planned_steps: int, steps_per_epoch: int, settings: Any, train_examples: Sequence[Any],
                         dev_examples: Sequence[Any]) -> list[str]:
    warnings = [w for w in (short_run(planned_steps, steps_per_epoch, settings),
                            unseen_dev_labels(dev_examples, train_examples)) if w]
    for warning in warnings:
        log.warning("%s", warning)
    return warnings
