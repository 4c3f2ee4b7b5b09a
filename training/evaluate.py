"""`berth evaluate`: score a fine-tuned folder on a data file of its task with the official metrics."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.spec import TaskSpec


def evaluate_folder(
    folder: str | Path, data: str | Path, data_format: str = "auto", limit: int | None = None,
    out: str | Path | None = None, device: str = "auto",
) -> dict[str, float]:
    import torch

    from tasks.tokenizer import load_tokenizer
    from training import model as models
    from training import task_data
    from training.checkpoint import load_pretrained
    from training.finetune import FinetuneSettings

    folder = Path(folder)
    spec = TaskSpec.load(folder)
    if spec.task == "fill-mask":
        raise SystemExit(f"{folder}: evaluate scores fine-tuned task heads; use `berth pretrain --eval-only` for MLM")
    settings = FinetuneSettings(task=spec.task, train_file=Path(data), out=folder, data_format=data_format,
                                regression=spec.problem_type == "regression", max_seq_length=spec.max_seq_length,
                                doc_stride=spec.doc_stride, max_query_length=spec.max_query_length)
    model, _ = load_pretrained(getattr(models, spec.head_class), folder)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    adapter = task_data.adapter_for(settings, load_tokenizer(folder))
    examples = adapter.read(Path(data), limit=limit, seed=None)
    metrics, _ = adapter.evaluate(model, examples, spec)
    if out is not None:
        Path(out).write_text(json.dumps({"model": str(folder), "data": str(data), "examples": len(examples),
                                         "metrics": metrics}, indent=2) + "\n", encoding="utf-8")
    return metrics
