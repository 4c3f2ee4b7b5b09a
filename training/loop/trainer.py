"""The one training loop: pretraining and every fine-tuning task go through `train`.

Like minGPT's Trainer it knows nothing about the task. It takes a model whose forward returns a dict
with a scalar "loss" (other 0-dim tensors there are logged as metrics), a map-style dataset, a collate
function that turns a list of items into the model's keyword arguments, and `TrainSettings`.

What it does: AdamW (no weight decay on biases and LayerNorm weights), linear warmup then linear decay
to 0, gradient accumulation, gradient clipping, mixed precision (training/loop/precision.py: bf16 autocast
where the GPU or the CPU has it natively, fp16 with a GradScaler on older GPUs, fp32 weights and
optimizer state always), DDP when launched by torchrun, progress lines or a bar, and a JSON-lines metrics log, and
checkpoints that make resume after a kill exact: same seed, same per-step losses, same final weights
as an uninterrupted run.

How exact resume works. Every epoch's data order is a permutation drawn from a generator seeded by
(seed, epoch) (training/loop/data_order.py), dealt to ranks like DistributedSampler, and cut into
micro-batches. A training state (training/loop/training_state.py) records the epoch and how many
micro-batches of it were consumed, plus every random state (training/loop/random_state.py: python,
numpy, torch, CUDA; per rank). Resuming rebuilds the epoch's batches and starts after the consumed
ones, without loading them. DataLoaders get their own seeded generator so that creating one does not
draw from the global torch RNG (the one dropout uses), and evaluation / saving run with the global
random states saved and restored, so neither perturbs training. A CPU run resumes with the thread count its
training state was computed with (the sums inside a step split by thread, so another count gives other bits).

Layout of `output_dir`: metrics.jsonl (training/loop/metrics_log.py), train_settings.json,
checkpoints/step-00000123/trainer_state.pt, and final_model/ when an `on_save` hook is given. The
optimizer and the learning-rate schedule are training/loop/optimizer.py's.

Why one file of ~600 lines: it is the loop itself (`_Run`), whose steps share one run's state (plan, position in the
epoch, random states, callbacks); what needs none of it is already its own module (data order, random state,
training state, precision, optimizer, metrics log, callbacks).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.errors import TrainingDiverged, UserFacingError
from training.loop.callbacks import TrainerCallback
from training.loop.data_order import (
    dataset_lengths,
    derive_seed,
    epoch_batches,
)
from training.loop.distributed import (
    DistContext,
    any_rank,
    barrier,
    broadcast_object,
    gather_objects,
    setup_distributed,
    teardown_distributed,
)
from training.loop.metrics_log import METRICS_FILE, MetricsLog, Window, batch_size_of, merge_windows
from training.loop.optimizer import (
    build_optimizer,
    build_scheduler,
    current_learning_rate,
    replan,
)
from training.loop.precision import autocast, dtype_named, precision_name, probe_cpu_precision, resolve_precision
from training.loop.random_state import capture_rng_state, preserved_rng, restore_rng_state, seed_everything
from training.loop.settings import TrainSettings
from training.loop.threads import default_threads
from training.loop.training_state import (
    CHECKPOINTS_DIR,
    STATE_FILE,
    atomic_directory,
    clean_stale_temporaries,
    latest_training_state,
    list_training_states,
    load_training_state,
    save_training_state,
)

log = logging.getLogger(__name__)

SETTINGS_FILE = "train_settings.json"
FINAL_MODEL_DIR = "final_model"
SAVE_COST_FACTOR = 20  # with save_every_minutes: the wait between saves is at least 20x the last save's time


@dataclass
class TrainResult:
    steps: int
    epochs: float
    final_loss: float | None
    elapsed_s: float  # training time, across resumes
    tokens_per_s: float  # over this invocation, all ranks
    examples_per_s: float
    last_checkpoint: Path | None
    stopped_by: str  # "steps" (planned length reached), "max_minutes", or "callback" (one asked to stop)
    planned_steps: int = 0  # from epochs / max_steps, before a budget fit
    fitted_to_budget: bool = False  # the plan was shortened to end (warmup + decay whole) at max_minutes
    world_size: int = 1
    effective_batch_size: int = 0
    threads: int = 0  # torch intra-op threads per process
    real_tokens: int = 0  # over this invocation, all ranks: attention-mask ones
    padded_tokens: int = 0  # the same batches' full width (what the model computed on)
    metrics_path: Path | None = None
    final_eval: dict[str, float] = field(default_factory=dict)
    precision: str = "fp32"  # what the steps computed in: fp32, or bf16 / fp16 autocast (weights stay fp32)
    evaluations: int = 0  # over this invocation
    eval_seconds: float = 0.0  # wall time of those evaluations (not counted in elapsed_s)
    nonfinite_steps: int = 0  # steps skipped for a nan / inf loss or gradient norm, across resumes

    def to_dict(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Plan:
    """How long the run is, in optimizer steps, given the data size and the batch geometry."""

    examples: int
    micro_batches_per_epoch: int  # per rank
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int

    @staticmethod
    def make(settings: TrainSettings, examples: int, world_size: int) -> Plan:
        per_rank = math.ceil(examples / world_size)
        micro = math.ceil(per_rank / settings.batch_size)
        steps_per_epoch = math.ceil(micro / settings.grad_accum_steps)
        candidates = []
        if settings.epochs is not None:
            candidates.append(math.ceil(settings.epochs * steps_per_epoch))
        if settings.max_steps is not None:
            candidates.append(settings.max_steps)
        total = max(1, min(candidates))
        warmup = (settings.warmup_steps if settings.warmup_steps is not None
                  else math.ceil(settings.warmup_ratio * total))
        return Plan(examples, micro, steps_per_epoch, total, min(warmup, total))


def _shown(value: Any) -> str:
    """A setting or digest for a message: a data digest by its first 12 hex digits."""
    return repr(value[:12] + "...") if isinstance(value, str) and len(value) == 64 else repr(value)


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _progress_bar(ctx: DistContext, settings: TrainSettings, plan: Plan, start: int):
    """Rank 0's progress (tasks/runtime/progress.py): a bar on a terminal, else a line at least every 30 s."""
    from tasks.runtime.progress import Progress

    folder = Path(settings.output_dir)
    name = folder.parent.name if folder.name == "train_state" else folder.name
    return Progress(f"train {name}", total=plan.total_steps, unit="steps", initial=start,
                    enabled=ctx.is_main and settings.progress_bar)


