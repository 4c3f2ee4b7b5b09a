"""The settings of `berth finetune`: the loop's settings plus the data, the model and the evaluation while
training. The flags of `berth finetune` and `berth sweep` are generated from these fields. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from tasks.definition import TaskDefinition
from tasks.registry import DEFINITIONS, definition
from training.errors import UserFacingError
from training.loop.settings import TrainLoopSettings, loop_default

# The tasks a training adapter reads data for, in the registry's order (the choices of --task).
FINETUNE_TASKS = tuple(name for name, task in DEFINITIONS.items() if task.training_adapter)
FinetuneTask = Literal[FINETUNE_TASKS]  # type: ignore[valid-type]
OVERLAP_DIVISOR = 4  # tasks without a doc stride of their own: windows overlap by max_seq_length // 4 tokens
_LENGTH = TaskDefinition.finetune_max_seq_length  # tasks that do not say otherwise
_LENGTHS = "".join(f"{definition(name).finetune_max_seq_length} for {name}, " for name in FINETUNE_TASKS
                   if definition(name).finetune_max_seq_length != _LENGTH) + f"{_LENGTH} otherwise"
_STRIDES = "; ".join(f"{name}: context tokens two windows share (default {definition(name).finetune_doc_stride})"
                     for name in FINETUNE_TASKS if definition(name).finetune_doc_stride is not None)


class FinetuneInputError(UserFacingError):
    """A setting that cannot work here (an unknown --metric-for-best, a tracker not installed), found before
    training starts."""


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
