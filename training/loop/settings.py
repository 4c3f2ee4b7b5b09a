"""The settings of the one training loop, declared once, and what the commands that embed it inherit.

`TrainLoopSettings` are the knobs of the one training loop (training/loop/trainer.py); `TrainSettings` adds
the folder its resumable training state goes to. `FinetuneSettings` (training/finetuning/settings.py) and
`PretrainSettings` (training/pretraining/settings.py) ARE loop settings (they inherit the fields, descriptions
and bounds) plus their own, with their own defaults for a few (`loop_default`). The `berth` flags, their
defaults and help are generated from these fields (berth/flags.py).
Torch-free, so that `berth --help` works in a serving install.

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