def train(
    model: nn.Module,
    dataset: Any,
    collate: Callable[[list[Any]], dict[str, Any]],
    settings: TrainSettings,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    on_save: Callable[[nn.Module, Path], None] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
) -> TrainResult:
    """Train `model` in place on `dataset` and return a summary.

    `dataset`: map-style (len and [i]); if it has `set_epoch(epoch)` it is called before each epoch.
    `collate(items)` -> the model's keyword arguments (tensors), labels included.
    `evaluate(model)` -> metrics, run on rank 0 in eval mode every eval_every_steps and at the end.
    `on_save(model, folder)` saves the final model in the caller's format (rank 0, atomically, into
    output_dir/final_model). Under torchrun, call this in every process; checkpoints must be on a
    filesystem all ranks can read.
    `callbacks` (training/loop/callbacks.py) see every metrics line and evaluation, may stop the run after an
    evaluation, and keep their state in the resumable training state.
    """
    ctx = setup_distributed(settings.device)
    try:
        return _Run(model, dataset, collate, settings, ctx, evaluate, on_save, callbacks).run()
    finally:
        teardown_distributed(ctx)


class _Run:
    def __init__(self, model, dataset, collate, settings: TrainSettings, ctx: DistContext, evaluate, on_save,
                 callbacks: Sequence[TrainerCallback] = ()) -> None:
        if len(dataset) == 0:
            raise ValueError("the training dataset is empty")
        self.settings, self.ctx, self.dataset, self.collate = settings, ctx, dataset, collate
        self.evaluate_fn, self.on_save = evaluate, on_save
        self.callbacks = list(callbacks) if ctx.is_main else []  # every hook runs on rank 0
        self.callback_states: dict[str, Any] | None = None  # from the training state resumed, if any
        self.evaluations, self.eval_seconds, self.stop_requested = 0, 0.0, False
        self.output_dir = Path(settings.output_dir)
        self.plan = Plan.make(settings, len(dataset), ctx.world_size)
        self.lengths = dataset_lengths(dataset) if settings.group_by_length else None
        if self.ctx.device.type == "cpu" or settings.num_threads:
            torch.set_num_threads(settings.num_threads or default_threads())
        seed_everything(derive_seed(settings.seed, ctx.rank))

        self.device = ctx.device
        self.model = model.to(self.device)
        self.amp_dtype = resolve_precision(settings.precision, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self.optimizer = build_optimizer(self.model, settings, self.device)
        self.scheduler = build_scheduler(self.optimizer, self.plan.warmup_steps, self.plan.total_steps)
        self.planned_steps = self.plan.total_steps
        self.step, self.epoch, self.micro_done, self.elapsed_before = 0, 0, 0, 0.0
        self.last_checkpoint: Path | None = None
        self.last_saved_step = -1
        self.nonfinite_steps = 0  # skipped for a nan / inf loss or gradient norm, across resumes
        self.last_save_seconds, self.last_save_elapsed = 0.0, 0.0
        self.resumed_precision: str | None = None  # what a resumed run's training state computed in
        self.resumed_threads: int | None = None  # and with how many intra-op threads
        self.resumed_from = self._resume()
        self._keep_resumed_threads()
        self.last_save_elapsed = self.elapsed_before
        self.precision_probe: dict[str, Any] | None = None
        if settings.precision == "auto" and self.resumed_precision is not None:
            self.amp_dtype = dtype_named(self.resumed_precision)  # a resumed run keeps the precision it chose
        elif settings.precision == "auto" and self.device.type == "cpu" and self.amp_dtype is not None:
            self._measure_precision()
        self.precision = precision_name(self.amp_dtype)
        for callback in self.callbacks:
            states = self.callback_states
            callback.restore(None if states is None else states.get(callback.name), self.step)
        self.stop_requested = broadcast_object(ctx, any(c.should_stop() for c in self.callbacks))
        if ctx.enabled:
            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=ids, find_unused_parameters=settings.ddp_find_unused_parameters)

    # -- resume

    def _resume(self) -> Path | None:
        s, ctx = self.settings, self.ctx
        checkpoints = self.output_dir / CHECKPOINTS_DIR
        if ctx.is_main:
            clean_stale_temporaries(checkpoints)
        if s.resume == "never":
            if ctx.is_main and list_training_states(self.output_dir):
                log.info("resume=never: removing the earlier run's checkpoints in %s", checkpoints)
                for old in list_training_states(self.output_dir):
                    shutil.rmtree(old)
            barrier(ctx)
            return None
        folder = latest_training_state(self.output_dir) if s.resume == "auto" else Path(s.resume)
        barrier(ctx)
        if folder is None:
            if ctx.is_main:
                log.info("no saved state in %s, starting at step 0", checkpoints)
            return None
        if not (folder / STATE_FILE).is_file():
            raise UserFacingError(f"--resume {folder}: not a training state (no {STATE_FILE} in it); name a "
                                  f"{CHECKPOINTS_DIR}/step-N folder, or auto or never")
        state = load_training_state(folder)
        # older checkpoints lack the later keys: those before the schedule's were always so, the schedule's unknown
        saved = {"group_by_length": False, "length_group_batches": None, "data": None, **state["geometry"]}
        here = self._geometry()
        changed = ", ".join(f"{k} {_shown(saved[k])} -> {_shown(here[k])}" for k in here
                            if k in saved and saved[k] != here[k])
        if changed:
            raise UserFacingError(f"cannot resume {folder} exactly: {changed} since it was written; run again with "
                                  "--resume never to start over, or name another output folder")
        if state["seed"] != s.seed:
            log.warning("resuming %s written with seed %d under seed %d", folder, state["seed"], s.seed)
        _unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.micro_done = state["step"], state["epoch"], state["micro_batches_done"]
        self.elapsed_before = state["elapsed_s"]
        self.nonfinite_steps = state.get("nonfinite_steps", 0)
        self.resumed_precision = state.get("precision")
        self.resumed_threads = state.get("threads")
        self.callback_states = state.get("callbacks", {})
        if "total_steps" in state and state["total_steps"] != self.plan.total_steps:  # a plan fitted to the budget
            self._set_plan(state["total_steps"], state["warmup_steps"])
        restore_rng_state(state["rng"][ctx.rank])
        self.last_checkpoint, self.last_saved_step = folder, self.step
        if ctx.is_main:
            log.info("resumed from step %d (%s): epoch %d, %d micro-batches into it", self.step, folder, self.epoch,
                     self.micro_done)
        return folder

    def _keep_resumed_threads(self) -> None:
        """A resumed CPU run computes with the thread count its training state was computed with: the sums inside
        a step split by thread, so another count gives other weights (measured: 1 and 2 threads train a tiny
        classifier to different bits), and the count picked by default follows the machine's load at start.
        An explicit num_threads wins, with a line that says the weights will differ."""
        saved, now = self.resumed_threads, torch.get_num_threads()
        if saved is None or self.device.type != "cpu" or saved == now:
            return
        if self.settings.num_threads:
            if self.ctx.is_main:
                log.warning("resuming a state computed with %d threads on %d (num_threads): the weights will not "
                            "be bit for bit those of an uninterrupted run", saved, now)
            return
        torch.set_num_threads(saved)
        if self.ctx.is_main:
            log.info("resuming with the %d threads the training state was computed with (not the %d this machine's "
                     "load suggests), so that the run ends with the same weights; num_threads overrides", saved, now)

    def _epoch_batches(self, epoch: int, rank: int, world_size: int) -> Sequence[list[int]]:
        """This rank's micro-batches of `epoch`: the dataset's own order when it makes one (prepared pretraining
        shards, read on demand), else a permutation of all examples (training/loop/data_order.py)."""
        own = getattr(self.dataset, "epoch_batches", None)
        if own is not None:
            return own(epoch, rank, world_size, self.settings.batch_size, self.settings.seed)
        return epoch_batches(self.plan.examples, self.settings, epoch, rank, world_size, self.lengths)

    def _measure_precision(self) -> None:
        """precision auto on a CPU with native bf16: time this run's own first and middle micro-batches in
        fp32 and bf16 and train in the faster. Rank 0 measures, every rank follows; the weights and the random
        state are left as they were."""
        record = None
        if self.ctx.is_main:
            order = self._epoch_batches(0, rank=0, world_size=1)
            picks = [order[i] for i in sorted({0, len(order) // 2})]  # a probe costs ~12 steps' time
            with preserved_rng():
                batches = [{k: v.to(self.device) if isinstance(v, torch.Tensor) else v
                            for k, v in self.collate([self.dataset[i] for i in pick]).items()} for pick in picks]

                def step(dtype: torch.dtype | None) -> None:
                    for batch in batches:
                        with autocast(self.device, dtype):
                            loss = self.model(**batch)["loss"]
                        loss.backward()
                    self.model.zero_grad(set_to_none=True)

                _, record = probe_cpu_precision(step)
        self.precision_probe = broadcast_object(self.ctx, record)
        self.amp_dtype = dtype_named(self.precision_probe["chosen"])

    # -- the loop

    def run(self) -> TrainResult:
        s, ctx, plan = self.settings, self.ctx, self.plan
        if ctx.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._write_settings()
        keep = self.step if self.resumed_from is not None else None
        self.metrics = MetricsLog(self.output_dir / METRICS_FILE, ctx.is_main, keep)
        self.bar = _progress_bar(ctx, s, plan, self.step)
        self.started = time.perf_counter()
        self.fit_from_step, self.fit_from_time = self.step, None
        self.run_tokens = self.run_examples = self.run_padded_tokens = 0
        self.final_loss: float | None = None
        self.final_eval: dict[str, float] = {}
        stopped_by = "steps"
        start_step = self.step
        self.model.train()
        try:
            window = Window()
            self.window = window
            if s.max_minutes is not None and self.elapsed_before >= s.max_minutes * 60:
                stopped_by = "max_minutes"  # a resumed run whose budget was already spent
            if self.stop_requested:
                stopped_by = "callback"  # a resumed run that a callback had already stopped
            while self.step < self.plan.total_steps and stopped_by == "steps":
                stopped_by = self._train_epoch(window) or stopped_by
            trained = self.step > start_step or self.resumed_from is None
            if trained:
                if self.evaluate_fn is not None and not self._due(s.eval_every_steps):
                    self._evaluate()
                if self.last_saved_step != self.step:
                    self._save()
            # Also when a kill came between the last checkpoint and the final model.
            missing = broadcast_object(ctx, not (self.output_dir / FINAL_MODEL_DIR).exists())
            if trained or missing:
                self._save_final_model()
        finally:
            self.bar.close()
            self.metrics.close()
        barrier(ctx)
        return self._result(stopped_by)

    def _train_epoch(self, window: Window) -> str | None:
        """Train from the current position to the end of the epoch (or of the run). Why it stopped early:
        "max_minutes" (out of time) or "callback" (a callback asked after an evaluation); else None."""
        s = self.settings
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)
        batches = self._epoch_batches(self.epoch, self.ctx.rank, self.ctx.world_size)
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_sampler=batches[self.micro_done :], collate_fn=self.collate,
            num_workers=s.num_workers, pin_memory=self.device.type == "cuda",
            generator=torch.Generator().manual_seed(derive_seed(s.seed, self.epoch, self.ctx.rank, 1)),
        )
        micro_batches = iter(loader)
        while self.micro_done < len(batches) and self.step < self.plan.total_steps:
            group = min(s.grad_accum_steps, len(batches) - self.micro_done)
            self._optimizer_step(micro_batches, group, window)
            self.micro_done += group
            self.step += 1
            self.bar.update(1)
            if self._fitting():
                self._fit_plan_to_budget()
            out_of_time = (s.max_minutes is not None and self.step < self.plan.total_steps
                           and self.step >= (s.min_steps or 0)
                           and any_rank(self.ctx, self._elapsed() > self._hard_limit_s()))
            if self._due(s.log_every_steps) or self.step == self.plan.total_steps or out_of_time:
                self._log(window)
                window.reset()
            if self.evaluate_fn is not None and self._due(s.eval_every_steps):
                self._evaluate()
            if self._due(s.save_every_steps) or self._save_due_by_time() or out_of_time or self.stop_requested:
                self._save()
            if self.stop_requested:
                log.info("stopped at step %d by a callback (e.g. early stopping)", self.step)
                return "callback"
            if out_of_time:
                log.info("max_minutes=%s reached at step %d", s.max_minutes, self.step)
                return "max_minutes"
        if self.micro_done >= len(batches):
            self.epoch, self.micro_done = self.epoch + 1, 0
        return None

    def _optimizer_step(self, micro_batches: Iterator[dict[str, Any]], group: int, window: Window) -> None:
        s = self.settings
        logged: list[tuple[str, torch.Tensor]] = []  # into the window once the step is known to be finite
        nonfinite = torch.zeros((), dtype=torch.bool, device=self.device)
        for i in range(group):
            batch = next(micro_batches)
            examples, tokens, padded = batch_size_of(batch)
            window.examples += examples
            window.tokens += tokens
            window.padded_tokens += padded
            self.run_examples += examples
            self.run_tokens += tokens
            self.run_padded_tokens += padded
            batch = {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                     for k, v in batch.items()}
            sync = i == group - 1 or not self.ctx.enabled
            with (contextlib.nullcontext() if sync else self.model.no_sync()):
                with autocast(self.device, self.amp_dtype):
                    out = self.model(**batch)
                loss = out["loss"]
                self.scaler.scale(loss / group).backward()
            nonfinite |= ~torch.isfinite(loss.detach())
            logged += [(key, value) for key, value in out.items()
                       if isinstance(value, torch.Tensor) and value.dim() == 0]
        self.learning_rate = current_learning_rate(self.optimizer)  # the rate this step applies
        if s.max_grad_norm:
            self.scaler.unscale_(self.optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.max_grad_norm)
            logged.append(("grad_norm", norm))
            if not self.scaler.is_enabled():  # fp16's scaler skips an overflowing step by itself, and says so
                nonfinite |= ~torch.isfinite(norm.detach())
        if any_rank(self.ctx, bool(nonfinite.item())):
            self._skip_nonfinite_step(logged)
            return
        for key, value in logged:
            window.add(key, value)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _skip_nonfinite_step(self, logged: list[tuple[str, torch.Tensor]]) -> None:
        """A step whose loss or gradient norm is nan or inf: its update is not applied. Up to max_nonfinite_steps
        of them are skipped (the schedule moves on, the count goes into the result and the training state); past
        that the run stops here with the weights of the step before, and the training states saved so far."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.update()  # a no-op in fp32 and bf16
        self.nonfinite_steps += 1
        step = self.step + 1
        values = ", ".join(f"{key} {float(value.detach()):g}" for key, value in logged if key in ("loss", "grad_norm"))
        if self.nonfinite_steps <= self.settings.max_nonfinite_steps:
            self.scheduler.step()
            log.warning("step %d: %s; skipped (%d of the %d non-finite steps allowed)", step, values,
                        self.nonfinite_steps, self.settings.max_nonfinite_steps)
            return
        kept = (f"the last good training state (step {self.last_saved_step}) is kept in {self.last_checkpoint}"
                if self.last_checkpoint is not None else "no training state had been saved yet")
        allowed = self.settings.max_nonfinite_steps
        raise TrainingDiverged(
            f"training diverged at step {step}: {values} (learning rate {self.learning_rate:g}); no model was "
            f"saved, {kept}. Lower the learning rate (--lr) and start over (--resume never)"
            + (f", or allow more skipped steps than {allowed} (--max-nonfinite-steps)" if allowed else
               ", or skip such steps (--max-nonfinite-steps N)"))

    # -- a time budget that keeps the schedule whole

    def _fitting(self) -> bool:
        return bool(self.settings.fit_schedule_to_budget and self.settings.max_minutes)

    def _hard_limit_s(self) -> float:
        """Fitting aims at the budget; the stop is a safety net a little past it (speed on a shared machine varies)."""
        return self.settings.max_minutes * 60 * (1.1 if self._fitting() else 1.0)

    def _fit_plan_to_budget(self) -> None:
        """Set the total steps so that the run ends at max_minutes at the speed measured so far.

        The speed is counted from the end of the first step of this invocation (which pays for warm-up);
        the plan only shrinks (never past what epochs / max_steps asked) and the warmup keeps its ratio.
        Refitted after every step, so a machine that slows down or speeds up moves the end, not the budget.
        """
        now = self._elapsed()
        if self.fit_from_time is None:
            self.fit_from_step, self.fit_from_time = self.step, now
            return
        steps, seconds = self.step - self.fit_from_step, now - self.fit_from_time
        if steps <= 0 or seconds <= 0:
            return
        total = steps_within_budget(self.step, steps / seconds, self.settings.max_minutes * 60 - now,
                                    self.planned_steps, self.settings.min_steps or 0)
        total = broadcast_object(self.ctx, total)
        s = self.settings
        warmup = s.warmup_steps if s.warmup_steps is not None else math.ceil(s.warmup_ratio * total)
        if total != self.plan.total_steps:
            if self.ctx.is_main and abs(total - self.plan.total_steps) > 0.05 * self.plan.total_steps:
                log.info("budget %.1f min at %.2f s/step: %d steps in all (planned %d), warmup %d", s.max_minutes,
                         seconds / steps, total, self.planned_steps, min(warmup, total))
            self._set_plan(total, min(warmup, total))

    def _set_plan(self, total: int, warmup: int) -> None:
        self.plan = replace(self.plan, total_steps=total, warmup_steps=warmup)
        replan(self.scheduler, warmup, total)  # the decay now reaches 0 at the new end, from the coming step on
        if hasattr(self, "bar"):
            self.bar.total = total

    def _due(self, every: int | None) -> bool:
        return bool(every) and self.step % every == 0

    def _save_due_by_time(self) -> bool:
        """save_every_minutes of training since the last save, and at least SAVE_COST_FACTOR times what that save
        took: a large state on a fast device then costs at most ~1/SAVE_COST_FACTOR of the training time."""
        minutes = self.settings.save_every_minutes
        if not minutes or self.step >= self.plan.total_steps:  # the end saves anyway
            return False
        wait = max(minutes * 60, SAVE_COST_FACTOR * self.last_save_seconds)
        return any_rank(self.ctx, self._elapsed() - self.last_save_elapsed >= wait)

    def _elapsed(self) -> float:
        """Training time so far, across resumes; evaluations are not counted."""
        return self.elapsed_before + time.perf_counter() - self.started - self.eval_seconds

    def _epoch_progress(self) -> float:
        return self.epoch + self.micro_done / self.plan.micro_batches_per_epoch

    # -- logging, evaluation, saving

    def _log(self, window: Window) -> None:
        summaries = gather_objects(self.ctx, window.summary())
        if not self.ctx.is_main:
            return
        means, tokens, padded, examples = merge_windows(summaries)
        seconds = max(time.perf_counter() - window.started, 1e-9)
        loss = means.pop("loss", None)  # none when every step of the window was a skipped non-finite one
        record = {"step": self.step, "epoch": round(self._epoch_progress(), 4), "loss": loss,
                  "learning_rate": self.learning_rate, "tokens_per_s": tokens / seconds,
                  "examples_per_s": examples / seconds, "padding_ratio": padded / max(tokens, 1),
                  "elapsed_s": round(self._elapsed(), 3), **means}
        self.final_loss = record["loss"]
        self.metrics.write(record)
        for callback in self.callbacks:
            callback.on_log(record)
        shown = "-" if loss is None else f"{loss:.4f}"
        self.bar.set_postfix(loss=shown, tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
        if not self.bar.disable:
            return
        log.info("step %d/%d epoch %.2f loss %s lr %.3g %.0f tokens/s", self.step, self.plan.total_steps,
                 record["epoch"], shown, record["learning_rate"], record["tokens_per_s"])

    def _evaluate(self) -> None:
        barrier(self.ctx)
        started = time.perf_counter()
        if self.ctx.is_main:
            model = _unwrap(self.model)
            model.eval()
            try:
                with preserved_rng(), torch.no_grad():
                    results = {k: float(v) for k, v in self.evaluate_fn(model).items()}
                    seconds = time.perf_counter() - started
                    for callback in self.callbacks:
                        callback.on_evaluate(self.step, results, model)
            finally:
                model.train()
            self.final_eval = results
            self.metrics.write({"split": "eval", "step": self.step, "epoch": round(self._epoch_progress(), 4),
                                **results, "eval_seconds": round(seconds, 3)})
            log.info("eval at step %d (%.1f s): %s", self.step, seconds, json.dumps(results))
        self.stop_requested = broadcast_object(self.ctx, any(c.should_stop() for c in self.callbacks))
        barrier(self.ctx)
        seconds = time.perf_counter() - started  # what the pause cost every rank
        self.evaluations, self.eval_seconds = self.evaluations + 1, self.eval_seconds + seconds
        self.window.started += seconds  # tokens/s counts training time only

    def _save(self) -> None:
        started = time.perf_counter()
        rng_states = gather_objects(self.ctx, capture_rng_state())
        folder = self.output_dir / CHECKPOINTS_DIR / f"step-{self.step:08d}"
        barrier(self.ctx)
        if self.ctx.is_main:
            state = {
                "model": _unwrap(self.model).state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rng_states,
                "step": self.step,
                "epoch": self.epoch if self.micro_done < self.plan.micro_batches_per_epoch else self.epoch + 1,
                "micro_batches_done": self.micro_done % self.plan.micro_batches_per_epoch,
                "elapsed_s": self._elapsed(),
                "nonfinite_steps": self.nonfinite_steps,
                "total_steps": self.plan.total_steps,
                "warmup_steps": self.plan.warmup_steps,
                "seed": self.settings.seed,
                "precision": self.precision,
                "threads": torch.get_num_threads(),
                "geometry": self._geometry(),
                "callbacks": {c.name: c.state_dict() for c in self.callbacks},
            }
            save_training_state(folder, state)
            for callback in self.callbacks:
                callback.on_state_saved(self.step)
            self._prune_checkpoints()
        barrier(self.ctx)
        self.last_checkpoint, self.last_saved_step = folder, self.step
        self.last_save_seconds = time.perf_counter() - started
        self.last_save_elapsed = self._elapsed()

    def _prune_checkpoints(self) -> None:
        keep = self.settings.keep_last_states
        if keep:
            for old in list_training_states(self.output_dir)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)

    def _save_final_model(self) -> None:
        if self.on_save is None:
            return
        if self.ctx.is_main:
            with preserved_rng(), atomic_directory(self.output_dir / FINAL_MODEL_DIR) as tmp:
                self.on_save(_unwrap(self.model), tmp)
        barrier(self.ctx)

    def _write_settings(self) -> None:
        s, plan = self.settings, self.plan
        record = {
            "settings": json.loads(s.model_dump_json()),
            "world_size": self.ctx.world_size,
            "effective_batch_size": self._effective_batch(),
            "plan": asdict(plan),
            "device": str(self.device),
            "precision": self.precision,
            "precision_probe": self.precision_probe,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
        }
        (self.output_dir / SETTINGS_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        log.info("train settings: %s", s.model_dump_json())
        log.info("training: %d examples, batch %d x accum %d x world %d = %d per step, %d steps/epoch, "
                 "%d steps (warmup %d), device %s, precision %s", plan.examples, s.batch_size, s.grad_accum_steps,
                 self.ctx.world_size, self._effective_batch(), plan.steps_per_epoch, plan.total_steps,
                 plan.warmup_steps, self.device, self.precision)

    def _geometry(self) -> dict[str, Any]:
        """What fixes the data order, the data and the optimizer's schedule: a checkpoint resumes exactly only under
        the same. (The plan's length is checked apart: a plan fitted to a time budget is restored from the state.)"""
        s = self.settings
        return {"world_size": self.ctx.world_size, "batch_size": s.batch_size, "grad_accum_steps": s.grad_accum_steps,
                "examples": self.plan.examples, "group_by_length": s.group_by_length,
                "length_group_batches": s.length_group_batches if s.group_by_length else None,
                "data": getattr(self.dataset, "fingerprint", None), "learning_rate": s.learning_rate,
                "warmup_ratio": s.warmup_ratio, "warmup_steps": s.warmup_steps, "weight_decay": s.weight_decay,
                "adam_epsilon": s.adam_epsilon, "max_grad_norm": s.max_grad_norm}

    def _effective_batch(self) -> int:
        return self.settings.batch_size * self.settings.grad_accum_steps * self.ctx.world_size

    def _result(self, stopped_by: str) -> TrainResult:
        seconds = max(time.perf_counter() - self.started - self.eval_seconds, 1e-9)  # training time only
        world = self.ctx.world_size  # every rank consumes the same number of examples
        return TrainResult(
            steps=self.step, epochs=round(self._epoch_progress(), 4), final_loss=self.final_loss,
            elapsed_s=round(self._elapsed(), 3), tokens_per_s=self.run_tokens * world / seconds,
            examples_per_s=self.run_examples * world / seconds, last_checkpoint=self.last_checkpoint,
            stopped_by=stopped_by, planned_steps=self.planned_steps,
            fitted_to_budget=self.plan.total_steps != self.planned_steps, world_size=world,
            effective_batch_size=self._effective_batch(), threads=torch.get_num_threads(),
            real_tokens=self.run_tokens * world, padded_tokens=self.run_padded_tokens * world,
            metrics_path=self.output_dir / METRICS_FILE, final_eval=self.final_eval, precision=self.precision,
            evaluations=self.evaluations, eval_seconds=round(self.eval_seconds, 3),
            nonfinite_steps=self.nonfinite_steps,
        )


def steps_within_budget(step: int, steps_per_s: float, remaining_s: float, planned_steps: int,
                        min_steps: int = 0) -> int:
    """The run's total steps when `remaining_s` of budget is left at `step`, at the measured speed: the
    steps that fit, never more than the plan (epochs / max_steps) asked, never fewer than already done nor than
    `min_steps`. This is what sizes a time-budgeted run's data: a fast machine trains on more examples, up to
    all epochs; a slow or busy one on the minimum, later."""
    fitting = step + max(0, math.floor(remaining_s * steps_per_s))
    return min(planned_steps, max(fitting, min_steps))
