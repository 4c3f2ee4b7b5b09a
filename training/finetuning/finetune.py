"""Fine-tune a BERT model folder into a task head and evaluate it: the engine of `berth finetune`.

The task layer (tasks/) turns examples into features and predictions into answers and metrics;
training/finetuning/task_data.py adapts it to torch; training/loop/trainer.py is the one training loop. This
module wires them: base model folder -> head -> train -> evaluate on dev -> a Hugging Face folder
with berth_task.json (labels, task settings, dev metrics) and the run's config.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import UserFacingError
from training.finetuning.settings import FinetuneInputError, FinetuneSettings

if TYPE_CHECKING:
    from training.loop.callbacks import TrainerCallback

__all__ = ["FinetuneInputError", "FinetuneSettings", "run_finetune"]  # the settings' names: imported by callers

log = logging.getLogger("berth.finetune")
STATE_DIR = "train_state"  # the resumable training state, under the output folder while training
ERRORS_FILE = "errors.jsonl"  # the bad rows skipped under bad_rows "skip", one JSON object a line


def write_card(out: Path, name: str | None = None) -> None:
    """README.md (the model card) from the folder's records; config.json names the model, not a path."""
    from tasks.model_card import CARD_FILE, clean_config, finetuned_card

    clean_config(out, name or out.name)
    (out / CARD_FILE).write_text(finetuned_card(out, name=name), encoding="utf-8")


def resolve_base(base: str) -> Path:
    """`default` means the embedded all-MiniLM-L6-v2 checkpoint; anything else is a BERT checkpoint folder, checked
    here (config, weights, tokenizer) so that a wrong --base is one line before any work."""
    from training.bert.checkpoint import checkpoint_problem, default_base_path

    path = default_base_path() if base == "default" else Path(base)
    problem = checkpoint_problem(path)
    if problem:
        raise UserFacingError(f"--base {path}: {problem}")
    return path


