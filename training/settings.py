"""The settings of training runs, declared once: the training loop's, and the two commands that embed it.

`TrainLoopSettings` are the knobs of the one training loop (training/trainer.py); `TrainSettings` adds
the folder its resumable training state goes to. `FinetuneSettings` and `PretrainSettings` ARE loop
settings (they inherit the fields, descriptions and bounds) plus their own, with their own defaults
for a few (`loop_default`). The `berth` flags, their defaults and help are generated from these fields
(berth/flags.py). Torch-free, so that `berth --help` works in a serving install.

Words: a *model folder* is a Hugging Face checkpoint (config.json + weights + tokenizer); a
*training state* is the trainer's resumable snapshot (optimizer, schedule, random states, data
position) under `<output>/checkpoints/step-N/`, needed only while training.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.fields import FieldInfo

from tasks.definition import TaskDefinition
from tasks.registry import DEFINITIONS, definition

log = logging.getLogger("berth.settings")

# Names these settings had before they were declared once; still accepted (old run records, scripts).
LEGACY_NAMES = {"threads": "num_threads", "fit_to_budget": "fit_schedule_to_budget",
                "keep_last_checkpoints": "keep_last_states"}


class TrainLoopSettings(BaseModel):
    """How the one training loop trains: schedule, optimizer, batches, saving, devices."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(42, ge=0, description="random seed: data order, dropout, new weights")
    epochs: float | None = Field(None, gt=0, description="passes over the training data, may be fractional; "
                                 "1 when neither this nor max_steps is set")
    max_steps: int | None = Field(None, gt=0, description="optimizer steps; with epochs, the smaller wins")
    max_minutes: float | None = Field(None, gt=0, description="training-time budget in minutes, counted across "
                                      "resumes; data preparation and evaluation are not counted")
    fit_schedule_to_budget: bool = Field(False, description="with max_minutes: measure the step speed and shorten "
                                         "the plan so that warmup + decay end at the budget (else: cut mid-schedule)")
    min_steps: int | None = Field(None, gt=0, description="with max_minutes: train at least this many optimizer "
                                  "steps (at most the plan) even when the budget is spent first: a slow or busy "
                                  "machine then takes longer rather than training less")
    batch_size: int = Field(32, gt=0, description="examples per micro-batch per device")
    grad_accum_steps: int = Field(1, gt=0, description="micro-batches per optimizer step")
    learning_rate: float = Field(5e-5, gt=0, description="peak AdamW learning rate, after warmup; decays "
                                 "linearly to 0 at the last step")
    warmup_ratio: float = Field(0.0, ge=0, le=1, description="share of the optimizer steps spent warming the "
                                "learning rate up from 0")
    warmup_steps: int | None = Field(None, ge=0, description="warmup in optimizer steps; overrides warmup_ratio")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (not on biases and LayerNorm weights)")
    adam_beta1: float = Field(0.9, description="AdamW beta1")
    adam_beta2: float = Field(0.999, description="AdamW beta2")
    adam_epsilon: float = Field(1e-8, description="AdamW epsilon")
    max_grad_norm: float | None = Field(1.0, description="gradient clipping: largest global L2 norm; 0: no clipping")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="number format of the training step (weights and optimizer state stay fp32): "
        "auto: bf16 autocast on a GPU that supports it (else fp16 with loss scaling); on a CPU with native "
        "bf16 (AVX-512 BF16 or AMX) whichever of fp32 and bf16 a timed probe on the run's own batches finds "
        "faster, else fp32; bf16 forced on a CPU without it is emulated and slow; fp16: CUDA")
    save_every_steps: int | None = Field(None, gt=0, description="save the resumable training state every N "
                                         "optimizer steps (and at the end)")
    save_every_minutes: float | None = Field(None, gt=0, description="save the resumable training state after "
                                             "this many minutes of training since the last save (and at the end), "
                                             "so that the same command resumes after a kill; the wait is at least "
                                             "20 times what the last save took")
    log_every_steps: int = Field(10, gt=0, description="optimizer steps between lines of metrics.jsonl")
    eval_every_steps: int | None = Field(None, gt=0, description="evaluate every N optimizer steps (and at the end)")
    keep_last_states: int | None = Field(2, gt=0, description="training states kept on disk, older ones deleted; "
                                         "unset keeps all")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes (0: load in the training process)")
    device: str = Field("auto", description="auto (CUDA if present), cpu, cuda, cuda:1 ...")
    resume: str = Field("auto", description="auto: continue from the latest training state in the output folder, "
                        "if any; never: start over; or a training-state folder")
    progress_bar: bool = Field(True, description="progress on rank 0, to stderr: a bar on a terminal, else a line "
                               "at least every 30 s ($BERTH_PROGRESS_SECONDS)")
    num_threads: int | None = Field(None, gt=0, description="torch intra-op threads (unset: every usable core, "
                                    "affinity and cgroup quota respected, shared by torchrun's local ranks)")
    group_by_length: bool = Field(False, description="micro-batches of similar lengths (less padding, same "
                                  "examples); the dataset gives lengths via lengths() or len(item)")
    length_group_batches: int = Field(50, gt=0, description="group_by_length: micro-batches per sorted chunk")
    max_nonfinite_steps: int = Field(0, ge=0, description="optimizer steps whose loss or gradient norm is not "
                                     "finite (nan, inf) that are skipped (no update) before the run stops; 0: stop "
                                     "at the first, keeping the last good training state")
    ddp_find_unused_parameters: bool = Field(False, description="DDP: look for parameters without a gradient at "
                                             "every step (slower; only for heads that leave some unused)")

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for old, new in LEGACY_NAMES.items():
                if old in data:
                    value = data.pop(old)
                    data.setdefault(new, value)
            if "amp" in data:  # the old CUDA-only mixed-precision switch
                amp = data.pop("amp")
                data.setdefault("precision", "fp32" if amp == "off" else amp)
            if isinstance(data.get("resume"), bool):  # pretrain's old resume: bool
                data["resume"] = "auto" if data["resume"] else "never"
        return data

    @model_validator(mode="after")
    def _default_length(self) -> TrainLoopSettings:
        if self.epochs is None and self.max_steps is None:
            self.epochs = 1.0
        return self

    def loop_settings(self, output_dir: Path, **overrides: Any) -> TrainSettings:
        """These settings' loop fields as the trainer's settings, writing its state into `output_dir`."""
        values = {name: getattr(self, name) for name in TrainLoopSettings.model_fields}
        return TrainSettings(**{**values, **overrides, "output_dir": output_dir})


