"""Run a PyTorch BERT head over model items on the one inference path (tasks/runtime/inference.py); numpy out,
input order kept: its Runner (`torch_runner`) and ItemRunner (`torch_item_runner`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tasks.runtime.inference import ItemRunner, ModelItem, Rows, Runner, offline_shape, run_items
from tasks.runtime.progress import Progress, counted


def torch_runner(model: torch.nn.Module, output_names: Sequence[str], device: torch.device | str = "cpu") -> Runner:
    """Padded int64 feeds -> the model's float32 outputs by name, as numpy arrays."""
    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            out = model(**{name: torch.from_numpy(array).to(device) for name, array in feeds.items()})
        return {name: out[name].float().cpu().numpy() for name in output_names}

    return run


def predict(
    model: torch.nn.Module,
    items: Sequence[ModelItem],
    output_names: Sequence[str],
    per_token: bool,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
) -> dict[str, list[np.ndarray]]:
    """For each output name, one float32 array per item. With `per_token` (NER, QA) each array is
    trimmed to the item's own length, so padding never leaks into decoding.

    Items are batched as the service batches them on the CPU: sorted by length, padded to the longest
    of their batch rounded up to a multiple of 8.
    """
    was_training = model.training
    model.eval()
    try:
        runner = torch_runner(model, output_names, device)
        if progress is not None:
            runner = counted(runner, progress)
        rows = run_items(runner, items, per_token, offline_shape(items, batch_size))
    finally:
        model.train(was_training)
    return {name: [row[name] for row in rows] for name in output_names}


def torch_item_runner(model: torch.nn.Module, progress: str | None = None) -> ItemRunner:
    """A PyTorch head as the task definitions' runner, on the device its parameters are on; `progress`: report
    each run under this label (tasks/runtime/progress.py)."""
    def run(items: Sequence[ModelItem], output_names: Sequence[str], per_token: bool) -> list[Rows]:
        with Progress(progress or "", total=len(items), unit="items", enabled=progress is not None) as bar:
            out = predict(model, items, output_names, per_token=per_token, device=next(model.parameters()).device,
                          progress=bar)
        return [{name: out[name][i] for name in output_names} for i in range(len(items))]

    return run
