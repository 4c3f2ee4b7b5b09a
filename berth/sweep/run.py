"""The BERT paper's fine-tuning protocol: every cell of a grid x every restart (seed) is a real fine-tuning
run through training.finetuning.finetune.run_finetune (the loop `berth finetune` uses), selected on dev by the task's
metric, the winner exported in this process as `berth export` does it. The engine of `berth sweep`.

Layout of the sweep folder OUT:
- sweep_plan.json: the settings as given, the grid, its cells and the seeds; a re-run with other settings or
  another grid is refused (a re-run with more restarts extends the sweep).
- trials/<id>/: one fine-tuning output folder per trial (id `c03-seed43`: cell 3, seed 43) with its
  trial.json, written atomically once the trial has finished (ok or failed). A trial with a trial.json is
  never run again; one killed mid-way re-runs in its folder, where the training loop resumes from its own
  training state (saved every --save-every-steps steps, 100 unless given).
- best/: the winner's model folder (hard links where the file system allows), kept up to date as trials
  finish; the other trials' weights are deleted as soon as they are beaten, unless `keep_trials`.
- sweep.json: every trial (its settings, seed, dev metrics, minutes, status), the winner, per cell the
  statistics over restarts (berth/sweep/stats.py), rewritten after every trial.
- with an export: the winner's bundle, gated as `berth export` gates it.

Order: restart-major (every cell's first restart, then every cell's second ...), so that a sweep cut short
by its time budget still has one trial of every cell.

Failures: an exception in a trial, or a non-finite training loss or dev metric, makes that trial "failed"
with the reason; the sweep goes on. A user's error that no trial can get past (a bad row, a base that is not a
checkpoint, a full disk: training.errors.UserFacingError other than a diverged run) stops the sweep with its one
line. KeyboardInterrupt and SIGKILL stop the sweep (the trial re-runs).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from berth.sweep import stats as sweep_stats
from berth.sweep.grid import RUNTIME_ONLY, describe
from training.errors import TrainingDiverged, UserFacingError
from training.finetuning.settings import FinetuneSettings
from training.loop.callbacks import greater_is_better

log = logging.getLogger("berth.sweep")

PLAN_FILE = "sweep_plan.json"
RECORD_FILE = "sweep.json"
TRIAL_FILE = "trial.json"
TRIALS_DIR = "trials"
BEST_DIR = "best"
# What stays of a beaten trial's folder: its records, not its weights.
KEPT_WHEN_PRUNED = {TRIAL_FILE, "finetune_run.json", "berth_task.json", "metrics.jsonl", "config.yaml", "metrics.png"}
# A trial saves its resumable training state this often unless told otherwise, so that a kill costs at
# most this many steps of it.
SAVE_EVERY_STEPS = 100
EPOCHS_NOTE = "each epochs value is a run of its own (its own linear decay to 0), not a point of a longer run"


class SweepError(ValueError):
    """A sweep that cannot start; the message is one line for the user."""


@dataclass
class SweepPlan:
    settings: FinetuneSettings  # every trial's, but for its cell's values and seed (out: the sweep folder)
    grid: dict[str, list]  # setting -> values; {} is the one-cell sweep (restarts only)
    cells: list[dict[str, Any]]  # the grid's cells, typed and validated (berth.sweep.grid.expand)
    seeds: list[int]
    metric: str | None = None  # None: the task's headline metric
    sweep_minutes: float | None = None  # no new trial starts once the trials have used this many minutes
    keep_trials: bool = False
    command: list[str] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return Path(self.settings.out)

    def given(self) -> dict[str, Any]:
        """The settings as given (flags, config file), as JSON values: what the sweep's records show."""
        return self.settings.model_dump(mode="json", exclude_unset=True)

    def order(self) -> list[tuple[int, int]]:
        """(cell, seed) in run order: restart-major."""
        return [(cell, seed) for seed in self.seeds for cell in range(len(self.cells))]

    def trial_settings(self, cell: int, seed: int) -> FinetuneSettings:
        """The trial's settings; its cell was validated with these settings when the plan was made."""
        saving = {} if self.settings.save_every_steps else {"save_every_steps": SAVE_EVERY_STEPS}
        return self.settings.model_copy(update={**saving, **self.cells[cell], "seed": seed,
                                                "out": self.out / TRIALS_DIR / trial_id(cell, seed)})

    def identity(self) -> dict[str, Any]:
        """What must match for a re-run to continue this sweep (seeds may grow; the budget, threads and
        other settings that do not change what a trial computes may change)."""
        base = {key: value for key, value in self.given().items() if key not in RUNTIME_ONLY}
        return {"base": base, "grid": as_json(self.grid), "cells": as_json(self.cells), "metric": self.metric}


