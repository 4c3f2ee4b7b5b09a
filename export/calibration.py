"""Model inputs from a task's data file: calibration batches for static int8, dev inputs for the gate.

The examples are read and encoded by the task's training adapter (training/finetuning/task_data.py: the same
readers and encoders as `berth finetune`), so a classification model is calibrated on sentences of
its own training set, a QA model on doc-stride windows of its own questions and contexts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tasks.runtime.batching import pad_batch
from tasks.runtime.spec import TaskSpec

# Training examples fed through the fp32 graph to fix the activation ranges (a seeded sample).
DEFAULT_EXAMPLES = 128
BATCH_SIZE = 8


def adapter(spec: TaskSpec, tokenizer: Tokenizer, path: Path, columns: dict[str, str] | None = None) -> Any:
    """The training adapter of `spec`'s task, set to the spec's sequence settings and a table file's `columns`
    (text_column, text_pair_column, label_column; default text, text_pair, label)."""
    from training.finetuning import task_data
    from training.finetuning.finetune import FinetuneSettings

    settings = FinetuneSettings(task=spec.task, train_file=path, out=Path("."),
                                regression=spec.problem_type == "regression", labels=spec.labels or None,
                                max_seq_length=spec.max_seq_length, doc_stride=spec.doc_stride,
                                max_query_length=spec.max_query_length, **(columns or {}))
    return task_data.adapter_for(settings, tokenizer)


def model_inputs(spec: TaskSpec, tokenizer: Tokenizer, path: Path, limit: int, seed: int | None = 0) -> list[Any]:
    """Encoded model inputs (sequences / windows) of `limit` examples of `path` (a seeded sample; the
    first `limit` when seed is None), sorted by length so batches pad little, as the service's do."""
    task = adapter(spec, tokenizer, Path(path))
    examples = task.read(Path(path), limit=limit, seed=seed)
    features = task.features(examples, spec)
    return sorted(features, key=len)


def batches(items: list[Any], batch_size: int = BATCH_SIZE) -> list[dict[str, np.ndarray]]:
    return [pad_batch(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]


class FeedReader:
    """onnxruntime.quantization's CalibrationDataReader protocol over prepared feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self.feeds = feeds
        self.position = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.position >= len(self.feeds):
            return None
        self.position += 1
        return self.feeds[self.position - 1]

    def rewind(self) -> None:
        self.position = 0
