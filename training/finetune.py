"""Fine-tune a BERT checkpoint into a task head and evaluate it: the engine of `berth finetune`.

The task layer (tasks/) turns examples into features and predictions into answers and metrics;
training/task_data.py adapts it to torch; training/trainer.py is the one training loop. This
module wires them: base checkpoint -> head -> train -> evaluate on dev -> a Hugging Face folder
with berth_task.json (labels, task settings, dev metrics) and the run's config.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

log = logging.getLogger("berth.finetune")

FinetuneTask = Literal["classification", "pair", "ner", "qa", "multiple-choice"]


class FinetuneSettings(BaseModel):
    """Defaults follow the BERT paper's fine-tuning recipe (AdamW, warmup 10%, batch 32, 3 epochs)."""

    task: FinetuneTask
    train_file: Path
    dev_file: Path | None = None
    out: Path
    base: str = Field("default", description="a Hugging Face BERT folder, a berth pretrained folder, or 'default'")
    data_format: str = Field("auto", description="auto | sst2 | mrpc | table (csv/tsv/jsonl) | conll | squad")
    text_column: str = "text"
    text_pair_column: str = "text_pair"
    label_column: str = "label"
    labels: list[str] | None = Field(None, description="label names in order (default: as found in train)")
    regression: bool = False
    max_seq_length: int | None = Field(None, description="default: 384 for qa, 128 otherwise")
    doc_stride: int | None = Field(None, description="qa: context tokens shared by windows (default 128); "
                                   "ner: window overlap when serving long texts (default max_seq_length // 4)")
    max_query_length: int = 64
    label_all_tokens: bool = Field(True, description="ner: train every sub-token (B-X continued as I-X), not only "
                                   "a word's first, so token-level entity grouping (the service's `simple`) is "
                                   "trained too; dev scores use each word's first sub-token either way")
    version_2_with_negative: bool | None = Field(None, description="qa: default from the data")
    epochs: float = 3.0
    learning_rate: float = 5e-5
    batch_size: int = 32
    grad_accum_steps: int = 1
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    max_minutes: float | None = Field(None, description="training-time budget in minutes")
    fit_to_budget: bool = Field(True, description="with max_minutes: shorten the schedule to end at the budget "
                                "(warmup and decay kept whole) instead of cutting it off mid-way")
    seed: int = 42
    pooling: Literal["auto", "cls", "mean"] = Field(
        "auto", description="classification/pair heads: cls (tanh pooler over [CLS]) or mean (average of the "
        "token states); auto: what the base was trained with (see default_pooling)")
    group_by_length: bool = Field(True, description="batches of similar lengths: less padding, same examples")
    threads: int | None = None
    device: str = "auto"

    def effective_max_seq_length(self) -> int:
        return self.max_seq_length or (384 if self.task == "qa" else 128)

    def effective_doc_stride(self) -> int:
        if self.doc_stride is not None:
            return self.doc_stride
        return 128 if self.task == "qa" else self.effective_max_seq_length() // 4


def resolve_base(base: str) -> Path:
    """`default` means the embedded all-MiniLM-L6-v2 checkpoint; anything else is a folder."""
    from training.checkpoint import default_base_path

    path = default_base_path() if base == "default" else Path(base)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a BERT checkpoint folder (no config.json)")
    return path