def trial_id(cell: int, seed: int) -> str:
    return f"c{cell:02d}-seed{seed}"


def check_budget(plan: SweepPlan) -> None:
    """A whole-sweep budget that cannot fit one trial's own budget is refused before training."""
    per_trial = plan.settings.max_minutes
    if plan.sweep_minutes is not None:
        if plan.sweep_minutes <= 0:
            raise SweepError(f"--sweep-minutes {plan.sweep_minutes:g}: must be above 0")
        if per_trial is not None and plan.sweep_minutes < per_trial:
            raise SweepError(f"--sweep-minutes {plan.sweep_minutes:g} cannot fit one trial of --max-minutes "
                             f"{per_trial:g}")


def open_sweep(plan: SweepPlan) -> None:
    """Create OUT with its plan, or check that OUT holds this same sweep."""
    check_budget(plan)
    plan.out.mkdir(parents=True, exist_ok=True)
    path = plan.out / PLAN_FILE
    identity = plan.identity()
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored.get("identity") != identity:
            changed = sorted(key for key in identity if stored.get("identity", {}).get(key) != identity[key])
            raise SweepError(f"{plan.out} holds another sweep (different {', '.join(changed)}); run the same "
                             "command to continue it, or give another --out")
    _write_json(path, {"identity": identity, "seeds": plan.seeds, "command": plan.command})


