"""What a fine-tuned model is for: its task, labels and the settings that turn text into features.

Written as `berth_task.json` beside a fine-tuned checkpoint by training, copied into the bundle
manifest by export, and read by the service. Torch-free.

A data record: it does not look its task up. Where the task's definition is needed,
`tasks.registry.definition(spec.task)` gives it (and a KeyError naming the known tasks for an unknown one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

TASK_FILE = "berth_task.json"

Task = str  # a name of tasks.registry.DEFINITIONS


class TaskSpec(BaseModel):
    task: Task = Field(description="the task's name: one of tasks.registry.TASK_NAMES")
    labels: list[str] = Field(default_factory=list, description="label names in id order; empty for qa/fill-mask")
    problem_type: str | None = Field(None, description="regression | single_label_classification | "
                                                       "multi_label_classification")
    max_seq_length: int = 128
    doc_stride: int = Field(128, description="an OVERLAP, not a step (name kept for bundle compatibility): qa: "
                                             "context tokens shared by consecutive windows; ner: tokens shared "
                                             "by consecutive windows (at most half a window)")
    max_query_length: int = 64  # qa
    version_2_with_negative: bool = False  # qa: trained with unanswerable questions (SQuAD v2)
    null_score_diff_threshold: float = 0.0  # qa v2: best threshold found on dev
    pooling: str | None = None  # classification/pair: "cls" or "mean"; computed inside the ONNX graph
    dev_metrics: dict[str, float] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict, description="task-specific settings, e.g. embedding "
                                                                     "pooling and normalize")

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
