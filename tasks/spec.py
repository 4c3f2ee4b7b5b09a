"""What a fine-tuned model is for: its task, labels and the settings that turn text into features.

Written as `berth_task.json` beside a fine-tuned checkpoint by training, copied into the bundle
manifest by export, and read by the service. Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

TASK_FILE = "berth_task.json"

Task = Literal["classification", "pair", "ner", "qa", "fill-mask", "embedding", "multiple-choice"]

# The model class of training/model.py that each task fine-tunes, and its ONNX output names.
HEAD_CLASSES: dict[str, str] = {
    "classification": "BertForSequenceClassification",
    "pair": "BertForSequenceClassification",
    "ner": "BertForTokenClassification",
    "qa": "BertForQuestionAnswering",
    "fill-mask": "BertForMaskedLM",
    "embedding": "BertForSentenceEmbedding",
    "multiple-choice": "BertForMultipleChoice",
}
OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "classification": ("logits",),
    "pair": ("logits",),
    "ner": ("logits",),
    "qa": ("start_logits", "end_logits"),
    "fill-mask": ("logits",),
    "embedding": ("sentence_embedding", "hidden_states"),  # (B, H) pooled; (B, T, L + 1, H) every layer
    "multiple-choice": ("logits",),  # (B, 1): one score per [CLS] context [SEP] choice [SEP] sequence
}


class TaskSpec(BaseModel):
    task: Task
    labels: list[str] = Field(default_factory=list, description="label names in id order; empty for qa/fill-mask")
    problem_type: str | None = Field(None, description="regression | single_label_classification | multi_label_classification")
    max_seq_length: int = 128
    doc_stride: int = 128  # qa: context tokens shared by consecutive windows; ner: window overlap
    max_query_length: int = 64  # qa
    version_2_with_negative: bool = False  # qa: trained with unanswerable questions (SQuAD v2)
    null_score_diff_threshold: float = 0.0  # qa v2: best threshold found on dev
    pooling: str | None = None  # classification/pair: "cls" or "mean"; computed inside the ONNX graph
    dev_metrics: dict[str, float] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict, description="task-specific settings, e.g. embedding "
                                                                     "pooling and normalize")

    @property
    def head_class(self) -> str:
        return self.extra.get("head_class") or HEAD_CLASSES[self.task]  # e.g. feature-based NER's own head

    @property
    def output_names(self) -> tuple[str, ...]:
        return OUTPUT_NAMES[self.task]

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / TASK_FILE
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> TaskSpec:
        path = Path(folder) / TASK_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found; is {folder} a berth fine-tuned model folder?")
        return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