def load_trials(plan: SweepPlan) -> dict[str, dict]:
    """The finished trials' records under OUT/trials, by id."""
    found = {}
    for path in sorted((plan.out / TRIALS_DIR).glob(f"*/{TRIAL_FILE}")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # written atomically: a broken file is not ours
        found[record["id"]] = record
    return found


Runner = Callable[[FinetuneSettings], dict[str, float]]


def run_sweep(plan: SweepPlan, runner: Runner | None = None) -> dict[str, Any]:
    """Run every unfinished trial of `plan` (in order, within the budget) and return the sweep record."""
    if runner is None:
        from training.finetuning.finetune import run_finetune as runner
    open_sweep(plan)
    done = load_trials(plan)
    order = plan.order()
    skipped = sum(trial_id(cell, seed) in done for cell, seed in order)
    if skipped:
        log.info("sweep %s: %d of %d trials already finished, not re-run", plan.out, skipped, len(order))
    stopped_by = None
    for position, (cell, seed) in enumerate(order, 1):
        key = trial_id(cell, seed)
        if key in done:
            continue
        if _budget_spent(plan, done):
            stopped_by = "sweep_minutes"
            log.warning("sweep budget of %g minutes spent: %d trials not run", plan.sweep_minutes,
                        sum(trial_id(c, s) not in done for c, s in order))
            break
        log.info("trial %d/%d %s: %s seed %d", position, len(order), key, describe(plan.cells[cell]), seed)
        done[key] = result = run_trial(plan, cell, seed, runner)
        log.info("trial %s %s: %s (%.1f min)", key, result["status"],
                 result.get("error") or json.dumps(result.get("dev_metrics")), result["minutes"])
        _keep_winner(plan, done, _winner(plan, done))
        _write_json(plan.out / RECORD_FILE, summarize(plan, done, stopped_by=None))
    _keep_winner(plan, done, _winner(plan, done))
    record = summarize(plan, done, stopped_by=stopped_by)
    _write_json(plan.out / RECORD_FILE, record)
    return record


def run_trial(plan: SweepPlan, cell: int, seed: int, runner: Runner) -> dict[str, Any]:
    """One fine-tuning run; its record, written to its folder's trial.json (atomically)."""
    settings = plan.trial_settings(cell, seed)
    folder = Path(settings.out)
    record: dict[str, Any] = {"id": trial_id(cell, seed), "cell": cell, "seed": seed,
                              "settings": as_json(plan.cells[cell]),
                              "folder": str(folder.relative_to(plan.out)), "started_at": _now()}
    started = time.monotonic()
    try:
        metrics = runner(settings)
        record.update(status="ok", dev_metrics=metrics)
    except TrainingDiverged as error:  # this trial's settings diverge: recorded, the sweep goes on
        log.warning("trial %s failed: %s", record["id"], error)
        record.update(status="failed", error=f"{type(error).__name__}: {error}"[:500], dev_metrics={})
    except UserFacingError:  # bad data, a bad base, a full disk: every trial would fail the same way
        raise
    except Exception as error:  # a crashing trial is recorded, the sweep goes on
        log.exception("trial %s failed", record["id"])
        record.update(status="failed", error=f"{type(error).__name__}: {error}".splitlines()[0][:500],
                      dev_metrics={})
    record["minutes"] = round((time.monotonic() - started) / 60, 3)
    record["finished_at"] = _now()
    record.update(_run_facts(folder))
    if record["status"] == "ok":
        reason = _failure_reason(record, plan.metric or plan.settings.metric_for_best)
        if reason:
            record.update(status="failed", error=reason)
    _write_json(folder / TRIAL_FILE, record)
    return record


def _run_facts(folder: Path) -> dict[str, Any]:
    """Training facts of a trial from its finetune_run.json (absent when it crashed before writing one)."""
    path = folder / "finetune_run.json"
    if not path.is_file():
        return {}
    run = json.loads(path.read_text(encoding="utf-8"))
    result = run.get("train_result") or {}
    chosen = {}
    task_file = folder / "berth_task.json"
    if task_file.is_file():  # SQuAD v2: the no-answer threshold the run chose on dev
        spec = json.loads(task_file.read_text(encoding="utf-8"))
        if spec.get("version_2_with_negative"):
            chosen["no_answer_threshold"] = spec.get("null_score_diff_threshold")
    return {**chosen, "final_loss": result.get("final_loss"), "steps": result.get("steps"),
            "train_minutes": run.get("train_minutes"), "stopped_by": result.get("stopped_by"),
            "precision": run.get("precision"), "threads": (run.get("speed") or {}).get("threads")}


def _failure_reason(record: dict, metric: str | None) -> str | None:
    loss = record.get("final_loss")
    if isinstance(loss, int | float) and not math.isfinite(loss):
        return f"non-finite training loss ({loss})"
    bad = [name for name, value in record["dev_metrics"].items()
           if isinstance(value, float) and not math.isfinite(value)]
    if bad:
        return f"non-finite dev metric {', '.join(bad)}"
    if not record["dev_metrics"]:
        return "no dev metrics"
    if metric and metric not in record["dev_metrics"]:
        return f"no dev metric {metric!r} (has {', '.join(record['dev_metrics'])})"
    return None


def _metric(plan: SweepPlan, done: dict[str, dict]) -> str | None:
    """The selection metric: the one asked for (--metric, else the runs' metric_for_best), else the task's
    headline metric of the first ok trial."""
    if plan.metric or plan.settings.metric_for_best:
        return plan.metric or plan.settings.metric_for_best
    from tasks.registry import definition

    for cell, seed in plan.order():
        trial = done.get(trial_id(cell, seed))
        if trial and trial["status"] == "ok":
            return definition(plan.settings.task).headline_metric(trial["dev_metrics"])[0]
    return None


def _winner(plan: SweepPlan, done: dict[str, dict]) -> dict | None:
    metric = _metric(plan, done)
    ordered = [done[key] for cell, seed in plan.order() if (key := trial_id(cell, seed)) in done]
    return sweep_stats.select_winner(ordered, metric, greater_is_better(metric)) if metric else None


def _budget_spent(plan: SweepPlan, done: dict[str, dict]) -> bool:
    """No new trial once the finished trials' minutes (across resumes) reach the budget, or when one more
    trial of the mean length so far would pass it."""
    if plan.sweep_minutes is None:
        return False
    minutes = [trial["minutes"] for trial in done.values()]
    spent = sum(minutes)
    expected = sum(minutes) / len(minutes) if minutes else 0.0
    return spent >= plan.sweep_minutes or spent + expected > plan.sweep_minutes


def summarize(plan: SweepPlan, done: dict[str, dict], stopped_by: str | None) -> dict[str, Any]:
    """The sweep record (sweep.json) from the trial records."""
    metric = _metric(plan, done) or plan.metric
    trials = []
    for cell, seed in plan.order():
        key = trial_id(cell, seed)
        trial = done.get(key) or {"id": key, "cell": cell, "seed": seed, "status": "not_run",
                                  "settings": as_json(plan.cells[cell])}
        trial = dict(trial)
        trial["model_kept"] = (plan.out / TRIALS_DIR / key / "config.json").is_file()
        trials.append(trial)
    greater = greater_is_better(metric) if metric else True
    cells = sweep_stats.cell_statistics(trials, plan.cells, metric, greater) if metric else []
    winner = sweep_stats.select_winner(trials, metric, greater) if metric else None
    statuses = ("ok", "failed", "not_run") + (("stopped",) if any(t["status"] == "stopped" for t in trials) else ())
    counts = {status: sum(t["status"] == status for t in trials) for status in statuses}  # stopped: by ASHA (--ray)
    from training.finetuning.finetune import run_provenance

    return {
        "format": 1,
        "command": plan.command,
        "task": plan.settings.task,
        "train_file": str(plan.settings.train_file),
        "dev_file": str(plan.settings.dev_file),
        "metric": metric, "direction": "max" if greater else "min",
        "grid": as_json(plan.grid),
        "seeds": plan.seeds,
        "base_settings": plan.given(),
        "epochs_cells": EPOCHS_NOTE,
        "counts": counts,
        "minutes": round(sum(t.get("minutes", 0) for t in trials), 3),
        "sweep_minutes": plan.sweep_minutes,
        "stopped_by": stopped_by or ("complete" if counts["not_run"] == 0 else "incomplete"),
        "winner": winner,
        "best_folder": BEST_DIR if winner else None,
        "best_cell_by_mean": sweep_stats.best_cell_by_mean(cells, greater),
        "cells": cells,
        "trials": trials,
        "provenance": run_provenance(),
    }


def _keep_winner(plan: SweepPlan, done: dict[str, dict], winner: dict | None) -> None:
    """OUT/best holds the winner's model; beaten trials lose their weights (unless keep_trials)."""
    if winner is None:
        return
    best = plan.out / BEST_DIR
    marker = best / "sweep_trial.json"
    current = json.loads(marker.read_text(encoding="utf-8"))["id"] if marker.is_file() else None
    source = plan.out / TRIALS_DIR / winner["id"]
    if current != winner["id"] and (source / "config.json").is_file():
        _replace_folder(source, best, skip={TRIAL_FILE, "train_state"})
        _write_json(marker, {"id": winner["id"], "seed": winner["seed"], "settings": winner["settings"],
                             "metric": winner["metric"], "value": winner["value"]})
    if plan.keep_trials:
        return
    for key in done:
        if key != winner["id"]:
            _prune(plan.out / TRIALS_DIR / key)


def _prune(folder: Path) -> None:
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        if path.name in KEPT_WHEN_PRUNED:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _replace_folder(source: Path, target: Path, skip: set[str]) -> None:
    """Copy `source` to `target` (hard links where possible), replacing it in one rename."""
    temporary = target.with_name(target.name + ".tmp")
    shutil.rmtree(temporary, ignore_errors=True)

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, temporary, ignore=lambda _dir, names: [n for n in names if n in skip],
                    copy_function=link_or_copy)
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    temporary.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _write_json(path: Path, data: Any) -> None:
    """Write JSON atomically: a reader (or a resumed sweep) sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def as_json(values: Any) -> Any:
    """Grid values and cells as a record holds them (paths as text)."""
    return json.loads(json.dumps(values, default=str))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def seeds_plan(settings: FinetuneSettings, seeds: list[int], out: Path, metric: str | None = None) -> SweepPlan:
    """The paper's restarts for one recipe as a one-cell sweep into `out`: every setting but the seed is the
    sweep's identity (the seeds come from `seeds`)."""
    given = FinetuneSettings(**{**settings.model_dump(exclude={"seed"}), "out": out})
    return SweepPlan(settings=given, grid={}, cells=[{}], seeds=list(seeds), metric=metric)