class TrainSettings(TrainLoopSettings):
    """Settings of one training run. Batch sizes are per device; see `effective_batch_size`."""

    output_dir: Path = Field(description="metrics.jsonl, train_settings.json and the resumable training states")


def loop_default(name: str, default: Any) -> Any:
    """The loop field `name` (its description and bounds) with another default, for one command."""
    return FieldInfo.merge_field_infos(TrainLoopSettings.model_fields[name], default=default)


# --- fine-tuning ---------------------------------------------------------------------------------

# The tasks a training adapter reads data for, in the registry's order (the choices of --task).
FINETUNE_TASKS = tuple(name for name, task in DEFINITIONS.items() if task.training_adapter)
FinetuneTask = Literal[FINETUNE_TASKS]  # type: ignore[valid-type]
OVERLAP_DIVISOR = 4  # tasks without a doc stride of their own: windows overlap by max_seq_length // 4 tokens
_LENGTH = TaskDefinition.finetune_max_seq_length  # tasks that do not say otherwise
_LENGTHS = "".join(f"{definition(name).finetune_max_seq_length} for {name}, " for name in FINETUNE_TASKS
                   if definition(name).finetune_max_seq_length != _LENGTH) + f"{_LENGTH} otherwise"
_STRIDES = "; ".join(f"{name}: context tokens two windows share (default {definition(name).finetune_doc_stride})"
                     for name in FINETUNE_TASKS if definition(name).finetune_doc_stride is not None)


