"""Fine-tune a BERT model folder into a task head and evaluate it: the engine of `berth finetune`.

The task layer (tasks/) turns examples into features and predictions into answers and metrics;
training/task_data.py adapts it to torch; training/trainer.py is the one training loop. This
module wires them: base model folder -> head -> train -> evaluate on dev -> a Hugging Face folder
with berth_task.json (labels, task settings, dev metrics) and the run's config.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from training.settings import FinetuneSettings

__all__ = ["FinetuneSettings", "run_finetune"]  # FinetuneSettings: imported from here by callers

log = logging.getLogger("berth.finetune")


def resolve_base(base: str) -> Path:
    """`default` means the embedded all-MiniLM-L6-v2 checkpoint; anything else is a folder."""
    from training.checkpoint import default_base_path

    path = default_base_path() if base == "default" else Path(base)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a BERT model folder (no config.json)")
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

    from tasks.classification import REGRESSION
    from tasks.registry import definition, head_class
    from tasks.tokenizer import load_tokenizer
    from training import feature_based, task_data
    from training import model as models
    from training.checkpoint import load_pretrained, save_pretrained
    from training.precision import cpu_bf16_support
    from training.predict import torch_item_runner
    from training.trainer import train

    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    torch.manual_seed(settings.seed)
    base = resolve_base(settings.base)
    tokenizer = load_tokenizer(base)
    adapter = task_data.adapter_for(settings, tokenizer)
    train_examples = adapter.read(settings.train_file, limit=settings.max_train_examples, seed=settings.seed)
    dev_examples = (adapter.read(settings.dev_file, limit=settings.max_eval_examples, seed=None)
                    if settings.dev_file else [])
    spec = adapter.spec(train_examples)
    log.info("task %s: %d train / %d dev examples, labels %s", spec.task, len(train_examples), len(dev_examples),
             spec.labels)

    overrides = {}
    if settings.feature_based:
        spec, head_fields = feature_based.head_setup(settings, spec)
        overrides.update(head_fields)
    head = getattr(models, head_class(spec))
    if spec.problem_type == REGRESSION:  # one score, no label names
        overrides = {"num_labels": 1, "problem_type": REGRESSION}
    overrides.update(definition(spec.task).head_overrides(spec))  # the label names, where the task has labels
    if definition(spec.task).pools:
        pooling = default_pooling(base) if settings.pooling == "auto" else settings.pooling
        overrides["classifier_pooling"] = pooling
        spec = spec.model_copy(update={"pooling": pooling})
    model, report = load_pretrained(head, base, **{k: v for k, v in overrides.items() if v is not None})
    log.info("loaded %s from %s: %s", head_class(spec), base, report)

    dataset = adapter.features(train_examples, spec)
    collate, cache_record = getattr(adapter, "collate", task_data.collate), None
    if settings.feature_based:  # the frozen encoder runs once per sentence, here, not in the training loop
        dataset, cache_record = feature_based.cache_features(model, dataset)
        collate = feature_based.collate
    out = Path(settings.out)
    train_settings = settings.loop_settings(out / "train_state")
    started = time.time()
    result = train(model, dataset, collate, train_settings)
    train_minutes = (time.time() - started) / 60
    # The resumable state (optimizer moments etc., ~3x the model) is only needed while training.
    shutil.rmtree(train_settings.output_dir, ignore_errors=True)

    metrics: dict[str, float] = {}
    eval_started = time.time()
    if dev_examples:
        metrics, extra = adapter.evaluate(torch_item_runner(model, progress="dev evaluation"), dev_examples, spec)
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
        "precision": result.precision,
        "speed": {  # over the training time, all ranks
            "threads": result.threads,
            "precision": result.precision,
            "cpu_native_bf16": cpu_bf16_support(),
            "examples_per_s": result.examples_per_s,
            "real_tokens_per_s": result.tokens_per_s,
            "padded_over_real_tokens": result.padded_tokens / max(result.real_tokens, 1),
        },
        "feature_cache": cache_record,
        "schedule": {"planned_steps": result.planned_steps, "steps": result.steps,
                     "fitted_to_budget": result.fitted_to_budget, "stopped_by": result.stopped_by},
    }
    (out / "finetune_run.json").write_text(json.dumps(run, indent=2, default=str) + "\n", encoding="utf-8")
    return metrics