def check_sequence_length(settings: FinetuneSettings, base: Path) -> None:
    """A max_seq_length past the base's position embeddings would fail at the first example that long."""
    positions = json.loads((base / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings", 512)
    if settings.task == "qa" and settings.effective_max_seq_length() <= settings.max_query_length + 3:
        raise UserFacingError(f"--max-seq-length {settings.effective_max_seq_length()} leaves no room for the context "
                              f"after a question of up to --max-query-length {settings.max_query_length} tokens and "
                              "the 3 special tokens; raise the first or lower the second")
    if settings.effective_max_seq_length() > positions:
        raise UserFacingError(f"--max-seq-length {settings.effective_max_seq_length()} is longer than the "
                              f"{positions} positions of the base {base} (max_position_embeddings in its "
                              f"config.json); use at most {positions}")


def run_provenance() -> dict:
    """The git revision, library versions and machine a run record was made with."""
    import os
    import platform

    from training.provenance import git_revision, library_versions

    return {"git_revision": git_revision(), "libraries": library_versions(), "python": platform.python_version(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def default_pooling(base: Path) -> str:
    """The pooling the base was trained with: a fine-tuned head's folder says it in config.json
    (`classifier_pooling`: a mean-pooled head has no trained pooler to switch to); a sentence-transformers folder
    (1_Pooling/config.json) says mean or cls; a plain BERT checkpoint has a pretrained [CLS] pooler (NSP), so cls.

    Measured on all-MiniLM-L6-v2 (docs/RESULTS.md, "Pooling"): its tanh pooler was never trained
    for its sentence objective, and mean pooling fine-tunes better.
    """
    head = json.loads((base / "config.json").read_text(encoding="utf-8")).get("classifier_pooling")
    if head in ("cls", "mean"):
        return head
    config = base / "1_Pooling" / "config.json"
    if config.is_file():
        modes = json.loads(config.read_text(encoding="utf-8"))
        if modes.get("pooling_mode_mean_tokens") or modes.get("pooling_mode") == "mean":  # old and new key
            return "mean"
    return "cls"


def run_finetune(settings: FinetuneSettings, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, float]:
    """`_run_finetune` holding the output folder's lock (training/loop/output_lock.py): a second run on a folder that a
    live run writes is refused. Under torchrun, rank 0 holds it for all."""
    from training.loop.output_lock import output_lock

    if int(os.environ.get("RANK", "0")) != 0:
        return _run_finetune(settings, callbacks)
    with output_lock(settings.out, "berth finetune"):
        return _run_finetune(settings, callbacks)


def _run_finetune(settings: FinetuneSettings, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, float]:
    """Set up, train, save. Returns the dev metrics of the saved model (empty without a dev file): with
    eval_every_steps, the best evaluation's checkpoint, scored again on the whole dev file. Under torchrun
    every process trains; rank 0 alone (where the evaluations ran) evaluates and writes the folder, the
    others return {}. `callbacks`: more hooks into the training loop (e.g. `berth sweep --ray` reporting each
    dev evaluation to Ray Tune); they see the run, they do not change it."""
    from training.loop.callbacks import closed_on_failure

    run = set_up(settings, callbacks)
    with closed_on_failure(run.callbacks):
        trained = train_and_evaluate(run)
        if trained is None:  # torchrun: rank 0 alone evaluates and writes the folder
            return {}
        save(run, trained)
    for callback in run.callbacks:
        callback.on_run_end(run.out, trained.saved_step, trained.metrics)
    return trained.metrics


@dataclass
class FinetuneRun:
    """What training needs, set up from the settings: the data, the model with its head, the loop's settings and
    the callbacks (dev evaluation, best checkpoint, early stopping, trackers, the caller's)."""

    settings: FinetuneSettings
    base: Path
    adapter: Any
    train_examples: list
    dev_examples: list
    bad_rows: dict
    spec: Any  # tasks.runtime.spec.TaskSpec
    model: Any  # torch.nn.Module
    dataset: Any
    collate: Any
    cache_record: dict | None
    train_settings: Any  # training.loop.settings.TrainSettings
    warnings: list[str]
    metric: str | None = None
    greater: bool = True
    best: Any = None  # training.loop.callbacks.BestCheckpoint, with evaluations while training
    evaluate: Any = None
    sample: list = field(default_factory=list)
    callbacks: list = field(default_factory=list)

    @property
    def out(self) -> Path:
        return Path(self.settings.out)


@dataclass
class Trained:
    """The outcome of training and the final dev evaluation."""

    result: Any  # training.loop.trainer.TrainResult
    train_minutes: float
    eval_minutes: float
    metrics: dict[str, float]
    dev_outputs: Any  # output_cache.Recorder, None without dev data
    saved_step: int
    best_record: dict | None


def set_up(settings: FinetuneSettings, callbacks: Sequence[TrainerCallback] = ()) -> FinetuneRun:
    """Read the data, load the base with the task's head, plan the loop and make its callbacks; every setting that
    cannot work here is refused before training."""
    import torch

    from training.finetuning import dev_evaluation, run_checks, task_data, trackers
    from training.loop.trainer import Plan

    run_trackers = trackers.make_trackers(settings.report_to, settings.out, json.loads(settings.model_dump_json()))
    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    torch.manual_seed(settings.seed)
    base = resolve_base(settings.base)
    check_sequence_length(settings, base)
    adapter, train_examples, dev_examples, bad_rows = read_data(settings, base)
    spec = adapter.spec(train_examples)
    log.info("task %s: %d train / %d dev examples, labels %s", spec.task, len(train_examples), len(dev_examples),
             spec.labels)
    model, spec = load_head(settings, base, spec)
    dataset = task_data.Features(adapter.features(train_examples, spec))
    collate, cache_record = getattr(adapter, "collate", task_data.collate), None
    if settings.feature_based:  # the frozen encoder runs once per sentence, here, not in the training loop
        from training.finetuning import feature_based

        dataset, cache_record = feature_based.cache_features(model, dataset)
        collate = feature_based.collate
    train_settings = settings.loop_settings(Path(settings.out) / STATE_DIR)
    plan = Plan.make(train_settings, len(dataset), int(os.environ.get("WORLD_SIZE", "1")))
    warnings = run_checks.warn_before_training(plan.total_steps, plan.steps_per_epoch, settings, train_examples,
                                               dev_examples) if int(os.environ.get("RANK", "0")) == 0 else []
    run = FinetuneRun(settings, base, adapter, train_examples, dev_examples, bad_rows, spec, model, dataset, collate,
                      cache_record, train_settings, warnings)
    if dev_examples:
        try:
            run.metric, run.greater = dev_evaluation.choose_metric(settings, adapter, model, dev_examples, spec)
        except dev_evaluation.UnknownMetric as error:
            raise FinetuneInputError(str(error)) from None
    if dev_examples and settings.eval_every_steps:
        run.sample = dev_evaluation.eval_sample(dev_examples, settings.eval_sample_size, settings.seed)
        run.evaluate = dev_evaluation.dev_evaluator(adapter, run.sample, spec)
        run.best, evaluation = dev_evaluation.evaluation_callbacks(settings, train_settings.output_dir, run.metric,
                                                                   run.greater)
        run.callbacks += evaluation
    run.callbacks += [*run_trackers, *callbacks]
    return run


def read_data(settings: FinetuneSettings, base: Path) -> tuple[Any, list, list, dict]:
    """The task's data adapter, the train and dev examples, and the record of the bad rows skipped."""
    from tasks.runtime.tokenizer import load_tokenizer
    from training.finetuning import task_data

    adapter = task_data.adapter_for(settings, load_tokenizer(base))
    train_examples = adapter.read(settings.train_file, limit=settings.max_train_examples, seed=settings.seed)
    dev_examples = (adapter.read(settings.dev_file, limit=settings.max_eval_examples, seed=None)
                    if settings.dev_file else [])
    bad_rows = write_bad_rows(getattr(adapter, "bad_rows", []), Path(settings.out), settings.bad_rows)
    return adapter, train_examples, dev_examples, bad_rows


def load_head(settings: FinetuneSettings, base: Path, spec) -> tuple[Any, Any]:
    """The base's encoder under the task's head (its labels, pooling, feature-based layers); the spec with the
    choices made here."""
    from tasks.classification import REGRESSION
    from tasks.registry import definition, head_class
    from training.bert import model as models
    from training.bert.checkpoint import CheckpointError, load_pretrained
    from training.finetuning import feature_based
    from training.loop.saving import ensure_free_space, tensor_bytes

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
    try:
        model, report = load_pretrained(head, base, **{k: v for k, v in overrides.items() if v is not None})
    except CheckpointError as error:  # e.g. encoder weights missing or of another shape than its config says
        raise UserFacingError(f"--base {base}: {error}") from None
    ensure_free_space(Path(settings.out), 4 * tensor_bytes(model.state_dict()),
                      "a training state (about 3x the weights) and the model")
    log.info("loaded %s from %s: %s", head_class(spec), base, report)
    return model, spec


def train_and_evaluate(run: FinetuneRun) -> Trained | None:
    """The loop, then the best evaluation's weights (if not the last) scored on the whole dev file; None on the
    ranks of a torchrun launch but 0."""
    from training.bert.torch_runner import torch_item_runner
    from training.finetuning import output_cache
    from training.loop.metrics_log import METRICS_FILE
    from training.loop.trainer import train

    started = time.time()
    result = train(run.model, run.dataset, run.collate, run.train_settings, evaluate=run.evaluate,
                   callbacks=run.callbacks)
    train_minutes = (time.time() - started) / 60
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    best = run.best
    if best is not None and best.step is not None and best.step != result.steps:
        log.info("the best %s on the dev sample was at step %d (%.4f), not the last (%d): keeping step %d",
                 run.metric, best.step, best.value, result.steps, best.step)
        run.model.load_state_dict(best.best_weights())
    # The curves stay with the model; the resumable state (optimizer moments etc., ~3x the model) is only
    # needed while training.
    if (run.train_settings.output_dir / METRICS_FILE).is_file():
        shutil.copyfile(run.train_settings.output_dir / METRICS_FILE, run.out / METRICS_FILE)
    result.metrics_path, result.last_checkpoint = run.out / METRICS_FILE, None

    metrics: dict[str, float] = {}
    dev_outputs = None
    eval_started = time.time()
    if run.dev_examples:
        dev_outputs = output_cache.Recorder(torch_item_runner(run.model, progress="dev evaluation"))
        metrics, extra = run.adapter.evaluate(dev_outputs, run.dev_examples, run.spec)
        run.spec = run.spec.model_copy(update=extra)
        log.info("dev metrics: %s", json.dumps(metrics))
    eval_minutes = (time.time() - eval_started) / 60
    saved_step = best.step if best is not None and best.step is not None else result.steps
    best_record = _best_record(best, run.callbacks, run.metric, run.greater, metrics, result, len(run.sample),
                               eval_minutes)
    return Trained(result, train_minutes, eval_minutes, metrics, dev_outputs, saved_step, best_record)


def save(run: FinetuneRun, trained: Trained) -> None:
    """The model folder: weights, tokenizer, berth_task.json, the run record and the model card, published whole;
    then the training state goes."""
    from training.bert.checkpoint import save_pretrained
    from training.finetuning import output_cache

    spec = run.spec.model_copy(update={"dev_metrics": trained.metrics})
    staging = model_staging(run.out, run.model, run.base)
    with staged_model(run.out, staging):
        if trained.dev_outputs is not None:  # export's metric gate reuses them; keyed on the device that made them
            trained.dev_outputs.save(staging / output_cache.CACHE_FILE, run.model)
        run.model.cpu()
        save_pretrained(run.model, staging, tokenizer_from=run.base)
        spec.save(staging)
        write_run_record(staging, run.settings, run.base, run.train_examples, run.dev_examples, trained.train_minutes,
                         trained.eval_minutes, trained.result, trained.metrics, trained.best_record, spec,
                         run.cache_record, run.bad_rows, run.warnings)
        write_card(staging, name=run.out.name)
    shutil.rmtree(run.train_settings.output_dir, ignore_errors=True)  # the model is in place: the state is not needed


def write_run_record(folder: Path, settings: FinetuneSettings, base: Path, train_examples: list,
                     dev_examples: list, train_minutes: float, eval_minutes: float, result, metrics: dict[str, float],
                     best_record: dict | None, spec, cache_record: dict | None, bad_rows: dict,
                     warnings: list[str]) -> None:
    """finetune_run.json: the settings, data, result, dev metrics, speed and provenance of the run."""
    from training.loop.precision import cpu_bf16_support

    run = {
        "settings": json.loads(settings.model_dump_json()),
        "base": str(base),
        "train_examples": len(train_examples),
        "dev_examples": len(dev_examples),
        "train_minutes": round(train_minutes, 2),
        "eval_minutes": round(eval_minutes, 2),
        "train_result": getattr(result, "__dict__", str(result)),
        "dev_metrics": metrics,
        "best": best_record,
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
        "warnings": warnings,
        "schedule": {"planned_steps": result.planned_steps, "steps": result.steps,
                     "fitted_to_budget": result.fitted_to_budget, "stopped_by": result.stopped_by},
        "bad_rows": bad_rows,
    }
    (folder / "finetune_run.json").write_text(json.dumps(run, indent=2, default=str) + "\n", encoding="utf-8")


def write_bad_rows(found: list, out: Path, policy: str) -> dict:
    """OUT/errors.jsonl: the rows skipped under bad_rows "skip" (file, line, reason), written whole or not at all;
    returns the run record's entry (policy, count, file)."""
    from training.loop.saving import atomic_write_text

    path = out / ERRORS_FILE
    if not found:
        path.unlink(missing_ok=True)  # an earlier run's
        return {"policy": policy, "count": 0, "file": None}
    lines = [json.dumps({"file": e.path, "line": e.line, "reason": e.reason}, ensure_ascii=False) for e in found]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return {"policy": policy, "count": len(found), "file": ERRORS_FILE}


def model_staging(out: Path, model, base: Path) -> Path:
    """The temporary folder the model is written into, inside `out`; refused up front when the disk has not the
    room for the weights and the tokenizer files."""
    from training.bert.checkpoint import TOKENIZER_FILES
    from training.loop.saving import ensure_free_space, tensor_bytes

    out.mkdir(parents=True, exist_ok=True)
    size = tensor_bytes(model.state_dict()) + sum((base / n).stat().st_size for n in TOKENIZER_FILES
                                                  if (base / n).is_file())
    ensure_free_space(out, size, "the fine-tuned model")
    return out / f".tmp-model-{os.getpid()}"


@contextlib.contextmanager
def staged_model(out: Path, staging: Path):
    """Fill `staging`, then move its files into `out`, berth_task.json (what marks a model folder finished) last.
    A refused write is one line and leaves the training state in OUT/train_state; the staging folder goes."""
    from tasks.runtime.spec import TASK_FILE
    from training.loop.saving import disk_errors, publish_files

    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        kept = (f"{out} is as it was, and the training state is kept in {out / STATE_DIR}: free some space and run "
                "the same command again to save the model")
        with disk_errors(out, "the fine-tuned model", kept):
            yield staging
            publish_files(staging, out, marker=TASK_FILE)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _best_record(best, callbacks, metric: str | None, greater: bool, dev_metrics: dict[str, float], result,
                 sample_size: int, final_eval_minutes: float) -> dict | None:
    """Which checkpoint was saved and why: the best evaluation (step, metric, value) and every evaluation on the
    dev sample, the last step's, early stopping, and what evaluating cost in wall time."""
    if metric is None:
        return None
    if best is None:  # no evaluation while training: the last step is saved, scored once on the whole dev file
        return {"metric": metric, "greater_is_better": greater, "step": result.steps,
                "value": dev_metrics.get(metric), "last_step": result.steps, "evaluations": [],
                "final_eval_seconds": round(final_eval_minutes * 60, 3)}
    record = best.record()
    stopping = next((c for c in callbacks if c.name == "early_stopping"), None)
    train_s = result.elapsed_s  # training time only, across resumes (evaluations not counted)
    return {**record, "last_step": result.steps, "last_value": record["evaluations"][-1].get(metric),
            "dev_sample_examples": sample_size, "early_stopping_patience": getattr(stopping, "patience", None),
            "early_stopped_at": getattr(stopping, "stopped_at", None),
            "eval_seconds": result.eval_seconds, "evaluations_this_invocation": result.evaluations,
            "eval_share_of_wall": round(result.eval_seconds / max(train_s + result.eval_seconds, 1e-9), 4),
            "final_eval_seconds": round(final_eval_minutes * 60, 3)}
