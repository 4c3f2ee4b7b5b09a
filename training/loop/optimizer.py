"""The optimizer and the learning-rate schedule of the one training loop.

AdamW with two parameter groups (no weight decay on biases and LayerNorm weights), fused where the
build supports it; a linear warmup then linear decay to 0 whose end a time budget may move.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from training.loop.settings import TrainSettings

log = logging.getLogger(__name__)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: weight decay for weight matrices and embeddings, none for biases and LayerNorm."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue  # tied weights (the MLM decoder and the word embeddings) appear once
            seen.add(id(param))
            exempt = name == "bias" or isinstance(module, nn.LayerNorm)
            (no_decay if exempt else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, settings: TrainSettings, device: torch.device) -> torch.optim.AdamW:
    """torch's AdamW, fused where this build supports it on `device`, else the foreach implementation."""
    groups = parameter_groups(model, settings.weight_decay)
    kwargs = {"lr": settings.learning_rate, "betas": (settings.adam_beta1, settings.adam_beta2),
              "eps": settings.adam_epsilon}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError, TypeError) as err:
        log.debug("fused AdamW unavailable on %s (%s); using foreach", device, err)
        return torch.optim.AdamW(groups, foreach=True, **kwargs)


class LinearSchedule:
    """The learning-rate factor for LambdaLR: 0 -> 1 over warmup_steps, then linearly down to 0 at
    total_steps.

    An object, not a closure: its plan can be moved (`replan`, a time budget shortening the run) and
    LambdaLR saves and restores its fields with the scheduler's state.
    """

    def __init__(self, warmup_steps: int, total_steps: int) -> None:
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))


def linear_schedule(warmup_steps: int, total_steps: int) -> LinearSchedule:
    return LinearSchedule(warmup_steps, total_steps)


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup then linear decay to 0, one factor for every parameter group."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, LinearSchedule(warmup_steps, total_steps))


def replan(scheduler: torch.optim.lr_scheduler.LambdaLR, warmup_steps: int, total_steps: int) -> None:
    """Move the schedule's end (and warmup) and set the rate of the coming step from the new plan."""
    for schedule in scheduler.lr_lambdas:
        schedule.warmup_steps, schedule.total_steps = warmup_steps, total_steps
    groups = scheduler.optimizer.param_groups
    for group, base, schedule in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * schedule(scheduler.last_epoch)


def current_learning_rate(optimizer: torch.optim.Optimizer) -> float:
    """The rate the coming optimizer step applies (the first parameter group's)."""
    return float(optimizer.param_groups[0]["lr"])