def run_provenance() -> dict:
    """The git revision, library versions and machine a run record was made with."""
    import os
    import platform

    from training.provenance import git_revision, library_versions

    return {"git_revision": git_revision(), "libraries": library_versions(), "python": platform.python_version(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def default_pooling(base: Path) -> str:
    """The pooling the base was trained with: a sentence-transformers folder (1_Pooling/config.json)
    says mean or cls; a plain BERT checkpoint has a pretrained [CLS] pooler (NSP), so cls.

    Measured on all-MiniLM-L6-v2 (docs/RESULTS.md, "Pooling"): its tanh pooler was never trained
    for its sentence objective, and mean pooling fine-tunes better.
    """
    config = base / "1_Pooling" / "config.json"
    if config.is_file():
        modes = json.loads(config.read_text(encoding="utf-8"))
        if modes.get("pooling_mode_mean_tokens") or modes.get("pooling_mode") == "mean":  # old and new key
            return "mean"
    return "cls"


def run_finetune(settings: FinetuneSettings) -> dict[str, float]:
    """Train, evaluate, save. Returns the dev metrics (empty without a dev file)."""
    import torch

    from tasks.tokenizer import load_tokenizer
    from training import model as models
    from training import task_data
    from training.checkpoint import load_pretrained, save_pretrained
    from training.trainer import TrainSettings, train

    if settings.threads:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    base = resolve_base(settings.base)
    tokenizer = load_tokenizer(base)
    adapter = task_data.adapter_for(settings, tokenizer)
    train_examples = adapter.read(settings.train_file, limit=settings.max_train_examples, seed=settings.seed)
    dev_examples = (adapter.read(settings.dev_file, limit=settings.max_eval_examples, seed=None)
                    if settings.dev_file else [])
    spec = adapter.spec(train_examples)
    log.info("task %s: %d train / %d dev examples, labels %s", spec.task, len(train_examples), len(dev_examples), spec.labels)

    head = getattr(models, spec.head_class)
    overrides = {}
    if spec.task in ("classification", "pair", "ner"):
        overrides["id2label"] = dict(enumerate(spec.labels)) if spec.labels else None
        if spec.problem_type == "regression":
            overrides = {"num_labels": 1, "problem_type": "regression"}
    if spec.task in ("classification", "pair"):
        pooling = default_pooling(base) if settings.pooling == "auto" else settings.pooling
        overrides["classifier_pooling"] = pooling
        spec = spec.model_copy(update={"pooling": pooling})
    model, report = load_pretrained(head, base, **{k: v for k, v in overrides.items() if v is not None})
    log.info("loaded %s from %s: %s", spec.head_class, base, report)

    dataset = adapter.features(train_examples, spec)
    out = Path(settings.out)
    train_settings = TrainSettings(
        output_dir=out / "train_state",
        seed=settings.seed,
        epochs=settings.epochs,
        max_minutes=settings.max_minutes,
        fit_schedule_to_budget=settings.fit_to_budget,
        batch_size=settings.batch_size,
        grad_accum_steps=settings.grad_accum_steps,
        learning_rate=settings.learning_rate,
        warmup_ratio=settings.warmup_ratio,
        weight_decay=settings.weight_decay,
        device=settings.device,
        num_threads=settings.threads,
        group_by_length=settings.group_by_length,
    )
    started = time.time()
    result = train(model, dataset, getattr(adapter, "collate", task_data.collate), train_settings)
    train_minutes = (time.time() - started) / 60
    # The resumable state (optimizer moments etc., ~3x the model) is only needed while training.
    shutil.rmtree(train_settings.output_dir, ignore_errors=True)

    metrics: dict[str, float] = {}
    eval_started = time.time()
    if dev_examples:
        metrics, extra = adapter.evaluate(model, dev_examples, spec)
        spec = spec.model_copy(update=extra)
        log.info("dev metrics: %s", json.dumps(metrics))
    eval_minutes = (time.time() - eval_started) / 60
    spec = spec.model_copy(update={"dev_metrics": metrics})
    model.cpu()
    save_pretrained(model, out, tokenizer_from=base)
    spec.save(out)
    run = {
        "settings": json.loads(settings.model_dump_json()),
        "base": str(base),
        "train_examples": len(train_examples),
        "dev_examples": len(dev_examples),
        "train_minutes": round(train_minutes, 2),
        "eval_minutes": round(eval_minutes, 2),
        "train_result": getattr(result, "__dict__", str(result)),
        "dev_metrics": metrics,
        "pooling": spec.pooling,  # the resolved choice (settings.pooling may say "auto")
        "provenance": run_provenance(),
        "speed": {  # over the training time, all ranks
            "threads": result.threads,
            "examples_per_s": result.examples_per_s,
            "real_tokens_per_s": result.tokens_per_s,
            "padded_over_real_tokens": result.padded_tokens / max(result.real_tokens, 1),
        },
        "schedule": {"planned_steps": result.planned_steps, "steps": result.steps,
                     "fitted_to_budget": result.fitted_to_budget, "stopped_by": result.stopped_by},
    }
    (out / "finetune_run.json").write_text(json.dumps(run, indent=2, default=str) + "\n", encoding="utf-8")
    return metrics