class FinetuneSettings(TrainLoopSettings):
    """Defaults follow the BERT paper's fine-tuning recipe (AdamW, warmup 10%, batch 32, 3 epochs)."""

    # -- data
    task: FinetuneTask = Field(description="classification: one text -> label; pair: two texts -> label or score; "
                               "ner: a tag per word; qa: SQuAD answer span; multiple-choice: the right choice for a "
                               "context (SWAG CSV or {context, choices, label} JSON lines); rerank: a query's "
                               "relevance to a document (SQuAD JSON: a question, its paragraph and hard negatives)")
    train_file: Path = Field(description="training data file")
    dev_file: Path | None = Field(None, description="dev data file: evaluated after training (and every "
                                  "eval_every_steps while training)")
    out: Path = Field(description="output folder: the fine-tuned model folder (Hugging Face checkpoint + "
                      "berth_task.json + finetune_run.json)")
    data_format: str = Field("auto", description="auto (from the file), sst2, mrpc, table (csv/tsv/jsonl), conll, "
                             "squad")
    text_column: str = Field("text", description="table format: column of the text")
    text_pair_column: str = Field("text_pair", description="table format: column of the second text (pairs)")
    label_column: str = Field("label", description="table format: column of the label")
    labels: list[str] | None = Field(None, description="label names in order (default: sorted as found in train)")
    regression: bool = Field(False, description="pair/classification: a numeric score (num_labels=1)")
    max_train_examples: int | None = Field(None, gt=0, description="use at most this many training examples")
    max_eval_examples: int | None = Field(None, gt=0, description="evaluate on at most this many dev examples")
    bad_rows: Literal["stop", "skip"] = Field(
        "stop", description="a row of the train or dev file that cannot be read (bad JSON, bytes that are not "
        "UTF-8, a missing label, a bad tag, a malformed SQuAD question): stop at the first, naming its file and line, "
        "or skip it and go on; skipped rows go to OUT/errors.jsonl, their count to finetune_run.json and the model "
        "card")
    # -- model
    base: str = Field("default", description="base model folder: a Hugging Face BERT folder, a `berth pretrain` "
                      "output, or 'default' (the embedded all-MiniLM-L6-v2, L6/H384)")
    pooling: Literal["auto", "cls", "mean"] = Field(
        "auto", description="classification/pair/rerank: cls (the tanh pooler over [CLS], BERT's recipe) or mean "
        "(average of the token states); auto: mean for a sentence-transformers base trained with it (the default "
        "all-MiniLM-L6-v2), else cls")
    max_seq_length: int | None = Field(None, gt=0, description=f"tokens per sequence (default: {_LENGTHS})")
    doc_stride: int | None = Field(None, ge=0, description="overlap in tokens of consecutive windows over a long "
                                   f"text: {_STRIDES}; the others, when served (default max_seq_length / "
                                   f"{OVERLAP_DIVISOR})")
    max_query_length: int = Field(64, gt=0, description="qa: question tokens kept")
    label_all_tokens: bool = Field(True, description="ner: train every sub-token (B-X continued as I-X), not only "
                                   "a word's first, so token-level entity grouping (the service's `simple`) is "
                                   "trained too; dev scores use each word's first sub-token either way")
    version_2_with_negative: bool | None = Field(None, description="qa: train for unanswerable questions "
                                                 "(default: when the data has any)")
    feature_based: bool = Field(False, description="ner: the paper's feature-based approach (Table 7): the encoder "
                                "stays frozen, its last four hidden layers are concatenated per token, computed once "
                                "and cached, and only a BiLSTM + linear tag layer is trained (give it a head's "
                                "learning rate, e.g. --lr 1e-3)")
    lstm_hidden_size: int = Field(256, gt=0, description="feature-based: BiLSTM units per direction")
    lstm_layers: int = Field(1, gt=0, description="feature-based: stacked BiLSTM layers (the paper used 2 "
                             "of 768 per direction)")
    negatives: int = Field(3, gt=0, description="rerank: hard negatives per question, other paragraphs of its "
                           "article that do not contain its answer")
    ranking_loss: Literal["listwise", "pointwise"] = Field(
        "listwise", description="rerank: listwise (softmax cross-entropy over the positive and its negatives) or "
        "pointwise (binary cross-entropy per question-document pair)")
    # -- evaluation while training (with eval_every_steps and a dev file)
    metric_for_best: str | None = Field(None, description="dev metric that picks the checkpoint saved: the best "
                                        "evaluation's (default: the task's own: accuracy, f1 for ner and qa, "
                                        "pearson for regression, mrr_at_10 for rerank; higher is better except for "
                                        "losses and errors)")
    early_stopping_patience: int | None = Field(None, gt=0, description="stop after this many evaluations in a row "
                                                "without a better metric_for_best (default: off, train the planned "
                                                "steps)")
    eval_sample_size: int | None = Field(1000, gt=0, description="evaluations during training score a seeded "
                                         "sample of at most this many dev examples (the saved model is then scored "
                                         "on the whole dev file); unset: all of them")
    report_to: list[Literal["tensorboard", "mlflow"]] = Field(
        default_factory=list, description="trackers, comma-separated: tensorboard (event files in OUT/tensorboard), "
        "mlflow (a run in MLFLOW_TRACKING_URI, else ./mlruns); default none")
    # -- the loop's defaults for fine-tuning
    epochs: float | None = loop_default("epochs", 3.0)
    warmup_ratio: float = loop_default("warmup_ratio", 0.1)
    fit_schedule_to_budget: bool = loop_default("fit_schedule_to_budget", True)
    group_by_length: bool = loop_default("group_by_length", True)
    save_every_minutes: float | None = loop_default("save_every_minutes", 1.0)

    @model_validator(mode="after")
    def _check_evaluation(self) -> FinetuneSettings:
        if self.eval_every_steps and self.dev_file is None:
            raise ValueError("eval_every_steps needs a dev file (--dev)")
        if self.early_stopping_patience and not self.eval_every_steps:
            raise ValueError("early_stopping_patience needs evaluations during training (--eval-every-steps)")
        return self

    def effective_max_seq_length(self) -> int:
        return self.max_seq_length or definition(self.task).finetune_max_seq_length

    def effective_doc_stride(self) -> int:
        if self.doc_stride is not None:
            return self.doc_stride
        own = definition(self.task).finetune_doc_stride
        return own if own is not None else self.effective_max_seq_length() // OVERLAP_DIVISOR
