"""Feature-based NER, the BERT paper's Table 7 comparison: `berth finetune --task ner --feature-based`.

The encoder stays frozen, so its features (the last four hidden layers concatenated, the paper's
best feature-based configuration) are computed ONCE per training sentence, with no_grad and in
length-sorted batches, and cached in memory (float16 when the cache would be large). The one
training loop then trains only the BiLSTM + linear tag head over the cache, for as many epochs as
asked. Labels, word-to-subword alignment and the dev metric (conlleval entity F1) are fine-tuned
NER's (training/finetuning/task_data.NERAdapter); the saved folder is a normal fine-tuned NER folder whose
model runs encoder + head (what `berth evaluate` scores and `berth export` exports).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tasks.registry import definition
from tasks.runtime.spec import TaskSpec
from training.bert.model import DEFAULT_FEATURE_LAYERS, BertFeatureBasedTokenClassification
from training.bert.torch_runner import predict
from training.errors import UserFacingError

log = logging.getLogger("berth.finetune")

HEAD_CLASS = BertFeatureBasedTokenClassification.__name__
FLOAT16_ABOVE_BYTES = 1 << 30  # a float32 cache above 1 GiB is kept in float16 (half the memory)
CHUNK_ITEMS = 1024  # sentences run per predict() call: bounds the float32 staging memory


@dataclass
class CachedFeature:
    """One training sentence: its frozen encoder features (T, K * H) and its per-token labels."""

    features: torch.Tensor
    labels: Sequence[int]

    def __len__(self) -> int:
        return self.features.shape[0]


def head_setup(settings: Any, spec: TaskSpec) -> tuple[TaskSpec, dict[str, Any]]:
    """The spec naming the feature-based head, and the config fields that size it (kept in config.json)."""
    if definition(spec.task).feature_based_head != HEAD_CLASS:
        raise UserFacingError(f"--feature-based trains a tagging head ({HEAD_CLASS}); task {spec.task!r} has none "
                              "(use it with --task ner)")
    spec = spec.model_copy(update={"extra": {**spec.extra, "head_class": HEAD_CLASS}})
    return spec, {"feature_layers": list(DEFAULT_FEATURE_LAYERS), "lstm_hidden_size": settings.lstm_hidden_size,
                  "lstm_layers": settings.lstm_layers}


class _TokenFeatures(torch.nn.Module):
    """The head's encoder half, with the output shape predict() reads."""

    def __init__(self, model: BertFeatureBasedTokenClassification):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return {"features": self.model.token_features(input_ids, attention_mask, token_type_ids)}


def cache_features(model: BertFeatureBasedTokenClassification, features: Sequence[Any],
                   dtype: torch.dtype | None = None, batch_size: int = 64) -> tuple[list[CachedFeature], dict]:
    """The frozen encoder's features of every training feature (task_data.Feature with its labels), once.

    `dtype` None: float16 when a float32 cache would pass FLOAT16_ABOVE_BYTES, else float32.
    Returns the cache (in the input order) and what it cost (for the run record).
    """
    width = len(model.feature_layers) * model.config.hidden_size
    tokens = sum(len(f) for f in features)
    if dtype is None:
        dtype = torch.float16 if tokens * width * 4 > FLOAT16_ABOVE_BYTES else torch.float32
    started = time.time()
    device = next(model.parameters()).device
    order = np.argsort([len(f) for f in features], kind="stable")
    cached: list[CachedFeature | None] = [None] * len(features)
    extractor = _TokenFeatures(model)
    for begin in range(0, len(order), CHUNK_ITEMS):
        chunk = [int(i) for i in order[begin : begin + CHUNK_ITEMS]]
        out = predict(extractor, [features[i] for i in chunk], ["features"], per_token=True,
                      batch_size=batch_size, device=device)["features"]
        for i, values in zip(chunk, out):
            cached[i] = CachedFeature(torch.tensor(values, dtype=dtype), list(features[i].targets["labels"]))
    seconds = time.time() - started
    element = torch.empty((), dtype=dtype).element_size()
    record = {"sentences": len(features), "tokens": tokens, "feature_width": width,
              "dtype": str(dtype).replace("torch.", ""), "cache_mb": round(tokens * width * element / 2**20, 1),
              "extract_minutes": round(seconds / 60, 2),
              "sentences_per_s": round(len(features) / max(seconds, 1e-9), 1)}
    log.info("cached frozen features: %s", record)
    return cached, record  # type: ignore[return-value]


def collate(items: Sequence[CachedFeature]) -> dict[str, torch.Tensor]:
    """Right-pad the cached features (zeros) and labels (-100); the mask marks real tokens."""
    width = max(len(item) for item in items)
    features = torch.zeros(len(items), width, items[0].features.shape[1], dtype=items[0].features.dtype)
    attention_mask = torch.zeros(len(items), width, dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item)
        features[row, :n] = item.features
        attention_mask[row, :n] = 1
        labels[row, :n] = torch.tensor(item.labels, dtype=torch.long)
    # input_ids only for the trainer's token counts; the head reads `features`.
    return {"features": features, "attention_mask": attention_mask, "input_ids": attention_mask, "labels": labels}
