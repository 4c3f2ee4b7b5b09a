"""Run a PyTorch BERT head over encoded inputs in length-sorted batches; numpy out, input order kept."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tasks.batching import pad_batch
from tasks.tokenizer import EncodedInput


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    items: Sequence[EncodedInput],
    output_names: Sequence[str],
    per_token: bool,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
) -> dict[str, list[np.ndarray]]:
    """For each output name, one float32 array per item. With `per_token` (NER, QA) each array is
    trimmed to the item's own length, so padding never leaks into decoding.

    Items are batched by similar length (sorted), which wastes little compute on padding.
    """
    was_training = model.training
    model.eval()
    order = np.argsort([len(x) for x in items], kind="stable")
    results: dict[str, list[np.ndarray | None]] = {name: [None] * len(items) for name in output_names}
    for begin in range(0, len(order), batch_size):
        index = order[begin : begin + batch_size]
        batch = {k: torch.from_numpy(v).to(device) for k, v in pad_batch([items[i] for i in index]).items()}
        out = model(**batch)
        for name in output_names:
            values = out[name].float().cpu().numpy()
            for row, i in enumerate(index):
                results[name][i] = values[row, : len(items[i])] if per_token else values[row]
    model.train(was_training)
    return results  # type: ignore[return-value]
