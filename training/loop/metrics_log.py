"""The metrics log of a training run: metrics.jsonl, one JSON object per line, and the sums behind it.

A `Window` sums the losses, tokens and examples of the micro-batches between two lines; the lines
average them over all ranks. `MetricsLog` is written by rank 0 only and, on resume, drops what a
killed run logged after the state it resumes from.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

METRICS_FILE = "metrics.jsonl"


class Window:
    """Sums over one logging window of micro-batches; averaged (over all ranks) when logged."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.tokens = 0
        self.padded_tokens = 0
        self.examples = 0
        self.started = time.perf_counter()

    def add(self, key: str, value: torch.Tensor) -> None:
        value = value.detach().float()
        self.sums[key] = self.sums[key] + value if key in self.sums else value
        self.counts[key] = self.counts.get(key, 0) + 1

    def summary(self) -> dict[str, Any]:
        return {"sums": {k: v.item() for k, v in self.sums.items()}, "counts": dict(self.counts),
                "tokens": self.tokens, "padded_tokens": self.padded_tokens, "examples": self.examples}


def merge_windows(summaries: Sequence[dict[str, Any]]) -> tuple[dict[str, float], int, int, int]:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for s in summaries:
        for key, value in s["sums"].items():
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + s["counts"][key]
    means = {key: sums[key] / counts[key] for key in sums}
    total = {key: sum(s[key] for s in summaries) for key in ("tokens", "padded_tokens", "examples")}
    return means, total["tokens"], total["padded_tokens"], total["examples"]


def batch_size_of(batch: dict[str, Any]) -> tuple[int, int, int]:
    """(examples, real tokens, padded tokens) of a collated batch; real tokens are the attention mask's
    ones."""
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor):
        return 0, 0, 0
    mask = batch.get("attention_mask")
    real = int(mask.sum()) if isinstance(mask, torch.Tensor) else int(ids.numel())
    return int(ids.shape[0]), real, int(ids.numel())


class MetricsLog:
    """metrics.jsonl, written by rank 0 only; one JSON object per line, flushed as written."""

    def __init__(self, path: Path, enabled: bool, keep_through_step: int | None) -> None:
        self.path = path
        self.file = None
        if not enabled:
            return
        kept: list[str] = []
        # On resume: drop what a killed run logged after the state it resumes from.
        if keep_through_step is not None and path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    if line.strip() and json.loads(line).get("step", 0) <= keep_through_step:
                        kept.append(line)
        rewritten = path.with_name(path.name + ".tmp")  # replaced in one step: a kill here loses no lines
        rewritten.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(rewritten, path)
        self.file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