def best_of_seeds(settings: FinetuneSettings, seeds: list[int], out: Path, metric: str | None = None) -> dict:
    """The paper's restarts for one recipe: one run per seed, the best on dev kept as OUT/best. Returns the
    sweep record (sweep.json)."""
    return run_sweep(seeds_plan(settings, seeds, out, metric))


def export_winner(plan: SweepPlan, bundle: Path, precision: str = "fp32") -> dict[str, Any]:
    """OUT/best exported to `bundle` in this process, with the gates of `berth export`; `exit_code` is what
    `berth export` exits with for the same outcome (0 exported, 1 refused by a gate, 2 could not export)."""
    from export.bundle_builder import EXPORT_FAILURES, EXPORT_REFUSALS, export_bundle, quiet_optimizer_logs
    from export.settings import ExportSettings

    quiet_optimizer_logs()
    settings = ExportSettings(model_folder=plan.out / BEST_DIR, out=bundle, precision=precision, force=True)
    result: dict[str, Any] = {"bundle": str(bundle), "precision": precision}
    try:
        export_bundle(settings)
    except EXPORT_REFUSALS as error:
        log.error("export of %s refused: %s", settings.model_folder, error)
        return {**result, "exit_code": 1, "error": str(error).splitlines()[0]}
    except EXPORT_FAILURES as error:
        log.error("export of %s failed: %s", settings.model_folder, error)
        return {**result, "exit_code": 2, "error": str(error).splitlines()[0]}
    return {**result, "exit_code": 0}
